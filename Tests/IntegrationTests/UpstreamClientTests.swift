import Cluster
import DemoFeed
import Foundation
import MarketDataHub
import PolygonWire
import RelayBench
import Testing
import Synchronization
import Upstream

/// The libwebsockets client against a real Polygon-style server (the demo feed) on loopback.
@Suite("Upstream client")
struct UpstreamClientTests {
    func feed(apiKey: String = "up-key", fragmentSize: Int? = nil) -> DemoFeed {
        DemoFeed(
            configuration: DemoFeedConfiguration(
                port: 0, apiKey: apiKey, eventsPerSecond: 4000, tickInterval: .milliseconds(10), seed: 7, fragmentSize: fragmentSize),
            logger: testLogger)
    }

    func client(_ url: String, key: String = "up-key", reconnect: ReconnectPolicy = ReconnectPolicy()) throws -> UpstreamClient {
        let endpoint = try #require(UpstreamConfiguration.Endpoint(url))
        return UpstreamClient(
            configuration: UpstreamConfiguration(endpoint: endpoint, apiKey: key, wire: .polygon, reconnect: reconnect), logger: testLogger)
    }

    @Test func authenticatesThenSubscribesTheWantedTopics() async throws {
        let feed = feed()
        try await withServices([feed]) {
            let upstream = try client(try await feed.url())
            upstream.setWantedTopics(topics("Q.AAPL", "T.MSFT"))
            try await withServices([upstream]) {
                try await waitFor(upstream.stateUpdates(), "authenticated") { $0 == .authenticated }
                let seen = try await waitFor(feed.monitor.updates(), "the subscribe at the feed") { !$0.topics(.subscribe).isEmpty }
                #expect(Set(seen.topics(.subscribe)) == ["Q.AAPL", "T.MSFT"])
                // The key went in the one auth action, and the topics in one subscribe message.
                #expect(seen.actions.map(\.kind) == [.auth, .subscribe])
                #expect(seen.actions.first?.params == "up-key")
                let events = try await collect(50, from: upstream.messages)
                #expect(Set(events.map(\.topic.description)).isSubset(of: ["Q.AAPL", "T.MSFT"]))
            }
        }
    }

    @Test func aConsumerThatFallsBehindLosesCountedEventsAndIsToldWhereNotMemory() async throws {
        let feed = feed()
        try await withServices([feed]) {
            let endpoint = try #require(UpstreamConfiguration.Endpoint(try await feed.url()))
            var configuration = UpstreamConfiguration(endpoint: endpoint, apiKey: "up-key", wire: .polygon)
            configuration.maxQueuedEvents = 200
            let upstream = UpstreamClient(configuration: configuration, logger: testLogger)
            upstream.setWantedTopics(topics("Q.*", "T.*"))
            try await withServices([upstream]) {
                // Nobody reads while the feed sends 4,000 events/s: the queue fills and then drops.
                try await eventually("events dropped for a full queue", timeout: .seconds(10)) { upstream.statistics.droppedEvents > 0 }
                let messages = upstream.messages
                let (queued, lost) = try await within(.seconds(10), "the loss notice") { () async -> (Int, Int?) in
                    var queued = 0
                    for await message in messages {
                        switch message {
                        case .events(let events): queued += events.count
                        case .lost(let count, _, _): return (queued, count)
                        default: break
                        }
                    }
                    return (queued, nil)
                }
                // Never more than the bound waited (a message that would pass it is dropped whole), and
                // the loss is told in order, before the first event after it.
                #expect(queued <= 200, "events that waited: \(queued)")
                #expect((lost ?? 0) > 0)
                #expect((lost ?? 0) <= upstream.statistics.droppedEvents)
            }
        }
    }

