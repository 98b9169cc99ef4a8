import DemoFeed
import Foundation
import MarketDataHub
import PolygonWire
import RelayComposition
import RelayConfiguration
import RelayServer
import ServiceLifecycle
import Testing
import Upstream

/// Runs demo feed ← relay (libwebsockets upstream) for the duration of `body`.
func withRelay(
    clientKeys: [String] = ["client-key"],
    feedRate: Double = 4000,
    _ body: (Relay.Components, DemoFeed, String) async throws -> Void
) async throws {
    let feed = DemoFeed(
        configuration: DemoFeedConfiguration(
            port: 0, apiKey: "upstream-secret", eventsPerSecond: feedRate, tickInterval: .milliseconds(10), seed: 42),
        logger: testLogger)
    try await withServices([feed]) {
        let feedURL = try await feed.url()
        let settings = RelaySettings(
            listen: .init(host: "127.0.0.1", port: 0),
            upstream: UpstreamConfiguration.Endpoint(feedURL),
            upstreamKey: "upstream-secret",
            clientKeys: clientKeys)
        let relay = Relay(settings: settings, logger: testLogger)
        try await withServices([relay]) {
            let parts = try await within(.seconds(10), "the relay to start") { try await relay.ready() }
            try await waitFor(try parts.upstreamClient.stateUpdates(), "the upstream to authenticate") { $0 == .authenticated }
            try await body(parts, feed, "ws://127.0.0.1:\(parts.port)/stocks")
        }
    }
}

