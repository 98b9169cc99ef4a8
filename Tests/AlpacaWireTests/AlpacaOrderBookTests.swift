import AlpacaWire
import MarketCore
import NIOCore
import Testing

/// Alpaca's crypto order book kept from its increments (`AlpacaOrderBook`).
@Suite("Alpaca order books")
struct AlpacaOrderBookTests {
    typealias Levels = [(Double, Double)]

    func event(bids: Levels, asks: Levels, reset: Bool = false, nanoseconds: Int64 = 1_700_000_000_000_000_000) -> MarketEvent {
        func side(_ levels: Levels) -> MessagePack.Value {
            .array(levels.map { .map([.init(.string("p"), .double($0.0)), .init(.string("s"), .double($0.1))]) })
        }
        var fields: [(String, MessagePack.Value)] = [
            ("T", .string("o")), ("S", .string("BTC/USD")), ("t", AlpacaEvents.time(nanoseconds: nanoseconds)), ("b", side(bids)), ("a", side(asks)),
        ]
        if reset { fields.append(("r", .bool(true))) }
        return AlpacaEvents.event("o", "BTC/USD", fields)
    }

    func decoded(_ event: MarketEvent) throws -> MessagePack.Value { try MessagePack.decode(event.bytes.readableBytesView) }

    func levels(_ value: MessagePack.Value?) -> [[Double]] {
        (value?.array ?? []).map { level in
            ["p", "s"].map { key in if case .double(let number)? = level[key] { number } else { .nan } }
        }
    }

    @Test func aResetThenIncrementsMakeTheBookAndSizeZeroRemovesALevel() throws {
        let book = AlpacaOrderBook(symbol: "BTC/USD", levels: 100)
        #expect(book.whole() == nil, "nothing before the vendor's whole book")
        book.apply(event(bids: [(100, 1), (99, 2)], asks: [(101, 1), (102, 3)], reset: true))
        book.apply(event(bids: [(99.5, 4), (100, 0)], asks: [(102, 5)], nanoseconds: 1_700_000_000_000_000_001))
        #expect(book.bidLevels.map(\.price) == [99.5, 99])
        #expect(book.bidLevels.map(\.size) == [4, 2])
        #expect(book.askLevels.map(\.price) == [101, 102])
        #expect(book.askLevels.map(\.size) == [1, 5])
        let whole = try #require(book.whole())
        let value = try decoded(whole)
        #expect(value["T"]?.string == "o" && value["S"]?.string == "BTC/USD")
        guard case .bool(true)? = value["r"] else {
            Issue.record("the whole book is not marked r:true: \(value)")
            return
        }
        #expect(levels(value["b"]) == [[99.5, 4], [99, 2]])
        #expect(levels(value["a"]) == [[101, 1], [102, 5]])
        guard case .timestamp(_, let nanoseconds)? = value["t"] else {
            Issue.record("no time: \(value)")
            return
        }
        #expect(nanoseconds == 1, "the time of the last change folded in")
    }

    @Test func aSecondResetReplacesTheBookWhole() {
        let book = AlpacaOrderBook(symbol: "BTC/USD", levels: 100)
        book.apply(event(bids: [(100, 1), (99, 2)], asks: [(101, 1)], reset: true))
        book.apply(event(bids: [(98, 7)], asks: [(103, 1)], reset: true))
        #expect(book.bidLevels.map(\.price) == [98])
        #expect(book.askLevels.map(\.price) == [103])
    }

    @Test func eachSideKeepsItsBestLevelsWithinTheBound() {
        let book = AlpacaOrderBook(symbol: "BTC/USD", levels: 3)
        book.apply(event(bids: [(100, 1), (99, 1), (98, 1), (97, 1)], asks: [(104, 1), (103, 1), (102, 1), (101, 1)], reset: true))
        #expect(book.bidLevels.map(\.price) == [100, 99, 98])
        #expect(book.askLevels.map(\.price) == [101, 102, 103])
        #expect(book.levelsDropped == 2)
        // A better level pushes out the worst; a worse one is not kept.
        book.apply(event(bids: [(100.5, 2), (90, 1)], asks: []))
        #expect(book.bidLevels.map(\.price) == [100.5, 100, 99])
        #expect(book.levelsDropped == 4)
    }

