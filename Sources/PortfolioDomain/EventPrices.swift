import Foundation
import NIOCore
import MarketCore

/// Exact prices: what a protocol read out of an event (``PriceReading``, decimal text) applied to a
/// symbol's prices, and the numbers of a JSON text (a REST answer) read as their own text, never a
/// `Double` in between.
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

    /// Exact decimal text as a `Decimal` (an exponent too: `1.234e-05`).
    public static func decimal(_ text: String) -> Decimal? {
        DecimalText.parse(text) ?? Decimal(string: text)
    }

    /// Updates a symbol's prices from what its protocol read out of an event (``WireProtocol/price(in:)``):
    /// a trade's price is the last price, a quote gives its mid. Nothing for a non-positive price or a
    /// crossed quote.
    public static func apply(_ reading: PriceReading?, to prices: inout SymbolPrices, now: Date) {
        switch reading {
        case .trade(let text, _, let at)?:
            guard let price = decimal(text), price > 0 else { return }
            prices.lastTrade = PriceObservation(value: price, at: date(at) ?? now, source: .trade)
        case .quote(let bidText, _, let askText, _, let at)?:
            guard let bid = decimal(bidText), let ask = decimal(askText), bid > 0, ask >= bid else { return }
            prices.lastQuoteMid = PriceObservation(value: (bid + ask) / 2, at: date(at) ?? now, source: .quoteMid)
        case nil:
            break
        }
    }

    /// A reading's time.
    public static func date(_ unixNanoseconds: Int64?) -> Date? {
        // Seconds and the fraction apart: nanoseconds since 1970 are past a Double's exact integers.
        unixNanoseconds.map { Date(timeIntervalSince1970: Double($0 / 1_000_000_000) + Double($0 % 1_000_000_000) / 1e9) }
    }
}