    @Test func wantedTopicChangesReachTheFeedAsSubscribeAndUnsubscribe() async throws {
        let feed = feed()
        try await withServices([feed]) {
            let upstream = try client(try await feed.url())
            upstream.setWantedTopics(topics("Q.AAPL"))
            try await withServices([upstream]) {
                try await waitFor(feed.monitor.updates(), "subscribe Q.AAPL") { $0.topics(.subscribe).contains("Q.AAPL") }
                upstream.setWantedTopics(topics("Q.NVDA"))
                let seen = try await waitFor(feed.monitor.updates(), "unsubscribe Q.AAPL") { $0.topics(.unsubscribe).contains("Q.AAPL") }
                #expect(seen.topics(.subscribe) == ["Q.AAPL", "Q.NVDA"])
                // Events of the old topic may still be buffered or in flight; then only NVDA follows.
                let messages = upstream.messages
                let onlyNVDA = try await within(.seconds(10), "20 consecutive Q.NVDA events") {
                    var run = 0
                    for await message in messages {
                        for event in message.events ?? [] {
                            let topic = event.topic.description
                            guard topic == "Q.NVDA" || topic == "Q.AAPL" else { return false }
                            run = topic == "Q.NVDA" ? run + 1 : 0
                        }
                        if run >= 20 { return true }
                    }
                    return false
                }
                #expect(onlyNVDA)
            }
        }
    }

    /// A server that greets and accepts the login again (1,000 times in one frame) gets no second login
    /// and no second subscription; the relay is not told of a new login either.
    @Test func aServerRepeatingItsGreetingAndLoginIsAnsweredOnce() async throws {
        let feed = feed()
        try await withServices([feed]) {
            let upstream = try client(try await feed.url())
            upstream.setWantedTopics(topics("Q.MSFT"))
            let messages = upstream.messages
            try await withServices([upstream]) {
                try await waitFor(feed.monitor.updates(), "subscribe Q.MSFT") { $0.topics(.subscribe).contains("Q.MSFT") }
                #expect(feed.inject(.relogin) == 1)
                // The client sends in order: whatever it answered the repetitions with reaches the feed
                // before this subscribe.
                upstream.setWantedTopics(topics("Q.MSFT", "Q.AAPL"))
                let seen = try await waitFor(feed.monitor.updates(), "subscribe Q.AAPL") { $0.topics(.subscribe).contains("Q.AAPL") }
                #expect(seen.actions.map(\.kind) == [.auth, .subscribe, .subscribe], "\(seen.actions)")
                #expect(seen.actions.last?.params == "Q.AAPL")
                #expect(upstream.state == .authenticated && upstream.statistics.connectAttempts == 1)
                // Events of Q.AAPL follow; before them the source said it was authenticated once.
                let logins = try await within(.seconds(10), "an event of Q.AAPL") {
                    var logins = 0
                    for await message in messages {
                        if case .authenticated = message { logins += 1 }
                        if message.events?.contains(where: { $0.topic.description == "Q.AAPL" }) == true { return logins }
                    }
                    return -1
                }
                #expect(logins == 1)
            }
        }
    }

    /// A server that accepts and refuses the login a thousand times over in one frame: the connection
    /// ends at the first refusal and nothing after it is taken (before, each acceptance after a refusal
    /// subscribed the whole wanted set again and told the relay of a new login).
    @Test func aFrameThatAcceptsAndRefusesTheLoginAgainAndAgainIsTakenToItsFirstRefusal() async throws {
        let feed = feed()
        try await withServices([feed]) {
            let upstream = try client(try await feed.url())
            upstream.setWantedTopics(topics("Q.MSFT"))
            let messages = upstream.messages
            try await withServices([upstream]) {
                let first = try await within(.seconds(10), "an event of Q.MSFT") {
                    for await message in messages where message.events?.contains(where: { $0.topic.description == "Q.MSFT" }) == true { return true }
                    return false
                }
                #expect(first)
                #expect(feed.inject(.authFlip) == 1)
                let logins = try await within(.seconds(10), "the connection to be lost") {
                    var logins = 0
                    for await message in messages {
                        if case .authenticated = message { logins += 1 }
                        if case .connectionLost = message { return logins }
                    }
                    return -1
                }
                #expect(logins == 0, "\(logins) logins taken after the first refusal")
            }
        }
    }

