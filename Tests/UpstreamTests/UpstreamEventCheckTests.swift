import AlpacaWire
import MarketCore
import NIOCore
import PolygonWire
import Testing

@testable import Upstream

@Suite("What the relay takes from its upstream, event by event")
struct UpstreamEventCheckTests {
    func quote(_ ticker: String, type: String = "Q", pad: Int = 0) -> MarketEvent {
        MarketEvent(
            eventType: type, ticker: ticker,
            bytes: ByteBuffer(string: #"{"ev":"\#(type)","sym":"\#(ticker)","pad":"\#(String(repeating: "x", count: pad))"}"#))
    }

    @Test func eventsOfNoTypeOfTheMarketTooLongATickerOrTooLargeAreDroppedTheRestKeptInOrder() {
        let check = UpstreamEventCheck(market: .stocks, wire: PolygonWireProtocol(), maxBytes: 1_000, maxFoldedBytes: 1 << 20)
        let good = [quote("A"), quote("B", type: "T")]
        let all = check.passing(good)
        #expect(all.refused == 0 && all.first == nil && all.events.map(\.ticker) == ["A", "B"])
        let mixed = [quote("A"), quote("A", type: "XQ"), quote(String(repeating: "L", count: 41)), quote("BIG", pad: 2_000), quote("B", type: "T")]
        let passed = check.passing(mixed)
        #expect(passed.events.map(\.ticker) == ["A", "B"])
        #expect(passed.refused == 3)
        #expect(passed.first?.contains("XQ") == true, "\(passed.first ?? "")")
        // Crypto's types are crypto's: a stocks quote is not one of them.
        let crypto = UpstreamEventCheck(market: .crypto, wire: PolygonWireProtocol(), maxBytes: 1_000, maxFoldedBytes: 1 << 20)
        #expect(crypto.passing([quote("X:BTC-USD", type: "XQ"), quote("A")]).events.map(\.eventType) == ["XQ"])
    }

    @Test func aWholeOrderBookMayTakeAWholeMessageOtherEventsMayNot() {
        let wire = AlpacaWireProtocol(feed: .crypto)
        let check = UpstreamEventCheck(market: .crypto, wire: wire, maxBytes: 1_000, maxFoldedBytes: 1 << 20)
        let levels: MessagePack.Value = .array((0..<200).map { .map([.init(.string("p"), .double(Double($0))), .init(.string("s"), .double(1))]) })
        let book = AlpacaEvents.event("o", "BTC/USD", [("T", .string("o")), ("S", .string("BTC/USD")), ("b", levels), ("a", levels), ("r", .bool(true))])
        let trade = AlpacaEvents.event(
            "t", "BTC/USD", [("T", .string("t")), ("S", .string("BTC/USD")), ("p", .double(1)), ("s", .double(1)), ("pad", .string(String(repeating: "x", count: 2_000)))])
        #expect(book.bytes.readableBytes > 1_000 && trade.bytes.readableBytes > 1_000)
        let passed = check.passing([book, trade])
        #expect(passed.events.map(\.eventType) == ["o"], "the book is folded (its levels bounded there); the trade is too large")
        #expect(passed.refused == 1)
    }
}
