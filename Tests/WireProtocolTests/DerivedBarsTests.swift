import AlpacaWire
import Foundation
import MarketCore
import NIOCore
import PolygonWire
import Testing

/// Derived bars against hand-computed references: Polygon's stock trades with their conditions, windows
/// with no trade, a late trade, the UTC day's end, trade and volume bars; and each vendor's bar event.
@Suite("Derived bars")
struct DerivedBarsTests {
    /// 2023-11-14T22:13:20Z, a multiple of 5 and 10 s; midnight comes 6,400 s later.
    static let base: Int64 = 1_700_000_000_000
    static let midnight: Int64 = base + 6_400_000
    let rules = PolygonBarRules(market: .stocks)!

    func trade(_ offset: Int64, _ price: Double, _ size: Int, _ conditions: [Int] = [0], at base: Int64 = DerivedBarsTests.base) -> BarTrade {
        let json = #"{"ev":"T","sym":"AAPL","i":"1","x":4,"p":\#(price),"s":\#(size),"c":[\#(conditions.map(String.init).joined(separator: ","))],"t":\#(base + offset),"q":1,"z":3}"#
        guard let trade = rules.trade(in: MarketEvent(eventType: "T", ticker: "AAPL", bytes: ByteBuffer(string: json))) else {
            Issue.record("unreadable: \(json)")
            return BarTrade(price: 0, size: 0, time: 0)
        }
        return trade
    }

    func ns(_ milliseconds: Int64) -> Int64 { milliseconds * 1_000_000 }

    @Test func sizesParseAndRefuseWhatTheyShould() {
        #expect(BarSpec(parsing: "5m") == BarSpec(size: .seconds(300)))
        #expect(BarSpec(parsing: "10s") == BarSpec(size: .seconds(10)))
        #expect(BarSpec(parsing: "60m") == BarSpec(size: .seconds(3600)))
        #expect(BarSpec(parsing: "5mz") == BarSpec(size: .seconds(300), emptyBars: true))
        #expect(BarSpec(parsing: "100t") == BarSpec(size: .trades(100)))
        #expect(BarSpec(parsing: "5000v") == BarSpec(size: .volume(5000)))
        for bad in ["", "m", "0s", "05s", "3601s", "61m", "-5m", "+5m", "5x", "100tz", "5 m", "1.5m", "99999999999t"] {
            #expect(BarSpec(parsing: bad) == nil, "\(bad)")
        }
        #expect(BarSpec(size: .seconds(300), emptyBars: true).description == "5mz")
        #expect(BarSpec(size: .seconds(90)).description == "90s")
        let topic = Topic(eventType: "AM", ticker: "AAPL@5m")!
        #expect(topic.derivedBar?.symbol == "AAPL" && topic.derivedBar?.spec == BarSpec(size: .seconds(300)))
        #expect(rules.problem(with: topic) == nil)
        #expect(rules.problem(with: Topic(eventType: "T", ticker: "AAPL@5m")!) != nil, "a trade topic is no bar")
        #expect(rules.problem(with: Topic(eventType: "AM", ticker: "AAPL@7x")!) != nil)
        #expect(rules.problem(with: Topic(eventType: "AM", ticker: "@5m")!) != nil)
        #expect(rules.sourceTopic(of: topic) == Topic(eventType: "T", ticker: "AAPL"))
        #expect(Market.stocks.problem(with: topic) == nil)
        #expect(Market.forex.problem(with: Topic(eventType: "CA", ticker: "C:EUR-USD@5m")!) != nil, "no trades, no derived bars")
    }