    /// An upstream that stops reading what it is sent: our messages wait for it up to
    /// `maxUnsentBytes`, then the connection is dropped and a new one subscribes the wanted set whole.
    /// While the upstream reads, the same changes never come near the bound.
    @Test func anUpstreamThatStopsReadingIsDroppedNotQueuedForWithoutEnd() async throws {
        let feed = feed()
        try await withServices([feed]) {
            let endpoint = try #require(UpstreamConfiguration.Endpoint(try await feed.url()))
            var configuration = UpstreamConfiguration(
                endpoint: endpoint, apiKey: "up-key", wire: .polygon, pingInterval: .seconds(60), deadAfter: .seconds(120))
            configuration.maxUnsentBytes = 256 << 10
            let upstream = UpstreamClient(configuration: configuration, logger: testLogger)
            // Two sets of 2,000 topics: each move between them is about 40 KB of messages.
            let sets = (0..<2).map { set in Set((0..<2_000).compactMap { Topic(eventType: "Q", ticker: "S\(set)X\($0)") }) }
            upstream.setWantedTopics(sets[0])
            try await withServices([upstream]) {
                try await waitFor(upstream.stateUpdates(), "authenticated") { $0 == .authenticated }
                func move(_ times: Int) async throws {
                    for turn in 0..<times {
                        upstream.setWantedTopics(sets[(turn + 1) % 2])
                        try await Task.sleep(for: .milliseconds(5))  // the pace of changes, not a wait for anything
                    }
                }
                try await move(50)
                #expect(upstream.statistics.lastError == nil, "a reading upstream: \(upstream.statistics.lastError ?? "")")
                #expect(upstream.statistics.connectAttempts == 1)
                let states = upstream.stateUpdates()
                #expect(feed.inject(.silence) == 1)
                // Past the kernel's socket buffers (a few MB on loopback), the messages wait in the client.
                var moves = 0
                while upstream.statistics.lastError == nil, moves < 2_000 {
                    try await move(10)
                    moves += 10
                }
                try await waitFor(states, "the connection dropped after \(moves) moves") { $0 != .authenticated }
                #expect(upstream.statistics.lastError?.contains("unread") == true, "\(upstream.statistics.lastError ?? "none")")
                // The feed serves the next connection: it logs in and subscribes the wanted set whole.
                try await waitFor(upstream.stateUpdates(), "authenticated again") { $0 == .authenticated }
                #expect(upstream.statistics.connectAttempts == 2)
            }
        }
    }

    @Test func fragmentedMessagesAreReassembled() async throws {
        let feed = feed(fragmentSize: 7)
        try await withServices([feed]) {
            let upstream = try client(try await feed.url())
            upstream.setWantedTopics(topics("Q.*", "T.*"))
            try await withServices([upstream]) {
                let events = try await collect(300, from: upstream.messages)
                #expect(events.allSatisfy { $0.eventType == "Q" || $0.eventType == "T" })
                #expect(upstream.statistics.malformedMessages == 0)
                #expect(feed.monitor.snapshot.framesSent > 1)
            }
        }
    }

    @Test func aRejectedKeyIsReportedAndNotRetriedAtOnce() async throws {
        let feed = feed(apiKey: "right")
        try await withServices([feed]) {
            let upstream = try client(try await feed.url(), key: "wrong")
            try await withServices([upstream]) {
                let state = try await waitFor(upstream.stateUpdates(), "auth_failed") { $0.name == "auth_failed" }
                #expect(state.detail?.contains("rejected the API key") == true)
                // A measurement window, not synchronisation: no second attempt follows a rejected key soon.
                try await Task.sleep(for: .seconds(1))
                #expect(feed.monitor.snapshot.totalConnections == 1)
                #expect(upstream.statistics.connectAttempts == 1)
            }
        }
    }

