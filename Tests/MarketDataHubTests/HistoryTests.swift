import Foundation
import NIOCore
import AlpacaWire
import PolygonWire
import Synchronization
import Testing

@testable import MarketDataHub

/// The fields of one event or notice as JSON.
private func fields(_ event: MarketEvent) -> [String: Any] {
    (try? JSONSerialization.jsonObject(with: Data(event.bytes.readableBytesView))) as? [String: Any] ?? [:]
}

private func topic(_ text: String) -> Topic { Topic(parsing: text)! }

/// Events, positions, history and resumes on one hub.
@Suite("Hub history: positions and resumes")
struct HubHistoryTests {
    @Test func everyEventGetsAContiguousTopicSequenceAndMarketSequenceWrittenIntoItsBytes() async throws {
        let hub = MarketDataHub(wire: .polygon)
        let subscription = await hub.subscribe(to: topics("T.AAPL", "T.MSFT"))
        await hub.publish([event("T", "AAPL", 1), event("T", "MSFT", 1), event("T", "AAPL", 2)])
        let got = try await take(3, from: subscription.events)
        #expect(got.map { fields($0)["_s"] as? Int } == [1, 1, 2])
        #expect(got.map { fields($0)["_m"] as? Int } == [1, 2, 3])
        #expect(got.map { fields($0)["n"] as? Int } == [1, 1, 2], "the vendor's own fields are untouched")
        #expect(got.map(\.sequence) == [1, 2, 3])
        #expect(EventPosition.read(from: got[2].bytes) == EventPosition(topic: 2, market: 3))
    }

    @Test func aResumeByTopicPositionGetsExactlyTheMissedEventsThenResumedThenLive() async throws {
        let hub = MarketDataHub(wire: .polygon)
        await hub.publish((1...5).map { event("T", "AAPL", $0) })
        let subscription = await hub.subscribe()
        let outcome = await hub.add([topic("T.AAPL")], to: subscription.id, resuming: .positions(epoch: hub.epoch, [topic("T.AAPL"): 2]))
        #expect(outcome.replayed == [topic("T.AAPL"): 3])
        await hub.publish([event("T", "AAPL", 6)])
        let got = try await take(5, from: subscription.events)
        #expect(got.prefix(3).map { fields($0)["n"] as? Int } == [3, 4, 5])
        #expect(fields(got[3])["status"] as? String == "resumed")
        #expect((fields(got[3])["replayed"] as? [String: Int]) == ["T.AAPL": 3])
        #expect(fields(got[4])["n"] as? Int == 6, "live right after the seam, nothing doubled")
    }

    @Test func aWildcardResumesByMarketSequenceInArrivalOrder() async throws {
        let hub = MarketDataHub(wire: .polygon)
        // Held by someone, so the relay received every Q event.
        let holder = await hub.subscribe(to: topics("Q.*"))
        await hub.publish([event("Q", "A", 1), event("T", "A", 1), event("Q", "B", 2), event("Q", "A", 3)])
        let subscription = await hub.subscribe()
        await hub.add([topic("Q.*")], to: subscription.id, resuming: .positions(epoch: nil, [topic("Q.*"): 1]))
        _ = holder
        let got = try await take(3, from: subscription.events)
        #expect(got.prefix(2).map { fields($0)["n"] as? Int } == [2, 3])
        #expect(got.prefix(2).map(\.sequence) == [3, 4])
        #expect(fields(got[2])["status"] as? String == "resumed")
    }

    /// A wildcard's `gap` is followed by its type's last values, read from the entries of its type (the
    /// table keeps them by type as entries come and go), not a walk of the market's.
    @Test func aWildcardsGapIsFollowedByItsOwnTypesLastValuesOnly() async throws {
        let hub = MarketDataHub(wire: .polygon)
        let holder = await hub.subscribe(to: topics("Q.*", "T.*"))
        await hub.publish([event("Q", "A", 1), event("T", "A", 1), event("Q", "B", 2), event("T", "C", 3)])
        await hub.remove(topics("T.*"), from: holder.id)
        let subscription = await hub.subscribe()
        let outcome = await hub.add([topic("Q.*")], to: subscription.id, resuming: .positions(epoch: "another", [topic("Q.*"): 1]))
        #expect(outcome.gaps == [topic("Q.*")])
        let got = try await take(4, from: subscription.events)
        #expect(fields(got[0])["status"] as? String == "gap")
        #expect(got[1...2].map { "\($0.eventType).\($0.ticker)" }.sorted() == ["Q.A", "Q.B"], "\(got.map { "\($0.eventType).\($0.ticker)" })")
        #expect(fields(got[3])["status"] as? String == "resumed")
        _ = holder
    }

    @Test func aWildcardReadsItsOwnTypesSlotsAndTheyGoWithTheirs() {
        var limits = HistoryLimits()
        limits.eventsPerTopic = 3
        let history = EventHistory(limits: limits, epoch: "e")
        history.wanted(topic("Q.*"), now: 0)
        history.wanted(topic("T.*"), now: 0)
        for round in 1...10 { _ = history.keep([event("T", "A", round), event("Q", "B", round), event("Q", "C", round)], at: Int64(round)) }
        #expect(history.typeSlotCount == 30, "every slot, emptied ones too, until it leaves")
        // Each topic keeps its last 3 (rounds 8 to 10); round 7's C is market sequence 21.
        guard case .events(let quotes) = history.missed(topic("Q.*"), since: .market(21)) else {
            Issue.record("events expected")
            return
        }
        #expect(quotes.allSatisfy { $0.json.contains(#""ev":"Q""#) })
        #expect(quotes.map(\.sequence) == [23, 24, 26, 27, 29, 30])
        guard case .tooMany = history.missed(topic("Q.*"), since: .market(21), limit: 5) else {
            Issue.record("past the limit: too many")
            return
        }
        history.evict(now: 10_000_000)
        #expect(history.typeSlotCount == 0)
    }

    @Test func aResumeByTimeReplaysWhatArrivedSinceThen() async throws {
        let hub = MarketDataHub(wire: .polygon)
        await hub.publish([event("T", "AAPL", 1)])
        try await Task.sleep(for: .milliseconds(20))
        let since = WallClock.nowMilliseconds()
        try await Task.sleep(for: .milliseconds(5))
        await hub.publish([event("T", "AAPL", 2), event("T", "AAPL", 3)])
        let subscription = await hub.subscribe()
        await hub.add([topic("T.AAPL")], to: subscription.id, resuming: .time(milliseconds: since))
        let got = try await take(3, from: subscription.events)
        #expect(got.prefix(2).map { fields($0)["n"] as? Int } == [2, 3])
        #expect(fields(got[2])["status"] as? String == "resumed")
    }

    @Test func anEvictedRangeIsAGapThenTheLastValueNeverAPartialReplay() async throws {
        let hub = MarketDataHub(wire: .polygon, history: HistoryLimits(eventsPerTopic: 3))
        await hub.publish((1...10).map { event("T", "AAPL", $0) })
        let subscription = await hub.subscribe()
        let outcome = await hub.add([topic("T.AAPL")], to: subscription.id, resuming: .positions(epoch: nil, [topic("T.AAPL"): 2]))
        #expect(outcome.gaps == [topic("T.AAPL")])
        let got = try await take(3, from: subscription.events)
        let gap = fields(got[0])
        #expect(gap["status"] as? String == "gap")
        #expect(gap["topic"] as? String == "T.AAPL")
        #expect(gap["from"] as? Int == 3 && gap["through"] as? Int == 7, "\(gap)")
        #expect(fields(got[1])["n"] as? Int == 10, "then its last value")
        #expect(fields(got[2])["status"] as? String == "resumed")
    }

