import MarketCore

/// What a hub wants from its source: every ticker topic that has a subscriber, except those of a type
/// whose wildcard has one (the wildcard replaces them, and gives them back when its last subscriber
/// leaves). One of the hub's jobs as a plain value, confined to the hub.
///
/// Each step returns what it changed in the set, in order, for the hub's history; the set also gathers
/// what joined and left during one hub call (``takeChange()``), a topic that joined and left within it
/// counting as neither.
struct WantedSet {
    /// One step's changes, in order: each topic and whether it is now wanted.
    typealias Step = [(topic: Topic, wanted: Bool)]

    /// The topics wanted now.
    private(set) var topics: Set<Topic> = []
    /// Event type → its ticker topics that have subscribers (wanted unless the type's wildcard is).
    private var tickers: [String: Set<Topic>] = [:]
    /// Event types whose wildcard is wanted: it has a subscriber, or lingers.
    private var wildcards: Set<String> = []
    /// Event types whose wildcard lost its last subscriber and stays wanted until the instant: a client
    /// that takes and drops a wildcard again and again changes nothing upstream, in the history or in
    /// the type's tickers within it, instead of walking every ticker of the type each time.
    private(set) var lingering: [String: ContinuousClock.Instant] = [:]
    private var gathered = WantedTopicsChange()
    /// The source's last refusal of each wanted topic, until the topic is no longer wanted or its events
    /// arrive: told to each later holder, since the source is not asked again while the set does not
    /// change. At most one per wanted topic.
    private(set) var refusals: [Topic: Refusal] = [:]

    /// A source's refusal: its code and words.
    struct Refusal: Hashable {
        var code: Int
        var reason: String
    }

    /// The source refused `topics`: those wanted are remembered as refused.
    mutating func refused(_ topics: Set<Topic>, code: Int, reason: String) {
        for topic in topics where self.topics.contains(topic) { refusals[topic] = Refusal(code: code, reason: reason) }
    }

    /// The refusal a holder of `topic` is told of: the topic's own, or that of its type's wildcard, which
    /// it comes through; `nil`: none.
    func refusal(of topic: Topic) -> (refused: Topic, Refusal)? {
        if let own = refusals[topic] { return (topic, own) }
        guard !topic.isWildcard, covered(topic), let wildcard = refusals[.wildcard(topic.eventType)] else { return nil }
        return (.wildcard(topic.eventType), wildcard)
    }

    /// The source is lost: its next connection asks for every wanted topic again.
    mutating func forgetRefusals() {
        refusals = [:]
    }

    /// Events arrived: their topics, and their types' wildcards they came through, are served now.
    /// (Paid on every publish while any refusal stands: a hash lookup an event.)
    mutating func arrived(_ events: [MarketEvent]) {
        for event in events {
            refusals[event.topic] = nil
            if wildcards.contains(event.eventType) { refusals[.wildcard(event.eventType)] = nil }
        }
    }

    /// A ticker topic got its first subscriber.
    mutating func tickerSubscribed(_ topic: Topic) -> Step {
        tickers[topic.eventType, default: []].insert(topic)
        var step: Step = []
        if !covered(topic) { add(topic, &step) }
        return step
    }

    /// Whether the type's wildcard is wanted in the topic's place. Never a derived bar's (`AM.AAPL@5m`):
    /// the wildcard is the vendor's events, the derived topic the relay's own.
    private func covered(_ topic: Topic) -> Bool {
        wildcards.contains(topic.eventType) && !topic.isDerived
    }

    /// A ticker topic lost its last subscriber.
    mutating func tickerUnsubscribed(_ topic: Topic) -> Step {
        tickers[topic.eventType]?.remove(topic)
        if tickers[topic.eventType]?.isEmpty == true { tickers[topic.eventType] = nil }
        var step: Step = []
        if !covered(topic) { remove(topic, &step) }
        return step
    }

    /// The wildcard of a type got its first subscriber: it replaces the type's tickers (nothing changes
    /// while it lingers: it is wanted still).
    mutating func wildcardSubscribed(_ eventType: String) -> Step {
        if lingering.removeValue(forKey: eventType) != nil { return [] }
        wildcards.insert(eventType)
        var step: Step = []
        add(.wildcard(eventType), &step)
        for topic in tickers[eventType] ?? [] where !topic.isDerived { remove(topic, &step) }
        return step
    }

    /// The wildcard of a type lost its last subscriber and stays wanted until `until`
    /// (``lingerEnded(by:)`` names it then, unless a subscriber took it again).
    mutating func linger(_ eventType: String, until: ContinuousClock.Instant) {
        guard wildcards.contains(eventType) else { return }
        lingering[eventType] = until
    }

    /// The types whose wildcard's linger ended by `now`, no longer lingering (each still wanted until
    /// ``wildcardUnsubscribed(_:)``).
    mutating func lingerEnded(by now: ContinuousClock.Instant) -> [String] {
        let ended = lingering.filter { $0.value <= now }.keys.sorted()
        for type in ended { lingering[type] = nil }
        return ended
    }

    /// Whether the type's wildcard lingers (wanted, its events coming, with no subscriber).
    func lingers(_ eventType: String) -> Bool { lingering[eventType] != nil }

    /// When the first linger ends (`nil`: none lingers).
    var nextLingerEnd: ContinuousClock.Instant? { lingering.values.min() }

    /// The wildcard of a type lost its last subscriber (or its linger ended): the type's tickers are
    /// wanted again.
    mutating func wildcardUnsubscribed(_ eventType: String) -> Step {
        lingering[eventType] = nil
        wildcards.remove(eventType)
        var step: Step = []
        remove(.wildcard(eventType), &step)
        for topic in tickers[eventType] ?? [] where !topic.isDerived { add(topic, &step) }
        return step
    }

    /// What joined and left since the last call (`nil`: nothing), and starts gathering afresh.
    mutating func takeChange() -> WantedTopicsChange? {
        guard !gathered.isEmpty else { return nil }
        defer { gathered = WantedTopicsChange() }
        return gathered
    }

    private mutating func add(_ topic: Topic, _ step: inout Step) {
        guard topics.insert(topic).inserted else { return }
        step.append((topic, true))
        if gathered.removed.remove(topic) == nil { gathered.added.insert(topic) }
    }

    private mutating func remove(_ topic: Topic, _ step: inout Step) {
        guard topics.remove(topic) != nil else { return }
        refusals[topic] = nil
        step.append((topic, false))
        if gathered.added.remove(topic) == nil { gathered.removed.insert(topic) }
    }
}

/// What joined and what left the hub's upstream topic set in one hub call. Value type, `Sendable`.
public struct WantedTopicsChange: Sendable, Equatable {
    public var added: Set<Topic> = []
    public var removed: Set<Topic> = []

    public init(added: Set<Topic> = [], removed: Set<Topic> = []) {
        self.added = added
        self.removed = removed
    }

    public var isEmpty: Bool { added.isEmpty && removed.isEmpty }

    /// Applies the change to a set.
    public func apply(to topics: inout Set<Topic>) {
        topics.subtract(removed)
        topics.formUnion(added)
    }
}
