import Foundation
import Logging
import MarketCore
import MarketDataHub
import MetricsTestKit
import NIOCore
import PolygonWire
import RelayBench
import RelayTestSupport
import Synchronization
import Testing

@testable import Cluster

/// A node's feed against a real nats-server: an epoch the lease does not vouch for is held with what
/// follows it, in order, until a lease read asked after it says whose it is.
@Suite(
    "Cluster feed: epochs the lease does not hold", .serialized, .timeLimit(.minutes(2)),
    .enabled(
        if: NATSServerProcess.binary != nil || ProcessInfo.processInfo.environment["RELAY_REQUIRE_NATS"] == "1",
        "nats-server is not installed (scripts/test installs it)"))
struct ClusterFeedHoldTests {
    let apple = Topic(eventType: "Q", ticker: "AAPL")!

    func quote(_ n: Int) -> String { #"{"ev":"Q","sym":"AAPL","n":\#(n)}"# }

    /// What a subscriber was sent, as text.
    final class Received: Sendable {
        let texts = Mutex<[String]>([])
    }

    /// Waits (5 s at most) until `condition` holds.
    func until(_ what: String, _ condition: () -> Bool) async throws {
        let deadline = ContinuousClock.now + .seconds(5)
        while !condition() {
            try #require(ContinuousClock.now < deadline, "\(what) within 5 s")
            try await Task.sleep(for: .milliseconds(10))
        }
    }

    /// Waits (5 s at most) until `feed` holds an epoch.
    func holding(_ feed: ClusterFeed) async throws {
        let deadline = ContinuousClock.now + .seconds(5)
        while !feed.holdsAnEpoch {
            try #require(ContinuousClock.now < deadline, "the feed to hold the epoch within 5 s")
            try await Task.sleep(for: .milliseconds(10))
        }
    }

    @Test func aMadeUpEpochIsRefusedAtTheNextReadAndANewTermsIsTakenWithTheEventsBehindEachInOrder() async throws {
        let nats = try NATSServerProcess()
        let url = try await nats.start()
        let connection = try await connectedNATS(url, name: "feed")
        let publisher = try await connectedNATS(url, name: "publisher")
        let subjects = try ClusterSubjects(cluster: "hold\(UInt16.random(in: 0...UInt16.max))", market: "stocks")
        let hub = MarketDataHub(wire: .polygon, adoptsPositions: true)
        let subscription = await hub.subscribe(to: [apple])
        let metrics = TestMetrics()
        let feed = ClusterFeed(
            connection: connection, subjects: subjects, node: "n1", hub: hub, metrics: ClusterMetrics(factory: metrics),
            logger: Logger(label: "feed"), epochHoldLimit: .seconds(60), holder: { _ in nil }, lastValues: { _ in nil })
        feed.start()
        let running = Task { await feed.run() }
        feed.setWanted { [apple] }
        feed.leaseRead(term: "t1", askedAt: ContinuousClock.now)
        // What the subscriber is sent, read by one reader all along.
        let received = Received()
        let events = subscription.events
        let reader = Task { for await event in events { received.texts.withLock { $0.append(String(buffer: event.bytes)) } } }
        func quotes() -> [String] { received.texts.withLock { $0.filter { $0.contains(#""ev":"Q""#) } } }
        // Vouched for: taken at once (published until the feed's subscription is in place).
        let start = ContinuousClock.now
        while quotes().isEmpty {
            try #require(ContinuousClock.now - start < .seconds(10), "the vouched epoch's events arrive")
            #expect(publisher.publish(subjects.upstreamControl, "epoch:t1"))
            #expect(publisher.publish(subjects.subject(for: apple), quote(0)))
            try await Task.sleep(for: .milliseconds(100))
        }
        // (Its first events may have come before the feed's subscription to the leader's notices.)
        try await until("the vouched epoch taken") { hub.epoch == "t1" }
        let settled = quotes().count
        // Made up: held with the events behind it until a read asked after it, then refused.
        #expect(publisher.publish(subjects.upstreamControl, "epoch:forged"))
        #expect(publisher.publish(subjects.subject(for: apple), quote(1001)))
        #expect(publisher.publish(subjects.subject(for: apple), quote(1002)))
        try await holding(feed)
        feed.leaseRead(term: "t1", askedAt: ContinuousClock.now)
        try await until("the held events") { quotes().contains { $0.contains("1002") } }
        let afterForged = quotes().dropFirst(settled).filter { !$0.contains(#""n":0"#) }
        #expect(afterForged.map { $0.contains("1001") ? 1 : $0.contains("1002") ? 2 : 0 } == [1, 2], "in order: \(afterForged)")
        #expect(hub.epoch == "t1", "a made-up epoch is not taken")
        #expect(metrics.counterTotal(label: "relay_cluster_rejected_total", dimensions: [("kind", "control")]) >= 1)
        // A new term's: held until the lease shows it, then taken where it came, its events after it.
        #expect(publisher.publish(subjects.upstreamControl, "epoch:t2"))
        #expect(publisher.publish(subjects.subject(for: apple), quote(2001)))
        try await holding(feed)
        let beforeRead = ContinuousClock.now
        feed.leaseRead(term: "t2", askedAt: ContinuousClock.now)
        try await until("the new term's event") { quotes().contains { $0.contains("2001") } }
        #expect(hub.epoch == "t2")
        // A slow read asked before the last one told says nothing: t1 stays ended, its late epoch stale.
        feed.leaseRead(term: "t1", askedAt: beforeRead - .milliseconds(1))
        #expect(publisher.publish(subjects.upstreamControl, "epoch:t1"))
        #expect(publisher.publish(subjects.subject(for: apple), quote(3001)))
        try await until("the event after the late epoch") { quotes().contains { $0.contains("3001") } }
        #expect(hub.epoch == "t2", "an ended term's late epoch is stale")
        #expect(!feed.holdsAnEpoch)
        reader.cancel()
        feed.stop()
        await running.value
        await connection.close()
        await publisher.close()
        await nats.stop()
    }
}