    @Test func fiveSecondBarsFollowTheConditionsAndSkipLateTrades() throws {
        var builder = BarBuilder(spec: BarSpec(size: .seconds(5)))
        var bars: [Bar] = []
        // The first window a builder sees began before it: never sent.
        bars += builder.add(trade(-1000, 9.00, 100))
        bars += builder.add(trade(100, 10.00, 100))
        bars += builder.add(trade(1200, 10.50, 200, [14]))  // Intermarket Sweep: everything
        bars += builder.add(trade(2000, 9.80, 50, [37]))  // Odd Lot: volume only
        bars += builder.add(trade(3000, 12.00, 100, [15]))  // Official Close: nothing
        bars += builder.add(trade(4000, 10.20, 100, [12]))  // Form T: volume only
        bars += builder.add(trade(4999, 10.10, 100, [22]))  // Prior Reference Price: high/low and volume
        #expect(bars.isEmpty, "the window is still open")
        bars += builder.add(trade(12_000, 11.00, 300))
        #expect(bars.count == 1, "the next trade past the window finishes it; the empty window between makes none")
        let first = try #require(bars.first)
        #expect(first.start == ns(Self.base) && first.end == ns(Self.base + 5000))
        #expect(first.open == 10.00 && first.high == 10.50 && first.low == 10.00 && first.close == 10.50)
        #expect(first.volume == 550 && first.trades == 5)
        #expect(abs(first.vwap - 5620.0 / 550.0) < 1e-9)
        #expect(builder.add(trade(9_000, 10.00, 100)).isEmpty)
        #expect(builder.lateTrades == 1, "its window was passed over: late")
        #expect(builder.add(trade(14_000, 10.80, 100)).isEmpty)
        #expect(builder.close(now: ns(Self.base + 15_900), grace: ns(1000)).isEmpty, "within the grace")
        let closed = builder.close(now: ns(Self.base + 16_000), grace: ns(1000))
        #expect(closed.count == 1)
        let second = try #require(closed.first)
        #expect(second.start == ns(Self.base + 10_000) && second.end == ns(Self.base + 15_000))
        #expect(second.open == 11.00 && second.high == 11.00 && second.low == 10.80 && second.close == 10.80)
        #expect(second.volume == 400 && second.trades == 2 && abs(second.vwap - 4380.0 / 400.0) < 1e-9)
        #expect(builder.close(now: ns(Self.base + 60_000), grace: ns(1000)).isEmpty, "no zero-volume bars unless asked")
        #expect(builder.add(trade(14_500, 10.00, 100)).isEmpty && builder.lateTrades == 2, "after the timer sent its bar: late")
    }

    @Test func zeroVolumeBarsFillWindowsWithNoTradeAtTheLastClose() {
        var builder = BarBuilder(spec: BarSpec(size: .seconds(5), emptyBars: true))
        #expect(builder.close(now: ns(Self.base + 60_000), grace: 0).isEmpty, "nothing before the first trade")
        #expect(builder.add(trade(-1000, 9.00, 100)).isEmpty)
        #expect(builder.add(trade(100, 10.00, 100)).isEmpty, "the first window, joined part way, is not sent")
        let bars = builder.add(trade(12_000, 11.00, 300))
        #expect(bars.map(\.volume) == [100, 0])
        #expect(bars.last?.start == ns(Self.base + 5000) && bars.last?.end == ns(Self.base + 10_000) && bars.last?.close == 10.00)
        #expect(bars.last?.open == 10.00 && bars.last?.trades == 0)
        let closed = builder.close(now: ns(Self.base + 26_000), grace: ns(1000))
        #expect(closed.map(\.start) == [ns(Self.base + 10_000), ns(Self.base + 15_000), ns(Self.base + 20_000)])
        #expect(closed.map(\.volume) == [300, 0, 0] && closed.allSatisfy { $0.close == 11.00 })
        #expect(builder.add(trade(24_000, 12.00, 100)).isEmpty && builder.lateTrades == 1, "its window went out empty")
        let after = builder.add(trade(31_000, 12.00, 100))
        #expect(after.map(\.start) == [ns(Self.base + 25_000)], "the empty window between: one zero-volume bar")
        builder.reset()
        #expect(builder.close(now: ns(Self.base + 120_000), grace: 0).isEmpty, "an outage: nothing is vouched for, no zero bars")
        #expect(builder.add(trade(121_000, 12.00, 100)).isEmpty)
        #expect(builder.close(now: ns(Self.base + 126_000), grace: 0).isEmpty, "the window the relay came back in is not vouched for")
        #expect(builder.add(trade(127_000, 12.50, 100)).isEmpty)
        #expect(builder.close(now: ns(Self.base + 131_000), grace: 0).map(\.volume) == [100], "the next one is")
    }