    @Test func anUnreachableUpstreamIsRetriedWithBackoff() async throws {
        // Port 1 on loopback refuses connections at once.
        let upstream = try client(
            "ws://127.0.0.1:1/stocks",
            reconnect: ReconnectPolicy(initialDelay: .milliseconds(50), maxDelay: .milliseconds(200)))
        try await withServices([upstream]) {
            let state = try await waitFor(upstream.stateUpdates(), "disconnected") { $0.name == "disconnected" }
            #expect(state.detail?.contains("connection failed") == true)
            try await eventually("a few retries") { upstream.statistics.connectAttempts >= 3 }
        }
    }

    /// A server that takes the TCP connection and never answers the upgrade (a listening socket that
    /// never accepts: the kernel completes the handshake) is given up within the sign-in's bound, and
    /// retried, not waited on for lws's own default.
    @Test func aServerThatNeverAnswersTheUpgradeIsGivenUpAndRetried() async throws {
        let (listener, port) = try listeningSocket()
        defer { close(listener) }
        let endpoint = try #require(UpstreamConfiguration.Endpoint("ws://127.0.0.1:\(port)/stocks"))
        let upstream = UpstreamClient(
            configuration: UpstreamConfiguration(
                endpoint: endpoint, apiKey: "up-key", wire: .polygon, handshakeTimeout: .seconds(1),
                reconnect: ReconnectPolicy(initialDelay: .milliseconds(50), maxDelay: .milliseconds(200))),
            logger: testLogger)
        try await withServices([upstream]) {
            let state = try await waitFor(upstream.stateUpdates(), "the first attempt given up", timeout: .seconds(10)) { $0.name == "disconnected" }
            #expect(state.detail?.contains("did not open the WebSocket within 1") == true, "\(String(describing: state.detail))")
            try await eventually("a second attempt", timeout: .seconds(10)) { upstream.statistics.connectAttempts >= 2 }
        }
    }

    /// A server that answers the upgrade with a redirect is not followed: the sign-in (the upstream
    /// key) would go to the host it names, perhaps in the clear. Here it names a real feed, which never
    /// sees a connection.
    @Test func aRedirectAnsweringTheUpgradeIsNotFollowed() async throws {
        let feed = feed()
        try await withServices([feed]) {
            let target = try await feed.url()
            let (listener, port) = try listeningSocket()
            let answered = Mutex(0)
            // Answers every upgrade with a redirect to the feed, until the listener is shut.
            let redirector = Thread {
                while true {
                    let connection = accept(listener, nil, nil)
                    guard connection >= 0 else { return }
                    var buffer = [UInt8](repeating: 0, count: 4096)
                    _ = read(connection, &buffer, buffer.count)
                    let answer = Array("HTTP/1.1 302 Found\r\nLocation: \(target)\r\nContent-Length: 0\r\n\r\n".utf8)
                    _ = write(connection, answer, answer.count)
                    answered.withLock { $0 += 1 }
                    close(connection)
                }
            }
            redirector.start()
            defer {
                shutdown(listener, Int32(SHUT_RDWR))
                close(listener)
            }
            let endpoint = try #require(UpstreamConfiguration.Endpoint("ws://127.0.0.1:\(port)/stocks"))
            let upstream = UpstreamClient(
                configuration: UpstreamConfiguration(
                    endpoint: endpoint, apiKey: "up-key", wire: .polygon,
                    reconnect: ReconnectPolicy(initialDelay: .milliseconds(50), maxDelay: .milliseconds(200))),
                logger: testLogger)
            try await withServices([upstream]) {
                try await eventually("three redirects answered", timeout: .seconds(10)) { answered.withLock { $0 } >= 3 }
                #expect(upstream.state.name != "authenticated")
            }
            #expect(feed.monitor.snapshot.totalConnections == 0, "the redirect was followed to the feed")
        }
    }

    @Test func shutdownClosesTheConnectionCleanly() async throws {
        let feed = feed()
        try await withServices([feed]) {
            let upstream = try client(try await feed.url())
            try await withServices([upstream]) {
                try await waitFor(upstream.stateUpdates(), "authenticated") { $0 == .authenticated }
                #expect(feed.monitor.snapshot.openConnections == 1)
            }
            #expect(upstream.state == .stopped)
            try await waitFor(feed.monitor.updates(), "the feed to see the close") { $0.openConnections == 0 }
        }
    }
}

