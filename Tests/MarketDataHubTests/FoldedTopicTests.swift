import AlpacaWire
import MarketCore
import MetricsTestKit
import NIOCore
import Testing

@testable import MarketDataHub

/// Topics the hub folds (Alpaca's crypto order books): a late subscriber starts from the whole book,
/// and never from one the hub knows is not whole.
@Suite("Hub: folded topics")
struct FoldedTopicTests {
    let wire = AlpacaWireProtocol(feed: .crypto)

    func hub(history: HistoryLimits? = nil) -> MarketDataHub {
        MarketDataHub(
            wire: wire, snapshotless: wire.snapshotless(of: .crypto), folding: wire.folding(of: .crypto, limits: FoldLimits()), history: history)
    }

    func book(_ bids: [(Double, Double)], _ asks: [(Double, Double)], reset: Bool = false, symbol: String = "BTC/USD") -> MarketEvent {
        func side(_ levels: [(Double, Double)]) -> MessagePack.Value {
            .array(levels.map { .map([.init(.string("p"), .double($0.0)), .init(.string("s"), .double($0.1))]) })
        }
        var fields: [(String, MessagePack.Value)] = [("T", .string("o")), ("S", .string(symbol)), ("b", side(bids)), ("a", side(asks))]
        if reset { fields.append(("r", .bool(true))) }
        return AlpacaEvents.event("o", symbol, fields)
    }

    func describe(_ event: MarketEvent) throws -> String {
        let value = try MessagePack.decode(event.bytes.readableBytesView)
        func side(_ key: String) -> String {
            (value[key]?.array ?? []).map { level in
                ["p", "s"].map { if case .double(let number)? = level[$0] { "\(number)" } else { "?" } }.joined(separator: "x")
            }.joined(separator: ",")
        }
        var reset = false
        if case .bool(true)? = value["r"] { reset = true }
        return "\(value["S"]?.string ?? "?") \(reset ? "reset " : "")b[\(side("b"))] a[\(side("a"))]"
    }

    /// A book wildcard's gap whose whole states do not fit in what the resume may replay: they come
    /// after `resumed`, through the client's buffer, as a wildcard subscribe's do (never not at all:
    /// its updates would have no book to apply to).
    @Test func aBookWildcardsWholeStatesPastTheResumesBoundComeThroughTheBuffer() async throws {
        let hub = hub(history: HistoryLimits(eventsPerResume: 5))
        let holder = await hub.subscribe(to: topics("o.*"))
        for index in 0..<10 { await hub.publish([book([(100, 1)], [(101, 1)], reset: true, symbol: "B\(index)/USD")]) }
        let subscription = await hub.subscribe()
        let wildcard = Topic(eventType: "o", ticker: "*")!
        let outcome = await hub.add([wildcard], to: subscription.id, resuming: .positions(epoch: "another", [wildcard: 1]))
        #expect(outcome.gaps == [wildcard])
        let got = try await take(12, from: subscription.events)
        let books = got.dropFirst(2).map(\.ticker).sorted()
        #expect(books == (0..<10).map { "B\($0)/USD" }.sorted(), "\(got.map(\.ticker))")
        _ = holder
    }

    /// The topic table's bound holds for books under a wildcard too: they go after every plain last
    /// value nobody holds, and go (oldest first) when they alone fill the table.
    @Test func foldedTopicsUnderAWildcardGoLastButGoWhenTheyAloneFillTheTable() async throws {
        let hub = MarketDataHub(
            wire: wire, snapshotless: wire.snapshotless(of: .crypto), folding: wire.folding(of: .crypto, limits: FoldLimits()),
            topicsKept: 20, history: nil)
        let holder = await hub.subscribe(to: topics("o.*", "t.*"))
        func at(_ time: Int, _ event: MarketEvent) -> MarketEvent {
            MarketEvent(eventType: event.eventType, ticker: event.ticker, bytes: event.bytes, receivedAt: UInt64(time))
        }
        func trade(_ symbol: String) -> MarketEvent {
            AlpacaEvents.event("t", symbol, [("T", .string("t")), ("S", .string(symbol)), ("p", .double(1)), ("s", .double(1))])
        }
        for index in 0..<10 { await hub.publish([at(index + 1, book([(100, 1)], [(101, 1)], reset: true, symbol: "B\(index)/USD"))]) }
        for index in 0..<30 { await hub.publish([at(100 + index, trade("T\(index)/USD"))]) }
        #expect(await hub.topicEntryCount <= 20)
        for index in 0..<10 {
            let kept = await hub.lastEvent(for: Topic(eventType: "o", ticker: "B\(index)/USD")!)
            #expect(kept != nil, "book \(index), older than every trade, stays: plain last values go first")
        }
        // Books alone past the bound: the oldest go.
        for index in 10..<40 { await hub.publish([at(1000 + index, book([(100, 1)], [(101, 1)], reset: true, symbol: "B\(index)/USD"))]) }
        #expect(await hub.topicEntryCount <= 20)
        #expect(await hub.lastEvent(for: Topic(eventType: "o", ticker: "B39/USD")!) != nil, "the newest book stays")
        #expect(await hub.lastEvent(for: Topic(eventType: "o", ticker: "B0/USD")!) == nil, "the oldest book went")
        #expect(try await take(70, from: holder.events).count == 70, "the wildcards' holder got every event")
    }

