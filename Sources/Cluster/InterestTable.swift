import PolygonWire

/// What every live node of the cluster wants, and the union the leader subscribes upstream. Pure,
/// value type, `Sendable`.
///
/// Each node's set counts until it is replaced or until `ttl` passes without word from the node (a
/// dead node stops counting). The union follows the hub's rules: a topic is wanted while any node
/// wants it, and a ticker topic is left out while the wildcard of its event type is wanted.
public struct InterestTable: Sendable {
    public let ttl: Duration
    private var nodes: [String: (topics: Set<Topic>, seen: ContinuousClock.Instant)] = [:]

    public init(ttl: Duration) {
        self.ttl = ttl
    }

    /// Records a node's whole set. Returns whether the union changed.
    @discardableResult
    public mutating func update(node: String, topics: Set<Topic>, at now: ContinuousClock.Instant) -> Bool {
        let before = union
        nodes[node] = (topics, now)
        return union != before
    }

    /// Forgets nodes not heard from within `ttl`. Returns whether the union changed.
    @discardableResult
    public mutating func expire(at now: ContinuousClock.Instant) -> Bool {
        let before = union
        nodes = nodes.filter { now - $0.value.seen < ttl }
        return union != before
    }

    /// The nodes that count now.
    public var liveNodes: [String] { nodes.keys.sorted() }

    /// The topics the upstream should send.
    public var union: Set<Topic> {
        var all = Set<Topic>()
        for entry in nodes.values { all.formUnion(entry.topics) }
        let wildcardTypes = Set(all.filter(\.isWildcard).map(\.eventType))
        return all.filter { $0.isWildcard || !wildcardTypes.contains($0.eventType) }
    }

    /// The wire form of a node's set: its topics, comma-separated (Polygon's `params` form).
    public static func encode(_ topics: Set<Topic>) -> String { Topic.joinList(topics.sorted()) }

    public static func decode(_ text: String) -> Set<Topic> { Set(Topic.parseList(text).topics) }
}
