import MarketCore
import NIOCore

/// Alpaca's rules for bars built from its trades, and its bar event as derived bars are written: a
/// feed's trades (`t`) make `b` bars (alpaca-py's `Bar`: `S`, `o`, `h`, `l`, `c`, `v`, `t` the start,
/// `n`, `vw`), with `_e`, the bar's end, beside them (the SDKs pass over it).
///
/// Which stock trades move what: Alpaca's bars follow the consolidated tape's rules, as Polygon's do,
/// for the CTA/UTP condition letters Alpaca sends (``stockConditionRules``); a trade updates a value only
/// when every one of its conditions allows it. Crypto trades have no conditions: every one counts.
public struct AlpacaBarRules: BarRules {
    public let feed: AlpacaFeed

    public init?(feed: AlpacaFeed) {
        guard feed.market == .stocks || feed.market == .crypto else { return nil }
        self.feed = feed
    }

    public var tradeEventType: String { "t" }
    public var barEventTypes: Set<String> { ["b"] }

    /// (updates high/low, updates open/close, updates volume) per condition letter that does not update
    /// all three. A letter not listed (`@` regular, `F` intermarket sweep, `O` opening, `6` closing …)
    /// updates all three.
    public static let stockConditionRules: [String: (highLow: Bool, openClose: Bool, volume: Bool)] = [
        "C": (false, false, true),  // Cash Sale
        "G": (true, false, true),  // Bunched Sold Trade
        "H": (false, false, true),  // Price Variation Trade
        "I": (false, false, true),  // Odd Lot Trade
        "M": (false, false, false),  // Market Center Official Close
        "N": (false, false, true),  // Next Day
        "P": (true, false, true),  // Prior Reference Price
        "Q": (false, false, false),  // Market Center Official Open
        "R": (false, false, true),  // Seller
        "T": (false, false, true),  // Form T (extended hours)
        "U": (false, false, true),  // Extended Trading Hours (Sold Out of Sequence)
        "V": (false, false, true),  // Contingent Trade
        "W": (false, false, true),  // Average Price Trade
        "Z": (true, false, true),  // Sold (Out of Sequence)
        "4": (true, false, true),  // Derivatively Priced
        "7": (false, false, true),  // Qualified Contingent Trade
        "9": (false, false, false),  // Corrected Consolidated Close
    ]

    public func trade(in event: MarketEvent) -> BarTrade? {
        guard event.eventType == "t", let value = try? MessagePack.decode(event.bytes.readableBytesView), case .map = value,
            case .timestamp(let seconds, let nanoseconds)? = value["t"], seconds > 0, seconds < Int64.max / 1_000_000_000 - 1
        else { return nil }
        func number(_ field: String) -> Double? {
            switch value[field] {
            case .double(let number)?: number
            case let other?: other.integer.map(Double.init)
            case nil: nil
            }
        }
        guard let price = number("p"), let size = number("s") else { return nil }
        var trade = BarTrade(price: price, size: size, time: seconds * 1_000_000_000 + Int64(nanoseconds))
        if feed.market == .stocks, let conditions = value["c"]?.array {
            for condition in conditions {
                guard let letter = condition.string, let rule = Self.stockConditionRules[letter] else { continue }
                trade.updatesHighLow = trade.updatesHighLow && rule.highLow
                trade.updatesOpenClose = trade.updatesOpenClose && rule.openClose
                trade.updatesVolume = trade.updatesVolume && rule.volume
            }
        }
        return trade
    }

    public func render(_ bar: Bar, eventType: String, ticker: String) -> ByteBuffer {
        var writer = MessagePack.Writer(capacity: 128)
        writer.mapHeader(11)
        writer.string("T")
        writer.string(eventType)
        writer.string("S")
        writer.string(ticker)
        for (key, value) in [("o", bar.open), ("h", bar.high), ("l", bar.low), ("c", bar.close)] {
            writer.string(key)
            writer.double(value)
        }
        writer.string("v")
        if feed.market == .stocks, bar.volume == bar.volume.rounded(), abs(bar.volume) < 1e15 { writer.int(Int64(bar.volume)) } else { writer.double(bar.volume) }
        writer.string("t")
        writer.value(AlpacaEvents.time(nanoseconds: bar.start))
        writer.string("n")
        writer.int(Int64(bar.trades))
        writer.string("vw")
        writer.double(bar.vwap)
        writer.string("_e")
        writer.value(AlpacaEvents.time(nanoseconds: bar.end))
        return ByteBuffer(bytes: writer.bytes)
    }
}
