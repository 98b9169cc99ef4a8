import NIOCore
import PolygonWire

/// A synthetic stock market: random-walk prices, quotes and trades around them, minute bars.
///
/// Value type, `Sendable`, deterministic for a given seed. Events are rendered once into Polygon's
/// JSON shapes and carried as ``MarketEvent`` values, exactly as the relay would receive them.
public struct DemoMarket: Sendable {
    /// The well-known tickers every demo universe starts with (about half of all events are theirs).
    public static let majors: [(ticker: String, price: Int64)] = [
        ("AAPL", 189_50), ("MSFT", 415_20), ("NVDA", 121_80), ("AMZN", 186_40), ("GOOGL", 172_30),
        ("META", 505_10), ("TSLA", 248_70), ("AMD", 158_90), ("SPY", 548_20), ("QQQ", 472_60),
    ]

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

    private(set) var symbols: [Symbol]
    private var rng: SplitMix64
    private var sequence: Int64 = 0
    private let majorCount: Int

    public init(generatedTickers: Int = 300, seed: UInt64) {
        rng = SplitMix64(seed: seed)
        var symbols = Self.majors.map { Symbol(ticker: $0.ticker, cents: $0.price) }
        for index in 0..<max(generatedTickers, 0) {
            let cents = Int64.random(in: 5_00...400_00, using: &rng)
            symbols.append(Symbol(ticker: Self.generatedTicker(index), cents: cents))
        }
        self.symbols = symbols
        majorCount = Self.majors.count
    }

    /// A market of exactly these tickers, each as likely as the others (benchmarks).
    public init(tickers: [String], seed: UInt64) {
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

    /// Generated tickers read like real ones but cannot clash with them: `ZAAA`, `ZAAB`, …
    static func generatedTicker(_ index: Int) -> String {
        var letters: [Character] = []
        var n = index
        for _ in 0..<3 {
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
        let event = Int.random(in: 0..<10, using: &rng) < 7 ? quote(index, timestamp: timestamp) : trade(index, timestamp: timestamp)
        guard let stamp else { return event }
        var bytes = event.bytes
        bytes.moveWriterIndex(to: bytes.writerIndex - 1)  // the closing brace
        bytes.writeString(#","rt":\#(stamp)}"#)
        return MarketEvent(eventType: event.eventType, ticker: event.ticker, bytes: bytes)
    }

    /// `AM` bars for every ticker that traded since the last call, for the window ending at `end`.
    public mutating func aggregates(start: Int64, end: Int64) -> [MarketEvent] {
        var events: [MarketEvent] = []
        for index in symbols.indices {
            guard let bar = symbols[index].bar else { continue }
            symbols[index].bar = nil
            let s = symbols[index]
            let vwap = bar.volume > 0 ? bar.notional / bar.volume : bar.close
            let json =
                #"{"ev":"AM","sym":"\#(s.ticker)","v":\#(bar.volume),"av":\#(s.dayVolume),"op":\#(Self.price(bar.open)),"vw":\#(Self.price(vwap)),"o":\#(Self.price(bar.open)),"c":\#(Self.price(bar.close)),"h":\#(Self.price(bar.high)),"l":\#(Self.price(bar.low)),"a":\#(Self.price(vwap)),"z":\#(bar.trades),"s":\#(start),"e":\#(end)}"#
            events.append(MarketEvent(eventType: "AM", ticker: s.ticker, bytes: ByteBuffer(string: json)))
        }
        return events
    }

    private mutating func step(_ index: Int) {
        let cents = symbols[index].cents
        let scale = max(cents / 2000, 1)
        let move = Int64.random(in: -scale...scale, using: &rng)
        symbols[index].cents = max(cents + move, 1_00)
    }

    private mutating func quote(_ index: Int, timestamp: Int64) -> MarketEvent {
        let s = symbols[index]
        let spread = max(s.cents / 5000, 1)
        let bid = s.cents - spread / 2
        let ask = bid + spread
        let bidSize = Int.random(in: 1...30, using: &rng)
        let askSize = Int.random(in: 1...30, using: &rng)
        let json =
            #"{"ev":"Q","sym":"\#(s.ticker)","bx":\#(Int.random(in: 1...20, using: &rng)),"bp":\#(Self.price(bid)),"bs":\#(bidSize),"ax":\#(Int.random(in: 1...20, using: &rng)),"ap":\#(Self.price(ask)),"as":\#(askSize),"c":0,"i":[604],"t":\#(timestamp),"q":\#(sequence),"z":3}"#
        return MarketEvent(eventType: "Q", ticker: s.ticker, bytes: ByteBuffer(string: json))
    }

    private mutating func trade(_ index: Int, timestamp: Int64) -> MarketEvent {
        let s = symbols[index]
        let size = Int64.random(in: 1...10, using: &rng) * 100
        var bar = s.bar ?? Bar(open: s.cents, high: s.cents, low: s.cents, close: s.cents, volume: 0, notional: 0, trades: 0)
        bar.high = max(bar.high, s.cents)
        bar.low = min(bar.low, s.cents)
        bar.close = s.cents
        bar.volume += size
        bar.notional += size * s.cents
        bar.trades += 1
        symbols[index].bar = bar
        symbols[index].dayVolume += size
        let json =
            #"{"ev":"T","sym":"\#(s.ticker)","i":"\#(sequence)","x":\#(Int.random(in: 1...20, using: &rng)),"p":\#(Self.price(s.cents)),"s":\#(size),"c":[0,12],"t":\#(timestamp),"q":\#(sequence),"z":3}"#
        return MarketEvent(eventType: "T", ticker: s.ticker, bytes: ByteBuffer(string: json))
    }

    /// Cents as a JSON number with two decimals, `189.05`.
    static func price(_ cents: Int64) -> String {
        let fraction = cents % 100
        return "\(cents / 100).\(fraction < 10 ? "0" : "")\(fraction)"
    }
}

/// A small, fast, seedable generator (SplitMix64), so a seeded demo market repeats exactly.
struct SplitMix64: RandomNumberGenerator, Sendable {
    private var state: UInt64

    init(seed: UInt64) { state = seed }

    mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
}
