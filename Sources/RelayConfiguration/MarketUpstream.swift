import Foundation
import MarketCore
import RelayServer
import Upstream
import Yams

/// One market's upstream connection as configured: the market (the URL's last path segment), where it
/// is, and its own key and CA file when it has them (otherwise the relay's default key, `POLYGON_API_KEY`,
/// and `--upstream-ca-file`). Value type, `Sendable`.
///
/// Read from three places, most important first: `--upstream URL` (repeatable) or `RELAY_UPSTREAM`
/// (comma-separated URLs) or the file's `upstream.url`; `--markets a,b` (`RELAY_MARKETS`,
/// `upstream.markets`) with `--upstream-host` (`RELAY_UPSTREAM_HOST`, `upstream.host`, default
/// `socket.massive.com`), each `wss://HOST/MARKET`; and the file's `upstreams:` list of mappings
/// (`market`, `url`, `key` or `keyEnv`, `caFile`). A market named by a more important place is not taken
/// again from a less important one; the same market twice in one place is an error.
public struct MarketUpstream: Sendable, Equatable {
    public var market: Market
    public var endpoint: UpstreamConfiguration.Endpoint
    /// This market's key; `nil`: the relay's default upstream key.
    public var apiKey: String?
    /// This market's extra trusted CAs; `nil`: the relay's default.
    public var caFile: String?

    /// Polygon's real-time host; `delayed.massive.com` is the 15-minute delayed feed.
    public static let defaultHost = "socket.massive.com"

    public init(market: Market, endpoint: UpstreamConfiguration.Endpoint, apiKey: String? = nil, caFile: String? = nil) {
        self.market = market
        self.endpoint = endpoint
        self.apiKey = apiKey
        self.caFile = caFile
    }

    /// The upstream at `url`, whose path names the market in a listed vendor's terms (Alpaca's `/v2/iex`),
    /// else by its last segment (`/stocks`).
    public init(
        url: String, market named: Market? = nil, apiKey: String? = nil, caFile: String? = nil, vendors: [WireVendor]
    ) throws(RelaySettings.InvalidSetting) {
        guard let endpoint = UpstreamConfiguration.Endpoint(url) else {
            throw RelaySettings.InvalidSetting(description: "upstream: expected a ws:// or wss:// URL, got \"\(url)\"")
        }
        // The upstream's key (and Alpaca's secret) goes out in the sign-in: in the clear only to this
        // machine (as the REST URL's), where no one in the middle reads it or plays the vendor.
        guard endpoint.secure || ClientAuthentication.isLoopback(endpoint.host) else {
            throw RelaySettings.InvalidSetting(
                description: "upstream \(url): ws:// would send the upstream key in the clear to \(endpoint.host); use wss:// (plain ws only to loopback)")
        }
        guard let market = named ?? Market(rawValue: endpoint.market.lowercased()) ?? vendors.market(ofPath: endpoint.path) else {
            throw RelaySettings.InvalidSetting(
                description: "upstream \(url): the URL's last path segment names the market, one of \(Self.marketList) (got \"\(endpoint.market)\")")
        }
        self.init(market: market, endpoint: endpoint, apiKey: apiKey, caFile: caFile)
    }

    static var marketList: String { Market.allCases.map(\.rawValue).joined(separator: ", ") }

    /// `wss://HOST/MARKET` for each market of a comma-separated list.
    static func markets(_ list: String, host: String, vendors: [WireVendor]) throws(RelaySettings.InvalidSetting) -> [MarketUpstream] {
        var upstreams: [MarketUpstream] = []
        for name in RelaySettings.splitList(list) {
            guard let market = Market(rawValue: name.lowercased()) else {
                throw RelaySettings.InvalidSetting(description: "markets: \"\(name)\" is not a market (one of \(marketList))")
            }
            try upstreams.append(MarketUpstream(url: "wss://\(host)/\(market)", market: market, vendors: vendors))
        }
        return upstreams
    }

    /// The file's `upstreams:` list (mappings swift-configuration does not read), `nil` when it has none.
    static func list(inFile file: String, environment: [String: String], vendors: [WireVendor]) throws(RelaySettings.InvalidSetting) -> [MarketUpstream]? {
        guard let text = try? String(contentsOfFile: file, encoding: .utf8),
            let document = (try? Yams.load(yaml: text)) as? [String: Any], let entries = document["upstreams"], !(entries is NSNull)
        else { return nil }
        guard let list = entries as? [Any] else {
            throw RelaySettings.InvalidSetting(description: "upstreams: a list of mappings with market, url, key or keyEnv, caFile")
        }
        var upstreams: [MarketUpstream] = []
        for (index, entry) in list.enumerated() {
            // A field given as null (`key: ~`) is not given.
            guard let fields = (entry as? [String: Any])?.filter({ !($0.value is NSNull) }) else {
                throw RelaySettings.InvalidSetting(description: "upstreams[\(index)]: a mapping with market, url, key or keyEnv, caFile")
            }
            let known: Set<String> = ["market", "url", "key", "keyEnv", "caFile"]
            if let unknown = fields.keys.first(where: { !known.contains($0) }) {
                throw RelaySettings.InvalidSetting(
                    description: "upstreams[\(index)]: unknown field \(unknown) (one of \(known.sorted().joined(separator: ", ")))")
            }
            var market: Market?
            if let name = fields["market"].map({ "\($0)" }) {
                guard let named = Market(rawValue: name.lowercased()) else {
                    throw RelaySettings.InvalidSetting(description: "upstreams[\(index)]: \"\(name)\" is not a market (one of \(marketList))")
                }
                market = named
            }
            let url = fields["url"].map { "\($0)" } ?? market.map { "wss://\(defaultHost)/\($0)" }
            guard let url else { throw RelaySettings.InvalidSetting(description: "upstreams[\(index)]: needs a market or a url") }
            if fields["key"] != nil, fields["keyEnv"] != nil {
                throw RelaySettings.InvalidSetting(description: "upstreams[\(index)]: key or keyEnv, not both")
            }
            var key = fields["key"].map { "\($0)" }
            if let variable = fields["keyEnv"].map({ "\($0)" }) {
                guard let value = environment[variable], !value.isEmpty else {
                    throw RelaySettings.InvalidSetting(description: "upstreams[\(index)]: keyEnv names \(variable), which is not set")
                }
                key = value
            }
            try upstreams.append(MarketUpstream(url: url, market: market, apiKey: key, caFile: fields["caFile"].map { "\($0)" }, vendors: vendors))
        }
        return upstreams
    }

    /// Joins the places in order of importance: a market already named is not taken again; the same market
    /// twice in one place is an error.
    static func merge(_ places: [[MarketUpstream]]) throws(RelaySettings.InvalidSetting) -> [MarketUpstream] {
        var merged: [MarketUpstream] = []
        for place in places {
            var seen: Set<Market> = []
            for upstream in place {
                guard seen.insert(upstream.market).inserted else {
                    throw RelaySettings.InvalidSetting(description: "upstream: the \(upstream.market) market is configured twice")
                }
                if !merged.contains(where: { $0.market == upstream.market }) { merged.append(upstream) }
            }
        }
        return merged
    }
}
