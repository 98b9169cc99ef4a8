import DemoFeed
import Foundation
import PolygonWire
import RelayComposition
import RelayConfiguration
import Testing
import Upstream

/// Timing short enough for tests: quick retries, a one-second ping, dead after four (enough margin
/// that a loaded machine does not fake a dead upstream).
func fastUpstreamTuning(maxConnectionsDelay: Duration = .milliseconds(1500), handshakeTimeout: Duration = .seconds(3))
    -> UpstreamConfiguration
{
    var tuning = RelaySettings.defaultUpstreamTuning
    tuning.reconnect = ReconnectPolicy(
        initialDelay: .milliseconds(50), maxDelay: .milliseconds(300), healthyAfter: .seconds(30),
        authFailedDelay: .seconds(120), maxConnectionsDelay: maxConnectionsDelay)
    tuning.pingInterval = .seconds(1)
    tuning.deadAfter = .seconds(4)
    tuning.handshakeTimeout = handshakeTimeout
    return tuning
}

/// Demo feed ← relay, with fault-friendly timing, for the duration of `body`.
func withFaultyFeedRelay(
    feed feedConfiguration: DemoFeedConfiguration = DemoFeedConfiguration(port: 0, apiKey: "upstream-secret"),
    upstreamKey: String = "upstream-secret",
    tuning: UpstreamConfiguration = fastUpstreamTuning(),
    waitForAuthentication: Bool = true,
    restFromFeed: Bool = false,
    configure: (inout RelaySettings) -> Void = { _ in },
    _ body: (Relay.Components, DemoFeed, String) async throws -> Void
) async throws {
    var configuration = feedConfiguration
    configuration.eventsPerSecond = 800
    configuration.tickInterval = .milliseconds(10)
    configuration.seed = 11
    let feed = DemoFeed(configuration: configuration, logger: testLogger)
    try await withServices([feed]) {
        var settings = RelaySettings(
            listen: .init(host: "127.0.0.1", port: 0), upstream: UpstreamConfiguration.Endpoint(try await feed.url()),
            upstreamKey: upstreamKey, clientKeys: ["client-key"], upstreamTuning: tuning)
        // The feed's REST history: the gap fill's source (without it a loopback upstream has none).
        if restFromFeed { settings.upstreamRESTURL = "http://127.0.0.1:\(try await feed.listeningPort())" }
        configure(&settings)
        let relay = Relay(settings: settings, logger: testLogger)
        try await withServices([relay]) {
            let parts = try await within(.seconds(10), "the relay to start") { try await relay.ready() }
            if waitForAuthentication {
                try await waitFor(try parts.upstreamClient.stateUpdates(), "the upstream to authenticate") { $0 == .authenticated }
            }
            try await body(parts, feed, "ws://127.0.0.1:\(parts.port)/stocks")
        }
    }
}

/// A client subscribed to `params` that has already received events.
func subscribedClient(_ url: String, _ params: String) async throws -> WSTestClient {
    let client = try await WSTestClient.authenticated(url: url)
    client.send(ClientAction(.subscribe, params: params))
    _ = try await client.nextEvents(3)
    return client
}

/// Checks the notices around an outage: the loss, then the reconnect naming the gap, then events again.
func expectOutageNotices(_ client: WSTestClient, topics expected: Set<String>) async throws {
    let lost = try await client.waitForStatus(StatusMessage.Kind.upstreamDisconnected)
    #expect(lost.fields["lost_at_ms"] is NSNumber)
    let back = try await client.waitForStatus(StatusMessage.Kind.upstreamReconnected)
    let before = try #require((back.fields["last_event_before_ms"] as? NSNumber)?.int64Value)
    let after = try #require((back.fields["first_event_after_ms"] as? NSNumber)?.int64Value)
    let gap = try #require((back.fields["gap_ms"] as? NSNumber)?.int64Value)
    #expect(after >= before)
    #expect(gap == after - before)
    #expect((back.fields["message"] as? String)?.contains("\(before)") == true)
    let events = try await client.nextEvents(3)
    #expect(Set(events.map(\.topic.description)).isSubset(of: expected))
}

