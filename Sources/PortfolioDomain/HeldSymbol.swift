import Foundation
import MarketCore

/// The symbols a portfolio may hold: exactly the tickers a market-feed client may subscribe to
/// (``SessionLimits/problem(with:)``: letters, digits and `. : / - _`, at most 40 characters), and
/// never a wildcard. The sidecar follows each held symbol's `T.` and `Q.` topics upstream, so a symbol
/// such as `*` or `ZZZQ,AM.*` would otherwise subscribe the relay to what no key asked for.
public enum HeldSymbol {
    /// The ticker rules of a market-feed subscription, with their default length.
    public static let limits = SessionLimits()

    /// A symbol as it is stored: trimmed of spaces, upper-cased (`" aapl"` is `AAPL`).
    public static func normalized(_ text: String) -> String {
        text.trimmingCharacters(in: .whitespaces).uppercased()
    }

    /// Why `symbol` (already trimmed and upper-cased) cannot be held, or `nil` when it can.
    public static func problem(with symbol: String) -> String? {
        if symbol.isEmpty { return "required" }
        if symbol == Topic.wildcardTicker { return "a wildcard is not a symbol" }
        guard let topic = Topic(eventType: "T", ticker: symbol), !topic.isDerived else { return "a ticker has letters, digits and . : / - _ only, a letter or digit among them" }
        return limits.problem(with: topic)
    }
}