@Suite("End to end: demo feed ← relay → WebSocket clients")
struct EndToEndTests {
    @Test func handshakeFramesComeInPolygonsOrderEachAlone() async throws {
        try await withRelay { _, _, url in
            let client = WSTestClient(url: url)
            let connected = try await client.nextFrame()
            #expect(connected == #"[{"ev":"status","status":"connected","message":"Connected Successfully"}]"#)
            client.send(#"{"action":"auth","params":"client-key"}"#)
            let authReply = try await client.nextFrame()
            #expect(authReply == #"[{"ev":"status","status":"auth_success","message":"authenticated"}]"#)
            await client.close()
        }
    }

    @Test func aWrongClientKeyIsRefusedWithAuthFailedAndClosed() async throws {
        try await withRelay { _, _, url in
            let client = WSTestClient(url: url)
            _ = try await client.nextFrame()
            // The upstream key is not a client key.
            client.send(ClientAction(.auth, params: "upstream-secret"))
            #expect(try await client.nextParsed().statuses == [.authFailed])
            #expect(try await client.waitForClose() == 1008)
        }
    }

    @Test func onlySubscribedEventsAreDeliveredAndTheUpstreamKeyNeverIs() async throws {
        try await withRelay { _, _, url in
            let client = try await WSTestClient.authenticated(url: url)
            client.send(ClientAction(.subscribe, params: "Q.AAPL, T.MSFT"))
            var frames: [String] = []
            var events: [MarketEvent] = []
            while events.count < 40 {
                let frame = try await client.nextFrame()
                frames.append(frame)
                events += try FrameParser.parse(frame).events
            }
            #expect(Set(events.map(\.topic.description)).isSubset(of: ["Q.AAPL", "T.MSFT"]))
            #expect(Set(events.map(\.topic.description)).contains("Q.AAPL"))
            #expect(frames.allSatisfy { !$0.contains("upstream-secret") })
            await client.close()
        }
    }

    @Test func goStylePipelinedAuthAndSubscribeIsAccepted() async throws {
        try await withRelay { _, _, url in
            let client = WSTestClient(url: url)
            // Like client-go: auth and subscriptions at once, without waiting for `connected`.
            client.send(ClientAction(.auth, params: "client-key"))
            client.send(ClientAction(.subscribe, params: "Q.NVDA"))
            #expect(try await client.nextParsed().statuses == [.connected])
            #expect(try await client.nextParsed().statuses == [.authSuccess])
            #expect(try await client.nextParsed().statuses == [StatusMessage(status: "success", message: "subscribed to: Q.NVDA")])
            let events = try await client.nextEvents(5)
            #expect(events.allSatisfy { $0.topic.description == "Q.NVDA" })
            await client.close()
        }
    }

    @Test func manyClientsShareOneUpstreamConnection() async throws {
        try await withRelay { parts, feed, url in
            var clients: [WSTestClient] = []
            for ticker in ["AAPL", "MSFT", "NVDA", "AMZN", "TSLA", "AAPL"] {
                let client = try await WSTestClient.authenticated(url: url)
                client.send(ClientAction(.subscribe, params: "Q.\(ticker)"))
                clients.append(client)
            }
            for client in clients {
                #expect(try await client.nextEvents(3).count >= 3)
            }
            let snapshot = feed.monitor.snapshot
            #expect(snapshot.totalConnections == 1)
            #expect(snapshot.openConnections == 1)
            #expect(await parts.hub.subscriberCount == 6)
            for client in clients { await client.close() }
        }
    }

    @Test func upstreamSubscriptionsFollowTheFirstAndLastSubscriber() async throws {
        try await withRelay { parts, feed, url in
            let first = try await WSTestClient.authenticated(url: url)
            let second = try await WSTestClient.authenticated(url: url)
            first.send(ClientAction(.subscribe, params: "Q.MSFT"))
            try await waitFor(feed.monitor.updates(), "subscribe Q.MSFT at the feed") { $0.topics(.subscribe).contains("Q.MSFT") }
            second.send(ClientAction(.subscribe, params: "Q.MSFT"))
            _ = try await second.nextParsed()  // its ack

            // The first subscriber leaves: the topic stays wanted for the second.
            await first.close()
            try await eventually("the hub to drop the first client") { await parts.hub.subscriberCount == 1 }
            #expect(!feed.monitor.snapshot.topics(.unsubscribe).contains("Q.MSFT"))
            #expect(try parts.upstreamClient.subscribedTopics == topics("Q.MSFT"))

            // The last one unsubscribes: the relay unsubscribes upstream.
            second.send(ClientAction(.unsubscribe, params: "Q.MSFT"))
            try await waitFor(feed.monitor.updates(), "unsubscribe Q.MSFT at the feed") { $0.topics(.unsubscribe).contains("Q.MSFT") }
            #expect(feed.monitor.snapshot.topics(.subscribe).filter { $0 == "Q.MSFT" }.count == 1)
            await second.close()
        }
    }

    @Test func disconnectingTheLastSubscriberUnsubscribesUpstream() async throws {
        try await withRelay { _, feed, url in
            let client = try await WSTestClient.authenticated(url: url)
            client.send(ClientAction(.subscribe, params: "T.AMD"))
            try await waitFor(feed.monitor.updates(), "subscribe T.AMD") { $0.topics(.subscribe).contains("T.AMD") }
            await client.close()
            try await waitFor(feed.monitor.updates(), "unsubscribe T.AMD") { $0.topics(.unsubscribe).contains("T.AMD") }
        }
    }

    @Test func malformedClientMessagesGetAnErrorAndTheConnectionLives() async throws {
        try await withRelay { _, _, url in
            let client = try await WSTestClient.authenticated(url: url)
            client.send("{this is not json")
            let error = try await client.nextParsed().statuses
            #expect(error.first?.status == "error")
            #expect(error.first?.message.contains("malformed") == true)
            client.send(#"{"action":"subscribe","params":"Q.AAPL,nodot"}"#)
            let acks = try await client.nextParsed().statuses
            #expect(acks.map(\.status) == ["success", "error"])
            #expect(try await client.nextEvents(2).allSatisfy { $0.topic.description == "Q.AAPL" })
            await client.close()
        }
    }

    @Test func healthAndLastEventOverHTTP() async throws {
        try await withRelay { parts, _, url in
            let base = "http://127.0.0.1:\(parts.port)"
            let health = try await httpGet("\(base)/healthz")
            #expect(health.status == 200)
            #expect(health.body.contains(#""state":"authenticated""#))
            #expect(!health.body.contains("upstream-secret"))

            let client = try await WSTestClient.authenticated(url: url)
            client.send(ClientAction(.subscribe, params: "Q.AAPL"))
            _ = try await client.nextEvents(1)
            let last = try await httpGet("\(base)/v1/last/Q.AAPL?apiKey=client-key")
            #expect(last.status == 200)
            let event = try #require(try FrameParser.parse(last.body).events.first)
            #expect(event.topic.description == "Q.AAPL")

            #expect(try await httpGet("\(base)/v1/last/Q.NOSUCH?apiKey=client-key").status == 404)
            #expect(try await httpGet("\(base)/v1/last/nodot?apiKey=client-key").status == 400)
            await client.close()
        }
    }

    @Test func healthIs503AndClientsAreStillServedWhileTheUpstreamIsDown() async throws {
        let settings = RelaySettings(
            listen: .init(host: "127.0.0.1", port: 0), upstream: UpstreamConfiguration.Endpoint("ws://127.0.0.1:1/stocks"),
            upstreamKey: "k", clientKeys: ["client-key"])
        let relay = Relay(settings: settings, logger: testLogger)
        try await withServices([relay]) {
            let parts = try await within(.seconds(10), "the relay to start") { try await relay.ready() }
            let health = try await httpGet("http://127.0.0.1:\(parts.port)/healthz")
            #expect(health.status == 503)
            #expect(health.body.contains(#""status":"degraded""#))
            let client = try await WSTestClient.authenticated(url: "ws://127.0.0.1:\(parts.port)/stocks")
            client.send(ClientAction(.subscribe, params: "Q.AAPL"))
            #expect(try await client.nextParsed().statuses.first?.status == "success")
            #expect(try parts.upstreamClient.subscribedTopics.isEmpty)
            await client.close()
        }
    }

    @Test func theRelayRefusesToListenBeyondLoopbackWithoutClientKeys() async throws {
        let relay = Relay(settings: RelaySettings(listen: .init(host: "0.0.0.0", port: 0)), logger: testLogger)
        await #expect(throws: ClientAuthentication.RefusedError.self) { try await relay.run() }
    }

    @Test func withNoUpstreamTheRelayServesTheBuiltInDemoFeedThroughLibwebsockets() async throws {
        let relay = Relay(settings: RelaySettings(listen: .init(host: "127.0.0.1", port: 0)), logger: testLogger)
        try await withServices([relay]) {
            let parts = try await within(.seconds(10), "the relay to start") { try await relay.ready() }
            #expect(parts.demoFeed != nil)
            #expect(try parts.upstreamClient.configuration.endpoint.host == "127.0.0.1")
            // Loopback without client keys: any key is accepted.
            let client = try await WSTestClient.authenticated(url: "ws://127.0.0.1:\(parts.port)/stocks", key: "anything")
            client.send(ClientAction(.subscribe, params: "Q.AAPL"))
            #expect(try await client.nextEvents(2).allSatisfy { $0.topic.description == "Q.AAPL" })
            // One upstream connection per market, each at its path (the others may still be connecting).
            let feed = try #require(parts.demoFeed)
            try await eventually("every market's upstream to connect to the demo feed") {
                feed.monitor.snapshot.totalConnections == Market.trading.count
            }
            #expect(feed.monitor.snapshot.totalConnections == Market.trading.count)
            await client.close()
        }
    }

    @Test func gracefulShutdownClosesClientsWith1012ThenTheUpstreamCleanly() async throws {
        let feed = DemoFeed(configuration: DemoFeedConfiguration(port: 0, eventsPerSecond: 1000, seed: 9), logger: testLogger)
        try await withServices([feed]) {
            let settings = RelaySettings(
                listen: .init(host: "127.0.0.1", port: 0), upstream: UpstreamConfiguration.Endpoint(try await feed.url()),
                upstreamKey: "k")
            let relay = Relay(settings: settings, logger: testLogger)
            let group = ServiceGroup(configuration: .init(services: [.init(service: relay)], logger: testLogger))
            let running = Task { try await group.run() }
            let parts = try await within(.seconds(10), "the relay to start") { try await relay.ready() }
            let client = try await WSTestClient.authenticated(url: "ws://127.0.0.1:\(parts.port)/stocks", key: "any")
            client.send(ClientAction(.subscribe, params: "Q.AAPL"))
            _ = try await client.nextEvents(1)

            await group.triggerGracefulShutdown()
            // 1012 "service restart": official clients reconnect; 1000/1001 would stop them for good.
            #expect(try await client.waitForClose() == 1012)
            try await stopped(running, within: .seconds(10), "the relay to stop")
            #expect(try parts.upstreamClient.state == .stopped)
            try await waitFor(feed.monitor.updates(), "the upstream connection to close") { $0.openConnections == 0 }
        }
    }
}
