import NIOCore

/// Bars the relay builds from a market's trades: what a derived topic asks for. A derived topic is a
/// vendor's bar topic whose ticker carries the bar's size after `@`: `AM.AAPL@5m`, `A.AAPL@10s`,
/// `AM.AAPL@100t`, `b.AAPL@5m` (Alpaca). Its events are the vendor's own bar event, with that ticker as
/// the symbol, so a client's models take them and tell them apart from the vendor's own bars.
///
/// Sizes: `Ns` (1 … 3600 seconds) or `Nm` (1 … 60 minutes) for time bars, `Nt` for a bar every N
/// trades (1 … 1,000,000), `Nv` for a bar every N units of volume (shares, coins: 1 … 10⁹). A `z` at
/// the end (`@5mz`) asks for zero-volume bars too (time bars only): a window with no trade gets a bar
/// at the last close, volume 0. Value type, `Sendable`.
public struct BarSpec: Hashable, Sendable, CustomStringConvertible {
    public enum Size: Hashable, Sendable {
        /// A time bar of this many seconds, windows aligned to the UTC day.
        case seconds(Int)
        /// A bar every this many trades that count for volume.
        case trades(Int)
        /// A bar once its volume reaches this much.
        case volume(Int)
    }

    public let size: Size
    /// A time window with no trade still gets a bar (volume 0, at the last close).
    public let emptyBars: Bool

    public init(size: Size, emptyBars: Bool = false) {
        self.size = size
        self.emptyBars = emptyBars
    }

    /// The character that separates a derived topic's ticker from its size.
    public static let separator: Character = "@"

    /// Reads a size as a derived topic writes it (`5m`, `10s`, `100t`, `5000v`, `5mz`); `nil` otherwise.
    public init?(parsing text: some StringProtocol) {
        var body = Substring(text)
        let empty = body.hasSuffix("z")
        if empty { body = body.dropLast() }
        guard let unit = body.last, body.count >= 2, body.count <= 11, let number = Int(body.dropLast()), number > 0,
            body.first != "0", body.first != "+"
        else { return nil }
        switch unit {
        case "s" where number <= 3600: size = .seconds(number)
        case "m" where number <= 60: size = .seconds(number * 60)
        case "t" where number <= 1_000_000 && !empty: size = .trades(number)
        case "v" where number <= 1_000_000_000 && !empty: size = .volume(number)
        default: return nil
        }
        emptyBars = empty
    }

    /// The size as a topic writes it: minutes as `m` when whole, else seconds.
    public var description: String {
        let text =
            switch size {
            case .seconds(let seconds): seconds % 60 == 0 ? "\(seconds / 60)m" : "\(seconds)s"
            case .trades(let count): "\(count)t"
            case .volume(let volume): "\(volume)v"
            }
        return emptyBars ? text + "z" : text
    }

    /// What a derived topic's size may be, for a refusal.
    public static let syntax = "a bar size after @: 1s…3600s, 1m…60m, Nt (every N trades), Nv (every N of volume), z at the end for zero-volume bars of a time size"
}

/// How many derived topics one connection may hold: each is a series the relay builds for the whole
/// market, so a client's share of that work is bounded where it asks.
public enum DerivedLimits {
    /// Derived topics per connection.
    public static let perConnection = 1_000
    /// Sizes of one symbol per connection.
    public static let sizesPerSymbol = 8
    /// Sizes of one symbol built at once for the whole market (all connections together).
    public static let sizesPerSymbolBuilt = 64

    /// The derived topics a connection holds, counted once: a subscribe message checks each new derived
    /// topic against it and adds those it takes (walking the whole held set for each cost the square of
    /// the topics, on the connection's event loop). Value type.
    public struct Tally: Sendable {
        private var count = 0
        private var perSymbol: [String: Int] = [:]

        public init(_ held: some Sequence<Topic>) {
            for topic in held { add(topic) }
        }

