import NIOCore
import PolygonWire

/// A synthetic market of one of Polygon's six kinds: random-walk prices, that market's quotes and trades
/// around them (stocks and options `Q`/`T`, forex `C`, crypto `XQ`/`XT`, indices `V`, futures `Q`/`T`)
/// and its minute bars (`AM`, forex `CA`, crypto `XA`), shaped after Polygon's sample frames.
///
/// Value type, `Sendable`, deterministic for a given seed. Events are rendered once into Polygon's
/// JSON shapes and carried as ``MarketEvent`` values (routed by their topic ticker, `X:BTC-USD`, while
/// their bytes carry the market's own field, `"pair":"BTC-USD"`), exactly as the relay would receive them.
/// Prices are integers in units of 10^-``decimals``.
public struct DemoMarket: Sendable {
    /// The well-known tickers every demo stock universe starts with (about half of all events are theirs).
    public static let majors: [(ticker: String, price: Int64)] = [
        ("AAPL", 189_50), ("MSFT", 415_20), ("NVDA", 121_80), ("AMZN", 186_40), ("GOOGL", 172_30),
        ("META", 505_10), ("TSLA", 248_70), ("AMD", 158_90), ("SPY", 548_20), ("QQQ", 472_60),
    ]

    /// The tickers (in topic form) and opening prices of each other market (in its units).
    public static func majors(of market: Market) -> [(ticker: String, price: Int64)] {
        switch market {
        case .stocks: majors
        case .options:
            [
                ("O:SPY251219C00650000", 4_35), ("O:SPY251219P00550000", 2_10), ("O:AAPL251219C00200000", 6_80),
                ("O:TSLA251219C00300000", 12_40), ("O:NVDA251219P00100000", 3_05),
            ]
        case .forex: [("C:EUR-USD", 1_0842), ("C:GBP-USD", 1_2715), ("C:USD-JPY", 151_4200), ("C:USD-CNH", 7_2310)]
        case .crypto: [("X:BTC-USD", 97_150_00), ("X:ETH-USD", 3_420_50), ("X:SOL-USD", 182_30), ("X:DOGE-USD", 38)]
        case .indices: [("I:SPX", 5_870_25), ("I:NDX", 20_710_40), ("I:DJI", 43_850_10), ("I:VIX", 15_80)]
        case .futures: [("ESZ5", 5_890_25), ("NQZ5", 20_780_50), ("CLZ5", 71_45), ("GCZ5", 2_650_30)]
        case .news: []
        }
    }

    /// Digits after the decimal point in a market's prices (forex quotes to 4).
    public static func decimals(of market: Market) -> Int { market == .forex ? 4 : 2 }

    struct Symbol: Sendable {
        let ticker: String
        var cents: Int64
        var bar: Bar?
        var dayVolume: Int64 = 0
    }

    struct Bar: Sendable {
        var open, high, low, close: Int64
        var volume: Int64
        var notional: Int64
        var trades: Int
    }

    /// The market this universe trades in.
    public let market: Market
    private(set) var symbols: [Symbol]
    private var rng: SplitMix64
    private var sequence: Int64 = 0
    private let majorCount: Int
    /// Trades and quotes generated since ``takeRecords()`` last took them (``DemoTape``).
    private(set) var records: [DemoTape.Record] = []
    /// Bars generated since ``takeRecords()`` last took them.
    private(set) var barRecords: [DemoTape.Bar] = []
    /// Whether generated events are recorded (the feed's REST history).
    var recording = false
    /// Whether crypto quotes are recorded too (Alpaca's events are made from the records; Polygon's
    /// REST history of crypto has its trades only).
    var recordsCryptoQuotes = false

    /// A stock universe: the majors and `generatedTickers` more.
    public init(generatedTickers: Int = 300, seed: UInt64) {
        self.init(market: .stocks, generatedTickers: generatedTickers, seed: seed)
    }

    /// A universe of `market`: its majors, and for stocks `generatedTickers` more.
    public init(market: Market, generatedTickers: Int = 300, seed: UInt64) {
        self.market = market
        rng = SplitMix64(seed: seed)
        var symbols = Self.majors(of: market).map { Symbol(ticker: $0.ticker, cents: $0.price) }
        if market == .stocks {
            for index in 0..<max(generatedTickers, 0) {
                let cents = Int64.random(in: 5_00...400_00, using: &rng)
                symbols.append(Symbol(ticker: Self.generatedTicker(index), cents: cents))
            }
        }
        majorCount = market == .stocks ? Self.majors.count : 0
        self.symbols = symbols
    }

