import Foundation
import AlpacaWire
import NIOCore
import MarketCore

/// Reads exact prices out of Polygon events (the number's own text, never a `Double` in between) and
/// Alpaca's (MessagePack doubles, at their shortest decimal text).
public enum EventPrices {
    /// The raw text of a top-level numeric field, e.g. `"p":189.05` → `189.05`.
    public static func number(_ field: String, in bytes: ByteBuffer) -> Decimal? {
        number(field, in: String(buffer: bytes))
    }

    public static func number(_ field: String, in text: String) -> Decimal? {
        guard let key = text.range(of: "\"\(field)\":") else { return nil }
        var end = key.upperBound
        while end < text.endIndex, "-0123456789.".contains(text[end]) { end = text.index(after: end) }
        return DecimalText.parse(String(text[key.upperBound..<end]))
    }

    /// The event's time (`t`, Unix ms) or now.
    public static func time(in text: String, default now: Date) -> Date {
        guard let ms = number("t", in: text) else { return now }
        return Date(timeIntervalSince1970: NSDecimalNumber(decimal: ms).doubleValue / 1000)
    }

    /// An Alpaca event's fields: its numbers as exact decimals, its time.
    public struct AlpacaFields: Sendable {
        let value: MessagePack.Value

        /// A number field: a MessagePack double at its shortest decimal text (`187.25`, not
        /// `187.2500000001`), or an integer.
        public func number(_ field: String) -> Decimal? {
            switch value[field] {
            // Swift writes tiny doubles with an exponent (`1.234e-05`), which Decimal reads too.
            case .double(let number)?: number.isFinite ? DecimalText.parse("\(number)") ?? Decimal(string: "\(number)") : nil
            case let other?: other.integer.map { Decimal($0) }
            case nil: nil
            }
        }

        /// `t`, a MessagePack timestamp.
        public var time: Date? {
            guard case .timestamp(let seconds, let nanoseconds)? = value["t"] else { return nil }
            return Date(timeIntervalSince1970: Double(seconds) + Double(nanoseconds) / 1e9)
        }
    }

    /// The fields of an Alpaca event (one MessagePack map), or `nil` for anything else.
    public static func alpacaFields(_ event: MarketEvent) -> AlpacaFields? {
        guard let value = try? MessagePack.decode(event.bytes.readableBytesView), case .map = value else { return nil }
        return AlpacaFields(value: value)
    }

    /// Updates a symbol's prices from an Alpaca trade (`t`) or quote (`q`).
    static func applyAlpaca(_ event: MarketEvent, to prices: inout SymbolPrices, now: Date) {
        guard let fields = alpacaFields(event) else { return }
        let at = fields.time ?? now
        switch event.eventType {
        case "t":
            if let price = fields.number("p"), price > 0 { prices.lastTrade = PriceObservation(value: price, at: at, source: .trade) }
        case "q":
            if let bid = fields.number("bp"), let ask = fields.number("ap"), bid > 0, ask >= bid {
                prices.lastQuoteMid = PriceObservation(value: (bid + ask) / 2, at: at, source: .quoteMid)
            }
        default:
            break
        }
    }

    /// Updates a symbol's prices from a trade or quote event (Polygon's JSON, or Alpaca's `t`/`q`).
    public static func apply(_ event: MarketEvent, to prices: inout SymbolPrices, now: Date) {
        if event.eventType == "t" || event.eventType == "q" {
            applyAlpaca(event, to: &prices, now: now)
            return
        }
        // Read as text once; each field is then found in it.
        let text = String(buffer: event.bytes)
        let at = time(in: text, default: now)
        // Trades (`T`, crypto `XT`) and index values (`V`) are last prices; quotes (`Q`, crypto `XQ`,
        // forex `C` with `b`/`a`) give their mid.
        switch event.eventType {
        case "T", "XT":
            if let price = number("p", in: text), price > 0 {
                prices.lastTrade = PriceObservation(value: price, at: at, source: .trade)
            }
        case "V":
            if let price = number("val", in: text), price > 0 {
                prices.lastTrade = PriceObservation(value: price, at: at, source: .trade)
            }
        case "Q", "XQ":
            if let bid = number("bp", in: text), let ask = number("ap", in: text), bid > 0, ask >= bid {
                prices.lastQuoteMid = PriceObservation(value: (bid + ask) / 2, at: at, source: .quoteMid)
            }
        case "C":
            if let bid = number("b", in: text), let ask = number("a", in: text), bid > 0, ask >= bid {
                prices.lastQuoteMid = PriceObservation(value: (bid + ask) / 2, at: at, source: .quoteMid)
            }
        default:
            break
        }
    }
}