    @Test func aTopicNobodyHeldMeanwhileIsAGapNotASilentlyShortReplay() async throws {
        let hub = MarketDataHub(wire: .polygon)
        let first = await hub.subscribe(to: topics("T.AAPL"))
        await hub.publish((1...3).map { event("T", "AAPL", $0) })
        await hub.remove(first.id)
        // Nobody held it: the upstream was told to stop sending it, so what the market did meanwhile is unknown.
        await hub.publish([event("Q", "MSFT", 1)])
        let holder = await hub.subscribe(to: topics("T.AAPL"))
        await hub.publish([event("T", "AAPL", 9)])
        let back = await hub.subscribe()
        let outcome = await hub.add([topic("T.AAPL")], to: back.id, resuming: .positions(epoch: nil, [topic("T.AAPL"): 3]))
        #expect(outcome.gaps == [topic("T.AAPL")])
        _ = holder
    }

    @Test func aTaggedConnectionStartsWhereItsTopicsWereAddedNotWhereItAskedBefore() async throws {
        let hub = MarketDataHub(wire: .polygon)
        // The upstream sends T.AAPL before anyone holds it (as a feed that sends every symbol does).
        await hub.publish([event("T", "AAPL", 1)])
        let connection = await hub.subscribe()
        let asked = await hub.position
        let epoch = try #require(asked.epoch)
        // Another topic's event arrives between the two steps (any topic's moves the market sequence).
        await hub.publish([event("Q", "MSFT", 1)])
        let added = await hub.add([topic("T.AAPL")], to: connection.id)
        #expect(added.sequence == asked.sequence + 1 && added.epoch == asked.epoch)
        await hub.publish((2...4).map { event("T", "AAPL", $0) })
        await hub.park(connection.id)
        let early = await hub.subscribe()
        let fromAsked = await hub.add([topic("T.AAPL")], to: early.id, resuming: .marketSequence(epoch: epoch, asked.sequence))
        #expect(fromAsked.gaps == [topic("T.AAPL")], "T.AAPL was held whole only from when it was wanted: a `gap` from the earlier position")
        let back = await hub.subscribe()
        let fromAdded = await hub.add([topic("T.AAPL")], to: back.id, resuming: .marketSequence(epoch: epoch, added.sequence))
        #expect(fromAdded.gaps.isEmpty && fromAdded.replayed == [topic("T.AAPL"): 3], "every event since the topics were added")
    }

    @Test func aTopicAddedLaterResumesFromItsFloorNotFromTheSessionsPosition() async throws {
        let hub = MarketDataHub(wire: .polygon)
        // T.MSFT was received before anyone held it (its run starts again when it is wanted).
        await hub.publish([event("T", "MSFT", 1)])
        let connection = await hub.subscribe()
        let start = await hub.add([topic("T.AAPL")], to: connection.id)
        let epoch = try #require(start.epoch)
        await hub.publish([event("T", "AAPL", 1), event("Q", "NVDA", 1)])
        let later = await hub.add([topic("T.MSFT")], to: connection.id)
        await hub.publish([event("T", "MSFT", 2), event("T", "AAPL", 2), event("T", "MSFT", 3)])
        await hub.park(connection.id)
        let back = await hub.subscribe()
        let outcome = await hub.add(
            [topic("T.AAPL"), topic("T.MSFT")], to: back.id,
            resuming: .marketSequence(epoch: epoch, start.sequence, floors: [topic("T.MSFT"): later.sequence]))
        #expect(outcome.gaps.isEmpty && outcome.replayed == [topic("T.AAPL"): 2, topic("T.MSFT"): 2], "\(outcome)")
        let without = await hub.subscribe()
        let gapped = await hub.add([topic("T.MSFT")], to: without.id, resuming: .marketSequence(epoch: epoch, start.sequence))
        #expect(gapped.gaps == [topic("T.MSFT")], "from the session's position alone, T.MSFT's run is not whole")
    }

    @Test func aParkedSubscriberKeepsItsTopicsWholeAndGetsNothing() async throws {
        let hub = MarketDataHub(wire: .polygon)
        let first = await hub.subscribe(to: topics("T.AAPL"))
        await hub.publish((1...3).map { event("T", "AAPL", $0) })
        await hub.park(first.id)
        await hub.publish((4...6).map { event("T", "AAPL", $0) })
        #expect(await hub.bufferStatistics.maxFill == 0, "what was queued and not read was let go")
        let back = await hub.subscribe()
        let outcome = await hub.add([topic("T.AAPL")], to: back.id, resuming: .positions(epoch: nil, [topic("T.AAPL"): 3]))
        #expect(outcome.replayed == [topic("T.AAPL"): 3] && outcome.gaps.isEmpty)
        #expect(await hub.wantedTopics == topics("T.AAPL"))
    }

    @Test func anotherEpochIsAGapForEveryTopicItNames() async throws {
        let hub = MarketDataHub(wire: .polygon)
        await hub.publish([event("T", "AAPL", 1)])
        let subscription = await hub.subscribe()
        let outcome = await hub.add([topic("T.AAPL")], to: subscription.id, resuming: .positions(epoch: "older", [topic("T.AAPL"): 1]))
        #expect(outcome.gaps == [topic("T.AAPL")] && outcome.replayed.isEmpty)
        let got = try await take(1, from: subscription.events)
        #expect((fields(got[0])["message"] as? String)?.contains("started afresh") == true)
    }

    @Test func theMemoryBoundEvictsTheOldestWhateverTheirTopic() async throws {
        let hub = MarketDataHub(wire: .polygon, history: HistoryLimits(memoryBytes: 40_000))
        let holder = await hub.subscribe(to: topics("Q.*"))
        defer { _ = holder }
        for round in 0..<50 { await hub.publish((0..<20).map { event("Q", "S\($0)", round) }) }
        let statistics = try #require(await hub.historyStatistics)
        #expect(statistics.memory <= 40_000)
        #expect(statistics.events > 50 && statistics.events < 1000)
        // The oldest are gone: a resume from the start is a gap, from near the end is whole.
        let subscription = await hub.subscribe()
        let outcome = await hub.add([topic("Q.*")], to: subscription.id, resuming: .positions(epoch: nil, [topic("Q.*"): 1]))
        #expect(outcome.gaps == [topic("Q.*")])
        let recent = await hub.subscribe()
        let whole = await hub.add([topic("Q.S1")], to: recent.id, resuming: .positions(epoch: nil, [topic("Q.S1"): 48]))
        #expect(whole.replayed == [topic("Q.S1"): 2])
    }