    /// A market of exactly these tickers, each as likely as the others (benchmarks).
    public init(tickers: [String], seed: UInt64, market: Market = .stocks) {
        self.market = market
        rng = SplitMix64(seed: seed)
        var symbols: [Symbol] = []
        for ticker in tickers {
            symbols.append(Symbol(ticker: ticker, cents: Int64.random(in: 5_00...400_00, using: &rng)))
        }
        self.symbols = symbols
        majorCount = 0
    }

    /// A ticker's current price in cents.
    public func cents(of ticker: String) -> Int64? {
        symbols.first { $0.ticker == ticker }?.cents
    }

    /// Every ticker's current price in cents.
    public var allCents: [String: Int64] {
        Dictionary(symbols.map { ($0.ticker, $0.cents) }, uniquingKeysWith: { first, _ in first })
    }

    /// The tickers of this universe.
    public var tickers: [String] { symbols.map(\.ticker) }

    /// The records of what was generated since the last call.
    mutating func takeRecords() -> (records: [DemoTape.Record], bars: [DemoTape.Bar]) {
        defer {
            records.removeAll(keepingCapacity: true)
            barRecords.removeAll(keepingCapacity: true)
        }
        return (records, barRecords)
    }

    private mutating func record(
        _ kind: DemoTape.Record.Kind, _ index: Int, time: Int64, price: Int64, ask: Int64 = 0, size: Int, askSize: Int = 0, exchange: Int,
        askExchange: Int = 0
    ) {
        guard recording else { return }
        records.append(
            DemoTape.Record(
                time: time, sequence: sequence, price: Int32(clamping: price), ask: Int32(clamping: ask), size: Int16(clamping: size),
                askSize: Int16(clamping: askSize), ticker: UInt16(clamping: index), kind: kind, exchange: UInt8(clamping: exchange),
                askExchange: UInt8(clamping: askExchange)))
    }

    /// Generated tickers read like real ones but cannot clash with them: `ZAAA`, `ZAAB`, … `ZZZZ`
    /// (26³), then `ZAAAA` on, each index its own name.
    static func generatedTicker(_ index: Int) -> String {
        let threeLetters = 26 * 26 * 26
        let (count, number) = index < threeLetters ? (3, index) : (4, index - threeLetters)
        var letters: [Character] = []
        var n = number
        for _ in 0..<count {
            letters.append(Character(Unicode.Scalar(UInt8(65 + n % 26))))
            n /= 26
        }
        return "Z" + String(letters.reversed())
    }

