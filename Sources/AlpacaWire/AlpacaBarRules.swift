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

    /// What each condition letter (by its byte) lets a trade move, for the letters that do not allow
    /// all three. A letter not listed (`@` regular, `F` intermarket sweep, `O` opening, `6` closing …)
    /// updates all three.
    public static let stockConditionRules: [UInt8: TradeUpdates] = [
        UInt8(ascii: "C"): .volumeOnly,  // Cash Sale
        UInt8(ascii: "G"): .highLowAndVolume,  // Bunched Sold Trade
        UInt8(ascii: "H"): .volumeOnly,  // Price Variation Trade
        UInt8(ascii: "I"): .volumeOnly,  // Odd Lot Trade
        UInt8(ascii: "M"): .nothing,  // Market Center Official Close
        UInt8(ascii: "N"): .volumeOnly,  // Next Day
        UInt8(ascii: "P"): .highLowAndVolume,  // Prior Reference Price
        UInt8(ascii: "Q"): .nothing,  // Market Center Official Open
        UInt8(ascii: "R"): .volumeOnly,  // Seller
        UInt8(ascii: "T"): .volumeOnly,  // Form T (extended hours)
        UInt8(ascii: "U"): .volumeOnly,  // Extended Trading Hours (Sold Out of Sequence)
        UInt8(ascii: "V"): .volumeOnly,  // Contingent Trade
        UInt8(ascii: "W"): .volumeOnly,  // Average Price Trade
        UInt8(ascii: "Z"): .highLowAndVolume,  // Sold (Out of Sequence)
        UInt8(ascii: "4"): .highLowAndVolume,  // Derivatively Priced
        UInt8(ascii: "7"): .volumeOnly,  // Qualified Contingent Trade
        UInt8(ascii: "9"): .nothing,  // Corrected Consolidated Close
    ]

    public func trade(in event: MarketEvent) -> BarTrade? {
        guard event.eventType == "t" else { return nil }
        // Read in place, once over the map, with no allocation: every trade of a symbol that has a bar
        // passes here, on the upstream's thread.
        let stocks = feed.market == .stocks
        let read = event.bytes.withUnsafeReadableBytes { raw -> BarTrade? in
            var reader = MessagePack.Reader(raw)
            var price: Double?
            var size: Double?
            var time: Int64?
            var updates = TradeUpdates.all
            do throws(MessagePack.ReadError) {
                let count = try reader.mapCount()
                for _ in 0..<count {
                    guard let key = try reader.stringBytes() else {
                        // A key that is no string: it and its value.
                        _ = try reader.skip()
                        _ = try reader.skip()
                        continue
                    }
                    let first = key.first ?? 0
                    switch (key.count, first) {
                    case (1, UInt8(ascii: "p")): price = Self.number(try reader.value())
                    case (1, UInt8(ascii: "s")): size = Self.number(try reader.value())
                    case (1, UInt8(ascii: "t")):
                        if case .timestamp(let seconds, let nanoseconds) = try reader.value(), seconds > 0, seconds < Int64.max / 1_000_000_000 - 1 {
                            time = seconds * 1_000_000_000 + Int64(nanoseconds)
                        }
                    case (1, UInt8(ascii: "c")) where stocks:
                        let conditions = try reader.arrayCount()
                        for _ in 0..<conditions {
                            guard let letter = try reader.stringBytes() else {
                                _ = try reader.skip()
                                continue
                            }
                            guard letter.count == 1, let byte = letter.first, let rule = Self.stockConditionRules[byte] else { continue }
                            updates = updates.and(rule)
                        }
                    default:
                        _ = try reader.skip()
                    }
                }
            } catch {
                return nil
            }
            guard let price, let size, let time else { return nil }
            return BarTrade(price: price, size: size, time: time, updates: updates)
        }
        return read
    }

    private static func number(_ value: MessagePack.Value) -> Double? {
        switch value {
        case .double(let number): number
        case .int(let number): Double(number)
        case .uint(let number): Double(number)
        default: nil
        }
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
