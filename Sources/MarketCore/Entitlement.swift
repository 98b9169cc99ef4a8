import Foundation
/// Which markets and topics a client may use: every topic, or those matching a list of patterns, where
/// `T.AAPL` allows that topic and `Q.*` allows every `Q` ticker and the `Q.*` wildcard itself. A
/// wildcard subscription is allowed only by its own wildcard pattern. Patterns may be given per market
/// (`crypto:XQ.*`); a market with patterns of its own uses only those, any other market the unqualified
/// patterns. Value type, `Sendable`.
public struct Entitlement: Sendable, Hashable {
    /// `nil`: everything (on markets without patterns of their own).
    public let patterns: Set<Topic>?
    /// The markets the key may use; `nil`: all.
    public let markets: Set<Market>?
    /// Patterns that apply on one market only, instead of ``patterns``.
    public let marketPatterns: [Market: Set<Topic>]

    public static let everything = Entitlement(patterns: nil)

    public init(patterns: Set<Topic>?, markets: Set<Market>? = nil, marketPatterns: [Market: Set<Topic>] = [:]) {
        self.patterns = patterns
        self.markets = markets
        self.marketPatterns = marketPatterns
    }

    /// Whether the key may connect to `market` at all.
    public func allows(market: Market) -> Bool {
        markets?.contains(market) ?? true
    }

    /// Whether every topic of `market` may be read: the market is allowed and no pattern narrows it.
    public func allowsWhole(market: Market) -> Bool {
        guard allows(market: market) else { return false }
        return marketPatterns[market] == nil && patterns == nil
    }

    /// Whether `topic` may be subscribed on `market` (`nil`: the unqualified patterns).
    public func allows(_ topic: Topic, in market: Market? = nil) -> Bool {
        if let market {
            guard allows(market: market) else { return false }
            if let own = marketPatterns[market] { return Self.matches(topic, own) }
        }
        guard let patterns else { return true }
        return Self.matches(topic, patterns)
    }

    /// Whether the trades a derived topic is built from (``BarRules/sourceTopic(of:)``) may be read too:
    /// a bar of one trade (`AM.AAPL@1t`) is the trade itself. `true` for a topic that is not derived.
    public func allowsTrades(behind topic: Topic, rules: (any BarRules)?, in market: Market?) -> Bool {
        guard topic.isDerived, let source = rules?.sourceTopic(of: topic) else { return true }
        return allows(source, in: market)
    }

    /// The same rights with `market`'s own patterns (`crypto:XQ.BTC-USD`) written as that market's
    /// protocol writes its topics (`XQ.X:BTC-USD` in Polygon's): the key file names tickers as people
    /// write them, a session compares topics in its protocol's form.
    public func inForm(of market: Market, _ form: (Topic) -> Topic) -> Entitlement {
        guard let own = marketPatterns[market] else { return self }
        var perMarket = marketPatterns
        perMarket[market] = Set(own.map(form))
        return Entitlement(patterns: patterns, markets: markets, marketPatterns: perMarket)
    }

    private static func matches(_ topic: Topic, _ patterns: Set<Topic>) -> Bool {
        patterns.contains(topic) || (!topic.isWildcard && patterns.contains(.wildcard(topic.eventType)))
    }
}

/// Who a client authenticated as and what it may do on the Polygon WebSocket. Value type, `Sendable`.
public struct ClientGrant: Sendable, Equatable {
    /// The key's name: what logs and metrics show, never the key itself.
    public var name: String
    public var entitlement: Entitlement
    /// Connections this key may hold at once; `nil` for no limit.
    public var maxConnections: Int?
    /// How this key's connections get state events merged (the key file's `conflate`).
    public var conflation: KeyConflation
    /// Whether its connections' events carry their receive and send times (the key file's
    /// `timestamps`; ``EventTimes``).
    public var timestamps = false
    /// The events each of its connections' buffers holds (the key file's `buffer`); `nil`: the relay's.
    public var buffer: Int?
    /// Whether it is a configured key's (``ClientKey``), whose connections share the key's budgets
    /// (replays, tape reads); not for any key taken on loopback without keys configured: everyone there
    /// is one client.
    public var isConfiguredKey = false

    public init(name: String, entitlement: Entitlement = .everything, maxConnections: Int? = nil, conflation: KeyConflation = .off) {
        self.name = name
        self.entitlement = entitlement
        self.maxConnections = maxConnections
        self.conflation = conflation
    }
}

/// A key's conflation: never (its lagging connections drop events, told `lagging`), only while a
/// connection lags (its state events are merged before any is dropped), or always at an interval.
/// Value type, `Sendable`.
public enum KeyConflation: Sendable, Equatable {
    case off
    case whileLagging
    case interval(Duration)

    /// Reads the key file's value: `off`, `lagging`, or an interval such as `250ms` or `1s`.
    public init?(parsing text: String) {
        let text = text.trimmingCharacters(in: .whitespaces).lowercased()
        switch text {
        case "off", "false", "no": self = .off
        case "lagging", "on-lag", "onlag": self = .whileLagging
        default:
            if text.hasSuffix("ms"), let value = Int(text.dropLast(2)), (1...60_000).contains(value) {
                self = .interval(.milliseconds(value))
            } else if text.hasSuffix("s"), let value = Int(text.dropLast()), (1...60).contains(value) {
                self = .interval(.seconds(value))
            } else {
                return nil
            }
        }
    }
}
