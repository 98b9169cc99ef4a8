import MarketCore
import NIOCore

/// Polygon's rules for bars built from its trades, and its aggregate events as derived bars are written:
/// stocks' trades (`T`) make `A`/`AM` bars (the `EquityAgg` shape: `sym`, `v`, `vw`, `o`, `c`, `h`, `l`,
/// `z`, `s`, `e`, and `n`), crypto's (`XT`) make `XA`/`XAS` bars (`CurrencyAgg`: `pair`, the same fields).
/// Fields a derived bar cannot know (the day's accumulated volume `av`, official open `op`, day VWAP `a`)
/// are left out; the clients read them as absent.
///
/// Which stock trades move what: Polygon's `update_rules.consolidated` per condition
/// (`GET /v3/reference/conditions`), a trade updating a value only when every one of its conditions
/// allows it (``stockConditionRules``). Crypto trades have no such conditions: every one counts.
public struct PolygonBarRules: BarRules {
    public let market: Market

    public init?(market: Market) {
        guard market == .stocks || market == .crypto else { return nil }
        self.market = market
    }

    public var tradeEventType: String { market == .crypto ? "XT" : "T" }
    public var barEventTypes: Set<String> { market == .crypto ? ["XA", "XAS"] : ["A", "AM"] }

    /// (updates high/low, updates open/close, updates volume) per stock trade condition that does not
    /// update all three. A condition not listed updates all three, as a regular sale does.
    public static let stockConditionRules: [Int: TradeUpdates] = [
        2: .volumeOnly,  // Average Price Trade
        5: .highLowAndVolume,  // Bunched Sold Trade
        7: .volumeOnly,  // Cash Sale
        10: .highLowAndVolume,  // Derivatively Priced
        12: .volumeOnly,  // Form T (extended hours)
        13: .volumeOnly,  // Extended Trading Hours (Sold Out of Sequence)
        15: .nothing,  // Market Center Official Close
        16: .nothing,  // Market Center Official Open
        20: .volumeOnly,  // Next Day
        21: .volumeOnly,  // Price Variation Trade
        22: .highLowAndVolume,  // Prior Reference Price
        29: .volumeOnly,  // Seller
        32: .highLowAndVolume,  // Sold (Out of Sequence)
        33: .highLowAndVolume,  // Sold (Out of Sequence) and Stopped Stock
        37: .volumeOnly,  // Odd Lot Trade
        38: .nothing,  // Corrected Consolidated Close
        52: .volumeOnly,  // Contingent Trade
        53: .volumeOnly,  // Qualified Contingent Trade
    ]

    public func trade(in event: MarketEvent) -> BarTrade? {
        guard event.eventType == tradeEventType else { return nil }
        // Read in place, once over the bytes, with no allocation: every trade of a symbol that has a bar
        // passes here, on the upstream's thread.
        guard
            let fields = event.bytes.withUnsafeReadableBytes({ TradeFields(json: $0, conditionRules: market == .stocks ? Self.stockConditionRules : nil) }),
            let price = fields.price, let size = fields.size, let milliseconds = fields.time, milliseconds > 0,
            milliseconds < Int64.max / 1_000_000
        else { return nil }
        return BarTrade(price: price, size: size, time: milliseconds * 1_000_000, updates: fields.updates)
    }

    public func render(_ bar: Bar, eventType: String, ticker: String) -> ByteBuffer {
        let symbolField = market == .crypto ? "pair" : "sym"
        // A crypto topic's ticker is `X:BTC-USD@5m`; the event's pair is written without the prefix.
        let symbol = market == .crypto && ticker.hasPrefix("X:") ? String(ticker.dropFirst(2)) : ticker
        var text = #"{"ev":"\#(eventType)","\#(symbolField)":"\#(JSONText.escape(symbol))","v":\#(Self.number(bar.volume)),"#
        text += #""vw":\#(Self.number(bar.vwap)),"o":\#(Self.number(bar.open)),"c":\#(Self.number(bar.close)),"#
        text += #""h":\#(Self.number(bar.high)),"l":\#(Self.number(bar.low)),"z":\#(Self.number(bar.averageSize)),"n":\#(bar.trades),"#
        text += #""s":\#(bar.start / 1_000_000),"e":\#(bar.end / 1_000_000)}"#
        return ByteBuffer(string: text)
    }

    /// A number as JSON: whole numbers without a fraction, others to at most 10 decimals (no float noise).
    static func number(_ value: Double) -> String {
        guard value.isFinite else { return "0" }
        if value == value.rounded(), abs(value) < 1e15 { return String(Int64(value)) }
        let scaled = (value * 1e10).rounded() / 1e10
        return "\(scaled)"
    }
}

/// A Polygon trade's `p`, `s`, `t` and `c`, read from its JSON object's top level in one pass. A value of
/// another shape than expected leaves its field unread (`nil`), so the trade is not counted. Value type.
struct TradeFields {
    var price: Double?
    var size: Double?
    var time: Int64?
    /// What its conditions let it move (everything when it has none, or they are not read).
    var updates = TradeUpdates.all

