import CoreMetrics
import Logging
import MarketCore
import Synchronization

/// Fans market events out to subscribers, each filtered to its own topics.
///
/// An actor: every mutation of the routing tables happens on it. It never awaits a subscriber: each
/// subscriber has its own bounded `AsyncStream` (`.bufferingOldest(1000)`, and at most its own
/// ``HubSubscription/bufferLimit`` of queued events, 1,000 by default), and a slow one fills its own
/// buffer and loses its own events, counted, never anybody else's. What happens then is the ``SlowConsumerPolicy``.
///
/// The hub reference-counts what its subscribers want and reports changes of the *upstream* set through
/// `onWantedTopicsChange` (what joined it and what left it): a topic is wanted from its first subscriber
/// until its last one leaves, and a ticker topic is left out while the wildcard of its event type is
/// wanted (the wildcard already brings its events, and asking for both would make the upstream send
/// them twice). The set is kept incrementally: a subscription change costs its own topics (a wildcard
/// joining or leaving, the tickers of its type), never a walk over every topic.
///
/// The hot path (``publish(_:)``) costs one dictionary lookup per event plus one per wildcard type, a bit
/// set per matching subscriber, and per subscriber one delivery per upstream message (per 64 events of
/// it): the message's events are held once and each subscriber's delivery names its share with a bit
/// mask (``HubDelivery``), so nothing is copied per subscriber. A delivery joins the subscriber's newest
/// stream element while its reader has not taken it (``DeliveryBatch``), so the stream sees one `yield`
/// per read, not per message.
public actor MarketDataHub {
    /// How many events a subscriber's buffer holds unless the hub is given another bound
    /// (`subscribers.buffer`).
    public static let defaultBufferLimit = 1000
    /// The bounds a hub's buffer limit is kept within: never below the default (a replay at `max` paces
    /// itself by 80% of it less two of its batches, and a publish of 256 events fits several times),
    /// and past 1,000,000 a stalled client would pin that many events.
    public static let bufferLimitRange = defaultBufferLimit...1_000_000
    /// The elements a subscriber's `AsyncStream` holds (`.bufferingOldest(1000)`). An element is a
    /// ``DeliveryBatch`` that grows while its reader has not taken it, so a stream holds one or two of
    /// them; this bound is a backstop, the events bound is ``bufferLimit``.
    public static let streamElements = 1000
    /// How many events a subscriber's buffer holds before newer events are dropped for it (or, with the
    /// `disconnect` policy, it is disconnected), unless it is given its own (``setBufferLimit(_:for:)``):
    /// ``defaultBufferLimit`` unless configured.
    public nonisolated let bufferLimit: Int

    /// The protocol of the market this hub carries: its notices are rendered in its words.
    public nonisolated let wire: any WireProtocol
    /// Its state event types (what conflation may merge), asked of the protocol once.
    let stateEventTypes: Set<String>
    public let policy: SlowConsumerPolicy
    public nonisolated let snapshotOnSubscribe: Bool
    /// Event types whose last event is no snapshot: one-off events a new subscriber would take for
    /// new ones (Alpaca's corrections `c` and cancel errors `x`) and changes that mean nothing alone
    /// (Alpaca's order book updates `o`).
    public let snapshotless: Set<String>
    /// Event types whose topics are folded into a state a new subscriber gets instead of the last
    /// event (order books built from increments; ``TopicFold``), and how.
    public nonisolated let folding: TopicFolding?
    /// Whether a topic's last event is kept after nobody wants it any more. A single relay keeps it (its
    /// upstream is the only source); a cluster node forgets it, because once unwanted nothing keeps it
    /// fresh, and the cluster's own last-value store answers the next subscriber instead (``seed(_:)``).
    public let keepsUnwantedLastValues: Bool
    /// Whether a topic's last event is kept at all (snapshots, `/v1/last`): not for a market whose
    /// events are no state and that gives no snapshot (news without `news.snapshot`), whose last
    /// items would otherwise stay in memory, one per symbol ever named.
    public let keepsLastValues: Bool
    var subscribers: [SubscriberID: Subscriber] = [:]
    var entries: [Topic: TopicEntry] = [:]
    /// The topics of ``entries`` by event type: a wildcard's last values are its type's, not a walk of
    /// every entry of the market.
    var entriesOfType: [String: Set<Topic>] = [:]
    /// How many entries the table keeps (``trimUnwantedLastValues()``).
    var lastValueBound: LastValueBound
    /// The entries whose last event publishes set, still sharing their messages' bytes, and what those
    /// messages hold (the storages counted once per run of events sharing one). They are given bytes of
    /// their own once ``sharedLastValuePublishes`` publishes or ``sharedLastValueBytes`` of messages have
    /// gone by, or when read: a topic's events of several publishes cost one copy, not one each, and a
    /// last value holds at most those publishes' messages alive. (The list keeps its capacity: a publish
    /// allocates nothing for it.)
    private var sharedLastValues: [TopicEntry] = []
    private var sharedSince = (publishes: 0, bytes: 0, storage: UnsafeMutableRawPointer?.none)
    static let sharedLastValuePublishes = 8
    static let sharedLastValueBytes = 4 << 20
    /// Recent events and the positions of new ones (`nil`: no history, no positions).
    var history: EventHistory?
    let historyLimits: HistoryLimits?
    /// Whether positions come written in the events (a cluster node: the leader's) instead of from here.
    let adoptsPositions: Bool
    nonisolated let epochBox: Mutex<String?>
    /// The epoch of this hub's positions (`nil` without a history). Any thread.
    public nonisolated var epoch: String? { epochBox.withLock { $0 } }
    /// Subscribers whose state events are conflated, and the task that flushes them.
    var conflating: Set<SubscriberID> = []
    var conflationTicker: Task<Void, Never>?
    var resumeCounts = ResumeCounts()
    /// Each client key's share of replays and tape reads (``KeyReplays``), by key name.
    var keyReplays: [String: KeyReplays] = [:]
    let metrics: HubHistoryMetrics
    /// Event type → subscribers of its wildcard.
    var wildcards: [String: HolderList<Subscriber>] = [:] { didSet { wildcardsChanged &+= 1 } }
    /// Counts changes of `wildcards` (a publish's lookups of it are good until it changes: a subscriber
    /// evicted in the middle of a publish leaves it).
    private var wildcardsChanged = 0
    /// What this hub wants from its source; what a call changed in it is reported at the call's end.
    var wanted = WantedSet()
    /// How long a wildcard stays wanted after its last subscriber left, and the task that ends lingers.
    let wildcardLinger: Duration
    var lingerTimer: Task<Void, Never>?
    var published = 0
    /// Events dropped since start for subscribers that did not keep up (full buffers and evictions).
    public internal(set) var droppedTotal = 0
    var laggingCount = 0
    /// The upstream's outages: the one in progress, and when the last event arrived.
    var outages = OutageLedger()
    /// What the source says of itself to every subscriber (a replay's notice), rendered: told to each
    /// subscriber as it takes its first topics, until the source says something else.
    var sourceNotice: MarketEvent?
    /// Gap fill: told of each recovery (its window and the topics held by name); each such topic's
    /// outages not filled yet, and those still watched for their first live event after the outage.
    var recoveryHandler: (@Sendable (GapFillRequest) -> Void)?
    /// Gap fill's outages, held recovered events and counts (``GapLedger``).
    var gapLedger: GapLedger
    /// Told every published event with its position (the tape's recorder), if any.
    var tap: (any EventTap)?
    /// Where events older than the history's memory are kept (the tape), if anywhere.
    var archive: (any EventArchive)?
    /// When this node began the current epoch it adopted (a cluster's leadership term), Unix ms: a
    /// resume from the former term is told nothing was received from that term's end until then.
    var epochAdoptedAt: Int64?
    /// The epoch this node adopted before the current one (the former leadership term): the one a
    /// resume across a failover is answered from the archive for.
    var previousEpoch: String?
    /// What the lease last said the leader had stamped, of an epoch this node may not have begun yet.
    var leaderMark: (epoch: String, through: UInt64, until: Int64)?
    /// The epoch whose history was said, once, to hold a forged leap.
    var leaderMarkWarned: String?

    private let onWantedTopicsChange: @Sendable (WantedTopicsChange) -> Void
    let logger: Logger
    /// Warnings about subscribers, a line per reason per 10 s.
    let warnings = ThrottledLog()
    private let subscribersGauge: Gauge
    let laggingGauge: Gauge
    private let publishedCounter: Counter
    /// Whole states (order books) a cluster node took from its store.
    let foldsAdopted: Counter
    let droppedFull: Counter
    let droppedEvicted: Counter

    /// - Parameters:
    ///   - wire: the market's protocol (it renders the hub's notices).
    ///   - policy: what to do with a subscriber whose buffer is full.
    ///   - bufferLimit: the events a subscriber's buffer holds (kept within ``bufferLimitRange``).
    ///   - snapshotOnSubscribe: whether a new subscription to a ticker topic immediately gets that
    ///     topic's last event.
    ///   - snapshotless: event types that never get one.
    ///   - folding: event types whose topics are kept as a folded state (an order book), given as the
    ///     snapshot instead of the last event.
    ///   - wildcardLinger: how long a wildcard stays wanted after its last subscriber left (none: let go
    ///     at once), so taking and dropping it again and again costs nothing past the first time.
    ///   - onWantedTopicsChange: called, on the hub, with what joined and left the upstream topic set
    ///     each time it changes. It must not block (the upstream client queues the change and returns).
    public init(
        wire: some WireProtocol,
        policy: SlowConsumerPolicy = .drop,
        bufferLimit: Int = MarketDataHub.defaultBufferLimit,
        snapshotOnSubscribe: Bool = true,
        snapshotless: Set<String> = [],
        folding: TopicFolding? = nil,
        keepsUnwantedLastValues: Bool = true,
        keepsLastValues: Bool = true,
        topicsKept: Int = MarketDataHub.defaultTopicsKept,
        history: HistoryLimits? = HistoryLimits(),
        adoptsPositions: Bool = false,
        wildcardLinger: Duration = .zero,
        logger: Logger = Logger(label: "relay.hub"),
        metricsFactory: any MetricsFactory = MetricsSystem.factory,
        tap: (any EventTap)? = nil,
        onWantedTopicsChange: @escaping @Sendable (WantedTopicsChange) -> Void = { _ in }
    ) {
        self.wire = wire
        self.tap = tap
        gapLedger = GapLedger(wire: wire)
        stateEventTypes = wire.stateEventTypes
        self.policy = policy
        self.bufferLimit = Self.bounded(bufferLimit)
        self.snapshotOnSubscribe = snapshotOnSubscribe
        self.snapshotless = snapshotless
        self.folding = folding
        self.keepsUnwantedLastValues = keepsUnwantedLastValues
        self.keepsLastValues = keepsLastValues
        lastValueBound = LastValueBound(limit: topicsKept, metricsFactory: metricsFactory)
        self.logger = logger
        self.onWantedTopicsChange = onWantedTopicsChange
        historyLimits = history
        // A node that adopts positions has no epoch until the leader names one.
        let made = adoptsPositions ? nil : history.map { EventHistory(limits: $0) }
        self.history = made
        self.adoptsPositions = adoptsPositions
        self.wildcardLinger = wildcardLinger
        epochBox = Mutex(made?.epoch)
        metrics = HubHistoryMetrics(factory: metricsFactory, limit: history?.memoryBytes ?? 0)
        subscribersGauge = Gauge(label: "relay_subscribers", factory: metricsFactory)
        laggingGauge = Gauge(label: "relay_subscribers_lagging", factory: metricsFactory)
        publishedCounter = Counter(label: "relay_hub_events_published_total", factory: metricsFactory)
        foldsAdopted = Counter(label: "relay_books_adopted_total", factory: metricsFactory)
        droppedFull = Counter(label: "relay_events_dropped_total", dimensions: [("reason", "buffer_full")], factory: metricsFactory)
        droppedEvicted = Counter(label: "relay_events_dropped_total", dimensions: [("reason", "subscriber_disconnected")], factory: metricsFactory)
    }

    // MARK: subscribing

    /// Adds a subscriber for `topics` (more can be added later with ``add(_:to:)``).
    ///
    /// - Parameter whenQueued: called (on the hub, so it must be quick and must not block) each time
    ///   events were queued on the subscription's stream, and once when the stream finished. A consumer
    ///   that reads many subscriptions uses it to read each one only when ``HubSubscription/hasQueued``
    ///   holds, instead of keeping a task waiting in every stream.
    public func subscribe(to topics: Set<Topic> = [], whenQueued: (@Sendable () -> Void)? = nil) -> HubSubscription {
        let id = SubscriberID.make()
        let (stream, continuation) = AsyncStream.makeStream(
            of: DeliveryBatch.self, bufferingPolicy: .bufferingOldest(Self.streamElements))
        continuation.onTermination = { [weak self] _ in
            guard let self else { return }
            Task { await self.streamEnded(id) }
        }
        let queue = SubscriberQueue(limit: bufferLimit)
        subscribers[id] = Subscriber(id: id, continuation: continuation, queue: queue, whenQueued: whenQueued)
        subscribersGauge.record(subscribers.count)
        add(topics, to: id)
        return HubSubscription(id: id, stream: stream, queue: queue)
    }

    /// Adds topics to a subscriber (those it has are ignored; with `snapshotOnSubscribe` each new ticker's
    /// last event at once). Returns the market position in the same step: the subscriber has every event
    /// of them after it, and the history holds them whole from there (a position read a step before may not).
    @discardableResult
    public func add(_ topics: some Sequence<Topic>, to id: SubscriberID) -> (epoch: String?, sequence: UInt64) {
        add(topics, to: id, snapshot: { _ in true })
        return position
    }

    /// Adds topics, each with its snapshot on subscribe unless `snapshot` says no.
    func add(_ topics: some Sequence<Topic>, to id: SubscriberID, snapshot: (Topic) -> Bool) {
        guard let subscriber = subscribers[id] else { return }
        // A source that says what it is (a replay): told before anything else, as the first topics come.
        let topics = Array(topics)
        if subscriber.topics.isEmpty, !topics.isEmpty, let sourceNotice { enqueue(HubDelivery([sourceNotice]), to: subscriber) }
        for topic in topics where subscribers[id] != nil && subscriber.topics.insert(topic).inserted {  // none once evicted
            if topic.isWildcard {
                let first = wildcards[topic.eventType] == nil
                wildcards[topic.eventType, default: HolderList()].append(subscriber)
                if first { wildcardWanted(topic.eventType) }
                // Every whole state of the type: a wildcard's holder starts each book whole too (as the
                // vendor sends it after a subscribe, so whatever the snapshot setting).
                if snapshot(topic) {
                    let wholes = wholeStates(held: [topic])
                    if !wholes.isEmpty { enqueue(HubDelivery(wholes), to: subscriber) }
                }
                continue
            }
            let entry = entry(for: topic)
            entry.subscribers.append(subscriber)
            if entry.subscribers.count == 1 { tickerWanted(topic) }
            // Not for a topic a resume replays (`snapshot` says no): its client has the state up to there.
            guard snapshot(topic) else { continue }
            if let fold = entry.fold {
                // The whole state, as the vendor sends it after a subscribe, whatever the snapshot setting;
                // or nothing while it is not known whole (the vendor's is on its way to every holder).
                if let whole = fold.whole() { enqueue(HubDelivery([whole]), to: subscriber) }
            } else if snapshotOnSubscribe, !snapshotless.contains(topic.eventType), let last = entry.ownLast {
                enqueue(HubDelivery([last]), to: subscriber)
            }
        }
        tellRefusals(of: topics, to: subscriber)
        // Subscribing while the upstream is down: told at once, not left waiting in silence (and told
        // when it is back, like the others).
        if let outage = outages.current, !subscriber.toldOfOutage, !subscriber.topics.isEmpty {
            subscriber.toldOfOutage = true
            enqueue(HubDelivery([wire.render(outage.notice)]), to: subscriber)
        }
        tell(CollectionOfOne(subscriber))
        reportWantedChange()
    }

    /// Removes topics from a subscriber; topics it does not have are ignored.
    public func remove(_ topics: some Sequence<Topic>, from id: SubscriberID) {
        guard let subscriber = subscribers[id] else { return }
        let removed = topics.filter { subscriber.topics.remove($0) != nil }
        for topic in removed { unindex(topic, subscriber) }
        // Their merged events not yet sent are not sent (a topic its wildcard still covers keeps its own).
        subscriber.conflation?.discard(removed) {
            subscriber.topics.contains($0) || (!$0.isDerived && subscriber.topics.contains(.wildcard($0.eventType)))
        }
        reportWantedChange()
    }

    /// Removes a subscriber and finishes its stream (also when the stream ends, unless parked: ``streamEnded(_:)``).
    public func remove(_ id: SubscriberID) {
        guard let subscriber = subscribers.removeValue(forKey: id) else { return }
        subscribersGauge.record(subscribers.count)
        if conflating.remove(id) != nil { conflationChanged() }
        if subscriber.lostSinceNotice > 0 { setLagging(false) }
        for topic in subscriber.topics { unindex(topic, subscriber) }
        subscriber.continuation.finish()
        subscriber.queue.finished.store(true, ordering: .releasing)
        subscriber.whenQueued?()
        reportWantedChange()
    }

    func entry(for topic: Topic) -> TopicEntry {
        if let entry = entries[topic] { return entry }
        let entry = TopicEntry(in: lastValueBound)
        entry.fold = folding?.fold(for: topic)
        entries[topic] = entry
        entriesOfType[topic.eventType, default: []].insert(topic)
        return entry
    }

    /// Frees `topic`'s entry.
    func removeEntry(_ topic: Topic) {
        guard entries.removeValue(forKey: topic) != nil else { return }
        entriesOfType[topic.eventType]?.remove(topic)
        if entriesOfType[topic.eventType]?.isEmpty == true { entriesOfType[topic.eventType] = nil }
    }

    /// Tells what the call changed in the upstream set, if anything.
    func reportWantedChange() {
        guard let change = wanted.takeChange() else { return }
        onWantedTopicsChange(change)
    }

    // MARK: publishing

    /// From now on `tap` is told every published event, positioned, before any subscriber (`nil`: none).
    public func setTap(_ tap: (any EventTap)?) {
        self.tap = tap
    }

    /// From now on a resume from a position older than the history holds is asked of `archive`.
    public func setArchive(_ archive: (any EventArchive)?) {
        self.archive = archive
    }

    /// Delivers events, in order, to every subscriber whose topics match, and caches the last event per topic.
    /// Never suspends. Each subscriber gets its matches as one element per window of 64 events (one an upstream message).
    public func publish(_ events: [MarketEvent]) {
        guard !events.isEmpty else { return }
        let now = WallClock.nowMilliseconds()
        if let recovery = outages.eventsArrived(at: now) { announce(recovery) }
        published += events.count
        publishedCounter.increment(by: events.count)
        let received = events
        var events = events
        if !gapLedger.watched.isEmpty { watchFirstLive(events) }
        if !wanted.refusals.isEmpty { wanted.arrived(events) }
        if history == nil, adoptsPositions, let limits = historyLimits {
            // Positioned events before the leader's epoch was heard (its notice travels on another
            // subject): kept, under an epoch named when it comes.
            let fresh = EventHistory(limits: limits, epoch: "")
            for topic in wanted.topics { fresh.wanted(topic, now: now) }
            history = fresh
        }
        var positions: [EventPosition]?
        if let history {
            if adoptsPositions {
                events = adopt(events, into: history, at: now)
            } else {
                // Positions once per event, here, before any subscriber sees it: every delivery shares them.
                (events, positions) = history.keepPositioned(events, at: now)
            }
            metrics.record(history)
        }
        if let tap {
            // The bytes as received (what a replay serves again, positioned afresh) with their positions.
            if let positions { tap.take(received, positions: positions, epoch: history?.epoch) } else { tap.take(events, epoch: history?.epoch) }
        }
        let shared = PublishedEvents(events)
        sharedSince.storage = nil
        // Each event type's wildcard holders, looked up once a publish while they do not change (an
        // eviction in the middle of it changes them): comparing a few short event types costs less than
        // hashing one per event.
        var wildHolders = WildcardLookups(asOf: wildcardsChanged)
        var touched: [Subscriber] = []
        // Sized once per publish instead of grown step by step (each step a malloc on the hot path).
        touched.reserveCapacity(Swift.min(subscribers.count, 4096))
        var base = 0
        while base < events.count {
            let end = Swift.min(base + 64, events.count)
            for index in base..<end {
                let bit: UInt64 = 1 << UInt64(index - base)
                let event = events[index]
                let wild = wildcards.isEmpty ? nil : wildcardHolders(of: event.eventType, seen: &wildHolders)
                // A cluster node may still receive a few events of a topic it just dropped: not kept.
                var withheld = false
                if let entry = entries[event.topic] ?? (keepsUnwantedLastValues || wild != nil ? entry(for: event.topic) : nil) {
                    if keepsLastValues {
                        entry.last = event
                        if !entry.lastShared {
                            entry.lastShared = true
                            sharedLastValues.append(entry)
                        }
                        let storage = event.bytes.withVeryUnsafeBytesWithStorageManagement { $1.toOpaque() }
                        if storage != sharedSince.storage {
                            sharedSince.storage = storage
                            sharedSince.bytes += event.bytes.storageCapacity
                        }
                    }
                    if let fold = entry.fold {
                        if entry.subscribers.isEmpty && wild == nil && !wanted.lingers(event.eventType) {
                            // Nobody holds it: what comes now (the last events before the unsubscribe takes
                            // effect) is not followed, so it never makes a state to vouch for.
                            fold.interrupt()
                        } else {
                            fold.apply(event)
                        }
                        // A cluster node whose state is not whole holds the change back, for the whole state
                        // the store will bring, instead of sending its holders changes to a book they lack.
                        withheld = adoptsPositions && !fold.isWhole
                        if withheld { entry.holdBack(event) } else if !entry.heldBack.isEmpty { entry.releaseHeldBack() }
                    }
                    if !withheld {
                        for subscriber in entry.subscribers {
                            if subscriber.mask == 0 { touched.append(subscriber) }
                            subscriber.mask |= bit
                        }
                    }
                }
                // A wildcard is the vendor's events of a type: the relay's derived bars (`AM.AAPL@5m`) are
                // sent only to who named them.
                if let wild, !withheld, !Topic.isDerivedTicker(event.ticker) {
                    for subscriber in wild {
                        if subscriber.mask == 0 { touched.append(subscriber) }
                        subscriber.mask |= bit
                    }
                }
            }
            for subscriber in touched {
                let mask = subscriber.mask
                subscriber.mask = 0
                if let conflation = subscriber.conflation, conflation.isMerging(fill: subscriber.queue.pending.load(ordering: .relaxed), warningFill: subscriber.warningFill) {
                    deliverConflating(HubDelivery(shared, base: base, mask: mask), to: subscriber, conflation)
                } else {
                    enqueue(HubDelivery(shared, base: base, mask: mask), to: subscriber)
                }
            }
            // Told after every subscriber's events are queued, one right after the other: whoever drains
            // them (one task per event loop downstream) then finds most of them queued at its first look.
            tell(touched)
            touched.removeAll(keepingCapacity: true)
            base = end
        }
        // Their own bytes: a cached event must not keep its whole upstream message alive for long.
        sharedSince.publishes += 1
        if sharedSince.publishes >= Self.sharedLastValuePublishes || sharedSince.bytes >= Self.sharedLastValueBytes { compactLastValues() }
        if lastValueBound.isPast(entries.count) { trimUnwantedLastValues() }
    }

    /// Gives every last value that still shares its message's bytes bytes of its own.
    func compactLastValues() {
        for entry in sharedLastValues { entry.compactLast() }
        sharedLastValues.removeAll(keepingCapacity: true)
        sharedSince = (0, 0, nil)
    }

    /// A publish's lookups of `wildcards` (at most eight event types), good while it has not changed.
    private struct WildcardLookups {
        var asOf: Int
        var found: [(eventType: String, holders: HolderList<Subscriber>?)] = []
    }

    /// The wildcard holders of `eventType`, from `seen` or the table.
    private func wildcardHolders(of eventType: String, seen: inout WildcardLookups) -> HolderList<Subscriber>? {
        if seen.asOf != wildcardsChanged { seen = WildcardLookups(asOf: wildcardsChanged) }
        for known in seen.found where known.eventType == eventType { return known.holders }
        let holders = wildcards[eventType]
        if seen.found.count < 8 { seen.found.append((eventType, holders)) }
        return holders
    }
}
