import Foundation
import MetricsTestKit
import NIOCore
import PolygonWire
import Synchronization
import Testing

@testable import MarketDataHub

private func fields(_ event: MarketEvent) -> [String: Any] {
    (try? JSONSerialization.jsonObject(with: Data(event.bytes.readableBytesView))) as? [String: Any] ?? [:]
}

/// A trade with Polygon's `q`, as the upstream (or a fill, flagged) would send it.
private func trade(_ q: Int, recovered: Bool = false) -> MarketEvent {
    MarketEvent(eventType: "T", ticker: "AAPL", bytes: ByteBuffer(string: #"{"ev":"T","sym":"AAPL","p":1,"q":\#(q)\#(recovered ? #","_r":1"# : "")}"#))
}

/// The hub's side of the gap fill: the request after an outage, recovered events bounded by the first
/// live one and delivered to named holders only, and the `recovered` status.
@Suite("Hub: gap fill")
struct GapFillHubTests {
    @Test func aRecoveryAsksForTheNamedTopicsAndRecoveredEventsGoToTheirHoldersUpToTheFirstLiveOne() async throws {
        let hub = MarketDataHub(wire: .polygon, history: nil)
        let requests = Mutex<[GapFillRequest]>([])
        await hub.setRecoveryHandler { request in requests.withLock { $0.append(request) } }
        let named = await hub.subscribe(to: topics("T.AAPL"))
        let wildcard = await hub.subscribe(to: topics("T.*"))
        await hub.publish([trade(10)])
        await hub.upstreamLost(reason: "test")
        // Back: the first live trade is q 15, so a fill may bring 11…14 and nothing from 15 on.
        await hub.publish([trade(15)])
        let request = try #require(requests.withLock { $0.first })
        #expect(request.topics.map(\.topic.description) == ["T.AAPL"], "named topics only")
        #expect(PolygonWireProtocol().orderValue(.sequence, of: try #require(request.topics.first?.lastBefore)) == 10)
        let delivered = await hub.deliverRecovered(
            Topic(parsing: "T.AAPL")!, (11...16).map { trade($0, recovered: true) }, order: .sequence)
        #expect(delivered == 4)
        var summary = GapFillSummary(from: request.from, through: request.through)
        summary.recovered[Topic(parsing: "T.AAPL")!] = delivered
        await hub.announceRecovered(summary, generation: request.generation)
        await hub.publish([trade(16)])

        // The named holder: 10, the loss, the reconnect and live 15, recovered 11…14, the status, live 16.
        let got = try await take(10, from: named.events)
        #expect(got.compactMap { fields($0)["q"] as? Int } == [10, 15, 11, 12, 13, 14, 16], "\(got.map(\.json))")
        #expect(got.filter { fields($0)["_r"] as? Int == 1 }.count == 4)
        #expect(
            got.compactMap { fields($0)["status"] as? String } == ["upstream_disconnected", "upstream_reconnected", "recovered"],
            "\(got.map(\.json))")
        let status = try #require(got.last { fields($0)["status"] as? String == "recovered" })
        #expect((fields(status)["topics"] as? [String: Int]) == ["T.AAPL": 4] && fields(status)["complete"] as? Bool == true)
        // The wildcard holder: 10, the notices, 15, 16; nothing recovered.
        let wild = try await take(5, from: wildcard.events)
        #expect(wild.compactMap { fields($0)["q"] as? Int } == [10, 15, 16], "\(wild.map(\.json))")
        #expect(wild.allSatisfy { fields($0)["_r"] == nil && fields($0)["status"] as? String != "recovered" })
        let counts = await hub.gapFillStatistics
        #expect(counts.fills == 1 && counts.recovered == 4 && counts.last?.complete == true)
    }

    @Test func anOutageBeforeTheLastFillEndedIsFilledWithItForTheUnionOfBothAndNothingArrivesTwice() async throws {
        let hub = MarketDataHub(wire: .polygon, history: nil)
        let requests = Mutex<[GapFillRequest]>([])
        await hub.setRecoveryHandler { request in requests.withLock { $0.append(request) } }
        let named = await hub.subscribe(to: topics("T.AAPL"))
        await hub.publish([trade(10)])
        await hub.upstreamLost(reason: "one")
        await hub.publish([trade(15), trade(16)])
        // The first fill is cut short (a cluster leader died) before it delivered anything.
        await hub.upstreamLost(reason: "two")
        await hub.publish([trade(20)])
        let (first, second) = try #require(requests.withLock { $0.count == 2 ? ($0[0], $0[1]) : nil })
        #expect(second.from == first.from && second.through >= first.through, "the union of both windows")
        #expect(PolygonWireProtocol().orderValue(.sequence, of: try #require(second.topics.first?.lastBefore)) == 10, "from before the first outage")
        // The whole union window, twice (a retry): only what fell in the two outages, once.
        let topic = Topic(parsing: "T.AAPL")!
        #expect(await hub.deliverRecovered(topic, (11...22).map { trade($0, recovered: true) }, order: .sequence) == 7)
        #expect(await hub.deliverRecovered(topic, (11...22).map { trade($0, recovered: true) }, order: .sequence) == 0)
        var summary = GapFillSummary(from: second.from, through: second.through)
        summary.recovered[topic] = 12
        await hub.announceRecovered(summary, generation: second.generation)
        // The first request's end, late: its gap is settled already, nobody is told again.
        await hub.announceRecovered(GapFillSummary(from: first.from, through: first.through), generation: first.generation)
        await hub.publish([trade(21)])

        let got = try await take(17, from: named.events)
        #expect(got.compactMap { fields($0)["q"] as? Int } == [10, 15, 16, 20, 11, 12, 13, 14, 17, 18, 19, 21], "\(got.map(\.json))")
        let statuses = got.compactMap { fields($0)["status"] as? String }
        #expect(statuses.filter { $0 == "recovered" }.count == 1, "\(statuses)")
        let status = try #require(got.last { fields($0)["status"] as? String == "recovered" })
        #expect((fields(status)["topics"] as? [String: Int]) == ["T.AAPL": 7], "what this hub delivered, not what was fetched")
        #expect(await hub.gapFillStatistics.recovered == 7)
    }

    @Test func aClusterNodeKeepsEveryRecoveredEventUnderTheLeadersPositionsAndDeliversOnlyInItsOwnGaps() async throws {
        let hub = MarketDataHub(wire: .polygon, adoptsPositions: true)
        await hub.startEpoch("leader1")
        await hub.setRecoveryHandler { _ in }
        let named = await hub.subscribe(to: topics("T.AAPL"))
        let positioned = { (events: [MarketEvent], first: UInt64, market: UInt64) in
            EventPosition.stamp(events, events.indices.map { EventPosition(topic: first + UInt64($0), market: market + UInt64($0)) })
        }
        await hub.publish(positioned([trade(10)], 1, 1))
        // This node had no outage: another node's fill reaches it, enters its history, goes to nobody.
        #expect(await hub.deliverRecovered(Topic(parsing: "T.AAPL")!, positioned((11...12).map { trade($0, recovered: true) }, 2, 2), order: .sequence) == 0)
        #expect(await hub.historyStatistics?.events == 3)
        await hub.publish(positioned([trade(13)], 4, 4))
        let got = try await take(2, from: named.events)
        #expect(got.compactMap { fields($0)["q"] as? Int } == [10, 13])
        #expect(got.allSatisfy { fields($0)["_r"] == nil })
        // The topic's run stayed whole: a resume from its first position replays the recovered ones too.
        let resumed = await hub.subscribe()
        await hub.add(Array(topics("T.AAPL")), to: resumed.id, resuming: .positions(epoch: "leader1", [Topic(parsing: "T.AAPL")!: 1]))
        let replay = try await take(4, from: resumed.events)
        #expect(replay.compactMap { fields($0)["q"] as? Int } == [11, 12, 13], "\(replay.map(\.json))")
    }

    /// A cluster node keeps in its history only events past the newest it kept: after one that leapt
    /// ahead (a publisher's forged numbers), the real events are delivered live and not kept. That is
    /// counted for the operator, as are positions that leap too far, not lost in silence.
    @Test func eventsANodeDoesNotKeepAreCounted() async throws {
        let metrics = TestMetrics()
        let hub = MarketDataHub(wire: .polygon, history: HistoryLimits(), adoptsPositions: true, metricsFactory: metrics)
        await hub.startEpoch("leader1")
        let named = await hub.subscribe(to: topics("T.AAPL"))
        let at = { (q: Int, topic: UInt64, market: UInt64) in EventPosition.stamp([trade(q)], [EventPosition(topic: topic, market: market)]) }
        await hub.publish(at(1, 1, 1))
        await hub.publish(at(2, 2, 1_000_000))
        await hub.publish(at(3, 3, 2))
        await hub.publish(at(4, 4, 3))
        await hub.publish(at(5, 5, 1_000_001 + (1 << 33)))
        #expect(try await take(5, from: named.events).compactMap { fields($0)["q"] as? Int } == [1, 2, 3, 4, 5], "all delivered live")
        #expect(await hub.historyStatistics?.events == 2)
        let notKept = { (reason: String) in metrics.counterTotal(label: "relay_history_events_not_kept_total", dimensions: [("reason", reason)]) }
        #expect(notKept("out_of_order") == 2)
        #expect(notKept("implausible") == 1)
    }

    /// One forged event leaping far past the leader's numbers would make every real event after it "out
    /// of order" and a resume by market sequence "whole"; past what the lease says the leader stamped,
    /// by more than the margin, it is not kept, and the real events after it are.
    @Test func anEventFarPastWhatTheLeaderStampedIsNotKeptAndTheRealOnesAfterItAre() async throws {
        let metrics = TestMetrics()
        let hub = MarketDataHub(wire: .polygon, history: HistoryLimits(), adoptsPositions: true, metricsFactory: metrics)
        // Told before this node began the epoch: kept for it (another epoch's mark told before says nothing of it).
        await hub.leaderStamped(through: 1_000, epoch: "another", freshFor: .seconds(60))
        await hub.leaderStamped(through: 2, epoch: "leader1", freshFor: .seconds(60))
        await hub.startEpoch("leader1")
        #expect(await hub.leaderStampedThrough == 2)
        let named = await hub.subscribe(to: topics("T.AAPL"))
        let at = { (q: Int, topic: UInt64, market: UInt64) in EventPosition.stamp([trade(q)], [EventPosition(topic: topic, market: market)]) }
        let margin = EventHistory.minimumMarkMargin
        await hub.publish(at(1, 1, 1))
        await hub.publish(at(2, 2, 2 + margin + 1))  // forged: one past the margin
        await hub.publish(at(3, 2, 2 + margin - 1))
        await hub.publish(at(4, 3, 2 + margin))  // the furthest a real one may come
        #expect(try await take(4, from: named.events).compactMap { fields($0)["q"] as? Int } == [1, 2, 3, 4], "all delivered live")
        let notKept = { (reason: String) in metrics.counterTotal(label: "relay_history_events_not_kept_total", dimensions: [("reason", reason)]) }
        #expect(notKept("past_leader") == 1)
        #expect(notKept("out_of_order") == 0)
        #expect(await hub.historyStatistics?.events == 3)
        // The margin grows with what the leader stamps between marks (8 times), and a mark never goes back.
        await hub.leaderStamped(through: 1_000_000, epoch: "leader1", freshFor: .seconds(60))
        await hub.leaderStamped(through: 3_000_000, epoch: "leader1", freshFor: .seconds(60))
        await hub.leaderStamped(through: 5, epoch: "leader1", freshFor: .seconds(60))
        #expect(await hub.leaderStampedThrough == 3_000_000)
        await hub.publish(at(5, 4, 3_000_000 + 16_000_000))  // within 8 times the last step (2,000,000)
        await hub.publish(at(6, 5, 3_000_000 + 16_000_001))  // past it
        _ = try await take(2, from: named.events)
        #expect(await hub.historyStatistics?.events == 4)
        #expect(notKept("past_leader") == 2)
        // A word no longer fresh (this node's lease reads failing) refuses nothing.
        await hub.leaderStamped(through: 3_000_000, epoch: "leader1", freshFor: .seconds(-1))
        await hub.publish(at(7, 5, 3_000_000 + 16_000_002))
        _ = try await take(1, from: named.events)
        #expect(notKept("past_leader") == 2)
        #expect(await hub.historyStatistics?.events == 5)
    }

    @Test func aQuietTopicsNextFillStartsAfterWhatTheLastFillBrought() async throws {
        let hub = MarketDataHub(wire: .polygon, history: nil)
        let requests = Mutex<[GapFillRequest]>([])
        await hub.setRecoveryHandler { request in requests.withLock { $0.append(request) } }
        let named = await hub.subscribe(to: topics("T.AAPL"))
        let other = MarketEvent(eventType: "T", ticker: "MSFT", bytes: ByteBuffer(string: #"{"ev":"T","sym":"MSFT","p":1,"q":1}"#))
        let topic = Topic(parsing: "T.AAPL")!
        await hub.publish([trade(10)])
        await hub.upstreamLost(reason: "one")
        await hub.publish([other])  // back; AAPL stays quiet
        let first = try #require(requests.withLock { $0.last })
        #expect(await hub.deliverRecovered(topic, (11...14).map { trade($0, recovered: true) }, order: .sequence) == 4)
        await hub.announceRecovered(GapFillSummary(from: first.from, through: first.through), generation: first.generation)
        await hub.upstreamLost(reason: "two")
        await hub.publish([other])
        let second = try #require(requests.withLock { $0.last })
        #expect(PolygonWireProtocol().orderValue(.sequence, of: try #require(second.topics.first?.lastBefore)) == 14, "after what the first fill brought")
        #expect(await hub.deliverRecovered(topic, (11...16).map { trade($0, recovered: true) }, order: .sequence) == 2)
        await hub.announceRecovered(GapFillSummary(from: second.from, through: second.through), generation: second.generation)
        // 10, the first outage's two notices, 11…14, the second's two, 15 and 16: nothing twice.
        let got = try await take(11, from: named.events)
        #expect(got.compactMap { fields($0)["q"] as? Int } == [10, 11, 12, 13, 14, 15, 16], "\(got.map(\.json))")
    }

    /// A hub whose named holder of `T.AAPL` had trade 10, then an outage the upstream came back from
    /// with another ticker's trade, so AAPL's first live event after it has not come: the hub, the
    /// holder's subscription and the fill request.
    private func backWithAnotherTicker() async throws -> (MarketDataHub, HubSubscription, GapFillRequest) {
        let hub = MarketDataHub(wire: .polygon, history: nil)
        let requests = Mutex<[GapFillRequest]>([])
        await hub.setRecoveryHandler { request in requests.withLock { $0.append(request) } }
        let named = await hub.subscribe(to: topics("T.AAPL"))
        await hub.publish([trade(10)])
        await hub.upstreamLost(reason: "test")
        await hub.publish([MarketEvent(eventType: "T", ticker: "MSFT", bytes: ByteBuffer(string: #"{"ev":"T","sym":"MSFT","p":1,"q":1}"#))])
        return (hub, named, try #require(requests.withLock { $0.first }))
    }

    @Test func recoveredEventsWaitForTheTopicsFirstLiveEventSoOneStillOnItsWayLiveIsNotSentTwice() async throws {
        let (hub, named, request) = try await backWithAnotherTicker()
        let topic = Topic(parsing: "T.AAPL")!
        // AAPL's 15 and 16, stamped before the window's end, are still on their way live when the fill
        // brings 11…16.
        #expect(await hub.deliverRecovered(topic, (11...16).map { trade($0, recovered: true) }, order: .sequence) == 6)
        await hub.publish([trade(15)])
        await hub.publish([trade(16)])
        var summary = GapFillSummary(from: request.from, through: request.through)
        summary.recovered[topic] = 6
        await hub.announceRecovered(summary, generation: request.generation)
        await hub.publish([trade(17)])

        // 10, the two notices, recovered 11…14 ahead of live 15, 16, the status, 17: nothing twice.
        let got = try await take(11, from: named.events)
        #expect(got.compactMap { fields($0)["q"] as? Int } == [10, 11, 12, 13, 14, 15, 16, 17], "\(got.map(\.json))")
        #expect(got.filter { fields($0)["_r"] as? Int == 1 }.compactMap { fields($0)["q"] as? Int } == [11, 12, 13, 14])
        let status = try #require(got.last { fields($0)["status"] as? String == "recovered" })
        #expect((fields(status)["topics"] as? [String: Int]) == ["T.AAPL": 4], "what was delivered, not what was fetched")
        #expect(await hub.gapLedger.held == 0)
    }

    @Test func whatAFillBroughtForATopicThatStaysQuietIsDeliveredWhenTheFillEnds() async throws {
        let (hub, named, request) = try await backWithAnotherTicker()
        let topic = Topic(parsing: "T.AAPL")!
        #expect(await hub.deliverRecovered(topic, (11...12).map { trade($0, recovered: true) }, order: .sequence) == 2)
        #expect(await hub.gapLedger.held == 2)
        var summary = GapFillSummary(from: request.from, through: request.through)
        summary.recovered[topic] = 2
        await hub.announceRecovered(summary, generation: request.generation)
        let got = try await take(6, from: named.events)
        #expect(got.compactMap { fields($0)["q"] as? Int } == [10, 11, 12], "\(got.map(\.json))")
        #expect(fields(got[5])["status"] as? String == "recovered", "the status after the events it counts")
        #expect((fields(got[5])["topics"] as? [String: Int]) == ["T.AAPL": 2])
        #expect(await hub.gapLedger.held == 0)
    }

    /// A new leadership term: no live event of the old one will come to bound what a fill brought for a
    /// quiet topic, held so far; it goes out with the old term's positions before the new epoch's
    /// notice (every position a connection is sent after the notice is the new epoch's).
    @Test func recoveredEventsHeldWhenANewTermBeginsGoOutBeforeItsNotice() async throws {
        let hub = MarketDataHub(wire: .polygon, adoptsPositions: true)
        await hub.setRecoveryHandler { _ in }
        await hub.startEpoch("e1")
        let named = await hub.subscribe(to: topics("T.AAPL"))
        await hub.publish(EventPosition.stamp([trade(10)], [EventPosition(topic: 1, market: 1)]))
        await hub.upstreamLost(reason: "test")
        let msft = MarketEvent(eventType: "T", ticker: "MSFT", bytes: ByteBuffer(string: #"{"ev":"T","sym":"MSFT","p":1,"q":1}"#))
        await hub.publish(EventPosition.stamp([msft], [EventPosition(topic: 1, market: 4)]))
        let recovered = EventPosition.stamp(
            (11...12).map { trade($0, recovered: true) }, [EventPosition(topic: 2, market: 2), EventPosition(topic: 3, market: 3)])
        #expect(await hub.deliverRecovered(Topic(parsing: "T.AAPL")!, recovered, order: .sequence) == 2)
        #expect(await hub.gapLedger.held == 2, "AAPL's first live event has not come")
        await hub.startEpoch("e2")
        #expect(await hub.gapLedger.held == 0)

        let got = try await take(7, from: named.events)
        let kinds = got.map { (fields($0)["status"] as? String) ?? "q\(fields($0)["q"] as? Int ?? 0)" }
        #expect(
            kinds == ["q10", "upstream_disconnected", "upstream_reconnected", "q11", "q12", "upstream_disconnected", "epoch"],
            "the old term's recovered events before the new epoch's notice: \(kinds)")
        #expect(got.filter { fields($0)["_r"] as? Int == 1 }.compactMap { fields($0)["_s"] as? Int } == [2, 3], "with the old term's positions")
    }

    @Test func recoveredEventsForAConnectionThatHasAResumesWorthUnreadAreToldNotQueued() async throws {
        let hub = MarketDataHub(wire: .polygon, history: HistoryLimits(eventsPerResume: 10))
        let requests = Mutex<[GapFillRequest]>([])
        await hub.setRecoveryHandler { request in requests.withLock { $0.append(request) } }
        let named = await hub.subscribe(to: topics("T.AAPL"))
        let topic = Topic(parsing: "T.AAPL")!
        await hub.publish([trade(10)])
        await hub.upstreamLost(reason: "test")
        await hub.publish([trade(30)])
        // Two parts of a fill, never read: the first fits the bound, the second does not.
        #expect(await hub.deliverRecovered(topic, (11...18).map { trade($0, recovered: true) }, order: .sequence) == 8)
        #expect(await hub.deliverRecovered(topic, (19...26).map { trade($0, recovered: true) }, order: .sequence) == 8)
        #expect(named.queue.replaying.load(ordering: .relaxed) == 8)
        let got = try await take(13, from: named.events)
        #expect(got.compactMap { fields($0)["q"] as? Int } == [10, 30] + Array(11...18), "\(got.map(\.json))")
        let told = try #require(got.last)
        #expect(fields(told)["status"] as? String == "gap" && fields(told)["topic"] as? String == "T.AAPL")
        #expect((fields(told)["message"] as? String)?.contains("8 recovered events of the outage not sent") == true)
    }
}
