/// Which field of an event carries its ticker, per event type (see `polygon-protocol.md`).
///
/// Stocks, options and aggregates use `sym`; crypto and forex aggregates use `pair`; forex quotes use `p`;
/// LULD, NOI and index values use `T`. An unknown event type is routed by the first of `sym`, `pair`, `T`,
/// then `p` that holds a string, so new channels keep flowing without a code change.
public enum TickerField: String, Sendable, CaseIterable {
    case sym, pair, p, T

    /// The ticker field of a known event type, `nil` for a type this table does not know.
    public static func forEventType(_ eventType: String) -> TickerField? {
        switch eventType {
        case "T", "Q", "A", "AM", "FMV", "LV": return .sym
        case "XT", "XQ", "XA", "XAS", "XL2", "CA", "CAS": return .pair
        case "C": return .p
        case "LULD", "NOI", "V": return .T
        default: return nil
        }
    }

    /// The order in which fields are tried for an unknown event type.
    static let fallbackOrder: [TickerField] = [.sym, .pair, .T, .p]
}
