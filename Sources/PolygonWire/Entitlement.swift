/// Which topics a client may subscribe to: every topic, or those matching a list of patterns, where
/// `T.AAPL` allows that topic and `Q.*` allows every `Q` ticker and the `Q.*` wildcard itself. A
/// wildcard subscription is allowed only by its own wildcard pattern. Value type, `Sendable`.
public struct Entitlement: Sendable, Equatable {
    /// `nil`: everything.
    public let patterns: Set<Topic>?

    public static let everything = Entitlement(patterns: nil)

    public init(patterns: Set<Topic>?) {
        self.patterns = patterns
    }

    public func allows(_ topic: Topic) -> Bool {
        guard let patterns else { return true }
        return patterns.contains(topic) || (!topic.isWildcard && patterns.contains(.wildcard(topic.eventType)))
    }
}

/// Who a client authenticated as and what it may do on the Polygon WebSocket. Value type, `Sendable`.
public struct ClientGrant: Sendable, Equatable {
    /// The key's name: what logs and metrics show, never the key itself.
    public var name: String
    public var entitlement: Entitlement
    /// Connections this key may hold at once; `nil` for no limit.
    public var maxConnections: Int?

    public init(name: String, entitlement: Entitlement = .everything, maxConnections: Int? = nil) {
        self.name = name
        self.entitlement = entitlement
        self.maxConnections = maxConnections
    }
}