/// Serialized: these tests are about timing under faults (pings, dead detection, backoff), which a
/// 2-core machine running ten relays at once would distort.
@Suite("Resilience: upstream faults over real sockets", .serialized)
struct ResilienceTests {
    @Test func anAbruptTCPDropKeepsClientsAndResumesWithAGapNotice() async throws {
        try await withFaultyFeedRelay { parts, feed, url in
            let quotes = try await subscribedClient(url, "Q.AAPL")
            let wildcard = try await subscribedClient(url, "T.*")
            let before = feed.monitor.snapshot.totalConnections
            let reconnectsBefore = try parts.upstreamClient.statistics.reconnectsByCause.values.reduce(0, +)
            #expect(feed.inject(.drop) == 1)
            try await expectOutageNotices(quotes, topics: ["Q.AAPL"])
            let trades = try await wildcard.waitForStatus(StatusMessage.Kind.upstreamReconnected)
            _ = trades
            #expect(try await wildcard.nextEvents(2).allSatisfy { $0.eventType == "T" })

            // One reconnect, which resubscribed everything in one message.
            let snapshot = feed.monitor.snapshot
            #expect(snapshot.totalConnections == before + 1)
            let latest = snapshot.actions.filter { $0.connection == snapshot.actions.map(\.connection).max() }
            #expect(latest.map(\.kind) == [.auth, .subscribe])
            #expect(Set(Topic.parseList(latest.last?.params ?? "").topics.map(\.description)) == ["Q.AAPL", "T.*"])
            #expect(
                try parts.upstreamClient.statistics.reconnectsByCause.values.reduce(0, +) == reconnectsBefore + 1,
                "\(String(describing: parts.upstream?.statistics.reconnectsByCause))")
            #expect(await parts.hub.subscriberCount == 2)
            await quotes.close()
            await wildcard.close()
        }
    }

    @Test func maxConnectionsBacksOffLongThenRecovers() async throws {
        try await withFaultyFeedRelay(tuning: fastUpstreamTuning(maxConnectionsDelay: .milliseconds(1500))) { parts, feed, url in
            let client = try await subscribedClient(url, "Q.MSFT")
            feed.inject(.maxConnections)
            let rejected = try await waitFor(try parts.upstreamClient.stateUpdates(), "max_connections") { $0.name == "max_connections" }
            #expect(rejected.detail?.contains("another connection holds") == true)
            let health = try await httpGet("http://127.0.0.1:\(parts.port)/healthz")
            #expect(health.status == 503)
            #expect(health.body.contains(#""state":"max_connections""#))
            try await expectOutageNotices(client, topics: ["Q.MSFT"])
            // Exactly one retry: the long max_connections delay, not the quick backoff.
            #expect(try parts.upstreamClient.statistics.connectAttempts == 2)
            #expect(try parts.upstreamClient.statistics.reconnectsByCause == ["max_connections": 1])
            await client.close()
        }
    }

    @Test func aWrongUpstreamKeyIsReportedAndRetriedRarely() async throws {
        try await withFaultyFeedRelay(upstreamKey: "wrong", waitForAuthentication: false) { parts, feed, url in
            try await waitFor(try parts.upstreamClient.stateUpdates(), "auth_failed") { $0.name == "auth_failed" }
            let health = try await httpGet("http://127.0.0.1:\(parts.port)/healthz")
            #expect(health.status == 503)
            #expect(health.body.contains(#""state":"auth_failed""#))
            #expect(health.body.contains("rejected the API key"))
            // Clients are still served locally while the upstream refuses us.
            let client = try await WSTestClient.authenticated(url: url)
            client.send(ClientAction(.subscribe, params: "Q.AAPL"))
            #expect(try await client.nextParsed().statuses.first?.status == "success")
            // A measurement window: with a rejected key there is no second attempt in it.
            try await Task.sleep(for: .seconds(2))
            #expect(try parts.upstreamClient.statistics.connectAttempts == 1)
            #expect(feed.monitor.snapshot.totalConnections == 1)
            await client.close()
        }
    }

    @Test func aSilentUpstreamIsDetectedAsDeadAndReplaced() async throws {
        try await withFaultyFeedRelay { parts, feed, url in
            let client = try await subscribedClient(url, "Q.NVDA")
            feed.inject(.silence)
            try await expectOutageNotices(client, topics: ["Q.NVDA"])
            #expect(try parts.upstreamClient.statistics.reconnectsByCause["dead"] == 1)
            #expect(feed.monitor.snapshot.totalConnections == 2)
            await client.close()
        }
    }

    @Test func malformedAndOversizedUpstreamFramesAreCountedNotFatal() async throws {
        try await withFaultyFeedRelay { parts, feed, url in
            let client = try await subscribedClient(url, "Q.AAPL")
            feed.inject(.malformed)
            feed.inject(.oversized)
            let upstream = try parts.upstreamClient
            try await eventually("both bad frames to be counted") {
                let statistics = upstream.statistics
                return statistics.malformedMessages == 1 && statistics.oversizedMessages == 1
            }
            // Same connection, events still flowing.
            #expect(try await client.nextEvents(5).allSatisfy { $0.topic.description == "Q.AAPL" })
            #expect(feed.monitor.snapshot.totalConnections == 1)
            #expect(try parts.upstreamClient.state == .authenticated)
            let health = try await httpGet("http://127.0.0.1:\(parts.port)/healthz")
            #expect(health.body.contains(#""malformedMessages":1"#))
            #expect(health.body.contains(#""oversizedMessages":1"#))
            await client.close()
        }
    }

    @Test func upstreamEventsOfNoTypeOfTheMarketTooLongATickerTooLargeOrOfTheRelaysOwnTopicsAreDroppedAndCounted() async throws {
        try await withFaultyFeedRelay { parts, feed, url in
            let client = try await subscribedClient(url, "Q.AAPL")
            client.send(ClientAction(.subscribe, params: "Q.BIG,Q.JUNKOK"))
            try await eventually("the subscription to reach the feed") { feed.monitor.snapshot.topics(.subscribe).contains("Q.JUNKOK") }
            feed.inject(.junk)
            let upstream = try parts.upstreamClient
            try await eventually("the five bad events to be counted") { upstream.statistics.refusedEvents == 5 }
            // The frame's order is kept: had the 100 KB quote of BIG been taken, it would come first.
            let first = try await client.nextEvents(200).first { $0.ticker == "BIG" || $0.ticker == "JUNKOK" }
            #expect(first?.ticker == "JUNKOK", "the good event of the frame went through, the large one did not")
            #expect(upstream.statistics.malformedMessages == 0, "a message with bad events is not malformed")
            let metrics = try await httpGet("http://127.0.0.1:\(parts.port)/metrics", key: "client-key").body
            let line = metrics.split(separator: "\n").first { $0.hasPrefix("relay_upstream_refused_events_total") }
            #expect(line?.hasSuffix(" 5") == true, "\(line ?? "no relay_upstream_refused_events_total")")
            await client.close()
        }
    }

    @Test func fragmentedUpstreamFramesReachClientsWhole() async throws {
        try await withFaultyFeedRelay(feed: DemoFeedConfiguration(port: 0, apiKey: "upstream-secret", fragmentSize: 9)) { parts, _, url in
            let client = try await subscribedClient(url, "Q.*")
            #expect(try await client.nextEvents(20).allSatisfy { $0.eventType == "Q" })
            #expect(try parts.upstreamClient.statistics.malformedMessages == 0)
            await client.close()
        }
    }

    @Test func aSlowHandshakeWithinTheTimeoutSucceeds() async throws {
        try await withFaultyFeedRelay(
            feed: DemoFeedConfiguration(port: 0, apiKey: "upstream-secret", handshakeDelay: .milliseconds(1200)),
            waitForAuthentication: false
        ) { parts, feed, url in
            // A client arriving before the upstream is ready is served; its topics take effect later.
            let client = try await WSTestClient.authenticated(url: url)
            client.send(ClientAction(.subscribe, params: "T.AMZN"))
            _ = try await client.nextParsed()
            try await waitFor(try parts.upstreamClient.stateUpdates(), "authenticated") { $0 == .authenticated }
            #expect(try await client.nextEvents(2).allSatisfy { $0.topic.description == "T.AMZN" })
            #expect(feed.monitor.snapshot.totalConnections == 1, "\(String(describing: parts.upstream?.statistics.reconnectsByCause))")
            await client.close()
        }
    }

    @Test func aHandshakeThatNeverCompletesIsAbandonedAndRetried() async throws {
        try await withFaultyFeedRelay(
            feed: DemoFeedConfiguration(port: 0, apiKey: "upstream-secret", handshakeDelay: .seconds(30)),
            tuning: fastUpstreamTuning(handshakeTimeout: .seconds(1)),
            waitForAuthentication: false
        ) { parts, feed, _ in
            let upstream = try parts.upstreamClient
            try await eventually("a handshake timeout", timeout: .seconds(10)) {
                upstream.statistics.reconnectsByCause["handshake_timeout"] ?? 0 >= 1
            }
            #expect(try parts.upstreamClient.state != .authenticated)
            try await eventually("the retry to reach the feed") { feed.monitor.snapshot.totalConnections >= 2 }
        }
    }

    @Test func clientsJoiningDuringAnOutageAreSubscribedWhenTheUpstreamReturns() async throws {
        try await withFaultyFeedRelay(tuning: fastUpstreamTuning(maxConnectionsDelay: .milliseconds(1500))) { parts, feed, url in
            feed.inject(.maxConnections)
            try await waitFor(try parts.upstreamClient.stateUpdates(), "max_connections") { $0.name == "max_connections" }
            let late = try await WSTestClient.authenticated(url: url)
            late.send(ClientAction(.subscribe, params: "Q.META"))
            #expect(try await late.nextParsed().statuses.first?.status == "success")
            try await waitFor(try parts.upstreamClient.stateUpdates(), "recovery") { $0 == .authenticated }
            #expect(try await late.nextEvents(2).allSatisfy { $0.topic.description == "Q.META" })
            #expect(feed.monitor.snapshot.topics(.subscribe).contains("Q.META"))
            await late.close()
        }
    }

    @Test func metricsAreServedInPrometheusText() async throws {
        try await withFaultyFeedRelay { parts, feed, url in
            let client = try await subscribedClient(url, "Q.AAPL")
            feed.inject(.drop)
            _ = try await client.waitForStatus(StatusMessage.Kind.upstreamReconnected)
            let metrics = try await httpGet("http://127.0.0.1:\(parts.port)/metrics?apiKey=client-key")
            #expect(metrics.status == 200)
            let lines = metrics.body.split(separator: "\n").map(String.init)
            func value(_ prefix: String) -> Double? {
                lines.first { $0.hasPrefix(prefix + " ") }.flatMap { Double($0.split(separator: " ").last ?? "") }
            }
            // Every upstream and hub metric carries its market.
            #expect(value(#"relay_upstream_state{market="stocks",state="authenticated"}"#) == 1)
            #expect(value(#"relay_upstream_state{market="stocks",state="disconnected"}"#) == 0)
            #expect(lines.contains { $0.hasPrefix(#"relay_upstream_reconnects_total{market="stocks",cause="#) && $0.hasSuffix(" 1") })
            #expect(value(#"relay_subscribers{market="stocks"}"#) == 1)
            #expect(value("relay_downstream_connections") == 1)
            #expect((value(#"relay_upstream_events_total{market="stocks"}"#) ?? 0) > 0)
            #expect((value(#"relay_events_delivered_total{market="stocks"}"#) ?? 0) >= 3)
            #expect((value(#"relay_downstream_writes_total{market="stocks"}"#) ?? 0) >= 1)
            #expect(lines.contains { $0.hasPrefix(#"relay_delivery_latency_seconds_count{market="stocks"}"#) })
            #expect(value(#"relay_upstream_last_message_age_seconds{market="stocks"}"#) != nil)
            await client.close()
        }
    }
}