        /// Why derived `topic` would take a connection holding `held` past its bounds, or `nil`; `tally`
        /// counts `held` the first time a message asks, and is kept up to date with ``add(_:)``.
        public static func problem(adding topic: Topic, _ tally: inout Tally?, held: Set<Topic>) -> String? {
            if tally == nil { tally = Tally(held) }
            return tally?.problem(adding: topic)
        }

        /// Why `topic` (derived) would take the connection past its bounds, or `nil`.
        public func problem(adding topic: Topic) -> String? {
            guard let symbol = topic.derivedBar?.symbol else { return nil }
            if count >= perConnection { return "a connection holds at most \(perConnection) derived topics" }
            if perSymbol[symbol, default: 0] >= sizesPerSymbol { return "a connection holds at most \(sizesPerSymbol) bar sizes of one symbol" }
            return nil
        }

        /// `topic` is held now (nothing for a topic that is not derived).
        public mutating func add(_ topic: Topic) {
            guard topic.isDerived else { return }
            count += 1
            if let symbol = topic.derivedBar?.symbol { perSymbol[symbol, default: 0] += 1 }
        }
    }
}

extension Topic {
    /// A derived topic's symbol (the ticker before `@`) and bar size; `nil` for a topic with no `@`, or
    /// one whose size does not parse (``derivedProblem``).
    public var derivedBar: (symbol: String, spec: BarSpec)? {
        guard let at = ticker.lastIndex(of: BarSpec.separator), at != ticker.startIndex,
            let spec = BarSpec(parsing: ticker[ticker.index(after: at)...])
        else { return nil }
        return (String(ticker[..<at]), spec)
    }

    /// Whether the topic names a derived bar (its ticker has `@`), well formed or not.
    public var isDerived: Bool { Self.isDerivedTicker(ticker) }

    /// Whether a ticker is a derived bar's (it has `@`): a byte scan, cheap enough per event.
    @inlinable
    public static func isDerivedTicker(_ ticker: String) -> Bool {
        // Over the bytes where they lie (a short ticker's too): asked of every event a wildcard holds.
        ticker.utf8.withContiguousStorageIfAvailable { $0.contains(UInt8(ascii: "@")) } ?? ticker.utf8.contains(UInt8(ascii: "@"))
    }
}

/// What a trade may move in a bar, by a vendor's rule for one of its conditions. Value type.
public struct TradeUpdates: Sendable, Equatable {
    public var highLow: Bool
    public var openClose: Bool
    public var volume: Bool

    public init(highLow: Bool, openClose: Bool, volume: Bool) {
        self.highLow = highLow
        self.openClose = openClose
        self.volume = volume
    }

    /// A regular sale: everything.
    public static let all = TradeUpdates(highLow: true, openClose: true, volume: true)
    /// Volume only (odd lots, average-price trades, Form T …).
    public static let volumeOnly = TradeUpdates(highLow: false, openClose: false, volume: true)
    /// High, low and volume, not open and close (sold out of sequence …).
    public static let highLowAndVolume = TradeUpdates(highLow: true, openClose: false, volume: true)
    /// Nothing (official opens and closes).
    public static let nothing = TradeUpdates(highLow: false, openClose: false, volume: false)

    /// What a trade with both this condition and `other` may move: each only if both allow it.
    public func and(_ other: TradeUpdates) -> TradeUpdates {
        TradeUpdates(highLow: highLow && other.highLow, openClose: openClose && other.openClose, volume: volume && other.volume)
    }
}

/// One trade as a bar counts it. Value type.
public struct BarTrade: Sendable, Equatable {
    public var price: Double
    public var size: Double
    /// The vendor's trade time, Unix ns.
    public var time: Int64
    /// Whether it moves the bar's high and low, its open and close, and its volume (the vendor's rules
    /// for its conditions).
    public var updatesHighLow: Bool
    public var updatesOpenClose: Bool
    public var updatesVolume: Bool

