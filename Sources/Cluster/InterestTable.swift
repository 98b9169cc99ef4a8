import MarketCore

/// What every live node of the cluster wants, and the union the leader subscribes upstream. Pure,
/// value type, `Sendable`.
///
/// Each node's set counts until it is replaced or until `ttl` passes without word from the node (a
/// dead node stops counting). The union follows the hub's rules: a topic is wanted while any node
/// wants it, and a ticker topic is left out while the wildcard of its event type is wanted. The union is
/// kept incrementally (each topic counts the nodes that want it): a node's new set costs what changed
/// in it, never a walk over every node's topics.
///
/// The union holds at most ``maxTopics`` distinct topics (the upstream is asked for no more, whoever
/// publishes interest): a node's topics new to the union past it are not counted and are named in
/// ``Change/refused`` once (the leader tells every node's clients of them), and they are asked again
/// at each publish of the node's set while the union has room.
public struct InterestTable: Sendable {
    public let ttl: Duration
    /// The most topics one node's set may hold; a set past it is refused whole (the node's previous set
    /// stays) and ``receive(_:from:at:)`` says so.
    public let maxTopicsPerNode: Int
    /// The most distinct topics the union holds (ticker topics a wildcard covers count too, as in a
    /// relay's own topic ledger).
    public let maxTopics: Int
    /// Each live node: the topics of its set that count, those of it that did not fit (named once, and
    /// asked again while there is room), and when it was heard. Its set is the two together.
    private struct Node {
        var topics: Set<Topic> = []
        var refused: Set<Topic> = []
        var seen: ContinuousClock.Instant

        func isSet(_ asked: Set<Topic>) -> Bool {
            asked.count == topics.count + refused.count && topics.isSubset(of: asked) && refused.isSubset(of: asked)
        }
    }
    private var nodes: [String: Node] = [:]
    /// How many live nodes want each topic.
    private var wanting: [Topic: Int] = [:]
    /// Event type → its ticker topics some node wants (in the union unless the type's wildcard is).
    private var tickers: [String: Set<Topic>] = [:]
    /// The topics the upstream should send.
    public private(set) var union: Set<Topic> = []
    /// Sets arriving in parts, by node: the generation being gathered and its topics so far.
    private var gathering: [String: (generation: UInt64, next: Int, topics: Set<Topic>, seen: ContinuousClock.Instant)] = [:]

    /// The most nodes whose sets count (or are being gathered); a new node's set past it is refused, so
    /// whoever may publish on the interest subjects cannot grow the table and the upstream set by
    /// inventing nodes.
    public let maxNodes: Int

    public init(ttl: Duration, maxTopicsPerNode: Int = 100_000, maxTopics: Int = 100_000, maxNodes: Int = 64) {
        self.ttl = ttl
        self.maxTopicsPerNode = maxTopicsPerNode
        self.maxTopics = maxTopics
        self.maxNodes = maxNodes
    }

    /// What a node's set changed: whether the union changed, and its topics that did not fit in it and
    /// were not named before (since the node's set last held them, or since ``nameRefusalsAgain()``).
    public struct Change: Sendable, Equatable {
        public var changed: Bool
        public var refused: Set<Topic>

        public init(changed: Bool, refused: Set<Topic> = []) {
            self.changed = changed
            self.refused = refused
        }
    }

    // MARK: the wire form, in parts

    /// One message of a node's interest: generation `generation` (new with every publish), part
    /// `part` of `parts` (1-based), and its topics. A set is as many parts as it takes to keep each
    /// message far below NATS's payload limit (1 MB by default).
    public struct Part: Sendable, Equatable {
        public var generation: UInt64
        public var part: Int
        public var parts: Int
        public var topics: [Topic]

        /// Topics per message: at most 45 bytes each (a 40-byte ticker), so under 100 KB.
        public static let topicsPerPart = 2_000
        /// More parts than this is not a set a node sends.
        public static let maxParts = 1_000
        /// More bytes than one part a node sends holds (``topicsPerPart`` topics of at most 45 bytes
        /// each, and the header), with room to spare: a larger message is refused before it is read.
        public static let maxBytes = topicsPerPart * 64 + 64

        public init(generation: UInt64, part: Int, parts: Int, topics: [Topic]) {
            self.generation = generation
            self.part = part
            self.parts = parts
            self.topics = topics
        }

        /// `<generation> <part>/<parts>` on the first line, then the topics comma-separated.
        public var text: String { "\(generation) \(part)/\(parts)\n" + Topic.joinList(topics) }

        /// The parts of one publish of `topics`.
        public static func split(_ topics: [Topic], generation: UInt64) -> [Part] {
            let chunks = stride(from: 0, to: max(topics.count, 1), by: topicsPerPart).map {
                Array(topics[min($0, topics.count)..<min($0 + topicsPerPart, topics.count)])
            }
            return chunks.enumerated().map { Part(generation: generation, part: $0.offset + 1, parts: chunks.count, topics: $0.element) }
        }

        /// Reads a part's header; the topics are returned as text, unparsed (with the entries that are
        /// not topics), for the caller's checks. `nil` for a message that is not a part.
        public static func parse(_ text: String) -> (generation: UInt64, part: Int, parts: Int, topics: Substring)? {
            guard let newline = text.firstIndex(of: "\n") else { return nil }
            let header = text[..<newline].split(separator: " ")
            guard header.count == 2, let generation = UInt64(header[0]) else { return nil }
            let numbers = header[1].split(separator: "/")
            guard numbers.count == 2, let part = Int(numbers[0]), let parts = Int(numbers[1]), parts >= 1, parts <= maxParts,
                part >= 1, part <= parts
            else { return nil }
            return (generation, part, parts, text[text.index(after: newline)...])
        }
    }

