import Crypto
import DemoFeed
import Foundation
import MarketDataHub
import NIOCore
import PolygonWire
import RelayBench
import RelayComposition
import RelayConfiguration
import Synchronization
import Testing

@testable import Cluster

/// A NATS client in this test process: what anyone allowed to publish on the cluster's NATS can do.
func natsClient(_ url: String, name: String = "intruder") async throws -> NATSConnection {
    let connection = NATSConnection(servers: [url], name: name, logger: testLogger)
    try await waitFor(connection.stateUpdates(), "\(name) to connect to NATS") { $0 == .connected }
    return connection
}

/// One series of a node's `/metrics` (0 when absent).
func metric(_ port: Int, _ series: String) async -> Double {
    guard let body = try? await httpGet("http://127.0.0.1:\(port)/metrics").body else { return 0 }
    for line in body.split(separator: "\n") where line.hasPrefix(series + " ") {
        return line.split(separator: " ").last.flatMap { Double($0) } ?? 0
    }
    return 0
}

/// A scratch directory for configuration files, certificates and keys.
func scratchDirectory(_ name: String) throws -> String {
    let path = FileManager.default.temporaryDirectory.appendingPathComponent("relay-\(name)-\(UUID().uuidString)").path
    try FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true)
    return path
}

/// Runs a tool to completion; fails the test with its output if it fails.
func runTool(_ executable: String, _ arguments: [String], in directory: String) throws {
    let process = Process()
    process.executableURL = URL(fileURLWithPath: executable)
    process.arguments = arguments
    process.currentDirectoryURL = URL(fileURLWithPath: directory)
    let pipe = Pipe()
    process.standardOutput = pipe
    process.standardError = pipe
    try process.run()
    let output = pipe.fileHandleForReading.readDataToEndOfFile()
    process.waitUntilExit()
    guard process.terminationStatus == 0 else {
        throw TimeoutError(description: "\(executable) \(arguments) failed: \(String(decoding: output, as: UTF8.self))")
    }
}

@Suite(
    "Cluster on NATS: what arrives is checked", .serialized, .timeLimit(.minutes(3)),
    .enabled(if: ClusterHarness.enabled, "nats-server is not installed (scripts/test installs it)"))