    public init(price: Double, size: Double, time: Int64, updatesHighLow: Bool = true, updatesOpenClose: Bool = true, updatesVolume: Bool = true) {
        self.price = price
        self.size = size
        self.time = time
        self.updatesHighLow = updatesHighLow
        self.updatesOpenClose = updatesOpenClose
        self.updatesVolume = updatesVolume
    }

    /// A trade that moves what `updates` allows.
    public init(price: Double, size: Double, time: Int64, updates: TradeUpdates) {
        self.init(
            price: price, size: size, time: time, updatesHighLow: updates.highLow, updatesOpenClose: updates.openClose, updatesVolume: updates.volume)
    }

    /// Whether the trade counts for the bar at all.
    public var counts: Bool { updatesHighLow || updatesOpenClose || updatesVolume }
}

/// A finished bar. Value type.
public struct Bar: Sendable, Equatable {
    /// Its start and end, Unix ns: a time bar's window `[start, end)`; a trade or volume bar's first and
    /// last trade.
    public var start: Int64
    public var end: Int64
    public var open: Double
    public var high: Double
    public var low: Double
    public var close: Double
    public var volume: Double
    /// Trades that counted for volume.
    public var trades: Int
    /// Σ price × size of those trades, for the volume-weighted price.
    public var notional: Double

    /// The volume-weighted average price (the close when there was no volume).
    public var vwap: Double { volume > 0 ? notional / volume : close }
    /// The average trade size (0 when none).
    public var averageSize: Double { trades > 0 ? volume / Double(trades) : 0 }

    public init(start: Int64, end: Int64, open: Double, high: Double, low: Double, close: Double, volume: Double, trades: Int, notional: Double) {
        self.start = start
        self.end = end
        self.open = open
        self.high = high
        self.low = low
        self.close = close
        self.volume = volume
        self.trades = trades
        self.notional = notional
    }
}

/// Builds one derived topic's bars from its symbol's trades, in the order they arrive. Value type.
///
/// - The first time window a builder sees, after it starts or forgets an outage, began before its first
///   trade: its bar is not sent (the trades before are unknown); its close carries on.
/// - A **time bar** covers `[start, start + size)`, windows aligned to the UTC day (a size that does not
///   divide a day has a shorter last window before midnight). It is finished by the first trade at or
///   past its end, or by ``close(now:grace:)`` once the wall clock passes its end plus the grace. A trade
///   older than the last window sent is late: counted (``lateTrades``), in no bar.
/// - A **trade bar** is finished by its Nth trade, a **volume bar** by the trade that brings its volume
///   to the size or past it (a trade is never split); both are finished early by the first trade of a
///   new UTC day, so no bar spans midnight.
/// - Which trades move what is the vendor's rule for their conditions (``BarTrade``): open and close
///   move with trades that update them, high and low likewise, volume, trade count and VWAP with those
///   that update volume. A bar whose window saw volume but no price (odd lots only) is at the last
///   close; with no close before it, it is not sent.
public struct BarBuilder: Sendable {
    public let spec: BarSpec
    /// The bar being built.
    private var open: Bar?
    /// Whether ``open`` has a price yet (a volume-only trade opens it without one).
    private var priced = false
    /// A time bar's window, once a trade fell in it.
    private var window: (start: Int64, end: Int64)?
    /// The end of the last time window finished (sent, or passed empty): a trade before it is late.
    private var finishedThrough: Int64?
    /// The last close sent, for zero-volume bars and priceless windows.
    private var lastClose: Double?
    /// The open time window began after its start: the builder is new, or forgot an outage. Its trades
    /// before the first one seen are unknown, so its bar is not sent (its close still carries on).
    private var partialWindow = true
    /// Trades too late for their window.
    public private(set) var lateTrades = 0

    /// At most this many zero-volume bars are made by one call (a relay idle for hours does not make
    /// a day of one-second bars at once: the next calls go on from there).
    public static let maxEmptyBarsPerCall = 3600

    public init(spec: BarSpec) {
        self.spec = spec
    }

    static let day: Int64 = 86_400 * 1_000_000_000