    /// What became of a part.
    public enum Outcome: Sendable, Equatable {
        /// Kept; the set is not complete yet.
        case gathering
        /// The set is complete and now counts (less what did not fit): what it changed.
        case complete(Change)
        /// Out of sequence (a part was lost): the set is dropped until the node's next publish.
        case outOfSequence
        /// Past ``maxTopicsPerNode``: the set is dropped, the node's previous set stays.
        case tooManyTopics
        /// A node the table does not know while it holds ``maxNodes``: refused.
        case tooManyNodes
    }

    /// Records one part of a node's set. Parts of one generation arrive in order (NATS keeps one
    /// publisher's order); a part of a new generation starts over. Any part keeps the node alive.
    public mutating func receive(_ part: Part, from node: String, at now: ContinuousClock.Instant) -> Outcome {
        if nodes[node] == nil, gathering[node] == nil, nodes.count + gathering.keys.filter({ nodes[$0] == nil }).count >= maxNodes {
            return .tooManyNodes
        }
        nodes[node]?.seen = now
        var current = gathering[node] ?? (part.generation, 1, [], now)
        if current.generation != part.generation { current = (part.generation, 1, [], now) }
        current.seen = now
        guard part.part == current.next else {
            gathering[node] = nil
            return .outOfSequence
        }
        current.topics.formUnion(part.topics)
        guard current.topics.count <= maxTopicsPerNode else {
            gathering[node] = nil
            return .tooManyTopics
        }
        guard part.part == part.parts else {
            current.next += 1
            gathering[node] = current
            return .gathering
        }
        gathering[node] = nil
        return .complete(update(node: node, topics: current.topics, at: now))
    }

    /// Records a node's whole set: its topics gone from it are let go first, then its new ones are
    /// counted in order while the union has room.
    @discardableResult
    public mutating func update(node: String, topics: Set<Topic>, at now: ContinuousClock.Instant) -> Change {
        var entry = nodes[node] ?? Node(seen: now)
        entry.seen = now
        // The same set again is asked again only while some of it waits for room the union now has.
        guard !entry.isSet(topics) || (!entry.refused.isEmpty && wanting.count < maxTopics) else {
            nodes[node] = entry
            return Change(changed: false)
        }
        var changed = false
        let gone = entry.topics.subtracting(topics)
        entry.topics.subtract(gone)
        for topic in gone { changed = release(topic) || changed }
        var refused: Set<Topic> = []
        for topic in topics.subtracting(entry.topics).sorted() {
            guard wanting[topic] != nil || wanting.count < maxTopics else {
                refused.insert(topic)
                continue
            }
            entry.topics.insert(topic)
            changed = want(topic) || changed
        }
        let named = refused.subtracting(entry.refused)
        entry.refused = refused
        nodes[node] = entry
        return Change(changed: changed, refused: named)
    }

    /// Every node's topics that did not fit are named again at its next publish (a new leader speaks
    /// for the table: what it refused while it followed was never told).
    public mutating func nameRefusalsAgain() {
        for node in nodes.keys { nodes[node]?.refused = [] }
    }

    /// Forgets nodes not heard from within `ttl`. Returns whether the union changed.
    @discardableResult
    public mutating func expire(at now: ContinuousClock.Instant) -> Bool {
        expireNodes(at: now).changed
    }

    /// Forgets nodes not heard from within `ttl`: whether the union changed, and the nodes whose
    /// forgetting changed it (their clients' topics may have gone from the upstream subscription).
    public mutating func expireNodes(at now: ContinuousClock.Instant) -> (changed: Bool, nodes: [String]) {
        gathering = gathering.filter { now - $0.value.seen < ttl }
        var changed = false
        var forgotten: [String] = []
        for (node, entry) in nodes where now - entry.seen >= ttl {
            nodes[node] = nil
            var released = false
            for topic in entry.topics { released = release(topic) || released }
            if released { forgotten.append(node) }
            changed = changed || released
        }
        return (changed, forgotten.sorted())
    }

    /// One more node wants `topic`; whether the union changed.
    private mutating func want(_ topic: Topic) -> Bool {
        wanting[topic, default: 0] += 1
        guard wanting[topic] == 1 else { return false }
        if topic.isWildcard {
            union.insert(topic)
            for ticker in tickers[topic.eventType] ?? [] { union.remove(ticker) }
            return true
        }
        tickers[topic.eventType, default: []].insert(topic)
        guard wanting[.wildcard(topic.eventType)] == nil else { return false }
        union.insert(topic)
        return true
    }

    /// One node fewer wants `topic`; whether the union changed.
    private mutating func release(_ topic: Topic) -> Bool {
        guard let count = wanting[topic] else { return false }
        guard count == 1 else {
            wanting[topic] = count - 1
            return false
        }
        wanting[topic] = nil
        if topic.isWildcard {
            union.remove(topic)
            for ticker in tickers[topic.eventType] ?? [] { union.insert(ticker) }
            return true
        }
        tickers[topic.eventType]?.remove(topic)
        if tickers[topic.eventType]?.isEmpty == true { tickers[topic.eventType] = nil }
        return union.remove(topic) != nil
    }

    /// The nodes that count now.
    public var liveNodes: [String] { nodes.keys.sorted() }

    /// The wire form of a node's set: its topics, comma-separated (Polygon's `params` form).
    public static func encode(_ topics: Set<Topic>) -> String { Topic.joinList(topics.sorted()) }

    public static func decode(_ text: String) -> Set<Topic> { Set(Topic.parseList(text).topics) }
}