/// `wss://` with certificate verification: a feed with a self-signed certificate is refused until its
/// certificate is trusted through `caFile`.
@Suite("Upstream client over TLS")
struct UpstreamTLSTests {
    func tlsFeed() throws -> DemoFeed {
        DemoFeed(
            configuration: DemoFeedConfiguration(
                port: 0, apiKey: "up-key", eventsPerSecond: 2000, tickInterval: .milliseconds(10), seed: 3,
                tls: .init(certificatePath: try fixture("test-server.pem"), privateKeyPath: try fixture("test-server.key"))),
            logger: testLogger)
    }

    @Test func anUntrustedCertificateIsRefused() async throws {
        let feed = try tlsFeed()
        try await withServices([feed]) {
            let url = try await feed.url()
            #expect(url.hasPrefix("wss://"))
            let endpoint = try #require(UpstreamConfiguration.Endpoint(url))
            let upstream = UpstreamClient(configuration: UpstreamConfiguration(endpoint: endpoint, apiKey: "up-key", wire: .polygon), logger: testLogger)
            try await withServices([upstream]) {
                let state = try await waitFor(upstream.stateUpdates(), "the TLS failure") { $0.name == "disconnected" }
                #expect(state.detail?.contains("connection failed") == true)
                #expect(feed.monitor.snapshot.authenticatedConnections == 0)
            }
        }
    }

    @Test func aTrustedCertificateConnectsAndStreams() async throws {
        let feed = try tlsFeed()
        try await withServices([feed]) {
            let endpoint = try #require(UpstreamConfiguration.Endpoint(try await feed.url()))
            let upstream = UpstreamClient(
                configuration: UpstreamConfiguration(endpoint: endpoint, apiKey: "up-key", wire: .polygon, caFile: try fixture("test-server.pem")),
                logger: testLogger)
            upstream.setWantedTopics(topics("Q.*"))
            try await withServices([upstream]) {
                try await waitFor(upstream.stateUpdates(), "authenticated over TLS") { $0 == .authenticated }
                #expect(try await collect(20, from: upstream.messages).allSatisfy { $0.eventType == "Q" })
            }
        }
    }
}

@Suite("Upstream keepalive")
struct UpstreamKeepaliveTests {
    @Test func serverPingsAreAnsweredSoTheConnectionStays() async throws {
        // The feed pings every two seconds and drops a client that misses a pong.
        let feed = DemoFeed(
            configuration: DemoFeedConfiguration(port: 0, eventsPerSecond: 10, seed: 5, pingInterval: .seconds(2)),
            logger: testLogger)
        try await withServices([feed]) {
            let endpoint = try #require(UpstreamConfiguration.Endpoint(try await feed.url()))
            let upstream = UpstreamClient(configuration: UpstreamConfiguration(endpoint: endpoint, apiKey: "k", wire: .polygon), logger: testLogger)
            try await withServices([upstream]) {
                try await waitFor(upstream.stateUpdates(), "authenticated") { $0 == .authenticated }
                // A measurement window spanning two ping periods and a half.
                try await Task.sleep(for: .seconds(5))
                #expect(upstream.state == .authenticated)
                #expect(feed.monitor.snapshot.totalConnections == 1)
            }
        }
    }
}

/// Whether this is the child process ``UpstreamDeadlineIsolationTests`` starts.
private var runsIsolated: Bool { ProcessInfo.processInfo.environment["RELAY_TEST_ISOLATED"] == "1" }

