/// One of the relay's markets: an upstream connection, a hub and a served path each. What a market
/// carries (its event types, the form of its tickers) is its protocol's (`WireProtocol.eventTypes(of:)`;
/// Polygon's table is in `PolygonWire`); a held symbol names its market by Polygon's ticker prefixes
/// (``of(ticker:)``), the relay's own convention for portfolio symbols. `news` is a stream of its own
/// (Alpaca's `/v1beta1/news`): a market in the relay's sense (one upstream connection, a hub, a path, a
/// key's right), with no prices. Value type, `Sendable`.
public enum Market: String, CaseIterable, Sendable, Codable, Comparable, CustomStringConvertible {
    case stocks, options, forex, crypto, indices, futures, news

    /// The markets that trade (every one but `news`): what the vendors' price streams are.
    public static let trading: [Market] = allCases.filter { $0 != .news }

    /// The market of a WebSocket path's last segment (`stocks` for `/stocks`), or `nil`.
    public init?(path: String) {
        let segment = path.split(separator: "/" as Character).last.map(String.init) ?? path
        self.init(rawValue: segment.lowercased())
    }

    /// The market a ticker names by its prefix: `X:` crypto, `C:` forex, `O:` options, `I:` indices,
    /// anything else stocks.
    @inlinable
    public static func of(ticker: some StringProtocol) -> Market {
        let utf8 = ticker.utf8
        guard utf8.count > 2, utf8.dropFirst().first == UInt8(ascii: ":") else { return .stocks }
        switch utf8.first {
        case UInt8(ascii: "X"): return .crypto
        case UInt8(ascii: "C"): return .forex
        case UInt8(ascii: "O"): return .options
        case UInt8(ascii: "I"): return .indices
        default: return .stocks
        }
    }

    public var description: String { rawValue }

    public static func < (lhs: Market, rhs: Market) -> Bool {
        lhs.order < rhs.order
    }

    private var order: Int {
        switch self {
        case .stocks: 0
        case .options: 1
        case .forex: 2
        case .crypto: 3
        case .indices: 4
        case .futures: 5
        case .news: 6
        }
    }
}