    /// A wildcard's last values come only within what the resume may still replay (a gap on a type of
    /// many tickers queued them all, outside the buffer); past it, the gap says they are not sent.
    @Test func aWildcardsLastValuesAfterAGapStayWithinTheResumesBound() async throws {
        let hub = MarketDataHub(wire: .polygon, history: HistoryLimits(eventsPerResume: 5))
        let holder = await hub.subscribe(to: topics("Q.*"))
        await hub.publish((0..<10).map { event("Q", "S\($0)", $0) })
        let subscription = await hub.subscribe()
        let outcome = await hub.add([topic("Q.*")], to: subscription.id, resuming: .positions(epoch: "another", [topic("Q.*"): 1]))
        #expect(outcome.gaps == [topic("Q.*")])
        let got = try await take(2, from: subscription.events)
        #expect(fields(got[0])["status"] as? String == "gap")
        #expect((fields(got[0])["last_values"] as? String)?.hasPrefix("not sent: up to 10 tickers'") == true, "\(fields(got[0]))")
        #expect(fields(got[1])["status"] as? String == "resumed", "no last value queued: \(got.map(\.ticker))")
        _ = holder
    }

    /// A ticker's gap keeps its last value whatever the replay took of the bound (only a wildcard's, every
    /// ticker's, waits for room).
    @Test func aTickersGapPastTheBoundStillGetsItsLastValue() async throws {
        let hub = MarketDataHub(wire: .polygon, history: HistoryLimits(eventsPerResume: 5))
        await hub.publish((1...5).map { event("T", "AAPL", $0) } + (1...6).map { event("T", "MSFT", $0) })
        let subscription = await hub.subscribe()
        let outcome = await hub.add(
            [topic("T.AAPL"), topic("T.MSFT")], to: subscription.id,
            resuming: .positions(epoch: nil, [topic("T.AAPL"): 0, topic("T.MSFT"): 0]))
        #expect(outcome.replayed == [topic("T.AAPL"): 5] && outcome.gaps == [topic("T.MSFT")])
        let got = try await take(8, from: subscription.events)
        #expect(fields(got[5])["status"] as? String == "gap" && fields(got[5])["last_values"] == nil, "\(got.map(\.json))")
        #expect(got[6].ticker == "MSFT" && fields(got[6])["n"] as? Int == 6, "its last value: \(got.map(\.json))")
        #expect(fields(got[7])["status"] as? String == "resumed")
    }

    /// A gap is followed by last values as a subscribe gives them: none of a type that never gets one
    /// (an Alpaca correction or cancel: an old one would be applied as new).
    @Test func aGapGivesNoLastValueOfATypeThatNeverGetsOne() async throws {
        let hub = MarketDataHub(wire: .polygon, snapshotless: ["T"])
        await hub.publish((1...3).map { event("T", "AAPL", $0) })
        let subscription = await hub.subscribe()
        let outcome = await hub.add([topic("T.AAPL")], to: subscription.id, resuming: .positions(epoch: "another", [topic("T.AAPL"): 1]))
        #expect(outcome.gaps == [topic("T.AAPL")])
        let got = try await take(2, from: subscription.events)
        #expect(got.map { fields($0)["status"] as? String } == ["gap", "resumed"], "\(got.map(\.json))")
    }

    /// A topic of more events than a resume replays costs its scan: charged as replayed, so a client
    /// cannot have the bound scanned again and again for the price of a `gap`.
    @Test func aTopicOfTooManyEventsIsChargedItsScan() async throws {
        var limits = HistoryLimits()
        limits.eventsPerResume = 20
        let hub = MarketDataHub(wire: .polygon, history: limits)
        let keeper = await hub.subscribe(to: topics("T.*"))
        await hub.publish((1...30).map { event("T", "AAPL", $0) })
        let subscription = await hub.subscribe()
        let wildcard = topic("T.*")
        #expect(await hub.add([wildcard], to: subscription.id, resuming: .positions(epoch: hub.epoch, [wildcard: 0])).gaps == [wildcard])
        let answered = try await take(3, from: subscription.events)
        #expect(answered.map { fields($0)["status"] as? String } == ["gap", nil, "resumed"], "\(answered.map(\.json))")
        await hub.remove([wildcard], from: subscription.id)
        // The 20 scanned and the 3 queued spent the minute's 20: the next resume is not made.
        let aapl = topic("T.AAPL")
        let again = await hub.add([aapl], to: subscription.id, resuming: .positions(epoch: hub.epoch, [aapl: 29]))
        #expect(again.replayed.isEmpty && again.gaps == [aapl])
        let answer = try await take(1, from: subscription.events)
        #expect((fields(answer[0])["message"] as? String)?.contains("not resumed") == true, "\(answer.map(\.json))")
        await hub.remove(keeper.id)
    }

    @Test func aResumePastItsBoundIsAGapForItsLargestTopics() async throws {
        let hub = MarketDataHub(wire: .polygon, history: HistoryLimits(eventsPerResume: 5))
        await hub.publish((1...10).map { event("T", "AAPL", $0) } + (1...3).map { event("T", "MSFT", $0) })
        let subscription = await hub.subscribe()
        let outcome = await hub.add(
            [topic("T.AAPL"), topic("T.MSFT")], to: subscription.id,
            resuming: .positions(epoch: nil, [topic("T.AAPL"): 0, topic("T.MSFT"): 0]))
        #expect(outcome.replayed == [topic("T.MSFT"): 3])
        #expect(outcome.gaps == [topic("T.AAPL")])
    }
}

@Suite("Hub conflation")
struct HubConflationTests {
    @Test func quotesMergePerSymbolTradesNeverAndATradeFlushesItsSymbolsQuoteFirst() async throws {
        let hub = MarketDataHub(wire: .polygon)
        let subscription = await hub.subscribe(to: topics("Q.AAPL", "Q.MSFT", "T.AAPL"))
        await hub.setConflation(ConflationMode(interval: .milliseconds(200)), for: subscription.id)
        await hub.publish((1...50).map { event("Q", "AAPL", $0) } + (1...50).map { event("Q", "MSFT", $0) })
        await hub.publish([event("T", "AAPL", 1000), event("Q", "AAPL", 51)])
        let got = try await take(4, from: subscription.events)
        // The trade took AAPL's pending quote out first; MSFT's and the newer AAPL quote came at the interval.
        #expect(got.map { "\($0.eventType).\($0.ticker).\(fields($0)["n"] as? Int ?? -1)" } == ["Q.AAPL.50", "T.AAPL.1000", "Q.MSFT.50", "Q.AAPL.51"])
    }

    /// An Alpaca market's quotes merge too (its protocol names its state events): the latest quote, then
    /// the trade that flushed it.
    @Test func anAlpacaMarketsQuotesMergeAndItsTradesDoNot() async throws {
        let alpaca = AlpacaWireProtocol(feed: .iex)
        let hub = MarketDataHub(wire: alpaca, history: nil)
        let subscription = await hub.subscribe(to: topics("q.AAPL", "t.AAPL"))
        await hub.setConflation(ConflationMode(interval: .seconds(60)), for: subscription.id)
        await hub.publish((1...20).map { AlpacaEvents.quote("AAPL", bid: Double($0), ask: Double($0) + 1, size: 1, nanoseconds: 0) })
        await hub.publish([AlpacaEvents.trade("AAPL", id: 7, price: 30, size: 1, nanoseconds: 0)])
        let got = try await take(2, from: subscription.events)
        #expect(got.map(\.eventType) == ["q", "t"])
        guard case .quote(let bid, _, _, _, _)? = alpaca.price(in: got[0]) else {
            Issue.record("not a quote: \(got[0].eventType)")
            return
        }
        #expect(bid == "20.0", "the newest of the 20 quotes")
        #expect(await hub.droppedEvents(for: subscription.id) == 0)
    }