    /// Many levels in one change are taken best first: sent worst first they would each be inserted at
    /// the front (a cost of levels × bound). The book is the same as taken one by one: the best within
    /// the bound, the last word on a price repeated.
    @Test func manyLevelsInOneChangeKeepTheBestAndTheLastWordOnEachPrice() {
        let book = AlpacaOrderBook(symbol: "BTC/USD", levels: 50)
        let bids: Levels = (1...20_000).map { (Double($0), 1) } + [(19_999, 7), (20_000, 0)]
        let asks: Levels = (1...20_000).reversed().map { (Double(20_000 + $0), 2) } + [(20_001, 9)]
        book.apply(event(bids: bids, asks: asks, reset: true))
        #expect(book.bidLevels.count == 50 && book.askLevels.count == 50)
        #expect(book.bidLevels.first?.price == 19_999 && book.bidLevels.first?.size == 7, "20,000 removed, 19,999 its last size")
        #expect(book.bidLevels.last?.price == 19_950)
        #expect(book.askLevels.first?.price == 20_001 && book.askLevels.first?.size == 9)
        #expect(book.askLevels.last?.price == 20_050)
        #expect(book.whole() != nil, "levels left out of a reset past the bound leave it whole")
    }

    @Test func aSidePastItsBoundThatShrinksIsNoLongerWhole() {
        let book = AlpacaOrderBook(symbol: "BTC/USD", levels: 2)
        book.apply(event(bids: [(100, 1), (99, 1), (98, 1)], asks: [(101, 1)], reset: true))
        #expect(book.isWhole, "the best two levels are whole")
        // 98 was left out; with 99 gone it may belong among the two kept.
        book.apply(event(bids: [(99, 0)], asks: []))
        #expect(!book.isWhole && book.whole() == nil)
        book.apply(event(bids: [(100, 1), (98, 1)], asks: [(101, 1)], reset: true))
        #expect(book.isWhole)
        // Zero or negative prices are no levels.
        book.apply(event(bids: [(0, 1)], asks: []))
        #expect(!book.isWhole)
    }

    @Test func anUnreadableChangeOrAnInterruptionLeavesNoWholeBookUntilTheNextReset() {
        let book = AlpacaOrderBook(symbol: "BTC/USD", levels: 10)
        book.apply(event(bids: [(100, 1)], asks: [(101, 1)], reset: true))
        #expect(book.isWhole)
        book.apply(AlpacaEvents.event("o", "BTC/USD", [("T", .string("o")), ("S", .string("BTC/USD")), ("b", .string("not levels"))]))
        #expect(!book.isWhole && book.whole() == nil)
        book.apply(event(bids: [(100, 1)], asks: [(101, 1)], reset: true))
        #expect(book.isWhole)
        book.interrupt()
        #expect(book.whole() == nil)
        // Changes alone never make it whole again.
        book.apply(event(bids: [(100, 2)], asks: []))
        #expect(book.whole() == nil)
        // Nor do negative sizes or bytes that are not MessagePack.
        book.apply(event(bids: [(100, 1)], asks: [(101, 1)], reset: true))
        book.apply(event(bids: [(100, -1)], asks: []))
        #expect(!book.isWhole)
        book.apply(event(bids: [(100, 1)], asks: [(101, 1)], reset: true))
        book.apply(MarketEvent(eventType: "o", ticker: "BTC/USD", bytes: ByteBuffer(bytes: [0xC1])))
        #expect(!book.isWhole)
    }

    @Test func theWholeBookCarriesThePositionOfTheLastChange() throws {
        let book = AlpacaOrderBook(symbol: "BTC/USD", levels: 10)
        let positions = [EventPosition(topic: 1, market: 10), EventPosition(topic: 2, market: 14)]
        let events = EventPosition.stamp(
            [event(bids: [(100, 1)], asks: [(101, 1)], reset: true), event(bids: [(100, 3)], asks: [])], positions)
        for event in events { book.apply(event) }
        let whole = try #require(book.whole())
        #expect(EventPosition.read(from: whole.bytes) == positions[1])
        #expect(levels(try decoded(whole)["b"]) == [[100, 3]])
    }

    @Test func onlyAlpacasCryptoFeedFoldsItsOrderBooks() {
        #expect(AlpacaWireProtocol(feed: .crypto).folding(of: .crypto, limits: FoldLimits())?.eventTypes == ["o"])
        #expect(AlpacaWireProtocol(feed: .iex).folding(of: .stocks, limits: FoldLimits()) == nil)
    }
}