    /// The window of `seconds` holding `time` (ns), cut at the UTC day's end.
    static func window(of time: Int64, seconds: Int) -> (start: Int64, end: Int64) {
        let size = Int64(seconds) * 1_000_000_000
        let dayStart = floorDivide(time, day) * day
        let start = dayStart + floorDivide(time - dayStart, size) * size
        return (start, min(start + size, dayStart + day))
    }

    private static func floorDivide(_ a: Int64, _ b: Int64) -> Int64 {
        let quotient = a / b
        return (a % b != 0 && (a < 0) != (b < 0)) ? quotient - 1 : quotient
    }

    /// Takes one trade; returns the bars it finished, oldest first.
    public mutating func add(_ trade: BarTrade) -> [Bar] {
        guard trade.counts, trade.price.isFinite, trade.price > 0, trade.size.isFinite, trade.size >= 0 else { return [] }
        var finished: [Bar] = []
        switch spec.size {
        case .seconds(let seconds):
            // Before the open window, or before the last window finished: its bar is gone (or was passed
            // over empty), so the trade is late.
            if let floor = window?.start ?? finishedThrough, trade.time < floor {
                lateTrades += 1
                return []
            }
            if let current = window, trade.time >= current.end {
                if let bar = takeOpen(end: current.end), !partialWindow { finished.append(bar) }
                partialWindow = false
                finishedThrough = current.end
                window = nil
            }
            if window == nil {
                let next = Self.window(of: trade.time, seconds: seconds)
                if spec.emptyBars, let through = finishedThrough { finished += emptyBars(from: through, before: next.start, seconds: seconds) }
                // The first window after a start or an outage is joined part way: it is not vouched for.
                partialWindow = finishedThrough == nil
                window = next
            }
            fold(trade, start: window?.start ?? trade.time)
        case .trades(let count):
            finishOnNewDay(trade, into: &finished)
            fold(trade, start: trade.time)
            if let bar = open, bar.trades >= count, let done = takeOpen(end: bar.end) { finished.append(done) }
        case .volume(let volume):
            finishOnNewDay(trade, into: &finished)
            fold(trade, start: trade.time)
            if let bar = open, bar.volume >= Double(volume), let done = takeOpen(end: bar.end) { finished.append(done) }
        }
        return finished
    }

    /// ``add(_:)``, and whether the trade was late.
    public mutating func take(_ trade: BarTrade) -> (bars: [Bar], late: Bool) {
        let before = lateTrades
        let bars = add(trade)
        return (bars, lateTrades > before)
    }

    /// The time bars whose window ended at least `grace` ns before `now` (Unix ns): the open one and,
    /// with zero-volume bars, each window since with no trade. Trade and volume bars wait for trades.
    public mutating func close(now: Int64, grace: Int64) -> [Bar] {
        guard case .seconds(let seconds) = spec.size else { return [] }
        var finished: [Bar] = []
        if let current = window, now >= current.end + grace {
            if let bar = takeOpen(end: current.end), !partialWindow { finished.append(bar) }
            partialWindow = false
            finishedThrough = current.end
            window = nil
        }
        if spec.emptyBars, window == nil, let through = finishedThrough {
            finished += emptyBars(from: through, before: now - grace, seconds: seconds, whole: true)
        }
        return finished
    }

    /// A trade or volume bar still open from an earlier UTC day is finished before the trade.
    private mutating func finishOnNewDay(_ trade: BarTrade, into finished: inout [Bar]) {
        guard let bar = open, Self.floorDivide(bar.start, Self.day) != Self.floorDivide(trade.time, Self.day) else { return }
        if let done = takeOpen(end: bar.end) { finished.append(done) }
    }

