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
    public static let stockConditionRules: [Int: (highLow: Bool, openClose: Bool, volume: Bool)] = [
        2: (false, false, true),  // Average Price Trade
        5: (true, false, true),  // Bunched Sold Trade
        7: (false, false, true),  // Cash Sale
        10: (true, false, true),  // Derivatively Priced
        12: (false, false, true),  // Form T (extended hours)
        13: (false, false, true),  // Extended Trading Hours (Sold Out of Sequence)
        15: (false, false, false),  // Market Center Official Close
        16: (false, false, false),  // Market Center Official Open
        20: (false, false, true),  // Next Day
        21: (false, false, true),  // Price Variation Trade
        22: (true, false, true),  // Prior Reference Price
        29: (false, false, true),  // Seller
        32: (true, false, true),  // Sold (Out of Sequence)
        33: (true, false, true),  // Sold (Out of Sequence) and Stopped Stock
        37: (false, false, true),  // Odd Lot Trade
        38: (false, false, false),  // Corrected Consolidated Close
        52: (false, false, true),  // Contingent Trade
        53: (false, false, true),  // Qualified Contingent Trade
    ]

    public func trade(in event: MarketEvent) -> BarTrade? {
        guard event.eventType == tradeEventType else { return nil }
        let text = String(buffer: event.bytes)
        guard let members = JSONText.members(of: text[...]), let priceText = members["p"], let price = Double(priceText),
            let sizeText = members["s"], let size = Double(sizeText), let timeText = members["t"], let milliseconds = Int64(timeText),
            milliseconds > 0, milliseconds < Int64.max / 1_000_000
        else { return nil }
        var trade = BarTrade(price: price, size: size, time: milliseconds * 1_000_000)
        if market == .stocks, let conditions = members["c"], conditions.first == "[" {
            for item in conditions.dropFirst().dropLast().split(separator: ",") {
                guard let code = Int(item.trimmingWhitespace()), let rule = Self.stockConditionRules[code] else { continue }
                trade.updatesHighLow = trade.updatesHighLow && rule.highLow
                trade.updatesOpenClose = trade.updatesOpenClose && rule.openClose
                trade.updatesVolume = trade.updatesVolume && rule.volume
            }
        }
        return trade
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
