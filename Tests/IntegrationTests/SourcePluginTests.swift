import AsyncSupport
import Foundation
import MarketDataHub
import NIOCore
import PolygonWire
import RelayServer
import ServiceLifecycle
import Synchronization
import Testing

/// A source written here, from the seam alone (what a recorded tape or a replay will be): an inbox
/// into its hub, the wanted set it follows, a health report. It plays what the test scripts.
final class ScriptedSource: MarketSource {
    let inbox = SourceInbox.source(capacity: 1_000)
    private let hub: MarketDataHub
    private let interest: LocalInterest
    /// What the hub wants, each time it changes.
    let wanted: AsyncStream<Set<Topic>>
    private let wantedContinuation: AsyncStream<Set<Topic>>.Continuation

    init(hub: MarketDataHub, interest: LocalInterest) {
        self.hub = hub
        self.interest = interest
        (wanted, wantedContinuation) = AsyncStream.makeStream(of: Set<Topic>.self)
    }

    func run() async throws {
        let continuation = wantedContinuation
        interest.listen { continuation.yield($0) }
        let inbox = self.inbox
        await withGracefulShutdownHandler {
            await HubPump.run(inbox, into: hub, lossReason: "the scripted source fell behind")
        } onGracefulShutdown: {
            inbox.finish()
        }
    }

    func report() async -> FeedReport {
        FeedReport(healthy: true, upstream: UpstreamReport(state: "scripted", url: "test://script"))
    }
}

@Suite("A source is a plug-in")
struct SourcePluginTests {
    /// A source made of the seam alone is served like the built-in ones: it is told what a client
    /// subscribes, its events reach the client in the market's protocol, its outage and its return are
    /// the client's notices, and its health is `/healthz`'s.
    @Test func aSourceWrittenHereIsServedLikeTheBuiltInOnes() async throws {
        let interest = LocalInterest()
        let hub = MarketDataHub(wire: .polygon, history: nil) { interest.apply($0) }
        let source = ScriptedSource(hub: hub, interest: interest)
        let configuration = RelayServerConfiguration(
            host: "127.0.0.1", port: 0, authentication: try ClientAuthentication.resolve(keys: ["client-key"], listenHost: "127.0.0.1"))
        let server = RelayServer(configuration: configuration, markets: [ServedMarket(market: .stocks, hub: hub, feed: source)], logger: testLogger)
        try await withServices([source, server]) {
            let port = try await server.listeningPort()
            let client = try await WSTestClient.authenticated(url: "ws://127.0.0.1:\(port)/stocks")
            client.send(ClientAction(.subscribe, params: "T.AAPL"))
            try await waitFor(source.wanted, "the source to be told T.AAPL is wanted") { $0.contains(Topic(parsing: "T.AAPL")!) }
            let trade = MarketEvent(
                eventType: "T", ticker: "AAPL", bytes: ByteBuffer(string: #"{"ev":"T","sym":"AAPL","p":187.25,"s":100,"t":1700000000000}"#))
            #expect(source.inbox.push(.events([trade])))
            let got = try await client.nextEvents(1)
            #expect(got.first.map { String(buffer: $0.bytes) }?.contains(#""p":187.25"#) == true)
            // Its outage and its return reach the client through the same inbox, in order.
            #expect(source.inbox.push(.connectionLost(reason: "the script paused")))
            let lost = try await client.waitForStatus("upstream_disconnected")
            #expect((lost.fields["message"] as? String)?.contains("the script paused") == true)
            #expect(source.inbox.push(.events([trade])))
            _ = try await client.waitForStatus("upstream_reconnected")
            let health = try await httpGet("http://127.0.0.1:\(port)/healthz")
            #expect(health.body.contains(#""state":"scripted""#), "\(health.body)")
            await client.close()
        }
    }
}
