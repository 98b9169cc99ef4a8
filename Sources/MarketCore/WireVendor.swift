/// One vendor as the settings and the composition root know it: the name `upstream.vendor` gives, how its
/// own upstream endpoints are recognised, whether its sign-in takes a secret beside the key, and its
/// ``WireProtocol`` for a market.
///
/// Each vendor module makes one (`WireVendor.polygon` in `PolygonWire`, `WireVendor.alpaca` in
/// `AlpacaWire`); the composition root lists them (`Relay.vendors`), and that list is the one place the
/// relay names its vendors. The settings are read with the list, so they recognise a vendor's URLs
/// without importing its module. Value type, `Sendable`; two vendors are the same when their names are.
public struct WireVendor: Sendable, Equatable, CustomStringConvertible {
    /// The name the settings use (`--upstream-vendor polygon`), lower case.
    public let name: String
    /// Whether its upstream sign-in sends a secret beside the key id (Alpaca's does).
    public let signsInWithSecret: Bool
    private let ownsHost: @Sendable (String) -> Bool
    private let marketOfPath: @Sendable (String) -> Market?
    private let makeProtocol: @Sendable (Market, String?) -> any WireProtocol

    /// - Parameters:
    ///   - ownsHost: whether a (lower-cased) host is one of the vendor's own servers.
    ///   - marketOfPath: the market an upstream URL's path names in the vendor's own terms (Alpaca's
    ///     `/v2/iex`), `nil` when it names none (the URL's last segment is then read as the market).
    ///   - wireProtocol: its protocol for a market, given the upstream URL's path when there is one.
    public init(
        name: String, signsInWithSecret: Bool = false, ownsHost: @escaping @Sendable (String) -> Bool,
        marketOfPath: @escaping @Sendable (String) -> Market? = { _ in nil },
        wireProtocol: @escaping @Sendable (Market, String?) -> any WireProtocol
    ) {
        self.name = name
        self.signsInWithSecret = signsInWithSecret
        self.ownsHost = ownsHost
        self.marketOfPath = marketOfPath
        self.makeProtocol = wireProtocol
    }

    /// Whether `host` is one of the vendor's own servers (any case).
    public func owns(host: String) -> Bool { ownsHost(host.lowercased()) }

    /// The market `path` names in the vendor's own terms, if it names one.
    public func market(ofPath path: String) -> Market? { marketOfPath(path) }

    /// Its protocol for `market`, whose upstream is at `path` when known.
    public func wireProtocol(market: Market, path: String? = nil) -> any WireProtocol { makeProtocol(market, path) }

    public var description: String { name }

    public static func == (lhs: WireVendor, rhs: WireVendor) -> Bool { lhs.name == rhs.name }
}

extension Array where Element == WireVendor {
    /// The vendor named `name` (any case).
    public func named(_ name: String) -> WireVendor? {
        let name = name.lowercased()
        return first { $0.name == name }
    }

    /// Whose protocol an upstream at `host` and `path` speaks: the vendor owning the host, else the one
    /// whose paths name a market, else the first listed (the default protocol).
    public func speaking(host: String, path: String) -> WireVendor? {
        first { $0.owns(host: host) } ?? first { $0.market(ofPath: path) != nil } ?? first
    }

    /// The market `path` names in any listed vendor's terms.
    public func market(ofPath path: String) -> Market? {
        lazy.compactMap { $0.market(ofPath: path) }.first
    }
}
