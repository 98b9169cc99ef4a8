import MarketCore

/// Where the relay's events come from, as the downstream server reports it on `/healthz` and
/// `/metrics`: a single node's upstream connection, or a cluster node's view of the cluster. Every
/// ``MarketSource`` is one; the server reads the feed only through this, so it does not depend on the
/// upstream client or the cluster modules.
public protocol FeedStatus: Sendable {
    /// The feed's part of `/healthz`, and whether the relay can serve now.
    func report() async -> FeedReport
    /// A topic's last event when this node's hub has none (a cluster's shared last values).
    func lastValue(for topic: Topic) async -> LastValueLookup
}

extension FeedStatus {
    public func lastValue(for topic: Topic) async -> LastValueLookup { .none }
}

/// What a feed's own store of last values said of a topic.
public enum LastValueLookup: Sendable {
    case found(MarketEvent)
    case none
    /// Not looked up: as many lookups as the feed allows at once are under way (answered `503`).
    case busy
}

/// A snapshot of the feed for `/healthz`. Value type, `Sendable`.
public struct FeedReport: Sendable {
    public var healthy: Bool
    public var upstream: UpstreamReport
    public var cluster: ClusterReport?
    /// Since the upstream's last frame or pong, when this node holds the upstream connection.
    public var lastUpstreamMessageAge: Duration?

    public init(healthy: Bool, upstream: UpstreamReport, cluster: ClusterReport? = nil, lastUpstreamMessageAge: Duration? = nil) {
        self.healthy = healthy
        self.upstream = upstream
        self.cluster = cluster
        self.lastUpstreamMessageAge = lastUpstreamMessageAge
    }
}

/// The upstream connection as `/healthz` shows it.
public struct UpstreamReport: Sendable, Encodable {
    public var state: String
    public var detail: String?
    public var url: String
    public var subscribedTopics: Int
    public var lastMessageAgeMs: Int64?
    public var messagesReceived: Int
    public var eventsReceived: Int
    public var malformedMessages: Int
    public var oversizedMessages: Int
    public var reconnects: [String: Int]
    public var lastError: String?
    /// Connected, topics subscribed, the market open, and no event for the silence setting.
    public var silent: Bool

    public init(
        state: String, detail: String? = nil, url: String, subscribedTopics: Int = 0, lastMessageAgeMs: Int64? = nil,
        messagesReceived: Int = 0, eventsReceived: Int = 0, malformedMessages: Int = 0, oversizedMessages: Int = 0,
        reconnects: [String: Int] = [:], lastError: String? = nil, silent: Bool = false
    ) {
        self.silent = silent
        self.state = state
        self.detail = detail
        self.url = url
        self.subscribedTopics = subscribedTopics
        self.lastMessageAgeMs = lastMessageAgeMs
        self.messagesReceived = messagesReceived
        self.eventsReceived = eventsReceived
        self.malformedMessages = malformedMessages
        self.oversizedMessages = oversizedMessages
        self.reconnects = reconnects
        self.lastError = lastError
    }
}

/// A cluster node as `/healthz` shows it.
public struct ClusterReport: Sendable, Equatable, Encodable {
    /// `leader` or `follower`.
    public var role: String
    public var node: String
    public var leader: String?
    /// The NATS connection: `connecting`, `connected`, `reconnecting` or `closed`.
    public var nats: String
    /// Nodes heard from within the interest TTL.
    public var liveNodes: [String]
    /// NATS event subjects this node subscribes to.
    public var subscriptions: Int

    public init(role: String, node: String, leader: String?, nats: String, liveNodes: [String], subscriptions: Int) {
        self.role = role
        self.node = node
        self.leader = leader
        self.nats = nats
        self.liveNodes = liveNodes
        self.subscriptions = subscriptions
    }
}