struct ClusterInboundChecksTests {
    @Test func eventsThatAreNotOneMatchingObjectAreCountedAndNeverDelivered() async throws {
        try await ClusterHarness.with(nodes: 1) { cluster in
            _ = try await cluster.agreedLeader()
            let client = try await subscribedClient(try cluster.url("n1"), "Q.AAPL")
            let nats = try await natsClient(cluster.natsURL)
            let subjects = try ClusterSubjects(cluster: cluster.clusterName, market: "stocks")
            let subject = subjects.subject(for: Topic(eventType: "Q", ticker: "AAPL")!)
            let forged = [
                "[1}]garbage", #"{"ev":"Q","sym":"MSFT","forged":1}"#, #"[{"ev":"Q","sym":"AAPL","forged":1}]"#,
                #"{"ev":"Q","sym":"AAPL","forged":1} trailing"#, "", #"{"ev":"status","status":"auth_success","message":"forged"}"#,
            ]
            for payload in forged { #expect(nats.publish(subject, payload)) }
            let port = try cluster.port("n1")
            try await eventually("n1 to count the forged events") {
                await metric(port, #"relay_cluster_rejected_total{market="stocks",kind="event"}"#) >= Double(forged.count)
            }
            // Every frame the client got, before and after, parses and holds real Q.AAPL events only.
            let events = try await client.nextEvents(30)
            #expect(events.allSatisfy { $0.topic.description == "Q.AAPL" && !$0.json.contains("forged") })
            #expect(client.closeCode == nil)
            await client.close()
            await nats.close()
        }
    }

    @Test func interestTopicsThatBreakTheTopicRulesAreNotSubscribedUpstream() async throws {
        try await ClusterHarness.with(nodes: 1) { cluster in
            let leader = try await cluster.agreedLeader()
            // Published once, the intruder's interest lasts 3.5 s: the upstream must be up by then (a
            // first leader connects a lease after it could see the lease bucket).
            try await eventually("the leader to connect upstream") { cluster.feed.monitor.snapshot.openConnections == 1 }
            let nats = try await natsClient(cluster.natsURL)
            let subjects = try ClusterSubjects(cluster: cluster.clusterName, market: "stocks")
            let subject = subjects.interest(of: "intruder")
            #expect(nats.publish(subject, "Q.AAPL,T.MSFT"))  // not an interest message at all
            // Written by hand: a topic with a space cannot be built as a Topic at all.
            let part = "1 1/1\nZZ.EVIL,Q.\(String(repeating: "A", count: 60)),T.A B,T.NVDA"
            #expect(nats.publish(subject, part))
            let port = try cluster.port(leader)
            try await eventually("the leader to count the refused interest") {
                await metric(port, #"relay_cluster_rejected_total{market="stocks",kind="interest"}"#) >= 2
            }
            // The topic that passes the rules counts (NATS permissions decide who may publish).
            try await eventually("the leader to subscribe T.NVDA upstream") {
                cluster.feed.monitor.snapshot.topics(.subscribe).contains("T.NVDA")
            }
            let subscribed = cluster.feed.monitor.snapshot.topics(.subscribe)
            #expect(!subscribed.contains { $0.hasPrefix("ZZ.") || $0.hasPrefix("Q.AAAA") || $0.contains(" ") }, "\(subscribed)")
            await nats.close()
        }
    }

    /// Issue 11: what anyone who may publish on the control subjects sends reaches clients bounded and
    /// printable; an ask reaching back to 2000 is not filled; fill events for a topic no ask named go
    /// nowhere.
    @Test func hostileControlAndFillMessagesReachNoClientAsSent() async throws {
        try await ClusterHarness.with(nodes: 0) { cluster in
            // With gap fill, so the leader reads the asks.
            let feedREST = "http://127.0.0.1:\(try await cluster.feed.listeningPort())"
            try await cluster.startNode("n1", extra: ["--no-portfolio", "--rest-url", feedREST])
            _ = try await cluster.agreedLeader()
            let client = try await subscribedClient(try cluster.url("n1"), "Q.AAPL,T.MSFT")
            let nats = try await natsClient(cluster.natsURL)
            let subjects = try ClusterSubjects(cluster: cluster.clusterName, market: "stocks")
            let port = try cluster.port("n1")

            // An ask from 2000-01-01: plausible, but never merged into a fill.
            let ancient = FillWire.Ask(
                node: "intruder", generation: 1, from: 946_684_800_000, through: WallClock.nowMilliseconds(),
                topics: [GapFillRequest.Held(topic: Topic(parsing: "T.MSFT")!, holders: 1, lastBefore: nil)])
            #expect(FillWire.ask(ancient).withUnsafeBytes { nats.publish(subjects.fillAsk, $0) })
            try await eventually("the leader to refuse the ancient ask") {
                await metric(port, #"relay_cluster_rejected_total{market="stocks",kind="fill_ask"}"#) >= 1
            }

            // Recovered events of a topic no ask named (no outage yet, so no node asked; the refused ask does
            // not count), though a client holds it.
            let forged = MarketEvent(
                eventType: "T", ticker: "MSFT", bytes: ByteBuffer(string: #"{"ev":"T","sym":"MSFT","p":1,"s":1,"t":1,"q":1,"forged":1}"#))
            for message in FillWire.events(Topic(parsing: "T.MSFT")!, order: .sequence, [forged]) {
                #expect(message.withUnsafeBytes { nats.publish(subjects.fillResult, $0) })
            }
            try await eventually("n1 to refuse the unasked fill") {
                await metric(port, #"relay_cluster_rejected_total{market="stocks",kind="fill"}"#) >= 1
            }

            // A 200 KB notice full of terminal escapes and line breaks.
            let huge = String(repeating: "\u{1B}[2J\r\nforged notice \u{7}", count: 10_000)
            #expect(nats.publish(subjects.upstreamControl, huge))
            let lost = try await client.waitForStatus(StatusMessage.Kind.upstreamDisconnected)
            let message = try #require(lost.fields["message"] as? String)
            #expect(message.utf8.count < 400, "\(message.utf8.count) bytes")
            #expect(message.contains("forged notice") && !message.unicodeScalars.contains { $0.value < 0x20 || $0 == "\u{7F}" })

            let frames = try await client.nextEvents(20)
            #expect(!frames.contains { $0.json.contains("forged") })
            await client.close()
            await nats.close()
        }
    }

    @Test func aLeaseValueNoNodeWroteIsTakenBackAndTheUpstreamStays() async throws {
        try await ClusterHarness.with(nodes: 2) { cluster in
            let leader = try await cluster.agreedLeader()
            try await eventually("the leader to connect upstream") { cluster.feed.monitor.snapshot.openConnections == 1 }
            let nats = try await natsClient(cluster.natsURL)
            let subjects = try ClusterSubjects(cluster: cluster.clusterName, market: "stocks")
            let bucket = try await nats.keyValue(bucket: subjects.leaseBucket, ttl: .seconds(5))
            // Overwrite the leader's lease (retrying if a renewal moved the revision in between).
            try await eventually("the forged lease value to be written") {
                guard let entry = try? await bucket.get(subjects.leaseKey) else { return false }
                return (try? await bucket.update(subjects.leaseKey, "garbage", last: entry.revision)) != nil
            }
            let port = try cluster.port(leader)
            try await eventually("the leader to refuse the forged value") {
                await metric(port, #"relay_cluster_rejected_total{market="stocks",kind="lease"}"#) >= 1
            }
            try await eventually("the lease to name the leader again") {
                guard let entry = try? await bucket.get(subjects.leaseKey) else { return false }
                return LeaseValue(parsing: entry.value)?.node == leader
            }
            #expect(try await cluster.agreedLeader() == leader)
            let snapshot = cluster.feed.monitor.snapshot
            #expect(snapshot.totalConnections == 1, "the leader dropped its upstream for a forged lease")
            #expect(snapshot.maxOpenConnections == 1)
            #expect(try await cluster.health(leader).status == 200)
            await nats.close()
        }
    }
}

@Suite(
    "Cluster on NATS: lease bucket, interest size", .serialized, .timeLimit(.minutes(3)),
    .enabled(if: ClusterHarness.enabled, "nats-server is not installed (scripts/test installs it)"))
struct ClusterLeaseAndInterestTests {
    /// A node's clients changing their subscriptions as fast as they may cost the cluster a bounded
    /// number of interest publishes (each sorts and sends the node's whole wanted set): at once, then
    /// at most four a second, besides the heartbeat's. The last one names every topic.
    @Test func subscriptionChurnCostsANodeAtMostFourInterestPublishesASecond() async throws {
        try await ClusterHarness.with(nodes: 1) { cluster in
            _ = try await cluster.agreedLeader()
            let nats = try await natsClient(cluster.natsURL, name: "listener")
            let subjects = try ClusterSubjects(cluster: cluster.clusterName, market: "stocks")
            let publishes = Mutex<[String]>([])
            let sink = NATSMessageSink { _, payload in
                let text = String(decoding: payload, as: UTF8.self)
                publishes.withLock { $0.append(text) }
            }
            #expect(nats.subscribe(subjects.interest(of: "n1"), sink: sink) != nil)
            let client = try await WSTestClient.authenticated(url: try cluster.url("n1"))
            let before = publishes.withLock { $0.count }
            let started = ContinuousClock.now
            let wanted = Set((0..<150).map { "Q.CH\($0)" })
            // One topic a message, every 10 ms: a hub change each (within the client's burst).
            for index in 0..<150 {
                client.send(ClientAction(.subscribe, params: "Q.CH\(index)"))
                try await Task.sleep(for: .milliseconds(10))
            }
            try await eventually("n1's interest to name all 150 topics", timeout: .seconds(10)) {
                guard let last = publishes.withLock({ $0.last }), let topics = last.split(separator: "\n").dropFirst().first else { return false }
                return wanted.isSubset(of: Set(topics.split(separator: ",").map(String.init)))
            }
            let elapsed = ContinuousClock.now - started
            let count = publishes.withLock { $0.count } - before
            // At once, then one each 250 ms; the heartbeat's once a second.
            let bound = Int(elapsed / .milliseconds(250)) + Int(elapsed / .seconds(1)) + 3
            #expect(count <= bound, "\(count) interest publishes in \(elapsed) (at most \(bound))")
            await client.close()
            await nats.close()
        }
    }

    /// Requests for every node's interest that name terms the lease does not hold (made up, or two in
    /// turn, each "new" after the other) are answered at most once a second, as any request is (each
    /// answer sorts and sends the node's whole wanted set, and every node reads it): only the lease's own
    /// new term is answered at once.
    @Test func requestsForInterestNamingTermsTheLeaseDoesNotHoldAreAnsweredAtMostOnceASecond() async throws {
        try await ClusterHarness.with(nodes: 1) { cluster in
            _ = try await cluster.agreedLeader()
            let nats = try await natsClient(cluster.natsURL, name: "asker")
            let subjects = try ClusterSubjects(cluster: cluster.clusterName, market: "stocks")
            let publishes = Mutex(0)
            let sink = NATSMessageSink { _, _ in publishes.withLock { $0 += 1 } }
            #expect(nats.subscribe(subjects.interest(of: "n1"), sink: sink) != nil)
            let started = ContinuousClock.now
            // Two made-up terms in turn, every 10 ms (pacing, not a wait).
            for index in 0..<200 {
                #expect(nats.publish(subjects.interestRequest, index.isMultiple(of: 2) ? "madeupterm01" : "madeupterm02"))
                try await Task.sleep(for: .milliseconds(10))
            }
            let elapsed = ContinuousClock.now - started
            let count = publishes.withLock { $0 }
            // One a second for the requests, one a second for the heartbeat, one at each end.
            let bound = 2 * Int(elapsed / .seconds(1)) + 4
            #expect(count >= 1, "the requests are answered")
            #expect(count <= bound, "\(count) interest publishes in \(elapsed) (at most \(bound))")
            await nats.close()
        }
    }

    @Test func aNodeWhoseLeaseDiffersFromTheBucketRefusesToRun() async throws {
        try await ClusterHarness.with(nodes: 1) { cluster in
            _ = try await cluster.agreedLeader()
            try await eventually("the leader to connect upstream") { cluster.feed.monitor.snapshot.openConnections == 1 }
            let odd = RelayProcess(
                binary: RelayProcess.siblingBinary(),
                arguments: [
                    "serve", "--listen", "127.0.0.1:0", "--upstream", cluster.feedURL, "--upstream-key", ClusterHarness.upstreamKey,
                    "--cluster", cluster.natsURL, "--cluster-name", cluster.clusterName, "--node-id", "odd", "--no-portfolio",
                ], showLogs: false, captureLogs: true, environment: ["RELAY_CLUSTER_LEASE_SECONDS": "3"])
            _ = try? await odd.start(timeout: .seconds(30))
            try await eventually("the node with a 3 s lease to exit", timeout: .seconds(20)) { !odd.process.isRunning }
            #expect(odd.process.terminationStatus != 0)
            #expect(odd.output.contains("keeps the lease 5000 ms but this node's lease is 3000 ms"), "\(odd.output.suffix(2000))")
            // The running node was never disturbed.
            #expect(cluster.feed.monitor.snapshot.totalConnections == 1)
        }
    }

    @Test func aNodeAsksForAtMostItsTopicCapAndSaysSo() async throws {
        try await ClusterHarness.with(nodes: 0) { cluster in
            let port = try await cluster.startNode("capped", extra: ["--no-portfolio", "--cluster-max-topics-per-node", "2"])
            _ = try await cluster.agreedLeader()
            let client = try await WSTestClient.authenticated(url: try cluster.url("capped"))
            client.send(ClientAction(.subscribe, params: "Q.AAPL,Q.MSFT,Q.NVDA"))
            try await eventually("the node to count the capped interest") { await metric(port, #"relay_cluster_interest_capped_total{market="stocks"}"#) >= 1 }
            try await eventually("the leader to subscribe two topics upstream") {
                guard let upstream = try? await cluster.health("capped").body["upstream"] as? [String: Any] else { return false }
                return upstream["subscribedTopics"] as? Int == 2
            }
            #expect(try cluster.process("capped").output.contains("cluster takes at most 2 per node"))
            await client.close()
        }
    }

    @Test func anInterestOfThousandsOfTopicsArrivesInPartsAndCounts() async throws {
        try await ClusterHarness.with(nodes: 1) { cluster in
            let leader = try await cluster.agreedLeader()
            // Published once, this interest lasts 3.5 s: the upstream must be up by then.
            try await eventually("the leader to connect upstream") { cluster.feed.monitor.snapshot.openConnections == 1 }
            let nats = try await natsClient(cluster.natsURL, name: "big-node")
            let subjects = try ClusterSubjects(cluster: cluster.clusterName, market: "stocks")
            let topics = (0..<5_000).map { Topic(eventType: "Q", ticker: "X\($0)")! }
            let parts = InterestTable.Part.split(topics, generation: 7)
            #expect(parts.count == 3)
            for part in parts { #expect(nats.publish(subjects.interest(of: "big"), part.text)) }
            try await eventually("the leader to subscribe all 5,000 topics upstream", timeout: .seconds(20)) {
                guard let upstream = try? await cluster.health(leader).body["upstream"] as? [String: Any] else { return false }
                return upstream["subscribedTopics"] as? Int ?? 0 >= 5_000
            }
            #expect(await metric(try cluster.port(leader), #"relay_cluster_rejected_total{market="stocks",kind="interest"}"#) == 0)
            await nats.close()
        }
    }

    @Test func aFillsEndNamingAGenerationTheNodeNeverAskedForIsNotTaken() async throws {
        try await ClusterHarness.with(nodes: 0) { cluster in
            let feedREST = "http://127.0.0.1:\(try await cluster.feed.listeningPort())"
            let port = try await cluster.startNode("n1", extra: ["--no-portfolio", "--rest-url", feedREST])
            _ = try await cluster.agreedLeader()
            // A forged end answering a generation of n1's far ahead would settle every gap it has until then.
            let nats = try await natsClient(cluster.natsURL, name: "forger")
            let subjects = try ClusterSubjects(cluster: cluster.clusterName, market: "stocks")
            let forged = FillWire.end(.nothing, from: 1, through: 2, answering: [ClusterSubjects.token("n1") + "/999999999"])
            #expect(forged.withUnsafeBytes { nats.publish(subjects.fillResult, $0) })
            try await eventually("the end refused") { await metric(port, #"relay_cluster_rejected_total{market="stocks",kind="fill"}"#) >= 1 }
            await nats.close()
        }
    }

    /// An epoch announced on the control subject that the lease does not hold (made up by whoever may
    /// publish there) restarts no node's history and tells no client a leader went: it is refused at
    /// the node's next lease read (the leader's next renewal), and the events go on, none lost.
    @Test func anEpochTheLeaseDoesNotHoldIsRefusedAndTheEventsBehindItArrive() async throws {
        try await ClusterHarness.with(nodes: 2) { cluster in
            let leader = try await cluster.agreedLeader()
            let follower = try #require(cluster.nodeIDs.first { $0 != leader })
            // The leader reads no lease while it leads: its renewals say whose an epoch is.
            for node in [follower, leader] {
                let client = try await subscribedClient(try cluster.url(node), "Q.*")
                let nats = try await natsClient(cluster.natsURL)
                let subjects = try ClusterSubjects(cluster: cluster.clusterName, market: "stocks")
                let port = try cluster.port(node)
                let before = await metric(port, #"relay_cluster_rejected_total{market="stocks",kind="control"}"#)
                for index in 0..<3 { #expect(nats.publish(subjects.upstreamControl, "epoch:forged\(index)")) }
                try await eventually("\(node) to refuse the made-up epochs") {
                    await metric(port, #"relay_cluster_rejected_total{market="stocks",kind="control"}"#) >= before + 3
                }
                var statuses: [String] = []
                var events = 0
                let deadline = ContinuousClock.now + .seconds(20)
                while events < 200, ContinuousClock.now < deadline {
                    let frame = try await client.nextParsed()
                    events += frame.events.count
                    statuses += frame.statuses.map(\.status)
                }
                #expect(events >= 200)
                #expect(statuses.isEmpty, "a made-up epoch reached \(node)'s clients as \(statuses)")
                await client.close()
                await nats.close()
            }
        }
    }

    /// One event with a position far past the leader's (within the 2³² any leap may be) would make every
    /// real event after it "out of order" on a node, not kept, and a resume by market sequence or time
    /// would miss them and say it is whole. Past what the lease says the leader stamped, by more than the
    /// margin, the node keeps it not, and the real events after it are kept.
    @Test func anEventLeapingFarPastWhatTheLeaderStampedIsNotKeptAndTheRealOnesAfterItAre() async throws {
        try await ClusterHarness.with(nodes: 2) { cluster in
            let leader = try await cluster.agreedLeader()
            let follower = try #require(cluster.nodeIDs.first { $0 != leader })
            let client = try await subscribedClient(try cluster.url(follower), "Q.AAPL")
            let port = try cluster.port(follower)
            // The leader writes how far it stamped into the lease at each renewal (every second).
            let url = "http://127.0.0.1:\(port)/v1/status"
            @Sendable func stampedThrough() async -> UInt64 {
                guard let status = try? await httpGet(url), let object = try? JSONSerialization.jsonObject(with: Data(status.body.utf8)) as? [String: Any],
                    let history = (object["markets"] as? [[String: Any]])?.first?["history"] as? [String: Any]
                else { return 0 }
                return (history["leaderStampedThrough"] as? NSNumber)?.uint64Value ?? 0
            }
            try await eventually("the follower to read how far the leader stamped") { await stampedThrough() > 0 }
            let through = await stampedThrough()
            @Sendable func series(_ reason: String) -> String { #"relay_history_events_not_kept_total{market="stocks",reason=""# + reason + #""}"# }
            let outOfOrder = await metric(port, series("out_of_order"))
            let nats = try await natsClient(cluster.natsURL)
            let subjects = try ClusterSubjects(cluster: cluster.clusterName, market: "stocks")
            let forged = #"{"ev":"Q","sym":"AAPL","bx":1,"bp":1,"bs":1,"ax":1,"ap":2,"as":1,"c":0,"t":1,"z":3,"_s":1,"_m":\#(through + (1 << 31))}"#
            #expect(nats.publish(subjects.subject(for: Topic(parsing: "Q.AAPL")!), forged))
            try await eventually("the follower not to keep the forged event") { await metric(port, series("past_leader")) >= 1 }
            _ = try await client.nextEvents(100)
            let after = await metric(port, series("out_of_order"))
            #expect(after - outOfOrder < 10, "the real events after the forged one were not kept (\(after - outOfOrder))")
            await client.close()
            await nats.close()
        }
    }

    /// Whoever may write the last-value store can make it hold no value larger than an event a node
    /// takes, and no more than `cluster.lastValueMB` in all (the oldest go first), in the NATS servers'
    /// memory; the leader's own values still go in. A bucket made before (by an older relay, without
    /// bounds) is given them.
    @Test(arguments: [false, true]) func theLastValueStoreHoldsNoValueOverAnEventsBoundAndNoMoreThanItsBytes(madeBefore: Bool) async throws {
        try await ClusterHarness.with(nodes: 0) { cluster in
            let nats = try await natsClient(cluster.natsURL, name: "writer")
            let subjects = try ClusterSubjects(cluster: cluster.clusterName, market: "stocks")
            if madeBefore { _ = try await nats.keyValue(bucket: subjects.lastValueBucket, ttl: nil) }
            _ = try await cluster.startNode("n1", extra: ["--no-portfolio", "--cluster-last-value-mb", "1"])
            _ = try await cluster.agreedLeader()
            #expect(try !cluster.process("n1").output.contains("could not be bounded"), "the store's bounds were not set")
            // The node made the bucket with its bounds (or gave them to it) before it took the lease.
            let bucket = try await nats.keyValue(bucket: subjects.lastValueBucket, ttl: nil)
            let client = try await WSTestClient.authenticated(url: try cluster.url("n1"))
            client.send(ClientAction(.subscribe, params: "Q.AAPL"))
            try await eventually("the leader to write AAPL's last quote") { (try? await bucket.get(subjects.lastValueKey(for: Topic(parsing: "Q.AAPL")!))) != nil }
            await client.close()
            do {
                _ = try await bucket.create("huge", String(repeating: "x", count: ClusterChecks.maxEventBytes + 1))
                Issue.record("a value past an event's bound was stored")
            } catch {}
            let value = String(repeating: "y", count: 40 << 10)
            for index in 0..<50 { _ = try await bucket.create("filler\(index)", value) }
            #expect(try await bucket.get("filler0") == nil, "the oldest value stayed past the store's bytes")
            #expect(try await bucket.get("filler49")?.value.count == 40 << 10)
            await nats.close()
        }
    }

    /// Reads `client` until a frame holds `text`, or fails after `timeout`.
    func read(_ client: WSTestClient, until text: String, timeout: Duration = .seconds(20)) async throws -> String {
        let deadline = ContinuousClock.now + timeout
        while true {
            let frame = try await client.nextFrame(timeout: deadline - .now)
            if frame.contains(text) { return frame }
        }
    }

    @Test func aPublisherOfInterestCannotGrowTheUpstreamSetPastTheClustersBoundAndTheClientsPastItAreTold() async throws {
        try await ClusterHarness.with(nodes: 0) { cluster in
            let port = try await cluster.startNode("n1", extra: ["--no-portfolio", "--cluster-max-topics", "50"])
            _ = try await cluster.agreedLeader()
            let client = try await WSTestClient.authenticated(url: try cluster.url("n1"))
            client.send(ClientAction(.subscribe, params: "Q.AAPL"))
            _ = try await read(client, until: #""ev":"Q","sym":"AAPL""#)
            // Whoever may publish interest invents a node wanting 5,000 topics, and repeats it as a node does.
            let nats = try await natsClient(cluster.natsURL, name: "big-node")
            let subjects = try ClusterSubjects(cluster: cluster.clusterName, market: "stocks")
            let topics = (0..<5_000).map { Topic(eventType: "Q", ticker: "X\($0)")! }
            let publisher = Task {
                var generation: UInt64 = 1
                while !Task.isCancelled {
                    for part in InterestTable.Part.split(topics, generation: generation) { _ = nats.publish(subjects.interest(of: "big"), part.text) }
                    generation += 1
                    try? await Task.sleep(for: .seconds(1))
                }
            }
            try await eventually("the leader to count the topics past its bound", timeout: .seconds(20)) {
                await metric(port, #"relay_cluster_interest_refused_topics_total{market="stocks"}"#) >= 4_951
            }
            try await eventually("the leader to subscribe 50 topics upstream") {
                (try? await cluster.health("n1").body["upstream"] as? [String: Any])?["subscribedTopics"] as? Int == 50
            }
            // A client's new topic finds no room: it is told, in Polygon's words, and keeps its connection.
            client.send(ClientAction(.subscribe, params: "T.MSFT"))
            let refusal = try await read(client, until: "refused T.MSFT")
            #expect(refusal.contains(#""status":"error""#) && refusal.contains("at most 50 distinct topics"), "\(refusal)")
            _ = try await read(client, until: #""ev":"Q","sym":"AAPL""#)
            // Repeated, the same set is not counted again.
            let counted = await metric(port, #"relay_cluster_interest_refused_topics_total{market="stocks"}"#)
            try await Task.sleep(for: .seconds(2))
            #expect(await metric(port, #"relay_cluster_interest_refused_topics_total{market="stocks"}"#) == counted)
            // A part larger than any a node sends, or with more topics than a part holds, is refused unread.
            let rejected = #"relay_cluster_rejected_total{market="stocks",kind="interest"}"#
            let before = await metric(port, rejected)
            #expect(nats.publish(subjects.interest(of: "huge"), "1 1/1\n" + String(repeating: "Q.ABCDEFGH,", count: 20_000)))
            let many = (0..<3_000).map { Topic(eventType: "Q", ticker: "Y\($0)")! }
            #expect(nats.publish(subjects.interest(of: "many"), InterestTable.Part(generation: 1, part: 1, parts: 1, topics: many).text))
            try await eventually("both refused") { await metric(port, rejected) >= before + 2 }
            // The invented node falls silent: its topics go, and the client's waiting topic is asked for.
            publisher.cancel()
            _ = try await read(client, until: #""ev":"T","sym":"MSFT""#, timeout: .seconds(30))
            #expect(client.closeCode == nil)
            await client.close()
            await nats.close()
        }
    }
}

@Suite(
    "Cluster on NATS: TLS and credentials", .serialized, .timeLimit(.minutes(3)),
    .enabled(if: ClusterHarness.enabled, "nats-server is not installed (scripts/test installs it)"))
struct ClusterSecurityTests {
    func writeConfig(_ text: String) throws -> (directory: String, file: String) {
        let directory = try scratchDirectory("nats-config")
        let file = directory + "/nats.conf"
        try text.write(toFile: file, atomically: true, encoding: .utf8)
        return (directory, file)
    }

    func natsPort(_ cluster: ClusterHarness) throws -> Int {
        try #require(cluster.natsURL.split(separator: ":").last.flatMap { Int($0) })
    }

    @Test func aPasswordInTheURLAuthenticatesAndIsShownNowhere() async throws {
        let (directory, file) = try writeConfig(#"authorization { users = [ { user: relay, password: "pw-s3cret-6f1" } ] }"#)
        defer { try? FileManager.default.removeItem(atPath: directory) }
        try await ClusterHarness.with(nodes: 0, natsConfig: file) { cluster in
            let port = try natsPort(cluster)
            try await cluster.startNode("n1", nats: "nats://relay:pw-s3cret-6f1@127.0.0.1:\(port)")
            _ = try await cluster.agreedLeader()
            let healthURL = "http://127.0.0.1:\(try cluster.port("n1"))/healthz"
            try await eventually("n1 to be healthy") { (try? await httpGet(healthURL))?.status == 200 }
            let health = try await httpGet(healthURL)
            let output = try cluster.process("n1").output
            #expect(output.contains("nats://***@127.0.0.1:\(port)"), "the log names the server")
            #expect(!output.contains("pw-s3cret-6f1") && !health.body.contains("pw-s3cret-6f1"), "the password was shown")

            // A wrong password: never connected, never leads, and the password is not shown either.
            try await cluster.startNode("n2", nats: "nats://relay:wrong-pw-77@127.0.0.1:\(port)")
            let section = try await cluster.cluster(of: "n2")
            #expect(section["nats"] as? String != "connected")
            #expect(!(try cluster.process("n2").output.contains("wrong-pw-77")))
        }
    }

    @Test func aTokenFromTheEnvironmentAuthenticates() async throws {
        let (directory, file) = try writeConfig(#"authorization { token: "tok-81b2" }"#)
        defer { try? FileManager.default.removeItem(atPath: directory) }
        try await ClusterHarness.with(nodes: 0, natsConfig: file) { cluster in
            try await cluster.startNode("n1", environment: ["RELAY_CLUSTER_TOKEN": "tok-81b2"])
            _ = try await cluster.agreedLeader()
            #expect(!(try cluster.process("n1").output.contains("tok-81b2")))
        }
    }

    @Test func anNKeySeedAuthenticates() async throws {
        var seedBytes = [UInt8](repeating: 0, count: 32)
        for index in seedBytes.indices { seedBytes[index] = UInt8.random(in: 0...255) }
        let seed = NKey.userSeed(seedBytes)
        let publicKey = try NKey.publicKey(fromSeed: seed)
        #expect(publicKey.hasPrefix("U") && publicKey.count == 56)
        let (directory, file) = try writeConfig("authorization { users = [ { nkey: \(publicKey) } ] }")
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let seedFile = directory + "/node.nk"
        try (seed + "\n").write(toFile: seedFile, atomically: true, encoding: .utf8)
        try await ClusterHarness.with(nodes: 0, natsConfig: file) { cluster in
            try await cluster.startNode("n1", extra: ["--no-portfolio", "--cluster-nkey-seed", seedFile])
            _ = try await cluster.agreedLeader()
        }
    }

    @Test func tlsWithTheClusterCAConnectsAndWithoutItDoesNot() async throws {
        let directory = try scratchDirectory("nats-tls")
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let openssl = "/usr/bin/openssl"
        try runTool(
            openssl,
            [
                "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-days", "1", "-subj",
                "/CN=relay-test-ca",
            ], in: directory)
        try runTool(
            openssl, ["req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=localhost"],
            in: directory)
        try "subjectAltName=IP:127.0.0.1,DNS:localhost\n".write(toFile: directory + "/san.ext", atomically: true, encoding: .utf8)
        try runTool(
            openssl,
            [
                "x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial", "-out", "server.pem", "-days",
                "1", "-extfile", "san.ext",
            ],
            in: directory)
        let config = directory + "/nats.conf"
        try "tls { cert_file: \"\(directory)/server.pem\", key_file: \"\(directory)/server.key\" }\n"
            .write(toFile: config, atomically: true, encoding: .utf8)
        try await ClusterHarness.with(nodes: 0, natsConfig: config) { cluster in
            let url = "tls://127.0.0.1:\(try natsPort(cluster))"
            try await cluster.startNode("n1", extra: ["--no-portfolio", "--cluster-tls-ca", directory + "/ca.pem"], nats: url)
            _ = try await cluster.agreedLeader()
            // Without the CA the server's certificate is not trusted.
            try await cluster.startNode("n2", nats: url)
            let section = try await cluster.cluster(of: "n2")
            #expect(section["nats"] as? String != "connected")
            #expect(try await cluster.health("n2").status == 503)
        }
    }

    /// The permissions README's cluster section shows, for a cluster named as the harness names it:
    /// the nodes work with them, and another user can neither forge events nor touch the lease.
    @Test func theDocumentedPermissionsAreEnoughForNodesAndKeepOthersOut() async throws {
        let clusterName = "perm\(UInt16.random(in: 0...UInt16.max))"
        let (directory, file) = try writeConfig(
            """
            authorization {
              RELAY_NODE = {
                publish = ["\(clusterName).>", "$JS.API.>", "$KV.\(clusterName)-lease.>", "$KV.\(clusterName)-last-stocks.>", "$KV.\(clusterName)-rest-budget.>"]
                subscribe = ["\(clusterName).>", "_INBOX.>"]
              }
              READER = {
                publish = { deny = [">"] }
                subscribe = ["\(clusterName).md.>", "_INBOX.>"]
              }
              users = [
                { user: node, password: "node-pw", permissions: $RELAY_NODE }
                { user: reader, password: "reader-pw", permissions: $READER }
              ]
            }
            """)
        defer { try? FileManager.default.removeItem(atPath: directory) }
        try await ClusterHarness.with(nodes: 0, natsConfig: file, clusterName: clusterName) { cluster in
            let port = try natsPort(cluster)
            let url = "nats://node:node-pw@127.0.0.1:\(port)"
            for id in ["n1", "n2"] { try await cluster.startNode(id, nats: url) }
            let leader = try await cluster.agreedLeader()
            let client = try await subscribedClient(try cluster.url(leader == "n1" ? "n2" : "n1"), "Q.AAPL")
            let reader = try await natsClient("nats://reader:reader-pw@127.0.0.1:\(port)", name: "reader")
            let subjects = try ClusterSubjects(cluster: clusterName, market: "stocks")
            reader.publish(subjects.subject(for: Topic(eventType: "Q", ticker: "AAPL")!), #"{"ev":"Q","sym":"AAPL","forged":1}"#)
            try await eventually("NATS to refuse the reader's publish") { reader.lastError?.lowercased().contains("permi") == true }
            #expect(try await client.nextEvents(20).allSatisfy { !$0.json.contains("forged") })
            await client.close()
            await reader.close()
        }
    }
}

@Suite("Cluster settings")
struct ClusterSettingsTests {
    @Test func securitySettingsFollowFlagEnvironmentFile() async throws {
        let directory = try scratchDirectory("cluster-settings")
        defer { try? FileManager.default.removeItem(atPath: directory) }
        for name in ["file-ca.pem", "env-ca.pem", "flag-ca.pem", "node.creds", "node.nk", "cert.pem", "key.pem"] {
            try "x".write(toFile: "\(directory)/\(name)", atomically: true, encoding: .utf8)
        }
        let file = "\(directory)/relay.yaml"
        try """
        cluster:
          url: tls://u:file-secret@nats.example:4222
          tlsCA: \(directory)/file-ca.pem
          tlsCert: \(directory)/cert.pem
          tlsKey: \(directory)/key.pem
          credentials: \(directory)/node.creds
          token: file-token
          maxTopicsPerNode: 500
          maxTopics: 700
        """.write(toFile: file, atomically: true, encoding: .utf8)
        let settings = try await RelaySettings.resolve(
            vendors: Relay.vendors,
            commandLine: ["--config", file, "--cluster-tls-ca", "\(directory)/flag-ca.pem"],
            environment: [
                "RELAY_CLUSTER_TLS_CA": "\(directory)/env-ca.pem", "RELAY_CLUSTER_NKEY_SEED": "\(directory)/node.nk",
                "RELAY_CLUSTER_TOKEN": "env-token",
            ])
        let cluster = try #require(settings.cluster)
        #expect(cluster.servers == ["tls://u:file-secret@nats.example:4222"])
        #expect(cluster.displayServers == "tls://***@nats.example:4222")
        #expect(cluster.security.caFile == "\(directory)/flag-ca.pem", "flag over environment over file")
        #expect(cluster.security.nkeySeedFile == "\(directory)/node.nk")
        #expect(cluster.security.credentialsFile == "\(directory)/node.creds")
        #expect(cluster.security.certificateFile == "\(directory)/cert.pem" && cluster.security.keyFile == "\(directory)/key.pem")
        #expect(cluster.security.token == "env-token")
        #expect(cluster.maxTopicsPerNode == 500 && cluster.maxTopics == 700)
    }

    @Test func badClusterSettingsAreRefusedWithoutShowingSecrets() async throws {
        do {
            _ = try await RelaySettings.resolve(vendors: Relay.vendors, commandLine: ["--cluster", "http://u:hidden-pw@h:1"], environment: [:])
            Issue.record("an http:// cluster URL was accepted")
        } catch {
            #expect("\(error)".contains("http://***@h:1") && !"\(error)".contains("hidden-pw"), "\(error)")
        }
        await #expect(throws: RelaySettings.InvalidSetting.self) {
            _ = try await RelaySettings.resolve(vendors: Relay.vendors, commandLine: ["--cluster", "nats://h:1", "--cluster-tls-ca", "/nonexistent/ca.pem"], environment: [:])
        }
    }
}

/// Occupies every thread of the cooperative pool (one blocking task per core, at least two) until `end`.
func blockCooperativePool(until end: ContinuousClock.Instant) async {
    await withTaskGroup(of: Void.self) { group in
        for _ in 0..<max(ProcessInfo.processInfo.activeProcessorCount, 2) {
            group.addTask { while ContinuousClock.now < end { usleep(5_000) } }
        }
    }
}

/// Decentralised NATS auth (operator, account, user JWTs), made here the way `nsc` makes it, since
/// Debian's nats-server ships neither `nsc` nor `nk`: Ed25519 keys, NKey encoding, JWTs signed by their
/// issuer.
struct NATSAccounts {
    struct Key {
        let privateKey = Curve25519.Signing.PrivateKey()
        let prefix: UInt8
        var publicKey: String { NKey.encode(prefix: [prefix], privateKey.publicKey.rawRepresentation) }
    }

    let operatorKey = Key(prefix: 14 << 3)
    let accountKey = Key(prefix: 0)
    /// The server's own account (JetStream needs one in operator mode).
    let systemKey = Key(prefix: 0)
    let userKey = Key(prefix: 20 << 3)

    static func base64URL(_ data: some DataProtocol) -> String {
        Data(data).base64EncodedString().replacingOccurrences(of: "+", with: "-").replacingOccurrences(of: "/", with: "_")
            .replacingOccurrences(of: "=", with: "")
    }

    /// A JWT of `claims` (the `nats` section) about `subject`, signed by `issuer`.
    func jwt(subject: Key, issuer: Key, name: String, nats: [String: Any]) throws -> String {
        let header = Self.base64URL(Data(#"{"typ":"JWT","alg":"ed25519-nkey"}"#.utf8))
        let claims: [String: Any] = [
            "jti": UUID().uuidString, "iat": Int(Date().timeIntervalSince1970), "iss": issuer.publicKey, "name": name,
            "sub": subject.publicKey, "nats": nats,
        ]
        let body = Self.base64URL(try JSONSerialization.data(withJSONObject: claims, options: [.sortedKeys]))
        let signature = try issuer.privateKey.signature(for: Data("\(header).\(body)".utf8))
        return "\(header).\(body).\(Self.base64URL(signature))"
    }

    /// The server's configuration (operator mode, the account preloaded) and the user's `.creds` file.
    func write(to directory: String) throws -> (config: String, creds: String) {
        let operatorJWT = try jwt(subject: operatorKey, issuer: operatorKey, name: "op", nats: ["type": "operator", "version": 2])
        let unlimited: [String: Any] = [
            "subs": -1, "data": -1, "payload": -1, "imports": -1, "exports": -1, "wildcards": true, "conn": -1, "leaf": -1,
            "mem_storage": -1, "disk_storage": -1, "streams": -1, "consumer": -1,
        ]
        let accountJWT = try jwt(
            subject: accountKey, issuer: operatorKey, name: "relay",
            nats: ["limits": unlimited, "default_permissions": ["pub": [:], "sub": [:]], "type": "account", "version": 2])
        let systemJWT = try jwt(
            subject: systemKey, issuer: operatorKey, name: "SYS", nats: ["limits": ["conn": -1], "type": "account", "version": 2])
        let userJWT = try jwt(
            subject: userKey, issuer: accountKey, name: "node",
            nats: ["pub": [:], "sub": [:], "subs": -1, "data": -1, "payload": -1, "type": "user", "version": 2])
        try operatorJWT.write(toFile: directory + "/operator.jwt", atomically: true, encoding: .utf8)
        let config = directory + "/nats.conf"
        try """
        operator: "\(directory)/operator.jwt"
        resolver: MEMORY
        system_account: \(systemKey.publicKey)
        resolver_preload: { \(accountKey.publicKey): "\(accountJWT)", \(systemKey.publicKey): "\(systemJWT)" }
        """.write(toFile: config, atomically: true, encoding: .utf8)
        let creds = directory + "/node.creds"
        try """
        -----BEGIN NATS USER JWT-----
        \(userJWT)
        ------END NATS USER JWT------

        ************************* IMPORTANT *************************
        NKEY Seed printed below can be used to sign and prove identity.

        -----BEGIN USER NKEY SEED-----
        \(NKey.userSeed(userKey.privateKey.rawRepresentation))
        ------END USER NKEY SEED------
        """.write(toFile: creds, atomically: true, encoding: .utf8)
        return (config, creds)
    }
}

@Suite(
    "Cluster on NATS: a credentials file", .timeLimit(.minutes(2)),
    .enabled(if: ClusterHarness.enabled, "nats-server is not installed (scripts/test installs it)"))
struct ClusterCredentialsFileTests {
    @Test func aUserCredentialsFileAuthenticatesAgainstAnOperatorModeServer() async throws {
        let directory = try scratchDirectory("nats-accounts")
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let (config, creds) = try NATSAccounts().write(to: directory)
        try await ClusterHarness.with(nodes: 0, natsConfig: config) { cluster in
            try await cluster.startNode("n1", extra: ["--no-portfolio", "--cluster-credentials", creds])
            _ = try await cluster.agreedLeader()
            // Without the credentials the server refuses the node.
            try await cluster.startNode("n2")
            #expect(try await cluster.cluster(of: "n2")["nats"] as? String != "connected")
        }
    }
}
