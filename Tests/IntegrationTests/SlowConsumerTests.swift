import DemoFeed
import Foundation
import MarketDataHub
import PolygonWire
import RelayComposition
import RelayConfiguration
import RelayServer
import Testing
import Upstream

/// A stalled client beside a fast one, for both slow-consumer policies. Serialized: it pushes a high
/// event rate through the relay.
@Suite("Slow consumers", .serialized)
struct SlowConsumerTests {
    func withBusyRelay(
        policy: SlowConsumerPolicy, keys: [ClientKey] = [], buffer: Int? = nil, _ body: (Relay.Components, String) async throws -> Void
    ) async throws {
        let feed = DemoFeed(
            configuration: DemoFeedConfiguration(
                port: 0, eventsPerSecond: 20_000, tickInterval: .milliseconds(10), generatedTickers: 0, seed: 21),
            logger: testLogger)
        try await withServices([feed]) {
            var settings = RelaySettings(
                listen: .init(host: "127.0.0.1", port: 0), upstream: UpstreamConfiguration.Endpoint(try await feed.url()),
                upstreamKey: "k", slowConsumerPolicy: policy)
            // 20,000 events/s through an unoptimised build in the test's own process, late in the suite: the
            // history's per-event work (cheap in release: +3.4% in fanbench) made the fast client fall
            // behind too in full runs. What is tested here is the stalled client's bound, not the history.
            settings.history = nil
            if let buffer { settings.subscriberBuffer = buffer }
            if !keys.isEmpty {
                settings.clientKeys = ["client-key"]
                settings.clientKeyRights = keys
            }
            let relay = Relay(settings: settings, logger: testLogger)
            try await withServices([relay]) {
                let parts = try await within(.seconds(10), "the relay to start") { try await relay.ready() }
                try await body(parts, "ws://127.0.0.1:\(parts.port)/stocks")
            }
        }
    }

    @Test func aStalledClientLosesItsOwnEventsIsToldHowManyAndTheFastOneLosesNothing() async throws {
        try await withBusyRelay(policy: .drop) { parts, url in
            let fast = try await subscribedClient(url, "Q.*,T.*")
            let stalled = try await subscribedClient(url, "Q.*,T.*")
            stalled.pause()
            try await eventually("the stalled client's buffer to overflow", timeout: .seconds(30)) {
                await parts.hub.bufferStatistics.lagging == 1
            }
            // The fast client was never told it lagged, and still receives.
            var fastEvents = 0
            while fastEvents < 2000 {
                let parsed = try await fast.nextParsed()
                #expect(!parsed.statuses.contains { $0.status == StatusMessage.Kind.lagging })
                fastEvents += parsed.events.count
            }
            stalled.resume()
            let notice = try await stalled.waitForStatus(StatusMessage.Kind.lagging, timeout: .seconds(30))
            #expect(((notice.fields["dropped"] as? NSNumber)?.intValue ?? 0) > 0)
            // Its connection survives and events follow the notice.
            #expect(try await stalled.nextEvents(5).count >= 5)
            await fast.close()
            await stalled.close()
        }
    }

    @Test func theDisconnectPolicyClosesAStalledClientWith1013() async throws {
        try await withBusyRelay(policy: .disconnect) { parts, url in
            let fast = try await subscribedClient(url, "Q.*")
            let stalled = try await subscribedClient(url, "Q.*,T.*")
            stalled.pause()
            try await eventually("the stalled client to be dropped", timeout: .seconds(30)) {
                await parts.hub.subscriberCount == 1
            }
            stalled.resume()
            let notice = try await stalled.waitForStatus(StatusMessage.Kind.lagging, timeout: .seconds(30))
            #expect((notice.fields["message"] as? String)?.contains("disconnected") == true)
            #expect(try await stalled.waitForClose(timeout: .seconds(30)) == 1013)
            #expect(try await fast.nextEvents(100).count >= 100)
            await fast.close()
        }
    }

    @Test func aKeysOwnBufferHoldsItsClientsEventsAndItsEvictionSaysHowMany() async throws {
        var firehose = try ClientKey(name: "firehose", secret: "firehose-key")
        firehose.buffer = 5000
        try await withBusyRelay(policy: .disconnect, keys: [firehose], buffer: 2000) { parts, url in
            #expect(parts.hub.bufferLimit == 2000, "the relay's setting is the market's")
            let usual = try await subscribedClient(url, "Q.*,T.*")
            let large = try await WSTestClient.authenticated(url: url, key: "firehose-key")
            large.send(ClientAction(.subscribe, params: "Q.*,T.*"))
            _ = try await large.nextEvents(3)
            usual.pause()
            large.pause()
            // Both stall, and each is dropped at its own bound (the messages below say which): the usual
            // client at the relay's 2,000 events, the firehose key's at 5,000.
            try await eventually("both stalled clients to be dropped", timeout: .seconds(30)) {
                await parts.hub.subscriberCount == 0
            }
            usual.resume()
            large.resume()
            let told = try await usual.waitForStatus(StatusMessage.Kind.lagging, timeout: .seconds(30))
            #expect((told.fields["message"] as? String)?.contains("buffer of 2000 events") == true)
            let toldLarge = try await large.waitForStatus(StatusMessage.Kind.lagging, timeout: .seconds(30))
            #expect((toldLarge.fields["message"] as? String)?.contains("buffer of 5000 events") == true)
            #expect(try await large.waitForClose(timeout: .seconds(30)) == 1013)
        }
    }
}