    /// - Parameter conditionRules: what each condition code allows; `nil`: conditions are not read.
    init?(json raw: UnsafeRawBufferPointer, conditionRules: [Int: TradeUpdates]?) {
        var index = 0
        let count = raw.count
        func skipSpace() {
            while index < count, JSONText.isSpace(raw[index]) { index += 1 }
        }
        skipSpace()
        guard index < count, raw[index] == UInt8(ascii: "{") else { return nil }
        index += 1
        while index < count {
            skipSpace()
            guard index < count else { return nil }
            if raw[index] == UInt8(ascii: "}") { return }
            if raw[index] == UInt8(ascii: ",") {
                index += 1
                continue
            }
            // A key: one byte long for the fields read here.
            guard raw[index] == UInt8(ascii: "\"") else { return nil }
            let keyStart = index + 1
            index = keyStart
            while index < count, raw[index] != UInt8(ascii: "\"") {
                if raw[index] == UInt8(ascii: "\\") { index += 1 }
                index += 1
            }
            guard index < count else { return nil }
            let key: UInt8 = index - keyStart == 1 ? raw[keyStart] : 0
            index += 1
            skipSpace()
            guard index < count, raw[index] == UInt8(ascii: ":") else { return nil }
            index += 1
            skipSpace()
            guard index < count else { return nil }
            switch (key, raw[index]) {
            case (UInt8(ascii: "p"), _): price = Self.number(raw, &index)
            case (UInt8(ascii: "s"), _): size = Self.number(raw, &index)
            case (UInt8(ascii: "t"), _): time = Self.number(raw, &index).flatMap { $0 == $0.rounded() && abs($0) < 9e18 ? Int64($0) : nil }
            case (UInt8(ascii: "c"), UInt8(ascii: "[")) where conditionRules != nil:
                index += 1
                while index < count, raw[index] != UInt8(ascii: "]") {
                    if raw[index] == UInt8(ascii: ",") || raw[index] == 0x20 {
                        index += 1
                        continue
                    }
                    guard let code = Self.number(raw, &index), code == code.rounded(), abs(code) < 1e9 else { return nil }
                    if let rule = conditionRules?[Int(code)] { updates = updates.and(rule) }
                }
                index += 1
            default:
                guard Self.skipValue(raw, &index) else { return nil }
            }
        }
        return nil
    }

    /// A JSON number at `index` (moved past it); `nil` if none there.
    static func number(_ raw: UnsafeRawBufferPointer, _ index: inout Int) -> Double? {
        let start = index
        var mantissa: UInt64 = 0
        var digits = 0
        var scale = 0
        var negative = false
        var simple = true
        if index < raw.count, raw[index] == UInt8(ascii: "-") {
            negative = true
            index += 1
        }
        var fraction = false
        while index < raw.count {
            let byte = raw[index]
            if byte >= UInt8(ascii: "0"), byte <= UInt8(ascii: "9") {
                if digits < 18 {
                    mantissa = mantissa * 10 + UInt64(byte - UInt8(ascii: "0"))
                    digits += mantissa == 0 ? 0 : 1
                    if fraction { scale += 1 }
                } else {
                    simple = false
                }
            } else if byte == UInt8(ascii: "."), !fraction {
                fraction = true
            } else if byte == UInt8(ascii: "e") || byte == UInt8(ascii: "E") || byte == UInt8(ascii: "+") || (byte == UInt8(ascii: "-") && index > start) {
                simple = false
            } else {
                break
            }
            index += 1
        }
        guard index > start + (negative ? 1 : 0) else { return nil }
        // Exact for up to 15 significant digits and 22 decimals: the quotient of two exact doubles is
        // rounded once, as the decimal is.
        if simple, mantissa < 1 << 53, scale <= 22 {
            let value = Double(mantissa) / Self.powersOfTen[scale]
            return negative ? -value : value
        }
        let text = String(decoding: UnsafeRawBufferPointer(rebasing: raw[start..<index]), as: UTF8.self)
        return Double(text)
    }

    static let powersOfTen: [Double] = (0...22).map { exponent in (0..<exponent).reduce(1.0) { value, _ in value * 10 } }

    /// Moves `index` past one JSON value (a string, number, literal, array or object).
    static func skipValue(_ raw: UnsafeRawBufferPointer, _ index: inout Int) -> Bool {
        var depth = 0
        var inString = false
        while index < raw.count {
            let byte = raw[index]
            if inString {
                if byte == UInt8(ascii: "\\") {
                    index += 1
                } else if byte == UInt8(ascii: "\"") {
                    inString = false
                    if depth == 0 {
                        index += 1
                        return true
                    }
                }
            } else {
                switch byte {
                case UInt8(ascii: "\""): inString = true
                case UInt8(ascii: "["), UInt8(ascii: "{"): depth += 1
                case UInt8(ascii: "]"), UInt8(ascii: "}"):
                    if depth == 0 { return true }
                    depth -= 1
                    if depth == 0 {
                        index += 1
                        return true
                    }
                case UInt8(ascii: ","):
                    if depth == 0 { return true }
                default: break
                }
            }
            index += 1
        }
        return false
    }
}