    /// The table's bound holds in bytes too: an upstream or a NATS publisher naming ever new tickers,
    /// with large events, cannot make the hub keep their last values past it. The oldest nobody holds by
    /// name go first; one held by name stays, however old.
    @Test func theTopicTableKeepsItsLastValuesWithinItsBytes() async throws {
        let hub = MarketDataHub(wire: .polygon, history: nil)
        let room = 256 << 10
        await hub.limitTable(lastValues: room)
        let padding = String(repeating: "x", count: 4000)
        func quote(_ ticker: String, _ n: Int) -> MarketEvent {
            MarketEvent(
                eventType: "Q", ticker: ticker, bytes: ByteBuffer(string: #"{"ev":"Q","sym":"\#(ticker)","n":\#(n),"pad":"\#(padding)"}"#),
                receivedAt: UInt64(n + 1))
        }
        let named = await hub.subscribe(to: topics("Q.AAPL"))
        await hub.publish([quote("AAPL", 0)])
        for n in 1...400 {
            await hub.publish([quote("S\(n)", n)])
            let bytes = await hub.lastValueBytes()
            // Counted a few publishes late (when the hub gives them bytes of their own), trimmed to nine
            // tenths, and again a tenth later.
            #expect(bytes <= room + room / 10 + 16 * 8192, "\(bytes) bytes of last values after \(n) tickers")
        }
        let kept = await hub.topicEntryCount
        #expect(kept < 100, "\(kept) topics kept")
        #expect(await hub.lastEvent(for: Topic(parsing: "Q.AAPL")!) != nil, "held by name: kept")
        #expect(await hub.lastEvent(for: Topic(parsing: "Q.S400")!) != nil, "the newest kept")
        #expect(await hub.lastEvent(for: Topic(parsing: "Q.S1")!) == nil, "the oldest let go")
        await hub.remove(named.id)
    }

    @Test func selectionFindsTheSmallestLikeSortingDoes() {
        var steps: UInt64 = 99
        func next() -> UInt64 {
            steps = steps &* 6_364_136_223_846_793_005 &+ 1_442_695_040_888_963_407
            return steps >> 33
        }
        let shapes: [[UInt64]] = [
            (0..<1000).map { _ in next() % 50 },  // many equal
            (0..<1000).map { UInt64($0) },  // sorted, as ages often are
            (0..<1000).map { UInt64(1000 - $0) },  // reversed
            (0..<997).map { _ in next() },
            [7], [3, 3], [5, 1],
        ]
        for shape in shapes {
            let sorted = shape.sorted()
            for count in Set([1, 2, shape.count / 10, shape.count / 2, shape.count]).filter({ $0 >= 1 && $0 <= shape.count }) {
                var values = shape
                let cut = LastValueBound.smallest(count, of: &values)
                #expect(cut == sorted[count - 1], "the \(count)-th of \(shape.count)")
                #expect(values.prefix(count).sorted() == Array(sorted.prefix(count)), "the first \(count) are the smallest")
                #expect(values.sorted() == sorted, "nothing lost")
            }
        }
    }

    @Test func aLateSubscriberGetsTheWholeBookThenTheChanges() async throws {
        let hub = hub(history: HistoryLimits())
        let first = await hub.subscribe(to: topics("o.BTC/USD"))
        await hub.publish([book([(100, 1), (99, 2)], [(101, 1)], reset: true)])
        await hub.publish([book([(99, 0), (98, 5)], [(101, 3)])])
        #expect(try await take(2, from: first.events).count == 2)
        let late = await hub.subscribe(to: topics("o.BTC/USD"))
        await hub.publish([book([(100, 4)], [])])
        let got = try await take(2, from: late.events)
        #expect(try got.map(describe) == ["BTC/USD reset b[100.0x1.0,98.0x5.0] a[101.0x3.0]", "BTC/USD b[100.0x4.0] a[]"])
        // Positioned as the change folded in last: a resume from it goes on after it.
        #expect(EventPosition.read(from: got[0].bytes)?.topic == 2)
    }

    /// Alpaca itself sends the whole book after a subscribe: so does the relay without snapshots; and a
    /// book's last value (`/v1/last`) is the whole book, never its last change.
    @Test func theWholeBookComesWithoutSnapshotsAndIsTheBooksLastValue() async throws {
        let hub = MarketDataHub(
            wire: wire, snapshotOnSubscribe: false, snapshotless: wire.snapshotless(of: .crypto),
            folding: wire.folding(of: .crypto, limits: FoldLimits()), history: nil)
        let first = await hub.subscribe(to: topics("o.BTC/USD"))
        await hub.publish([book([(100, 1)], [(101, 1)], reset: true), book([(99, 2)], [])])
        _ = try await take(2, from: first.events)
        let late = await hub.subscribe(to: topics("o.BTC/USD"))
        #expect(try await take(1, from: late.events).map(describe) == ["BTC/USD reset b[100.0x1.0,99.0x2.0] a[101.0x1.0]"])
        let topic = try #require(Topic(eventType: "o", ticker: "BTC/USD"))
        let last = try #require(await hub.lastEvent(for: topic))
        #expect(try describe(last) == "BTC/USD reset b[100.0x1.0,99.0x2.0] a[101.0x1.0]")
        await hub.upstreamLost(reason: "test")
        #expect(await hub.lastEvent(for: topic) == nil, "no book it cannot vouch for")
    }

    @Test func aWildcardSubscriberGetsEveryWholeBook() async throws {
        let hub = hub()
        let first = await hub.subscribe(to: topics("o.BTC/USD", "o.ETH/USD"))
        await hub.publish([book([(100, 1)], [(101, 1)], reset: true), book([(10, 1)], [(11, 1)], reset: true, symbol: "ETH/USD")])
        _ = try await take(2, from: first.events)
        let wild = await hub.subscribe(to: topics("o.*"))
        let got = try await take(2, from: wild.events)
        #expect(try Set(got.map(describe)) == ["BTC/USD reset b[100.0x1.0] a[101.0x1.0]", "ETH/USD reset b[10.0x1.0] a[11.0x1.0]"])
    }

    /// While the wildcard lingers after its last holder left, its books are still followed (their
    /// changes still come): a holder that takes it again gets every book whole at once, brought up to
    /// date, without asking the upstream again.
    @Test func booksAreFollowedWhileTheirWildcardLingersAndServedWholeWhenItIsTakenAgain() async throws {
        let hub = MarketDataHub(
            wire: wire, snapshotless: wire.snapshotless(of: .crypto), folding: wire.folding(of: .crypto, limits: FoldLimits()), history: nil,
            wildcardLinger: .seconds(60))
        let wild = await hub.subscribe(to: topics("o.*"))
        await hub.publish([book([(100, 1)], [(101, 1)], reset: true), book([(10, 1)], [(11, 1)], reset: true, symbol: "ETH/USD")])
        _ = try await take(2, from: wild.events)
        await hub.remove(wild.id)
        // Changes while nobody holds the wildcard: followed.
        await hub.publish([book([(100, 3)], [])])
        let again = await hub.subscribe(to: topics("o.*"))
        let got = try await take(2, from: again.events)
        #expect(try Set(got.map(describe)) == ["BTC/USD reset b[100.0x3.0] a[101.0x1.0]", "ETH/USD reset b[10.0x1.0] a[11.0x1.0]"])
    }

    @Test func noBookIsServedBeforeTheVendorsWholeOneNorAfterAnOutageOrWhileUnwanted() async throws {
        let hub = hub()
        let first = await hub.subscribe(to: topics("o.BTC/USD", "t.BTC/USD"))
        // Changes before any whole book: nothing to serve a second subscriber.
        await hub.publish([book([(100, 1)], [])])
        _ = try await take(1, from: first.events)
        let second = await hub.subscribe(to: topics("o.BTC/USD", "t.BTC/USD"))
        await hub.publish([AlpacaEvents.trade("BTC/USD", id: 1, price: 100, size: 1, nanoseconds: 0, crypto: true)])
        #expect(try await take(1, from: second.events).map(\.eventType) == ["t"], "no book first")
        // Whole, then the upstream is lost: not whole until the vendor's next whole book.
        await hub.publish([book([(100, 1)], [(101, 1)], reset: true)])
        await hub.upstreamLost(reason: "test")
        let third = await hub.subscribe(to: topics("o.BTC/USD", "t.BTC/USD"))
        await hub.publish([AlpacaEvents.trade("BTC/USD", id: 2, price: 100, size: 1, nanoseconds: 0, crypto: true)])
        let afterOutage = try await take(3, from: third.events)
        #expect(!afterOutage.contains { $0.eventType == "o" }, "\(afterOutage.map(\.eventType))")
        // Whole again; then nobody holds it, so its changes stop coming: not served when held again.
        await hub.publish([book([(100, 2)], [(101, 1)], reset: true)])
        await hub.remove(topics("o.BTC/USD"), from: first.id)
        await hub.remove(topics("o.BTC/USD"), from: second.id)
        await hub.remove(topics("o.BTC/USD"), from: third.id)
        let fourth = await hub.subscribe(to: topics("o.BTC/USD", "t.BTC/USD"))
        await hub.publish([AlpacaEvents.trade("BTC/USD", id: 3, price: 100, size: 1, nanoseconds: 0, crypto: true)])
        let got = try await take(2, from: fourth.events)
        #expect(got.map(\.eventType) == ["t", "t"], "the last trade, then the new one; no stale book")
    }

    /// A subscriber that fell behind lost changes to its book: right after its `lagging` notice it gets
    /// the book whole again.
    @Test func aSubscriberThatLostChangesGetsItsBookWholeAfterTheNotice() async throws {
        let hub = hub()
        let subscription = await hub.subscribe(to: topics("o.BTC/USD"))
        await hub.publish([book([(100, 1)], [(101, 1)], reset: true)])
        // Nobody reads: past the buffer's 1,000 events the rest are lost.
        await hub.publish((1...1_200).map { book([(Double(90 + $0 % 7), Double($0))], []) })
        _ = try await take(1_000, from: subscription.events)
        await hub.publish([book([(95, 0)], [])])
        let got = try await take(3, from: subscription.events)
        #expect(got[0].isNotice, "the lagging notice first: \(got[0].eventType)")
        let whole = try describe(got[1])
        #expect(whole.hasPrefix("BTC/USD reset "), "then the book whole: \(whole)")
        #expect(!whole.contains("95.0x"), "as of the change after the notice: \(whole)")
        #expect(try describe(got[2]) == "BTC/USD b[95.0x0.0] a[]")
    }

    @Test func theRenewalPacerWaitsAGraceThenRepeatsAtItsInterval() throws {
        var pacer = RenewalPacer()
        let topic = try #require(Topic(eventType: "o", ticker: "BTC/USD"))
        let start = ContinuousClock.now
        #expect(pacer.due([topic], now: start).isEmpty, "the vendor's whole book may be on its way")
        #expect(pacer.due([topic], now: start + .seconds(2)) == [topic])
        #expect(pacer.due([topic], now: start + .seconds(5)).isEmpty, "not again within the interval")
        #expect(pacer.due([topic], now: start + .seconds(12)) == [topic])
        // Whole again, then not: a new grace.
        #expect(pacer.due([], now: start + .seconds(13)).isEmpty)
        #expect(pacer.due([topic], now: start + .seconds(14)).isEmpty)
    }

    /// A whole book from a former term (its sequences started afresh) is not taken even when its topic
    /// sequence happens to fit: its market sequence does not.
    @Test func aClusterNodeTakesNoWholeBookWhoseSequencesDisagreeWithItsChanges() async throws {
        let hub = MarketDataHub(
            wire: wire, snapshotless: wire.snapshotless(of: .crypto), folding: wire.folding(of: .crypto, limits: FoldLimits()),
            keepsUnwantedLastValues: false, history: HistoryLimits(), adoptsPositions: true)
        func positioned(_ event: MarketEvent, _ topic: UInt64, _ market: UInt64) -> MarketEvent {
            EventPosition.stamp([event], [EventPosition(topic: topic, market: market)])[0]
        }
        let subscription = await hub.subscribe(to: topics("o.BTC/USD", "t.BTC/USD"))
        await hub.publish([positioned(book([(99, 1)], []), 3, 30), positioned(book([(98, 1)], []), 4, 40)])
        // Topic sequence 3 fits, but a market sequence of 900 is after the held change at 4 (market 40).
        await hub.seed(positioned(book([(1, 1)], [(2, 1)], reset: true), 3, 900))
        #expect(await hub.foldsNotWhole().count == 1)
        await hub.seed(positioned(book([(100, 1)], [(101, 1)], reset: true), 3, 35))
        let got = try await take(1, from: subscription.events)
        #expect(try got.map(describe) == ["BTC/USD reset b[100.0x1.0,98.0x1.0] a[101.0x1.0]"])
    }

    /// A cluster node (positions from the leader) that begins receiving a book late holds its changes
    /// back until it takes the leader's whole book from the store, brought up to date by position; a
    /// whole book older than a missing change is not taken.
    @Test func aClusterNodeHoldsChangesBackUntilAWholeBookItCanBringUpToDate() async throws {
        let hub = MarketDataHub(
            wire: wire, snapshotless: wire.snapshotless(of: .crypto), folding: wire.folding(of: .crypto, limits: FoldLimits()),
            keepsUnwantedLastValues: false, history: HistoryLimits(), adoptsPositions: true)
        func positioned(_ event: MarketEvent, _ topic: UInt64) -> MarketEvent {
            EventPosition.stamp([event], [EventPosition(topic: topic, market: topic * 10)])[0]
        }
        let subscription = await hub.subscribe(to: topics("o.BTC/USD", "t.BTC/USD"))
        await hub.publish([positioned(book([(99, 1)], [(102, 2)]), 5), positioned(book([(98, 3)], []), 6)])
        #expect(await hub.foldsNotWhole() == [Topic(eventType: "o", ticker: "BTC/USD")])
        // Older than a change this node never saw (topic sequence 4 is missing): not taken.
        await hub.seed(positioned(book([(100, 1)], [(101, 1)], reset: true), 2))
        // Just before the first change held back: taken, with both changes folded in.
        await hub.seed(positioned(book([(100, 1)], [(101, 1)], reset: true), 4))
        await hub.publish([positioned(book([(100, 0)], []), 7)])
        let got = try await take(2, from: subscription.events)
        #expect(try got.map(describe) == ["BTC/USD reset b[100.0x1.0,99.0x1.0,98.0x3.0] a[101.0x1.0,102.0x2.0]", "BTC/USD b[100.0x0.0] a[]"])
        #expect(EventPosition.read(from: got[0].bytes)?.topic == 6)
        #expect(await hub.foldsNotWhole().isEmpty)
        // A later whole book changes nothing: this node's is whole.
        await hub.seed(positioned(book([(1, 1)], [(2, 1)], reset: true), 7))
        await hub.publish([AlpacaEvents.trade("BTC/USD", id: 1, price: 100, size: 1, nanoseconds: 0, crypto: true)])
        #expect(try await take(1, from: subscription.events).map(\.eventType) == ["t"])
    }

    /// A cluster node's books hold changes back within one room for all of them: a publisher that keeps
    /// many books from being whole (changes, never a whole book) cannot make the node hold up to a
    /// megabyte for each. Past the room a book's changes are not held; one that held its changes is
    /// still brought up to date, and what books held is given back as they become whole or go.
    @Test func booksHoldChangesBackWithinOneRoomForAllOfThem() async throws {
        let metrics = TestMetrics()
        let hub = MarketDataHub(
            wire: wire, snapshotless: wire.snapshotless(of: .crypto), folding: wire.folding(of: .crypto, limits: FoldLimits()),
            keepsUnwantedLastValues: false, history: HistoryLimits(), adoptsPositions: true, metricsFactory: metrics)
        let room = 64 << 10
        await hub.limitTable(heldBack: room)
        let subscription = await hub.subscribe(to: topics("o.*"))
        let levels = (0..<40).map { (Double(1000 - $0), 1.0) }
        var market: UInt64 = 0
        for symbol in 0..<100 {
            for change in 1...5 {
                market += 1
                let event = book(levels, [], symbol: "S\(symbol)/USD")
                await hub.publish(EventPosition.stamp([event], [EventPosition(topic: UInt64(change), market: market)]))
            }
        }
        let held = await hub.heldBackRoom()
        #expect(held.total <= room && held.total > room / 2, "the room filled, and no more: \(held)")
        #expect(held.refused > 0, "changes past the room not held: \(held)")
        #expect(metrics.counterTotal(label: "relay_book_changes_not_held_total") == Int64(held.refused), "and counted for the operator")
        // The first book held its five changes (markets 1 to 5): a whole book at the fifth takes them up.
        let whole = book([(1, 1)], [(2, 1)], reset: true, symbol: "S0/USD")
        await hub.seed(EventPosition.stamp([whole], [EventPosition(topic: 5, market: 5)])[0])
        #expect(await !hub.foldsNotWhole().contains(Topic(eventType: "o", ticker: "S0/USD")!), "brought up to date")
        #expect(await hub.heldBackRoom().total < held.total, "what it held given back")
        // Nobody holds the books any more: their entries go, and what they held with them.
        await hub.remove(subscription.id)
        await hub.compactLastValues()
        #expect(await hub.heldBackRoom().total == 0)
    }
}
