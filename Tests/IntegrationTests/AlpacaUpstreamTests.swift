import AlpacaWire
import DemoFeed
import Foundation
import MarketDataHub
import PolygonWire
import Testing
import Upstream

/// The libwebsockets client in Alpaca's protocol, against the demo feed in Alpaca's protocol on loopback.
@Suite("Upstream client: Alpaca")
struct AlpacaUpstreamTests {
    func feed(apiKey: String = "alpaca-key") -> DemoFeed {
        var configuration = DemoFeedConfiguration(port: 0, apiKey: apiKey, eventsPerSecond: 4000, tickInterval: .milliseconds(10), seed: 7)
        configuration.alpaca = true
        configuration.markets = [.stocks, .crypto]
        return DemoFeed(configuration: configuration, logger: testLogger)
    }

    func client(_ url: String, key: String = "alpaca-key", reconnect: ReconnectPolicy = ReconnectPolicy()) throws -> UpstreamClient {
        let endpoint = try #require(UpstreamConfiguration.Endpoint(url))
        var configuration = UpstreamConfiguration(
            endpoint: endpoint, apiKey: key, wire: .alpaca(AlpacaFeed(path: endpoint.path) ?? .iex), reconnect: reconnect)
        configuration.secret = "alpaca-secret"
        return UpstreamClient(configuration: configuration, logger: testLogger)
    }

    @Test func authenticatesWithKeyAndSecretSubscribesByChannelAndTakesMessagePackEvents() async throws {
        let feed = feed()
        try await withServices([feed]) {
            let upstream = try client(try await feed.url(for: .stocks))
            upstream.setWantedTopics(topics("t.AAPL", "c.AAPL", "x.AAPL", "q.MSFT"))
            try await withServices([upstream]) {
                try await waitFor(upstream.stateUpdates(), "authenticated") { $0 == .authenticated }
                let seen = try await waitFor(feed.monitor.updates(), "the subscribe at the feed") { !$0.topics(.subscribe).isEmpty }
                // Corrections and cancel errors come with trades: asked for by trades alone.
                #expect(Set(seen.topics(.subscribe)) == ["t.AAPL", "c.AAPL", "x.AAPL", "q.MSFT"])
                let events = try await collect(50, from: upstream.messages)
                #expect(Set(events.map(\.topic.description)).isSubset(of: ["t.AAPL", "q.MSFT"]))
                // Each event is its own MessagePack map, as the feed sent it, `t` a timestamp.
                let first = try #require(events.first)
                let decoded = try MessagePack.decode(first.bytes.readableBytesView)
                #expect(decoded["S"]?.string == first.ticker && decoded["T"]?.string == first.eventType)
                guard case .timestamp? = decoded["t"] else {
                    Issue.record("t is not a timestamp: \(decoded)")
                    return
                }
            }
        }
    }

    @Test func aWrongKeyIsAuthFailedAndRetriedRarely() async throws {
        let feed = feed()
        try await withServices([feed]) {
            let upstream = try client(try await feed.url(for: .crypto), key: "wrong")
            upstream.setWantedTopics(topics("t.BTC/USD"))
            try await withServices([upstream]) {
                let state = try await waitFor(upstream.stateUpdates(), "auth failed") {
                    if case .authFailed = $0 { true } else { false }
                }
                #expect("\(state)".contains("402"))
                // Backed off as for Polygon's auth_failed: no second attempt within a second.
                try await Task.sleep(for: .seconds(1))
                #expect(feed.monitor.snapshot.totalConnections == 1, "a hot loop would have connected again")
            }
        }
    }
}