    @Test func aWindowThatDoesNotDivideTheDayIsCutAtMidnight() {
        var builder = BarBuilder(spec: BarSpec(size: .seconds(7)))
        _ = builder.add(trade(-10_000, 10.00, 100, at: Self.midnight))
        _ = builder.add(trade(-3000, 10.00, 100, at: Self.midnight))
        let bars = builder.add(trade(1000, 11.00, 100, at: Self.midnight))
        #expect(bars.count == 1)
        #expect(bars.first?.start == ns(Self.midnight - 6000) && bars.first?.end == ns(Self.midnight), "86,400 = 7 × 12,342 + 6")
        let next = builder.close(now: ns(Self.midnight + 7000), grace: 0)
        #expect(next.first?.start == ns(Self.midnight) && next.first?.end == ns(Self.midnight + 7000), "the new day's windows start at midnight")
    }

    @Test func tradeAndVolumeBarsCountAndEndAtMidnight() {
        var ticks = BarBuilder(spec: BarSpec(size: .trades(3)))
        var bars: [Bar] = []
        for (offset, price) in [(0, 10.0), (10, 11.0), (20, 9.0), (30, 10.0)] { bars += ticks.add(trade(Int64(offset), price, 100)) }
        #expect(bars.count == 1)
        #expect(bars.first.map { [$0.open, $0.high, $0.low, $0.close, $0.volume] } == [10, 11, 9, 9, 300])
        #expect(bars.first?.start == ns(Self.base) && bars.first?.end == ns(Self.base + 20), "a trade bar spans its first to its last trade")
        #expect(ticks.add(trade(-1000, 10.0, 100, at: Self.midnight)).isEmpty)
        let split = ticks.add(trade(5, 12.0, 100, at: Self.midnight))
        #expect(split.count == 1 && split.first?.trades == 2, "the day's last bar ends with the day")
        var volume = BarBuilder(spec: BarSpec(size: .volume(500)))
        var full: [Bar] = []
        for offset in [0, 1, 2] { full += volume.add(trade(Int64(offset), 10.0, 200)) }
        #expect(full.count == 1 && full.first?.volume == 600, "the trade that passes the size ends the bar; never split")
        #expect(volume.add(trade(3, 10.0, 100, [37])).isEmpty, "an odd lot with no price yet in the bar")
        #expect(volume.add(trade(4, 10.5, 400)).first.map { [$0.open, $0.volume] } == [10.5, 500])
    }

    @Test func aTradeIsReadInPlaceWhateverItsFieldsLookLike() throws {
        func read(_ json: String, market: Market = .stocks) -> BarTrade? {
            PolygonBarRules(market: market)?.trade(in: MarketEvent(eventType: market == .crypto ? "XT" : "T", ticker: "AAPL", bytes: ByteBuffer(string: json)))
        }
        let plain = try #require(read(#"{"ev":"T","sym":"AAPL","i":"a\"b,}","x":4,"o":{"n":[1,{"p":9}]},"p":189.53,"s":100,"c":[0, 37],"t":1700000000000,"z":3}"#))
        #expect(plain.price == 189.53 && plain.size == 100 && plain.time == 1_700_000_000_000_000_000)
        #expect(!plain.updatesHighLow && !plain.updatesOpenClose && plain.updatesVolume, "37 is an odd lot")
        #expect(read(#"{"p":1.5e2,"s":0.00012345678901234567,"t":1700000000000}"#).map { [$0.price, $0.size] } == [150, 0.00012345678901234567])
        #expect(read(#" { "p" : 0.1 , "s" : 3 , "t" : 1700000000000 } "#)?.price == 0.1)
        #expect(read(#"{"p":"189.5","s":100,"t":1700000000000}"#) == nil, "a price that is a string")
        #expect(read(#"{"p":189.5,"s":100}"#) == nil && read(#"{"p":189.5,"s":100,"t":1.5}"#) == nil && read("[1]") == nil && read(#"{"p":1"#) == nil)
        let crypto = try #require(read(#"{"ev":"XT","pair":"BTC-USD","p":33021.9,"t":1610462007425,"s":0.01616617,"c":[2],"i":14272084,"x":3}"#, market: .crypto))
        #expect(crypto.size == 0.01616617 && crypto.updatesOpenClose, "crypto's conditions are not the tape's")
    }

