import Crypto
import MarketCore
import MarketREST

/// One downstream client key and its rights. Value type, `Sendable`.
///
/// The key itself is kept only as its SHA-256 digest, so a configuration may hold `sha256:<hex>` and
/// no secret at all; a presented key is hashed and compared digest to digest in constant time.
/// Every restriction is opt-in: a key with no `topics` may subscribe to anything, with no
/// `maxConnections` may hold any number, and its portfolio right defaults to `write` — which is what a
/// key in a plain list of strings gets.
public struct ClientKey: Sendable, Equatable {
    public enum PortfolioRight: String, Sendable, Comparable, CaseIterable {
        case none, read, write

        public static func < (lhs: Self, rhs: Self) -> Bool {
            (allCases.firstIndex(of: lhs) ?? 0) < (allCases.firstIndex(of: rhs) ?? 0)
        }
    }

    /// What logs and metrics show for this key.
    public var name: String
    let digest: [UInt8]
    public var entitlement: Entitlement
    public var maxConnections: Int?
    public var portfolio: PortfolioRight
    /// Whether its connections' state events are merged (`conflate` in the key file).
    public var conflation: KeyConflation
    /// Whether it may use the REST gateway (`rest` in the key file; default yes).
    public var rest = true
    /// Its own REST rate (`restRate`, e.g. `60/min`), within the account's budget; `nil`: none of its own.
    public var restRate: RESTRate?
    /// Whether its connections' events carry their receive and send times (`timestamps`; default no).
    public var timestamps = false
    /// The events each of its connections' buffers holds (`buffer`; default the relay's
    /// `subscribers.buffer`): more for a client of a fast feed that must ride out a longer stall.
    public var buffer: Int?

    /// Why a key definition cannot be used, named for the person who wrote it.
    public struct Invalid: Error, Sendable, CustomStringConvertible {
        public var description: String
    }

    /// - Parameters:
    ///   - secret: the key, or `sha256:` and its SHA-256 digest in hex.
    ///   - topics: patterns (`T.AAPL`, `Q.*`), each for every market, or for one when written
    ///     `market:PATTERN` (`crypto:XQ.*`).
    ///   - markets: the markets the key may use (`nil`: all).
    public init(
        name: String, secret: String, topics: [String]? = nil, markets: [String]? = nil, maxConnections: Int? = nil,
        portfolio: PortfolioRight = .write, conflation: KeyConflation = .off
    ) throws(Invalid) {
        guard !name.isEmpty else { throw Invalid(description: "a client key needs a name") }
        let trimmed = String(secret.trimmingWhitespaceASCII())
        if trimmed.lowercased().hasPrefix("sha256:") {
            guard let digest = Self.hexBytes(trimmed.dropFirst("sha256:".count)), digest.count == 32 else {
                throw Invalid(description: "client key \(name): sha256: must be followed by 64 hex digits")
            }
            self.digest = digest
        } else {
            guard !trimmed.isEmpty else { throw Invalid(description: "client key \(name): the key is empty") }
            digest = Self.digest(of: trimmed)
        }
        var allowedMarkets: Set<Market>?
        if let markets {
            var set = Set<Market>()
            for text in markets {
                guard let market = Market(rawValue: text.trimmingWhitespaceASCII().lowercased()) else {
                    throw Invalid(
                        description: "client key \(name): \"\(text)\" is not a market (\(Market.allCases.map(\.rawValue).joined(separator: ", ")))")
                }
                set.insert(market)
            }
            allowedMarkets = set
        }
        if let topics {
            var patterns = Set<Topic>()
            var perMarket: [Market: Set<Topic>] = [:]
            for text in topics {
                var pattern = Substring(text.trimmingWhitespaceASCII())
                var market: Market?
                // `crypto:XQ.*`: a market name, then the pattern (a ticker's own `X:` has no dot before it).
                if let colon = pattern.firstIndex(of: ":"), !pattern[..<colon].contains("."),
                    let named = Market(rawValue: pattern[..<colon].lowercased())
                {
                    market = named
                    pattern = pattern[pattern.index(after: colon)...]
                }
                // As written: each market's protocol puts its own patterns in its form (Entitlement.inForm).
                guard let topic = Topic(parsing: pattern) else {
                    throw Invalid(description: "client key \(name): \"\(text)\" is not a topic (EV.TICKER, EV.* or market:EV.TICKER)")
                }
                if let market {
                    perMarket[market, default: []].insert(topic)
                } else {
                    patterns.insert(topic)
                }
            }
            // Only market-qualified patterns: the key's other markets get nothing.
            entitlement = Entitlement(patterns: patterns, markets: allowedMarkets, marketPatterns: perMarket)
        } else {
            entitlement = Entitlement(patterns: nil, markets: allowedMarkets)
        }
        if let maxConnections, maxConnections < 1 {
            throw Invalid(description: "client key \(name): maxConnections must be at least 1")
        }
        self.name = name
        self.maxConnections = maxConnections
        self.portfolio = portfolio
        self.conflation = conflation
    }

    /// What this key may do on the Polygon WebSocket.
    public var grant: ClientGrant {
        var grant = ClientGrant(name: name, entitlement: entitlement, maxConnections: maxConnections, conflation: conflation)
        grant.timestamps = timestamps
        grant.buffer = buffer
        grant.isConfiguredKey = true
        return grant
    }

    static func digest(of key: String) -> [UInt8] { Array(SHA256.hash(data: Array(key.utf8))) }

    static func hexBytes(_ text: Substring) -> [UInt8]? {
        let digits = Array(text.utf8)
        guard digits.count % 2 == 0 else { return nil }
        var bytes: [UInt8] = []
        for index in stride(from: 0, to: digits.count, by: 2) {
            guard let high = hexValue(digits[index]), let low = hexValue(digits[index + 1]) else { return nil }
            bytes.append(high << 4 | low)
        }
        return bytes
    }

    private static func hexValue(_ digit: UInt8) -> UInt8? {
        switch digit {
        case UInt8(ascii: "0")...UInt8(ascii: "9"): digit - UInt8(ascii: "0")
        case UInt8(ascii: "a")...UInt8(ascii: "f"): digit - UInt8(ascii: "a") + 10
        case UInt8(ascii: "A")...UInt8(ascii: "F"): digit - UInt8(ascii: "A") + 10
        default: nil
        }
    }
}