    private mutating func fold(_ trade: BarTrade, start: Int64) {
        let isTimeBar = if case .seconds = spec.size { true } else { false }
        var bar =
            open
            ?? Bar(start: start, end: isTimeBar ? start : trade.time, open: 0, high: 0, low: 0, close: 0, volume: 0, trades: 0, notional: 0)
        if trade.updatesOpenClose || trade.updatesHighLow {
            if !priced {
                // The first price of the bar: a high/low-only trade sets the open too, as a vendor's bar
                // has an open whenever it has a high.
                (bar.open, bar.high, bar.low, bar.close) = (trade.price, trade.price, trade.price, trade.price)
                priced = true
            } else {
                if trade.updatesHighLow {
                    bar.high = max(bar.high, trade.price)
                    bar.low = min(bar.low, trade.price)
                }
                if trade.updatesOpenClose { bar.close = trade.price }
            }
        }
        if trade.updatesVolume {
            bar.volume += trade.size
            bar.trades += 1
            bar.notional += trade.price * trade.size
        }
        if !isTimeBar { bar.end = max(bar.end, trade.time) }
        open = bar
    }

    /// The open bar, finished at `end`; `nil` if none, or if it never had a price and there is no
    /// close before it to give it one.
    private mutating func takeOpen(end: Int64) -> Bar? {
        guard var bar = open else { return nil }
        let hadPrice = priced
        open = nil
        priced = false
        bar.end = end
        if !hadPrice {
            guard let close = lastClose else { return nil }
            (bar.open, bar.high, bar.low, bar.close) = (close, close, close, close)
        }
        lastClose = bar.close
        return bar
    }

    /// Zero-volume bars at the last close for the windows from `from` that end by `before` (`whole`: the
    /// window's end must be at or before it; else its start must be before it); ``finishedThrough``
    /// moves past them.
    private mutating func emptyBars(from: Int64, before: Int64, seconds: Int, whole: Bool = false) -> [Bar] {
        guard let close = lastClose else { return [] }
        var bars: [Bar] = []
        var start = from
        while bars.count < Self.maxEmptyBarsPerCall {
            let next = Self.window(of: start, seconds: seconds)
            guard whole ? next.end <= before : next.start < before else { break }
            bars.append(Bar(start: next.start, end: next.end, open: close, high: close, low: close, close: close, volume: 0, trades: 0, notional: 0))
            start = next.end
        }
        if !bars.isEmpty { finishedThrough = start }
        return bars
    }

    /// Forgets the open bar and where windows stood: its trades were not all seen (an outage). No
    /// zero-volume bars are made for the time it covered.
    public mutating func reset() {
        open = nil
        priced = false
        window = nil
        finishedThrough = nil
        partialWindow = true
    }
}

/// How a vendor's trades make bars and how its bar events are written: what a protocol provides for
/// derived topics (``WireProtocol/barRules(of:)``). `Sendable`.
public protocol BarRules: Sendable {
    /// The trade event type bars are built from (`T`, `XT`, `t`).
    var tradeEventType: String { get }
    /// The bar event types a derived topic may name (`A` and `AM`; `XA` and `XAS`; `b`).
    var barEventTypes: Set<String> { get }
    /// The trade in an event of ``tradeEventType`` as a bar counts it; `nil`: unreadable (not counted).
    func trade(in event: MarketEvent) -> BarTrade?
    /// A finished bar as the vendor's bar event of `eventType` for `ticker` (the derived topic's).
    func render(_ bar: Bar, eventType: String, ticker: String) -> ByteBuffer
}

extension BarRules {
    /// Why `topic` (derived) cannot be built here, or `nil`.
    public func problem(with topic: Topic) -> String? {
        guard barEventTypes.contains(topic.eventType) else {
            return "\(topic): derived bars are \(barEventTypes.sorted().joined(separator: " or ")) topics"
        }
        guard !topic.isWildcard, let derived = topic.derivedBar, !derived.symbol.isEmpty, !derived.symbol.contains(BarSpec.separator) else {
            return "\(topic): \(BarSpec.syntax)"
        }
        return nil
    }

    /// The trade topic a derived topic is built from.
    public func sourceTopic(of topic: Topic) -> Topic? {
        guard let derived = topic.derivedBar else { return nil }
        return Topic(eventType: tradeEventType, ticker: derived.symbol)
    }
}