    @Test func polygonsBarIsItsAggregateEventWithTheDerivedSymbol() throws {
        let bar = Bar(start: ns(Self.base), end: ns(Self.base + 5000), open: 10, high: 10.5, low: 10, close: 10.5, volume: 550, trades: 5, notional: 5620)
        let stock = String(buffer: rules.render(bar, eventType: "AM", ticker: "AAPL@5s"))
        let object = try #require(try JSONSerialization.jsonObject(with: Data(stock.utf8)) as? [String: Any])
        #expect(object["ev"] as? String == "AM" && object["sym"] as? String == "AAPL@5s")
        #expect(object["o"] as? Double == 10 && object["h"] as? Double == 10.5 && object["c"] as? Double == 10.5 && object["v"] as? Int == 550)
        #expect(object["s"] as? Int64 == Self.base && object["e"] as? Int64 == Self.base + 5000 && object["n"] as? Int == 5 && object["z"] as? Double == 110)
        #expect(abs((object["vw"] as? Double ?? 0) - 10.2181818182) < 1e-9)
        let crypto = try #require(PolygonBarRules(market: .crypto))
        #expect(String(buffer: crypto.render(bar, eventType: "XA", ticker: "X:BTC-USD@1m")).hasPrefix(#"{"ev":"XA","pair":"BTC-USD@1m","#))
        #expect(PolygonBarRules(market: .forex) == nil)
    }

    @Test func alpacasBarIsItsBarMessageWithItsEnd() throws {
        let rules = try #require(AlpacaBarRules(feed: .iex))
        let bar = Bar(start: ns(Self.base), end: ns(Self.base + 5000), open: 10, high: 10.5, low: 10, close: 10.5, volume: 550, trades: 5, notional: 5620)
        let bytes = Array(rules.render(bar, eventType: "b", ticker: "AAPL@5s").readableBytesView)
        let value = try MessagePack.decode(bytes)
        #expect(value["T"]?.string == "b" && value["S"]?.string == "AAPL@5s" && value["v"]?.integer == 550 && value["n"]?.integer == 5)
        #expect(value["o"] == .double(10) && value["c"] == .double(10.5))
        #expect(value["t"] == AlpacaEvents.time(nanoseconds: ns(Self.base)) && value["_e"] == AlpacaEvents.time(nanoseconds: ns(Self.base + 5000)))
        // Its trades: the letters' rules, an odd lot (I) for volume only.
        let odd = AlpacaEvents.event(
            "t", "AAPL",
            [("T", .string("t")), ("S", .string("AAPL")), ("p", .double(10)), ("s", .int(50)), ("c", .array([.string("@"), .string("I")])),
             ("t", AlpacaEvents.time(nanoseconds: ns(Self.base)))])
        let read = try #require(rules.trade(in: odd))
        #expect(!read.updatesHighLow && !read.updatesOpenClose && read.updatesVolume && read.size == 50 && read.time == ns(Self.base))
        // Keys of any length are passed over; a crypto trade's conditions do not exist.
        let crypto = try #require(AlpacaBarRules(feed: .crypto))
        let coin = AlpacaEvents.trade("BTC/USD", id: 2, price: 60_000.5, size: 0.25, nanoseconds: ns(Self.base) + 7, crypto: true)
        #expect(crypto.trade(in: coin).map { [$0.price, $0.size] } == [60_000.5, 0.25] && crypto.trade(in: coin)?.time == ns(Self.base) + 7)
        let sweep = AlpacaEvents.event(
            "t", "AAPL",
            [("T", .string("t")), ("S", .string("AAPL")), ("extra-long-key", .array([.int(1), .map([])])), ("p", .int(10)), ("s", .int(5)),
             ("c", .array([.string("F"), .string("Z")])), ("t", AlpacaEvents.time(nanoseconds: ns(Self.base)))])
        let swept = try #require(rules.trade(in: sweep))
        #expect(swept.price == 10 && swept.updatesHighLow && !swept.updatesOpenClose && swept.updatesVolume, "Z: sold out of sequence")
        #expect(rules.trade(in: MarketEvent(eventType: "t", ticker: "AAPL", bytes: ByteBuffer(bytes: [0x93, 1, 2, 3]))) == nil)
        #expect(rules.trade(in: AlpacaEvents.event("t", "AAPL", [("p", .string("10")), ("s", .int(5)), ("t", AlpacaEvents.time(nanoseconds: 1))])) == nil)
    }
}