    /// A wildcard holds as many topics as the upstream sends: what conflation holds for a subscriber is
    /// bounded by its buffer, not by the topics, so one that merges at a long interval (or never reads)
    /// cannot make the hub hold an event per ticker of the market.
    @Test func conflationHoldsNoMoreTopicsThanTheSubscribersBuffer() async throws {
        let hub = MarketDataHub(wire: .polygon)
        let subscription = await hub.subscribe(to: topics("Q.*"))
        await hub.setConflation(ConflationMode(interval: .seconds(60)), for: subscription.id)
        let limit = subscription.bufferLimit
        for batch in 0..<5 { await hub.publish((0..<limit / 2).map { event("Q", "S\(batch)-\($0)", batch) }) }
        let pending = await hub.conflatedPending(for: subscription.id)
        #expect(pending <= limit, "at most the buffer's \(limit) topics held: \(pending)")
        // What was held past it went to the queue: the buffer's worth, the rest lost and told.
        let got = try await take(limit, from: subscription.events)
        let first = (0..<2).flatMap { batch in (0..<limit / 2).map { "S\(batch)-\($0)" } }
        #expect(got.map(\.ticker) == first, "the first held quotes, in order")
        #expect(await hub.droppedEvents(for: subscription.id) > 0, "more than the buffer holds was lost, and counted")
    }

    /// A topic's merged event not sent yet when it is unsubscribed is not sent later (nor replayed and
    /// sent again after a subscribe that resumes it); one its wildcard still covers is.
    @Test func anUnsubscribedTopicsMergedEventIsNotSentLater() async throws {
        let hub = MarketDataHub(wire: .polygon)
        let subscription = await hub.subscribe(to: topics("Q.AAPL", "Q.MSFT", "Q.NVDA", "Q.*", "T.MSFT", "A.IBM"))
        await hub.setConflation(ConflationMode(interval: .seconds(60)), for: subscription.id)
        await hub.publish([event("Q", "AAPL", 1), event("Q", "NVDA", 2), event("Q", "MSFT", 3), event("A", "IBM", 4)])
        #expect(await hub.conflatedPending(for: subscription.id) == 4)
        // AAPL's, NVDA's and IBM's own topics go: the quotes stay while the wildcard covers them, and go
        // with it; IBM's second bar (no `A.*` held) goes at once.
        await hub.remove(topics("Q.AAPL", "Q.NVDA", "A.IBM"), from: subscription.id)
        #expect(await hub.conflatedPending(for: subscription.id) == 3, "the wildcard still covers the quotes")
        await hub.remove(topics("Q.*"), from: subscription.id)
        // Merging stops: what is pending is queued at once.
        await hub.setConflation(nil, for: subscription.id)
        await hub.publish([event("T", "MSFT", 4)])
        let got = try await take(2, from: subscription.events)
        #expect(got.map { "\($0.eventType).\($0.ticker)" } == ["Q.MSFT", "T.MSFT"], "\(got.map(\.json))")
    }

    @Test func aStalledSubscriberIsConflatedBeforeAnyEventIsDropped() async throws {
        let hub = MarketDataHub(wire: .polygon)
        let subscription = await hub.subscribe(to: topics("Q.*"))
        await hub.setConflation(ConflationMode(interval: nil, whileLagging: true), for: subscription.id)
        // Nobody reads: far more than the buffer holds, over 10 symbols.
        for round in 0..<300 { await hub.publish((0..<10).map { event("Q", "S\($0)", round) }) }
        #expect(await hub.droppedEvents(for: subscription.id) == 0)
        #expect(await hub.droppedTotal == 0)
        let pending = await hub.conflatedPending(for: subscription.id)
        #expect(pending <= 10, "at most one pending quote per symbol: \(pending)")
        // Reading it catches up, and the newest quote of each symbol arrives.
        var newest: [String: Int] = [:]
        var reader = subscription.events.makeAsyncIterator()
        let deadline = ContinuousClock.now + .seconds(5)
        while newest.count < 10 || newest.values.contains(where: { $0 != 299 }), ContinuousClock.now < deadline {
            guard let next = await reader.next() else { break }
            if !next.isNotice { newest[next.ticker] = fields(next)["n"] as? Int }
        }
        #expect(newest.count == 10 && newest.values.allSatisfy { $0 == 299 }, "\(newest)")
    }
}

/// What one subscriber's resumes may make the hub hold: replays weigh against one resume's bound until
/// they are read, and against a budget of one resume's bound a minute after.
@Suite("Hub history: replays are bounded per subscriber")
struct ReplayBoundTests {
    @Test func replaysNotYetReadAndReplaysOfTheLastMinuteCountAgainstTheBound() async throws {
        var limits = HistoryLimits()
        limits.eventsPerResume = 20
        let hub = MarketDataHub(wire: .polygon, history: limits)
        let aapl = Topic(parsing: "T.AAPL")!
        // Another holder keeps the topic wanted (so its history stays whole) throughout.
        let keeper = await hub.subscribe(to: [aapl])
        await hub.publish((1...16).map { event("T", "AAPL", $0) })
        let subscription = await hub.subscribe()
        let resume = HubResume.positions(epoch: hub.epoch, [aapl: 0])
        // 16 events and the `resumed` status: 17 of the 20.
        #expect(await hub.add([aapl], to: subscription.id, resuming: resume).replayed == [aapl: 16])
        // Not read yet: another 16 would pass the bound. A gap, its last value and `resumed`: 20.
        await hub.remove([aapl], from: subscription.id)
        let queued = await hub.add([aapl], to: subscription.id, resuming: resume)
        #expect(queued.gaps == [aapl] && queued.replayed.isEmpty)
        // Read now; but the minute's 20 are spent, notices included: not resumed at all, one notice
        // says why, and the topic is live.
        _ = try await take(20, from: subscription.events)
        await hub.remove([aapl], from: subscription.id)
        #expect(await hub.add([aapl], to: subscription.id, resuming: resume).gaps == [aapl])
        await hub.publish([event("T", "AAPL", 17)])
        let answer = try await take(4, from: subscription.events)
        #expect((fields(answer[0])["message"] as? String)?.contains("not resumed (T.AAPL)") == true, "\(answer.map(\.json))")
        #expect(fields(answer[1])["status"] as? String == "resumed")
        #expect(fields(answer[2])["n"] as? Int == 16, "its last value, as any subscribe's")
        #expect(fields(answer[3])["n"] as? Int == 17, "then live")
        await hub.remove(keeper.id)
    }

    @Test func aConnectionThatNeverReadsCannotPileUpResumeAnswers() async throws {
        var limits = HistoryLimits()
        limits.eventsPerResume = 1_000
        let hub = MarketDataHub(wire: .polygon, history: limits)
        let wanted = (0..<200).map { Topic(eventType: "T", ticker: "S\($0)")! }
        let keeper = await hub.subscribe(to: Set(wanted))
        await hub.publish(wanted.map { event("T", $0.ticker, 1) })
        // Another epoch: every topic a gap, each with a notice and a last value; 100 times, never read.
        let subscription = await hub.subscribe()
        for _ in 0..<100 {
            await hub.add(wanted, to: subscription.id, resuming: .positions(epoch: "old", Dictionary(uniqueKeysWithValues: wanted.map { ($0, 1) })))
            await hub.remove(wanted, from: subscription.id)
        }
        let queued = subscription.queue.replaying.load(ordering: .relaxed)
        // Resumes are answered while less than the bound is queued: the bound and one answer (401) at
        // most; the not-resumed answers after go through the 1,000-event buffer.
        #expect(queued <= limits.eventsPerResume + 401, "\(queued) queued outside the buffer")
        #expect(subscription.queue.pending.load(ordering: .relaxed) <= MarketDataHub.defaultBufferLimit)
        await hub.remove(keeper.id)
    }