@Suite("Resilience: a silent upstream", .serialized)
struct SilentUpstreamTests {
    /// The feed keeps the connection and answers pings but sends nothing more: the relay notices within
    /// the silence setting, drops the connection once, and its client streams again from the new one.
    @Test func aConnectedButSilentUpstreamIsReconnectedOnce() async throws {
        var tuning = fastUpstreamTuning()
        tuning.silentAfter = .seconds(2)
        var feedConfiguration = DemoFeedConfiguration(port: 0, apiKey: "upstream-secret")
        feedConfiguration.markets = [.stocks, .crypto]
        try await withFaultyFeedRelay(feed: feedConfiguration, tuning: tuning, configure: { settings in
            // Crypto trades around the clock, so the test does not depend on the hour.
            if var endpoint = settings.upstream {
                endpoint.path = "/crypto"
                settings.upstream = endpoint
            }
        }) { parts, feed, url in
            let client = try await subscribedClient(url.replacingOccurrences(of: "/stocks", with: "/crypto"), "XT.X:BTC-USD")
            #expect(feed.inject(.mute) == 1)
            try await eventually("the relay to reconnect the silent upstream", timeout: .seconds(20)) {
                feed.monitor.snapshot.totalConnections >= 2
            }
            _ = try await client.nextEvents(3, timeout: .seconds(10))
            let upstream = try parts.upstreamClient
            #expect(upstream.statistics.reconnectsByCause.values.reduce(0, +) >= 1)
            await client.close()
        }
    }
}