/// Runs the deadline tests in a child process of this test binary: two of them block the cooperative
/// pool, which would stall (and fail) the tests running beside them in this one.
@Suite("Upstream deadline, in a child process", .timeLimit(.minutes(3)))
struct UpstreamDeadlineIsolationTests {
    @Test(.enabled(if: !runsIsolated, "already the child"))
    func theDeadlineTestsPassInAProcessOfTheirOwn() async throws {
        let binary = try FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe")
        let log = FileManager.default.temporaryDirectory.appendingPathComponent("relay-deadline-\(UUID().uuidString).log").path
        defer { try? FileManager.default.removeItem(atPath: log) }
        _ = FileManager.default.createFile(atPath: log, contents: nil)
        let output = try #require(FileHandle(forWritingAtPath: log))
        let child = Process()
        child.executableURL = URL(fileURLWithPath: binary)
        child.arguments = ["--testing-library", "swift-testing", "--filter", "UpstreamDeadlineTests"]
        child.environment = ProcessInfo.processInfo.environment.merging(["RELAY_TEST_ISOLATED": "1"]) { $1 }
        child.standardOutput = output
        child.standardError = output
        try child.run()
        do {
            try await eventually("the deadline tests' process to finish", timeout: .seconds(150)) { !child.isRunning }
        } catch {
            child.terminate()
            throw error
        }
        try output.close()
        let text = (try? String(contentsOfFile: log, encoding: .utf8)) ?? ""
        #expect(child.terminationStatus == 0, "\(text.suffix(4000))")
        #expect(text.contains("Test run with 3 tests") && !text.contains("skipped"), "\(text.suffix(4000))")
    }
}

/// The deadline a cluster leader hands its upstream client with each lease renewal: enforced by the
/// client's own libwebsockets thread, so it holds while every thread of the cooperative pool is stuck.
/// Runs only in its own process (see ``UpstreamDeadlineIsolationTests``); serialized, since two of
/// these block the cooperative pool (for at most 1.5 s each).
@Suite(
    "Upstream deadline", .serialized, .timeLimit(.minutes(2)),
    .enabled(if: runsIsolated, "runs in a child process: UpstreamDeadlineIsolationTests"))
struct UpstreamDeadlineTests {
    @Test func theServiceThreadClosesTheSocketAtTheDeadlineWhileThePoolIsBlocked() async throws {
        let feed = DemoFeed(configuration: DemoFeedConfiguration(port: 0, apiKey: "k", eventsPerSecond: 10, seed: 9), logger: testLogger)
        try await withServices([feed]) {
            let endpoint = try #require(UpstreamConfiguration.Endpoint(try await feed.url()))
            let upstream = UpstreamClient(
                configuration: UpstreamConfiguration(
                    endpoint: endpoint, apiKey: "k", wire: .polygon,
                    reconnect: ReconnectPolicy(initialDelay: .milliseconds(50), maxDelay: .milliseconds(100))),
                logger: testLogger)
            upstream.setDeadline(.now + .seconds(60))
            try await withServices([upstream]) {
                try await waitFor(upstream.stateUpdates(), "authenticated") { $0 == .authenticated }
                let deadline = ContinuousClock.now + .milliseconds(500)
                upstream.setDeadline(deadline)
                // Nothing renews, and no Swift task can run until a second past the deadline.
                await blockCooperativePool(until: deadline + .seconds(1))
                let statistics = upstream.statistics
                #expect(statistics.deadlineCloses == 1)
                let closedAt = try #require(statistics.lastDeadlineClose, "the service thread did not close the connection")
                #expect(closedAt >= deadline)
                #expect(closedAt < deadline + .seconds(1), "closed \(closedAt - deadline) after the deadline")
                try await waitFor(feed.monitor.updates(), "the feed to see the close") { $0.openConnections == 0 }
                // A measurement window, not synchronisation: retries are 50–100 ms apart, and none connects
                // past the deadline.
                try await Task.sleep(for: .milliseconds(500))
                #expect(feed.monitor.snapshot.totalConnections == 1)
                // A later deadline (the next renewal) lets it connect again.
                upstream.setDeadline(.now + .seconds(60))
                try await waitFor(upstream.stateUpdates(), "authenticated again") { $0 == .authenticated }
                #expect(feed.monitor.snapshot.totalConnections == 2)
            }
        }
    }