    /// A key's many connections share ``HistoryLimits/resumesPerKey`` resumes' worth a minute: past
    /// it, the key's next connection is not resumed and is told why, while a connection of another key
    /// (or of none) still is.
    @Test func aKeysConnectionsShareItsReplaysAndOtherKeysKeepTheirs() async throws {
        let hub = MarketDataHub(wire: .polygon, history: HistoryLimits(eventsPerResume: 20, resumesPerKey: 2))
        let aapl = Topic(parsing: "T.AAPL")!
        let keeper = await hub.subscribe(to: [aapl])
        await hub.publish((1...19).map { event("T", "AAPL", $0) })
        let resume = HubResume.positions(epoch: hub.epoch, [aapl: 0])
        // Each connection's own budget is 20 a minute; 19 events and `resumed` spend it whole.
        var clients: [HubSubscription] = []
        for owner in ["k", "k", "k", "other", nil] {
            let client = await hub.subscribe()
            await hub.setOwner(owner, for: client.id)
            clients.append(client)
        }
        for client in clients[0...1] { #expect(await hub.add([aapl], to: client.id, resuming: resume).replayed == [aapl: 19]) }
        // The key's 40 are spent: its third connection, though it was replayed nothing, is not resumed
        // (told that the key's connections were replayed 40 events; or, if a slow run let the key's
        // budget refill by an event, that they may not be replayed more now).
        let third = await hub.add([aapl], to: clients[2].id, resuming: resume)
        #expect(third.gaps == [aapl] && third.replayed.isEmpty, "\(third)")
        let told = try await take(1, from: clients[2].events)
        let message = fields(told[0])["message"] as? String ?? ""
        #expect(message.contains("this key's connections"), "\(message)")
        for client in clients[3...] { #expect(await hub.add([aapl], to: client.id, resuming: resume).replayed == [aapl: 19]) }
        await hub.remove(keeper.id)
    }

    @Test func theBudgetRefillsOverAMinute() {
        var budget = ReplayBudget()
        #expect(budget.available(capacity: 600, now: 0) == 600)
        budget.spend(600, capacity: 600, now: 0)
        #expect(budget.available(capacity: 600, now: 0) == 0)
        #expect(budget.available(capacity: 600, now: 30_000) == 300)
        #expect(budget.available(capacity: 600, now: 120_000) == 600, "never more than the capacity")
    }
}

/// The pending table itself: a trade takes its own ticker's events in the order they became pending,
/// the rest keep their order, and stale entries left by trades never reorder or double anything.
@Suite("Conflation's pending table")
struct ConflationTableTests {
    @Test func aTradeTakesItsTickerInOrderAndTheRestKeepTheirs() {
        let table = Conflation(mode: ConflationMode(interval: .milliseconds(250)))
        #expect(!table.hold(event("Q", "AAPL", 1)))
        #expect(!table.hold(event("Q", "MSFT", 1)))
        #expect(!table.hold(event("AM", "AAPL", 1)))
        #expect(table.hold(event("Q", "AAPL", 2)), "replaces the pending quote")
        let taken = table.take(ticker: "AAPL")
        #expect(taken.map(\.topic.description) == ["Q.AAPL", "AM.AAPL"])
        #expect(String(buffer: taken[0].bytes).contains(#""n":2"#), "the newest")
        #expect(table.take(ticker: "AAPL").isEmpty && table.pendingCount == 1)
        // Many trades of one ticker between flushes: its stale entries are compacted, nothing doubles.
        for round in 0..<500 {
            _ = table.hold(event("Q", "IBM", round))
            #expect(table.take(ticker: "IBM").count == 1)
        }
        _ = table.hold(event("Q", "AAPL", 3))
        #expect(table.takeAll().map(\.topic.description) == ["Q.MSFT", "Q.AAPL"])
        #expect(table.isEmpty && table.merged == 1)
    }
}

@Suite("Hub history: a new epoch")
struct EpochNoticeTests {
    /// A cluster node's history starts afresh under a failover's new epoch: its connected clients are
    /// told (`epoch`), and the end of the outage names it too, so a later `since` can.
    @Test func aClientThatStaysConnectedIsToldTheNewEpoch() async throws {
        let hub = MarketDataHub(wire: .polygon, adoptsPositions: true)
        let subscription = await hub.subscribe(to: topics("T.AAPL"))
        await hub.startEpoch("first")
        await hub.startEpoch("first")
        await hub.startEpoch("second")
        let told = try await take(2, from: subscription.events)
        #expect(fields(told[0])["status"] as? String == "upstream_disconnected", "\(fields(told[0]))")
        #expect(fields(told[1])["status"] as? String == "epoch" && fields(told[1])["epoch"] as? String == "second", "\(fields(told[1]))")
    }

    /// The hub's own `epoch` notice is the delivery that marks the new epoch, as a drain reads it: the
    /// outage notice before it marks none.
    @Test func theHubsEpochNoticeDeliveryIsMarkedAsTheDrainReadsIt() async throws {
        let hub = MarketDataHub(wire: .polygon, adoptsPositions: true)
        let subscription = await hub.subscribe(to: topics("T.AAPL"))
        await hub.startEpoch("first")
        await hub.startEpoch("second")
        var reader = subscription.makeReader()
        var deliveries: [HubDelivery] = []
        let read = await reader.nextDeliveries(into: &deliveries)
        #expect(read)
        #expect(deliveries.map(\.epochStarted) == [nil, "second"], "the outage notice, then the epoch notice marked")
    }

    /// A parked subscriber holds a broken session's topics until the session lets it go, whoever held
    /// its subscription: a session restored at start-up keeps only its id, and a connection's drain
    /// lets its stream go. (A plain subscriber whose subscription goes is removed.)
    @Test func aParkedSubscriberOutlivesItsSubscription() async throws {
        let hub = MarketDataHub(wire: .polygon)
        var subscription: HubSubscription? = await hub.subscribe(to: topics("T.AAPL"))
        let parked = try #require(subscription?.id)
        #expect(await hub.park(parked))
        subscription = nil
        // Let go of after the parked one's: once it is gone, the parked one's end was seen first.
        _ = await hub.subscribe(to: topics("T.MSFT")).id
        let msft = try #require(Topic(parsing: "T.MSFT"))
        let gone = try await within(.seconds(5)) {
            while await hub.wantedTopics.contains(msft) { try? await Task.sleep(for: .milliseconds(5)) }
            return true
        }
        #expect(gone == true, "a plain subscriber whose subscription went is removed")
        #expect(await hub.wantedTopics == topics("T.AAPL"), "the parked one stays")
        #expect(await hub.subscriberCount == 1)
        await hub.remove(parked)
        #expect(await hub.wantedTopics.isEmpty)
    }

    /// A tagged connection takes the newest market sequence it writes as where its client stands in its
    /// epoch: a last value kept from the former epoch (a snapshot on subscribe, a `gap`'s last value)
    /// carries none of the new one, though its bytes keep their `_m`.
    @Test func aLastValueKeptFromTheFormerEpochCarriesNoPositionOfTheNewOne() async throws {
        let hub = MarketDataHub(wire: .polygon, adoptsPositions: true)
        let holder = await hub.subscribe(to: topics("T.AAPL"))
        await hub.startEpoch("first")
        await hub.publish(EventPosition.stamp([event("T", "AAPL", 1)], [EventPosition(topic: 400, market: 400)]))
        await hub.startEpoch("second")
        let client = await hub.subscribe(to: topics("T.AAPL"))
        var reader = client.makeReader()
        var deliveries: [HubDelivery] = []
        #expect(await reader.nextDeliveries(into: &deliveries))
        var events: [MarketEvent] = []
        for delivery in deliveries { delivery.append(to: &events) }
        #expect(events.compactMap { EventPosition.read(from: $0.bytes)?.market } == [400], "the snapshot, its bytes as they were")
        #expect(deliveries.allSatisfy { $0.lastSequence == 0 }, "no position of the new epoch: \(deliveries.map(\.lastSequence))")
        _ = holder
    }

    /// A tagged connection's write path reads which epoch a delivery starts: its positions after it
    /// count in that epoch (and only a delivery that is that notice says so).
    @Test func theEpochNoticesDeliveryNamesTheEpochItStarts() async throws {
        let hub = MarketDataHub(wire: .polygon, adoptsPositions: true)
        await hub.startEpoch("first")
        #expect(await hub.position == ("first", 0))
        await hub.publish(EventPosition.stamp([event("T", "AAPL", 1)], [EventPosition(topic: 7, market: 7)]))
        #expect(await hub.position == ("first", 7))
        let notice = hub.wire.render(Notice(.epoch, message: "positions start again under epoch second", details: ["epoch": .text("second")]))
        #expect(HubDelivery(epochNotice: notice, epoch: "second").epochStarted == "second")
        #expect(HubDelivery([notice]).epochStarted == nil, "only the hub's own epoch delivery starts one, not a notice's bytes")
        #expect(HubDelivery(epochNotice: notice, epoch: "second").prefix(1).epochStarted == "second", "a delivery cut to fit keeps it")
        #expect(HubDelivery([event("T", "AAPL", 1)]).epochStarted == nil)
        #expect(HubDelivery(replay: [notice]).epochStarted == nil, "a replay's are not the stream's own")
    }

    /// What conflation holds of the old term goes out before the `epoch` notice: a tagged connection
    /// counts every position after the notice as the new epoch's.
    @Test func conflatedEventsOfTheOldTermComeBeforeTheEpochNotice() async throws {
        let hub = MarketDataHub(wire: .polygon, adoptsPositions: true)
        await hub.startEpoch("old")
        let subscription = await hub.subscribe(to: topics("Q.AAPL"))
        await hub.setConflation(ConflationMode(interval: .seconds(60)), for: subscription.id)
        await hub.publish(EventPosition.stamp([event("Q", "AAPL", 1)], [EventPosition(topic: 1, market: 500)]))
        #expect(await hub.conflatedPending(for: subscription.id) == 1)
        await hub.startEpoch("new")
        let got = try await take(3, from: subscription.events)
        #expect(got.map { fields($0)["status"] as? String ?? "n\(fields($0)["n"] ?? "")" } == ["n1", "upstream_disconnected", "epoch"])
        #expect(await hub.conflatedPending(for: subscription.id) == 0)
    }

    /// A new term's first event can reach a node before word that the last leader is gone: the outage
    /// starts with the term, so its notice comes first and the fill reaches back to the old term's last.
    @Test func aNewTermOpensTheOutageBeforeItsFirstEventSoTheFillCoversTheFailover() async throws {
        let hub = MarketDataHub(wire: .polygon, adoptsPositions: true)
        let requests = Mutex<[GapFillRequest]>([])
        await hub.setRecoveryHandler { request in requests.withLock { $0.append(request) } }
        let subscription = await hub.subscribe(to: topics("T.AAPL"))
        let positioned = { (n: Int, position: UInt64) in
            EventPosition.stamp([event("T", "AAPL", n)], [EventPosition(topic: position, market: position)])
        }
        await hub.startEpoch("old")
        await hub.publish(positioned(1, 1))
        await hub.publish(positioned(2, 2))
        // The new leader's epoch, then its first event: no lease word came in between.
        await hub.startEpoch("new")
        await hub.publish(positioned(9, 1))
        let got = try await take(6, from: subscription.events)
        #expect(got.map { fields($0)["status"] as? String ?? "n\(fields($0)["n"] ?? "")" } == ["n1", "n2", "upstream_disconnected", "epoch", "upstream_reconnected", "n9"])
        let request = try #require(requests.withLock { $0.first })
        #expect(fields(try #require(request.topics.first?.lastBefore))["n"] as? Int == 2, "the fill starts after the old term's last event")
    }
}

/// On a cluster node, a topic's sequence that skips while the node held it whole means events of it
/// never arrived (the leader's upstream stopped sending it for a while): its holders are told.
@Suite("Hub history: a broken run on a cluster node")
struct BrokenRunTests {
    func positioned(_ n: Int, _ topicSequence: UInt64, _ market: UInt64) -> [MarketEvent] {
        EventPosition.stamp([event("T", "AAPL", n)], [EventPosition(topic: topicSequence, market: market)])
    }

    @Test func aSkipInAWholeRunIsAGapToItsHoldersBeforeTheEventAfterIt() async throws {
        let hub = MarketDataHub(wire: .polygon, adoptsPositions: true)
        await hub.startEpoch("e")
        let named = await hub.subscribe(to: topics("T.AAPL"))
        let wildcard = await hub.subscribe(to: topics("T.*"))
        await hub.publish(positioned(1, 1, 1))
        await hub.publish(positioned(2, 2, 2))
        // The leader's upstream dropped T.AAPL for a while: its next event skips a topic sequence.
        await hub.publish(positioned(3, 4, 3))
        for subscription in [named, wildcard] {
            let got = try await take(4, from: subscription.events)
            #expect(got.map { fields($0)["status"] as? String ?? "n\(fields($0)["n"] ?? "")" } == ["n1", "n2", "gap", "n3"])
            #expect(fields(got[2])["topic"] as? String == "T.AAPL")
        }
    }

    @Test func aRunThisNodeDidNotHoldWholeIsNoGap() async throws {
        let hub = MarketDataHub(wire: .polygon, adoptsPositions: true)
        await hub.startEpoch("e")
        let first = await hub.subscribe(to: topics("T.AAPL"))
        await hub.publish(positioned(1, 1, 1))
        // Nobody here wanted it for a while (this node stopped receiving it): a later run is not a loss.
        await hub.remove(first.id)
        let later = await hub.subscribe(to: topics("T.AAPL"))
        await hub.publish(positioned(5, 5, 2))
        let got = try await take(2, from: later.events)
        #expect(got.map { fields($0)["n"] as? Int } == [1, 5], "its snapshot, then the event, no gap: \(got.map(\.json))")
    }

    @Test func theLeadersSequencerSkipsATopicTakenBackAndEveryTickerOfAWildcard() {
        var sequencer = PositionSequencer(epoch: "e")
        let first = sequencer.stamp([event("T", "A", 1), event("T", "B", 1), event("Q", "C", 1)])
        sequencer.interrupt([Topic(parsing: "T.A")!, Topic(parsing: "Q.*")!, Topic(parsing: "T.NEVER")!])
        let next = sequencer.stamp([event("T", "A", 2), event("T", "B", 2), event("Q", "C", 2), event("T", "NEVER", 1)])
        #expect(first.compactMap { EventPosition.read(from: $0.bytes)?.topic } == [1, 1, 1])
        #expect(next.compactMap { EventPosition.read(from: $0.bytes)?.topic } == [3, 2, 3, 1], "A and C skip one; B and a new topic do not")
    }

    @Test func theLeadersSequencerKeepsAtMostItsTopicsAndNeverRepeatsANumber() {
        var sequencer = PositionSequencer(epoch: "e", maxTopics: 100)
        func topicNumber(_ ticker: String) -> UInt64 {
            EventPosition.read(from: sequencer.stamp([event("T", ticker, 1)])[0].bytes)?.topic ?? 0
        }
        // A busy topic reaches 50; a hundred others come and go by.
        for _ in 1...50 { _ = topicNumber("BUSY") }
        _ = topicNumber("IDLE")
        for n in 0..<150 {
            _ = topicNumber("T\(n)")
            if n % 10 == 0 { _ = topicNumber("BUSY") }
            #expect(sequencer.topicCount <= 100)
        }
        // The busy one is kept and goes on; the idle one was let go and starts past every number given.
        #expect(topicNumber("BUSY") == 66)
        let back = topicNumber("IDLE")
        #expect(back > 50, "IDLE starts past every number given (\(back)), never at 2 or 1 again")
        #expect(topicNumber("IDLE") == back + 1)
        #expect(topicNumber("NEW") >= back, "an unknown topic too")
    }

    @Test func aTopicLetGoThatHeldTheHighestNumberSkipsOneWhenItComesBack() {
        var sequencer = PositionSequencer(epoch: "e", maxTopics: 10)
        func topicNumber(_ ticker: String) -> UInt64 {
            EventPosition.read(from: sequencer.stamp([event("T", ticker, 1)])[0].bytes)?.topic ?? 0
        }
        for _ in 1...50 { _ = topicNumber("TOP") }
        for n in 0..<20 { _ = topicNumber("T\(n)") }
        // Its next was 51: it comes back past it, so a node that held it sees the break.
        #expect(topicNumber("TOP") > 51)
    }
}

/// A topic nobody wants whose events are all evicted leaves no line behind, and its numbers never repeat.
@Suite("Hub history: lines of topics nobody wants")
struct HistoryLineTests {
    @Test func idleLinesAreLetGoCountedMeanwhileAndTheirNumbersNeverReused() {
        var limits = HistoryLimits()
        limits.eventsPerTopic = 1
        let history = EventHistory(limits: limits, epoch: "e")
        let junk = (0..<1_000).map { Topic(eventType: "T", ticker: "J\($0)")! }
        let aapl = Topic(parsing: "T.AAPL")!
        history.wanted(aapl, now: 0)
        for topic in junk { history.wanted(topic, now: 0) }
        _ = history.keep(junk.map { event("T", $0.ticker) } + [event("T", "AAPL", 1)], at: 0)
        #expect(history.topicCount == 1_001)
        #expect(history.memory >= 1_001 * EventHistory.overheadPerLine, "lines are counted")
        for topic in junk { history.unwanted(topic, now: 0) }
        // Each junk topic's one event is pushed out by its next; then nobody wants it: its line goes.
        _ = history.keep(junk.map { event("T", $0.ticker, 2) }, at: 1)
        #expect(history.topicCount == 1_001, "still holding an event each")
        history.evict(now: 10_000_000)
        #expect(history.topicCount == 1, "the junk lines let go; AAPL's kept, empty, because it is wanted")
        #expect(history.memory == EventHistory.overheadPerLine)
        // A resume from an old position of a let-go topic is a gap, never the wrong events.
        guard case .gap = history.missed(junk[0], since: .topic(1)) else {
            Issue.record("a gap expected")
            return
        }
        // Its next event numbers past anything it had before.
        let again = history.keep([event("T", "J0", 3)], at: 10_000_001)
        #expect((EventPosition.read(from: again[0].bytes)?.topic ?? 0) > 2)
    }

    /// The upstream lost interrupts every topic, and each topic reads the interruption when asked (an
    /// upstream going down and back again and again walks no topic): one received before it resumes
    /// across it as a gap, one received again after it resumes whole from there, one first seen after
    /// it whole from its first event; the last of many interruptions stands.
    @Test func anInterruptionOfEveryTopicIsReadByEachTopicWhenAsked() {
        let history = EventHistory(limits: HistoryLimits(), epoch: "e")
        let (aapl, msft, ibm) = (Topic(parsing: "T.AAPL")!, Topic(parsing: "T.MSFT")!, Topic(parsing: "T.IBM")!)
        for topic in [aapl, msft, ibm] { history.wanted(topic, now: 0) }
        _ = history.keep([event("T", "AAPL", 1), event("T", "MSFT", 1)], at: 0)
        for round in 1...1_000 { history.interruptAll(now: Int64(round), marked: true) }
        _ = history.keep([event("T", "MSFT", 2), event("T", "IBM", 1)], at: 2_000)
        guard case .gap = history.missed(aapl, since: .topic(1)) else {
            Issue.record("AAPL, received before the interruptions: a gap")
            return
        }
        guard case .gap = history.missed(msft, since: .topic(1)) else {
            Issue.record("MSFT from before the interruptions: a gap")
            return
        }
        guard case .events(let none) = history.missed(msft, since: .topic(2)), none.isEmpty else {
            Issue.record("MSFT from its event after them: whole")
            return
        }
        guard case .events(let first) = history.missed(ibm, since: .topic(0)), first.count == 1 else {
            Issue.record("IBM, first seen after them: whole from its first event")
            return
        }
        // Marked: each interruption took a market sequence of its own.
        #expect(history.nextMarketSequence == 1_000 + 2 + 2 + 1)
    }

    /// A wildcard holds every ticker the market sends: the lines of its tickers that hold no event are
    /// kept only while lines take at most half the memory bound, so ever new tickers (options' trades
    /// over a day) never fill the history with empty lines and leave no room for events. A ticker held
    /// by name keeps its line; one let go resumes as a gap, never with wrong events.
    @Test func idleLinesOfTickersOnlyAWildcardWantsGoPastHalfTheMemoryBound() {
        var limits = HistoryLimits()
        limits.memoryBytes = 200 * EventHistory.overheadPerLine
        let history = EventHistory(limits: limits, epoch: "e")
        history.wanted(Topic(parsing: "T.*")!, now: 0)
        let named = Topic(parsing: "T.AAPL")!
        history.wanted(named, now: 0)
        _ = history.keep([event("T", "AAPL", 1)], at: 0)
        for round in 0..<20 {
            _ = history.keep((0..<50).map { event("T", "S\(round)-\($0)", 1) }, at: Int64(round))
            #expect(history.memory <= limits.memoryBytes, "within the bound after round \(round): \(history.memory)")
            #expect(history.topicCount <= limits.memoryBytes / EventHistory.overheadPerLine, "\(history.topicCount) lines")
        }
        guard case .events(let newest) = history.missed(Topic(parsing: "T.*")!, since: .market(history.nextMarketSequence - 11)) else {
            Issue.record("the newest events of the wildcard expected")
            return
        }
        #expect(newest.count == 10, "events still held, not only empty lines")
        guard case .events = history.missed(named, since: .topic(1)) else {
            Issue.record("the named ticker's line kept: nothing missed since its event")
            return
        }
        guard case .gap = history.missed(Topic(eventType: "T", ticker: "S0-0")!, since: .topic(1)) else {
            Issue.record("a ticker let go resumes as a gap")
            return
        }
    }

    @Test func aBufferIsCountedWholeUntilTheLastEventOfItIsLetGo() throws {
        var limits = HistoryLimits()
        limits.eventsPerTopic = 1
        let history = EventHistory(limits: limits, epoch: "e")
        for ticker in ["A", "B"] { history.wanted(Topic(eventType: "T", ticker: ticker)!, now: 0) }
        let lines = 2 * EventHistory.overheadPerLine
        // A and B stamped together: one buffer, counted whole once.
        let first = history.keep([event("T", "A", 1), event("T", "B", 1)], at: 0)
        let firstBuffer = first[0].bytes.storageCapacity + EventHistory.overheadPerBuffer
        #expect(first[1].bytes.withVeryUnsafeBytesWithStorageManagement { $1.toOpaque() } == first[0].bytes.withVeryUnsafeBytesWithStorageManagement { $1.toOpaque() })
        #expect(history.memory == lines + 2 * EventHistory.overheadPerEvent + firstBuffer)
        // A's next pushes A's first out; B's first still holds the buffer, so it still counts, and the
        // emptied slot stays in the arrival ring, counted, until the ring lets it go.
        let second = history.keep([event("T", "A", 2)], at: 0)
        let secondBuffer = second[0].bytes.storageCapacity + EventHistory.overheadPerBuffer
        let emptySlot = EventHistory.slotBytes
        #expect(history.memory == lines + 2 * EventHistory.overheadPerEvent + emptySlot + firstBuffer + secondBuffer)
        // B's next lets its first go: the first buffer is no longer held.
        let third = history.keep([event("T", "B", 2)], at: 0)
        let thirdBuffer = third[0].bytes.storageCapacity + EventHistory.overheadPerBuffer
        #expect(history.memory == lines + 2 * EventHistory.overheadPerEvent + 2 * emptySlot + secondBuffer + thirdBuffer)
        // The age bound takes every slot: only the lines are left.
        history.evict(now: 10_000_000)
        #expect(history.memory == lines)
        // What a slot really takes (as its queue holds it: optional, `nil` once removed) is within what each event is counted.
        #expect(MemoryLayout<EventHistory.Slot?>.stride <= EventHistory.slotBytes, "\(MemoryLayout<EventHistory.Slot?>.stride)")
        // And a line: its object as malloc holds it, with its ring of one event, within what it is counted.
        let topic = Topic(checkedEventType: "T", ticker: "AAPL")
        let line = EventHistory.TopicLine(topic: topic, type: EventHistory.TypeLine(), interruptions: 0)
        line.held.append(1)
        // glibc's `malloc_usable_size` (not in Swift's Glibc module): what malloc gave the object.
        typealias UsableSize = @convention(c) (UnsafeMutableRawPointer?) -> Int
        let symbol = try #require(dlsym(UnsafeMutableRawPointer(bitPattern: 0), "malloc_usable_size"), "glibc's malloc_usable_size")
        let object = unsafeBitCast(symbol, to: UsableSize.self)(Unmanaged.passUnretained(line).toOpaque())
        // The ring's storage: its places and its header (an object's 16 bytes and the count and capacity).
        let ring = MemoryLayout<UInt64>.stride * line.held.capacity + 32
        #expect(object + ring <= EventHistory.overheadPerLine, "\(object) B and a ring of \(line.held.capacity)")
    }

    @Test func aPublishIsStampedIntoBuffersItNearlyFills() {
        // 50 quotes of about 180 bytes: one buffer of the publish's size would be rounded up to a power
        // of two (16 KiB for ~10 KiB); buffers of a power of two each, filled in turn, are not.
        let padding = String(repeating: "x", count: 120)
        let events = (0..<50).map {
            MarketEvent(eventType: "Q", ticker: "S\($0)", bytes: ByteBuffer(string: #"{"ev":"Q","sym":"S\#($0)","x":"\#(padding)"}"#))
        }
        let stamped = EventPosition.stamp(events, (1...50).map { EventPosition(topic: UInt64($0), market: UInt64(1_000_000 + $0)) })
        #expect(stamped.count == 50)
        var capacities: [UInt: Int] = [:]
        for event in stamped {
            capacities[UInt(bitPattern: event.bytes.withVeryUnsafeBytesWithStorageManagement { $1.toOpaque() })] = event.bytes.storageCapacity
        }
        let used = stamped.reduce(0) { $0 + $1.bytes.readableBytes }
        let held = capacities.values.reduce(0, +)
        #expect(capacities.count <= 4, "a few buffers per publish, not one per event: \(capacities.values.sorted())")
        #expect(Double(held) <= Double(used) * 1.1, "\(held) bytes held for \(used)")
        #expect(String(buffer: stamped[49].bytes).hasSuffix(#","_s":50,"_m":1000050}"#))
    }

    @Test func aReplayIsCutWhereItsFramesWouldPassATurnsBytesAndNothingElseIs() {
        let live = HubDelivery((0..<3).map { event("Q", "L", $0) })
        let replay = HubDelivery(replay: (0..<100).map { event("Q", "R", $0) })
        let after = HubDelivery([event("Q", "L", 9)])
        let size = event("Q", "R", 10).bytes.readableBytes + 1
        var deliveries = [live, replay, after]
        // Room for the live events and ten replayed ones.
        let budget = live.framedBytes + 10 * size
        let rest = HubDelivery.cut(&deliveries, afterBytes: budget)
        #expect(rest != nil)
        var kept: [MarketEvent] = []
        for delivery in deliveries { delivery.append(to: &kept) }
        var left: [MarketEvent] = []
        for delivery in rest ?? [] { delivery.append(to: &left) }
        #expect(kept.map(\.json) == ((0..<3).map { event("Q", "L", $0) } + (0..<10).map { event("Q", "R", $0) }).map(\.json))
        #expect(left.map(\.json) == ((10..<100).map { event("Q", "R", $0) } + [event("Q", "L", 9)]).map(\.json))
        #expect(rest?.first?.replayWeight == 90 && rest?.last?.replayWeight == 0)
        // Within the budget: untouched. Past it without a replay: untouched (the buffer bounds those).
        var small = [live, after]
        #expect(HubDelivery.cut(&small, afterBytes: 1) == nil && small.count == 2)
        // A budget smaller than one event still sends one.
        var tiny = [replay]
        #expect(HubDelivery.cut(&tiny, afterBytes: 1)?.first?.count == 99)
        #expect(tiny.first?.count == 1)
        // Live deliveries past `liveBytes` wait for the next turn, whole, in order; the first always goes.
        var runs = [live, after, live]
        let later = HubDelivery.cut(&runs, afterBytes: 1 << 20, liveBytes: live.framedBytes + 1)
        #expect(runs.count == 1 && later?.count == 2 && later?.first?.count == 1, "\(runs.count) kept, \(later?.count ?? 0) left")
        var one = [live]
        #expect(HubDelivery.cut(&one, afterBytes: 1, liveBytes: 1) == nil && one.count == 1)
    }
}
