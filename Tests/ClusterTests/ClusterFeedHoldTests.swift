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

    /// A node's feed on a real nats-server, in the vouched term `t1` with its first event through, a
    /// subscriber of AAPL read all along, and a publisher.
    final class Rig: Sendable {
        let nats: NATSServerProcess
        let connection: NATSConnection
        let publisher: NATSConnection
        let subjects: ClusterSubjects
        let hub: MarketDataHub
        let metrics: TestMetrics
        let feed: ClusterFeed
        let running: Task<Void, Never>
        let reader: Task<Void, Never>
        let received = Received()
        /// What the subscriber had been sent once the term was taken.
        let settled: Int

        init(
            _ test: ClusterFeedHoldTests, epochHoldLimit: Duration, holdBounds: (events: Int, controls: Int)? = nil,
            controlRate: (perSecond: Int, burst: Int) = ClusterFeed.controlRate
        ) async throws {
            nats = try NATSServerProcess()
            let url = try await nats.start()
            connection = try await connectedNATS(url, name: "feed")
            publisher = try await connectedNATS(url, name: "publisher")
            subjects = try ClusterSubjects(cluster: "hold\(UInt16.random(in: 0...UInt16.max))", market: "stocks")
            hub = MarketDataHub(wire: .polygon, adoptsPositions: true)
            let subscription = await hub.subscribe(to: [test.apple])
            metrics = TestMetrics()
            feed = ClusterFeed(
                connection: connection, subjects: subjects, node: "n1", hub: hub, metrics: ClusterMetrics(factory: metrics),
                logger: Logger(label: "feed"), check: EventCheck(market: subjects.wireMarket, wire: hub.wire, maxBytes: ClusterChecks.maxEventBytes),
                epochHoldLimit: epochHoldLimit,
                holdBounds: holdBounds ?? (ClusterFeed.maxQueuedEvents, SourceInbox.maxControlMessages), controlRate: controlRate,
                holder: { _ in nil }, lastValues: { _ in nil })
            feed.start()
            running = Task { [feed] in await feed.run() }
            feed.setWanted { [test.apple] }
            feed.leaseRead(term: "t1", askedAt: ContinuousClock.now)
            let events = subscription.events
            reader = Task { [received] in for await event in events { received.texts.withLock { $0.append(String(buffer: event.bytes)) } } }
            // Vouched for: taken at once (published until the feed's subscription is in place).
            let start = ContinuousClock.now
            while !received.texts.withLock({ $0.contains { $0.contains(#""ev":"Q""#) } }) {
                try #require(ContinuousClock.now - start < .seconds(10), "the vouched epoch's events arrive")
                #expect(publisher.publish(subjects.upstreamControl, "epoch:t1"))
                #expect(publisher.publish(subjects.subject(for: test.apple), test.quote(0)))
                try await Task.sleep(for: .milliseconds(100))
            }
            // Its first events may have come before the feed's subscription to the leader's notices was
            // in place, its epoch lost with them: told again until it is taken.
            let epochStart = ContinuousClock.now
            while hub.epoch != "t1" {
                try #require(ContinuousClock.now - epochStart < .seconds(10), "the vouched epoch taken within 10 s")
                #expect(publisher.publish(subjects.upstreamControl, "epoch:t1"))
                try await Task.sleep(for: .milliseconds(100))
            }
            settled = received.texts.withLock { $0.count }
        }

        /// Everything the subscriber was sent since the term was taken.
        func sent() -> [String] { Array(received.texts.withLock { $0 }.dropFirst(settled)) }

        func stop() async {
            reader.cancel()
            feed.stop()
            await running.value
            await connection.close()
            await publisher.close()
            await nats.stop()
        }
    }

    @Test func aMadeUpEpochIsRefusedAtTheNextReadAndANewTermsIsTakenWithTheEventsBehindEachInOrder() async throws {
        let rig = try await Rig(self, epochHoldLimit: .seconds(60))
        let (publisher, subjects, hub, feed, metrics) = (rig.publisher, rig.subjects, rig.hub, rig.feed, rig.metrics)
        func quotes() -> [String] { rig.sent().filter { $0.contains(#""ev":"Q""#) } }
        // Made up: held with the events behind it until a read asked after it, then refused.
        #expect(publisher.publish(subjects.upstreamControl, "epoch:forged"))
        #expect(publisher.publish(subjects.subject(for: apple), quote(1001)))
        #expect(publisher.publish(subjects.subject(for: apple), quote(1002)))
        try await holding(feed)
        feed.leaseRead(term: "t1", askedAt: ContinuousClock.now)
        try await until("the held events") { quotes().contains { $0.contains("1002") } }
        let afterForged = quotes().filter { !$0.contains(#""n":0"#) }
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
        await rig.stop()
    }

    /// Past its bounds, what comes while an epoch is held is dropped, counted, and told in place: before
    /// the next message kept, or at the end. With no lease read after it, a hold ends at its limit and
    /// everything is taken as it came (the node cannot tell).
    @Test func whatIsPastAHoldsBoundsIsDroppedAndToldInPlaceAndAHoldEndsAtItsLimit() async throws {
        let rig = try await Rig(self, epochHoldLimit: .milliseconds(1500), holdBounds: (events: 50, controls: 10))
        let (publisher, subjects, hub, feed, metrics) = (rig.publisher, rig.subjects, rig.hub, rig.feed, rig.metrics)
        func texts() -> [String] { rig.sent() }
        // Held: the made-up epoch and nine refusals (ten controls), three more dropped; then fifty
        // events, five more dropped.
        #expect(publisher.publish(subjects.upstreamControl, "epoch:forged"))
        let refusal = try #require(ClusterControl.refused(topics: [Topic(eventType: "Q", ticker: "NOBODY")!], code: 405, reason: "held").messages.first)
        for _ in 0..<12 { #expect(publisher.publish(subjects.upstreamControl, refusal)) }
        try await until("the controls held and dropped") { feed.heldCounts.map { $0.controls == 10 && $0.droppedControls == 3 } ?? false }
        for n in 1...55 { #expect(publisher.publish(subjects.subject(for: apple), quote(1000 + n))) }
        try await until("the events held and dropped") { feed.heldCounts.map { $0.events == 50 && $0.droppedEvents == 5 } ?? false }
        feed.leaseRead(term: "t1", askedAt: ContinuousClock.now)
        try await until("the dropped events told") { texts().contains { $0.contains("held more events than it may") } }
        #expect(hub.epoch == "t1", "the made-up epoch refused")
        let after = texts()
        let quotes = after.filter { $0.contains(#""ev":"Q""#) }
        #expect(quotes.count == 50 && quotes.first?.contains(#""n":1001"#) == true && quotes.last?.contains(#""n":1050"#) == true, "\(quotes.count)")
        let controlsTold = try #require(after.firstIndex { $0.contains("3 control messages were dropped") }, "\(after.prefix(3))")
        let firstQuote = try #require(after.firstIndex { $0.contains(#""n":1001"#) })
        let eventsTold = try #require(after.firstIndex { $0.contains("held more events than it may") })
        #expect(controlsTold < firstQuote && firstQuote < eventsTold, "each told where its messages were dropped")
        #expect(metrics.counterTotal(label: "relay_cluster_nats_dropped_total", dimensions: [("reason", "epoch_held")]) == 8)
        // No read after it: at its limit the hold is taken as it came, the epoch with it.
        #expect(publisher.publish(subjects.upstreamControl, "epoch:unread"))
        try await holding(feed)
        #expect(publisher.publish(subjects.subject(for: apple), quote(2001)))
        try await until("the hold taken at its limit") { hub.epoch == "unread" }
        try await until("the event behind it") { texts().contains { $0.contains(#""n":2001"#) } }
        #expect(!feed.holdsAnEpoch)
        await rig.stop()
    }

    /// A publisher flooding the control subject: past the node's control rate the messages are dropped
    /// before they are read, counted, and the clients told once (at most once a second), not a pass over
    /// them per message; once the rate has refilled, the leader's next message is taken.
    @Test func controlMessagesPastTheRateAreDroppedAndToldOnce() async throws {
        let rig = try await Rig(self, epochHoldLimit: .seconds(60), controlRate: (perSecond: 2, burst: 40))
        let (publisher, subjects, metrics) = (rig.publisher, rig.subjects, rig.metrics)
        func dropped() -> Int64 { metrics.counterTotal(label: "relay_cluster_nats_dropped_total", dimensions: [("reason", "control_rate")]) }
        // What does not read is counted, and takes no place of the leader's word.
        func rejected() -> Int64 { metrics.counterTotal(label: "relay_cluster_rejected_total", dimensions: [("kind", "control")]) }
        let rejectedBefore = rejected()
        for _ in 0..<100 { #expect(publisher.publish(subjects.upstreamControl, "loss:none")) }
        try await until("the messages that do not read counted") { rejected() - rejectedBefore == 100 }
        #expect(dropped() == 0)
        // Another node's `forgotten` costs this node's clients nothing (outages and losses have a rate of
        // their own within this one).
        let forgotten = try #require(ClusterControl.forgotten(node: "another").messages.first)
        for _ in 0..<200 { #expect(publisher.publish(subjects.upstreamControl, forgotten)) }
        // Forty at most taken (fewer: the rig's own epochs took some), the rest dropped.
        try await until("the flood dropped past the rate") { dropped() >= 160 }
        let told = rig.sent().filter { $0.contains("faster than this relay node takes them (2 a second)") }
        #expect(told.count == 1, "told once: \(told)")
        #expect(dropped() < 200, "the first ones were taken")
        // Refilled (a token every half second), the node takes the leader's word again.
        try await until("a control message taken after the flood") {
            _ = publisher.publish(subjects.upstreamControl, "loss:4321")
            return rig.sent().contains { $0.contains("4321 events were lost") }
        }
        await rig.stop()
    }

    /// Word of an outage or a loss costs a notice to every client (an outage between events also a
    /// history break and a fill ask): past their own rate, within the control messages', they are
    /// dropped, counted and told once a second, so a publisher of `down:` costs each client a few
    /// notices a second, not a hundred.
    @Test func outagesAndLossesPastTheirOwnRateAreDroppedAndTold() async throws {
        let rig = try await Rig(self, epochHoldLimit: .seconds(60))
        let (publisher, subjects, metrics) = (rig.publisher, rig.subjects, rig.metrics)
        func dropped() -> Int64 { metrics.counterTotal(label: "relay_cluster_nats_dropped_total", dimensions: [("reason", "notice_rate")]) }
        // Each outage between events: without the rate, every one would reach the subscriber.
        for index in 1...60 {
            #expect(publisher.publish(subjects.upstreamControl, "down:forged outage \(index)"))
            #expect(publisher.publish(subjects.subject(for: apple), quote(index)))
        }
        try await until("the last event through") { rig.sent().contains { $0.contains(#""n":60"#) } }
        let outages = rig.sent().filter { $0.contains("forged outage") }
        #expect(outages.count <= ClusterFeed.noticeRate.burst + 2 * ClusterFeed.noticeRate.perSecond, "\(outages.count) outages told")
        #expect(dropped() >= 60 - Int64(outages.count) - 2, "\(dropped()) dropped")
        let told = rig.sent().filter { $0.contains("outages and losses came faster than this relay node takes it") }
        #expect((1...3).contains(told.count), "told once a second: \(told.count)")
        await rig.stop()
    }
}