    @Test func aDeadlineMovedBeforeItPassesKeepsTheConnection() async throws {
        let feed = DemoFeed(configuration: DemoFeedConfiguration(port: 0, apiKey: "k", eventsPerSecond: 10, seed: 9), logger: testLogger)
        try await withServices([feed]) {
            let endpoint = try #require(UpstreamConfiguration.Endpoint(try await feed.url()))
            let upstream = UpstreamClient(configuration: UpstreamConfiguration(endpoint: endpoint, apiKey: "k", wire: .polygon), logger: testLogger)
            upstream.setDeadline(.now + .seconds(60))
            try await withServices([upstream]) {
                try await waitFor(upstream.stateUpdates(), "authenticated") { $0 == .authenticated }
                // Renewed every 200 ms for two seconds, each time 2 s ahead.
                let end = ContinuousClock.now + .seconds(2)
                while ContinuousClock.now < end {
                    upstream.setDeadline(.now + .seconds(2))
                    try await Task.sleep(for: .milliseconds(200))
                }
                #expect(upstream.statistics.deadlineCloses == 0)
                #expect(upstream.state == .authenticated)
                #expect(feed.monitor.snapshot.totalConnections == 1)
            }
        }
    }

    /// A cluster leader in this process, so the test can starve its cooperative pool: the lease renewal
    /// and the Swift-side close both stop, and the upstream client's own thread must close the socket
    /// before the lease (1 s here, from the last renewal) could lapse and another node connect.
    @Test(.enabled(if: ClusterHarness.enabled, "nats-server is not installed (scripts/test installs it)"))
    func aLeaderWhosePoolIsBlockedClosesItsUpstreamSocketBeforeTheLeaseCouldLapse() async throws {
        let nats = try NATSServerProcess()
        let natsURL = try await nats.start()
        do {
            try await leadThenStarve(natsURL: natsURL)
        } catch {
            await nats.stop()
            throw error
        }
        await nats.stop()
    }

    func leadThenStarve(natsURL: String) async throws {
        let feed = DemoFeed(
            configuration: DemoFeedConfiguration(port: 0, apiKey: "k", eventsPerSecond: 100, seed: 4), logger: testLogger)
        try await withServices([feed]) {
            let feedURL = try await feed.url()
            let interest = LocalInterest()
            let hub = MarketDataHub(wire: .polygon, keepsUnwantedLastValues: false, logger: testLogger) { interest.apply($0) }
            let node = try ClusterNode(
                configuration: ClusterConfiguration(
                    servers: [natsURL], name: "backstop\(UInt16.random(in: 0...9999))", nodeID: "inproc", leaseDuration: .seconds(1)),
                market: "stocks", hub: hub, localInterest: interest, logger: testLogger
            ) {
                let endpoint = try #require(UpstreamConfiguration.Endpoint(feedURL))
                var configuration = UpstreamConfiguration(endpoint: endpoint, apiKey: "k", wire: .polygon)
                configuration.closeTimeout = .seconds(1)
                return UpstreamClient(configuration: configuration, logger: testLogger)
            }
            try await withServices([node]) {
                try await eventually("the node to lead and authenticate upstream", timeout: .seconds(15)) {
                    node.upstream?.state == .authenticated
                }
                let upstream = try #require(node.upstream)
                let blockedAt = ContinuousClock.now
                // Every cooperative thread busy for longer than the lease: no renewal, no Swift close.
                await blockCooperativePool(until: blockedAt + .milliseconds(1500))
                let statistics = upstream.statistics
                #expect(statistics.deadlineCloses >= 1, "the upstream thread did not close the socket")
                let closedAt = try #require(statistics.lastDeadlineClose)
                // The last renewal was sent before the block; the lease lapses 1 s after it at the earliest.
                #expect(closedAt < blockedAt + .seconds(1), "closed \(closedAt - blockedAt) into the block")
                #expect(feed.monitor.snapshot.maxOpenConnections == 1)
            }
        }
    }
}