    /// The next quote or trade, at `timestamp` (Unix ms).
    /// - Parameter stamp: when given, added as `"rt"` (send time, Unix ns) for latency measurement.
    public mutating func nextEvent(timestamp: Int64, stamp: Int64? = nil) -> MarketEvent {
        let index: Int
        if majorCount == 0 {
            index = Int.random(in: 0..<symbols.count, using: &rng)
        } else if symbols.count > majorCount, Bool.random(using: &rng) {
            index = Int.random(in: majorCount..<symbols.count, using: &rng)
        } else {
            index = Int.random(in: 0..<min(majorCount, symbols.count), using: &rng)
        }
        step(index)
        sequence += 1
        let event: MarketEvent
        switch market {
        case .forex: event = forexQuote(index, timestamp: timestamp)
        case .indices: event = indexValue(index, timestamp: timestamp)
        default:
            event = Int.random(in: 0..<10, using: &rng) < 7 ? quote(index, timestamp: timestamp) : trade(index, timestamp: timestamp)
        }
        guard let stamp else { return event }
        var bytes = event.bytes
        bytes.moveWriterIndex(to: bytes.writerIndex - 1)  // the closing brace
        bytes.writeString(#","rt":\#(stamp)}"#)
        return MarketEvent(eventType: event.eventType, ticker: event.ticker, bytes: bytes)
    }

    /// Whether an event of this type sets its ticker's last price (trades; forex quotes and index values,
    /// which have no trades).
    public static func setsLastPrice(_ eventType: String) -> Bool {
        switch eventType {
        case "T", "XT", "C", "V": true
        default: false
        }
    }

    /// The ticker as the market's events carry it: crypto `pair` `BTC-USD`, forex `p` `EUR/USD`.
    func wireTicker(_ ticker: String) -> String {
        switch market {
        case .crypto: String(ticker.dropFirst(2))
        case .forex: String(ticker.dropFirst(2).map { $0 == "-" ? "/" : $0 })
        default: ticker
        }
    }

    /// `AM` bars for every ticker that traded since the last call, for the window ending at `end`.
    public mutating func aggregates(start: Int64, end: Int64) -> [MarketEvent] {
        var events: [MarketEvent] = []
        for index in symbols.indices {
            guard let bar = symbols[index].bar else { continue }
            symbols[index].bar = nil
            let s = symbols[index]
            let vwap = bar.volume > 0 ? bar.notional / bar.volume : bar.close
            let json: String
            let type: String
            switch market {
            case .forex:
                type = "CA"
                json =
                    #"{"ev":"CA","pair":"\#(wireTicker(s.ticker))","o":\#(price(bar.open)),"c":\#(price(bar.close)),"h":\#(price(bar.high)),"l":\#(price(bar.low)),"v":\#(bar.trades),"s":\#(start)}"#
            case .crypto:
                type = "XA"
                json =
                    #"{"ev":"XA","pair":"\#(wireTicker(s.ticker))","v":\#(bar.volume),"vw":\#(price(vwap)),"z":\#(bar.trades),"o":\#(price(bar.open)),"c":\#(price(bar.close)),"h":\#(price(bar.high)),"l":\#(price(bar.low)),"s":\#(start),"e":\#(end)}"#
            case .indices:
                type = "AM"
                json =
                    #"{"ev":"AM","sym":"\#(s.ticker)","op":\#(price(bar.open)),"o":\#(price(bar.open)),"c":\#(price(bar.close)),"h":\#(price(bar.high)),"l":\#(price(bar.low)),"s":\#(start),"e":\#(end)}"#
            default:
                type = "AM"
                json =
                    #"{"ev":"AM","sym":"\#(s.ticker)","v":\#(bar.volume),"av":\#(s.dayVolume),"op":\#(price(bar.open)),"vw":\#(price(vwap)),"o":\#(price(bar.open)),"c":\#(price(bar.close)),"h":\#(price(bar.high)),"l":\#(price(bar.low)),"a":\#(price(vwap)),"z":\#(bar.trades),"s":\#(start),"e":\#(end)}"#
            }
            events.append(MarketEvent(eventType: type, ticker: s.ticker, bytes: ByteBuffer(string: json)))
            if recording {
                barRecords.append(
                    DemoTape.Bar(
                        ticker: UInt16(clamping: index), start: start, end: end, open: bar.open, high: bar.high, low: bar.low, close: bar.close,
                        volume: bar.volume, vwap: vwap, trades: bar.trades))
            }
        }
        return events
    }

    private mutating func step(_ index: Int) {
        let cents = symbols[index].cents
        let scale = max(cents / 2000, 1)
        let move = Int64.random(in: -scale...scale, using: &rng)
        symbols[index].cents = max(cents + move, 1)
    }

    private mutating func quote(_ index: Int, timestamp: Int64) -> MarketEvent {
        let s = symbols[index]
        let spread = max(s.cents / 5000, 1)
        let bid = s.cents - spread / 2
        let ask = bid + spread
        let bidSize = Int.random(in: 1...30, using: &rng)
        let askSize = Int.random(in: 1...30, using: &rng)
        let exchange = Int.random(in: 1...20, using: &rng)
        if market == .crypto {
            if recordsCryptoQuotes {
                record(.quote, index, time: timestamp, price: bid, ask: ask, size: bidSize, askSize: askSize, exchange: exchange, askExchange: exchange)
            }
            let json =
                #"{"ev":"XQ","pair":"\#(wireTicker(s.ticker))","bp":\#(price(bid)),"bs":\#(Double(bidSize) / 100),"ap":\#(price(ask)),"as":\#(Double(askSize) / 100),"t":\#(timestamp),"x":\#(exchange),"r":\#(timestamp)}"#
            return MarketEvent(eventType: "XQ", ticker: s.ticker, bytes: ByteBuffer(string: json))
        }
        let askExchange = Int.random(in: 1...20, using: &rng)
        record(.quote, index, time: timestamp, price: bid, ask: ask, size: bidSize, askSize: askSize, exchange: exchange, askExchange: askExchange)
        let json =
            #"{"ev":"Q","sym":"\#(s.ticker)","bx":\#(exchange),"bp":\#(price(bid)),"bs":\#(bidSize),"ax":\#(askExchange),"ap":\#(price(ask)),"as":\#(askSize),"c":0,"i":[604],"t":\#(timestamp),"q":\#(sequence),"z":3}"#
        return MarketEvent(eventType: "Q", ticker: s.ticker, bytes: ByteBuffer(string: json))
    }

    private mutating func trade(_ index: Int, timestamp: Int64) -> MarketEvent {
        let s = symbols[index]
        let size = Int64.random(in: 1...10, using: &rng) * (market == .stocks ? 100 : 1)
        recordTrade(index, size: size)
        let exchange = Int.random(in: 1...20, using: &rng)
        record(.trade, index, time: timestamp, price: s.cents, size: Int(size), exchange: exchange)
        if market == .crypto {
            let json =
                #"{"ev":"XT","pair":"\#(wireTicker(s.ticker))","p":\#(price(s.cents)),"t":\#(timestamp),"s":\#(Double(size) / 100),"c":[2],"i":\#(sequence),"x":\#(exchange),"r":\#(timestamp)}"#
            return MarketEvent(eventType: "XT", ticker: s.ticker, bytes: ByteBuffer(string: json))
        }
        let json =
            #"{"ev":"T","sym":"\#(s.ticker)","i":"\#(sequence)","x":\#(exchange),"p":\#(price(s.cents)),"s":\#(size),"c":[0],"t":\#(timestamp),"q":\#(sequence),"z":3}"#
        return MarketEvent(eventType: "T", ticker: s.ticker, bytes: ByteBuffer(string: json))
    }

    /// A forex quote, Polygon's `C`, and the bar it moves.
    private mutating func forexQuote(_ index: Int, timestamp: Int64) -> MarketEvent {
        let s = symbols[index]
        recordTrade(index, size: 1)
        let spread = max(s.cents / 20000, 1)
        record(.quote, index, time: timestamp, price: s.cents, ask: s.cents + spread, size: 0, exchange: 48, askExchange: 48)
        let json =
            #"{"ev":"C","p":"\#(wireTicker(s.ticker))","x":48,"a":\#(price(s.cents + spread)),"b":\#(price(s.cents)),"t":\#(timestamp)}"#
        return MarketEvent(eventType: "C", ticker: s.ticker, bytes: ByteBuffer(string: json))
    }

    /// An index value, Polygon's `V`, and the bar it moves.
    private mutating func indexValue(_ index: Int, timestamp: Int64) -> MarketEvent {
        let s = symbols[index]
        recordTrade(index, size: 0)
        let json = #"{"ev":"V","val":\#(price(s.cents)),"T":"\#(s.ticker)","t":\#(timestamp)}"#
        return MarketEvent(eventType: "V", ticker: s.ticker, bytes: ByteBuffer(string: json))
    }

    private mutating func recordTrade(_ index: Int, size: Int64) {
        let s = symbols[index]
        var bar = s.bar ?? Bar(open: s.cents, high: s.cents, low: s.cents, close: s.cents, volume: 0, notional: 0, trades: 0)
        bar.high = max(bar.high, s.cents)
        bar.low = min(bar.low, s.cents)
        bar.close = s.cents
        bar.volume += size
        bar.notional += size * s.cents
        bar.trades += 1
        symbols[index].bar = bar
        symbols[index].dayVolume += size
    }

    /// A price in this market's units as a JSON number.
    func price(_ units: Int64) -> String { Self.price(units, decimals: Self.decimals(of: market)) }

    /// Units of 10^-`decimals` as a JSON number with that many decimals, `189.05`.
    public static func price(_ units: Int64, decimals: Int) -> String {
        guard decimals != 2 else { return price(units) }
        var scale: Int64 = 1
        for _ in 0..<decimals { scale *= 10 }
        let fraction = String(units % scale)
        return "\(units / scale).\(String(repeating: "0", count: max(decimals - fraction.count, 0)))\(fraction)"
    }

    /// A ticker's price (in its market's units) as a JSON number.
    public static func price(_ units: Int64, ticker: String) -> String {
        price(units, decimals: decimals(of: Market.of(ticker: ticker)))
    }

    /// Cents as a JSON number with two decimals, `189.05`.
    static func price(_ cents: Int64) -> String {
        let fraction = cents % 100
        return "\(cents / 100).\(fraction < 10 ? "0" : "")\(fraction)"
    }
}
