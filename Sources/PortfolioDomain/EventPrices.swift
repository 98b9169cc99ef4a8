import Foundation
import NIOCore
import MarketCore

/// Exact prices: what a protocol read out of an event (``PriceReading``, decimal text, never a `Double`
/// in between) applied to a symbol's prices.
public enum EventPrices {
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
            prices.lastTrade = PriceObservation(value: price, at: seen(at, now: now), source: .trade)
        case .quote(let bidText, _, let askText, _, let at)?:
            guard let bid = decimal(bidText), let ask = decimal(askText), bid > 0, ask >= bid else { return }
            prices.lastQuoteMid = PriceObservation(value: (bid + ask) / 2, at: seen(at, now: now), source: .quoteMid)
        case nil:
            break
        }
    }

    /// A price's time as it counts: its own, never later than `now` (a time in the future, a clock
    /// ahead or a crafted one, would keep the price fresh for ever), `now` without one.
    public static func seen(_ unixNanoseconds: Int64?, now: Date) -> Date {
        min(date(unixNanoseconds) ?? now, now)
    }

    /// A reading's time.
    public static func date(_ unixNanoseconds: Int64?) -> Date? {
        // Seconds and the fraction apart: nanoseconds since 1970 are past a Double's exact integers.
        unixNanoseconds.map { Date(timeIntervalSince1970: Double($0 / 1_000_000_000) + Double($0 % 1_000_000_000) / 1e9) }
    }
}
