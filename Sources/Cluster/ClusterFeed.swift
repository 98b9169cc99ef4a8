import Foundation
import Logging
import MarketDataHub
import NIOCore
import MarketCore
import Synchronization

/// One node's side of the cluster's data path: NATS subscriptions for exactly the topics this node's
/// hub wants, and one ordered queue from libnats' delivery thread into the hub.
///
/// Events, the leader's "upstream lost" notices, snapshots from the last-value store and loss reports
/// all travel through the same queue, so they reach the hub in the order they happened. The queue is
/// bounded (``maxQueuedEvents``, by ``SourceInbox/weight(of:)``): past it, events are dropped, counted, and the subscribers of their
/// topics get a `lagging` notice — never unbounded memory.
///
/// `Sendable`; state behind `Mutex`es. ``run()`` is the one consumer.
final class ClusterFeed: Sendable {
    static let maxQueuedEvents = 100_000

    /// The leader's control messages a node takes a second, and at once. Each may cost the hub a pass
    /// over its subscribers (an outage, a loss); a leader sends one a second (its epoch), a few at an
    /// outage, and one per 500 topics its upstream refused. Past it, those that read are dropped,
    /// counted, and the clients told at most once a second (as an outage: one dropped may have been the
    /// word of one), so a publisher flooding the control subject costs the hub this many a second, not
    /// as many as NATS delivers. (What does not read is counted only: it takes no place.)
    static let controlRate = (perSecond: 100, burst: 1_000)
    /// Within that, the leader's word of an outage (`down:`) or a loss (`loss:`) a node takes a second,
    /// and at once, together: each costs a notice to every client (an outage, between events, also a
    /// break in the history and a gap fill ask of the leader), and a leader sends one per outage or per
    /// run it fell behind. Past it, as past ``controlRate``: dropped, counted (`notice_rate`), and the
    /// clients told at most once a second that events may be missing.
    static let noticeRate = (perSecond: 2, burst: 10)

    let subjects: ClusterSubjects
    /// This node's name (a `forgotten:` notice naming it is for its clients).
    private let node: String
    private let connection: NATSConnection
    private let hub: MarketDataHub
    private let metrics: ClusterMetrics
    private let logger: Logger
    /// NATS's callback threads → this node's hub: the same inbox and pump as an upstream connection's.
    private let inbox = SourceInbox.source(capacity: ClusterFeed.maxQueuedEvents)
    private let subscriptions = Mutex<[Topic: NATSSubscription]>([:])
    private let lastValues: @Sendable (Topic) async -> MarketEvent?
    /// Who held the term an epoch is named like: this process (its own term), or a node as this node
    /// read it in the lease.
    private let holder: @Sendable (String) -> TermHolder?
    /// The epochs the leader announced.
    private let epochs = Mutex(AnnouncedEpochs())
    private let eventSink: Mutex<NATSMessageSink?> = Mutex(nil)
    /// This node's NATS link is down (told to its subscribers) and not back yet. Held while an event is
    /// queued, so an event is queued before the loss notice or not at all: NATS may deliver a message it
    /// had already received after its disconnection was told, and the hub takes the first event after
    /// a loss as the link back (the outage would end at once, its gap fill asked for a millisecond).
    private let linkDown = Mutex(false)
    /// What an event from NATS must be, made once.
    private let check: EventCheck
    /// An epoch the lease did not vouch for when it was heard, and what came after it, until a lease
    /// read says whose it is (``Held``).
    private let held = Mutex<Held?>(nil)
    /// When the newest lease read told was asked.
    private let newestRead = Mutex<ContinuousClock.Instant?>(nil)
    /// The last mark of the leader's stamping told the hub (``leaderStamped(term:through:freshFor:)``).
    private let lastMark = Mutex<(term: String, through: UInt64)?>(nil)
    /// The control messages taken (``controlRate``), and when the clients were last told of a drop.
    private let controlRate: Mutex<MessageRate>
    private let controlsPerSecond: Int
    /// The outages and losses taken (``noticeRate``).
    private let noticeRate: Mutex<MessageRate>
    private let noticesPerSecond: Int

    init(
        connection: NATSConnection, subjects: ClusterSubjects, node: String, hub: MarketDataHub, metrics: ClusterMetrics, logger: Logger,
        check: EventCheck, epochHoldLimit: Duration = .seconds(2),
        holdBounds: (events: Int, controls: Int) = (ClusterFeed.maxQueuedEvents, SourceInbox.maxControlMessages),
        controlRate: (perSecond: Int, burst: Int) = ClusterFeed.controlRate,
        noticeRate: (perSecond: Int, burst: Int) = ClusterFeed.noticeRate,
        holder: @escaping @Sendable (String) -> TermHolder?,
        lastValues: @escaping @Sendable (Topic) async -> MarketEvent?
    ) {
        self.holder = holder
        self.node = node
        self.connection = connection
        self.subjects = subjects
        self.hub = hub
        self.metrics = metrics
        self.logger = logger
        self.lastValues = lastValues
        self.check = check
        self.epochHoldLimit = epochHoldLimit
        self.holdBounds = holdBounds
        self.controlRate = Mutex(MessageRate(perSecond: controlRate.perSecond, burst: controlRate.burst))
        controlsPerSecond = controlRate.perSecond
        self.noticeRate = Mutex(MessageRate(perSecond: noticeRate.perSecond, burst: noticeRate.burst))
        noticesPerSecond = noticeRate.perSecond
    }

    /// Subscribes to the leader's notices and makes the sink for events. Call once, before ``run()``.
    func start() {
        let subjects = self.subjects
        let sink = NATSMessageSink { [weak self] subject, payload in
            guard let self else { return }
            let length = strlen(subject)
            let topic = subject.withMemoryRebound(to: UInt8.self, capacity: length) {
                subjects.topic(fromSubject: UnsafeBufferPointer(start: $0, count: length))
            }
            guard let topic else {
                self.metrics.rejected("event", "\(String(cString: subject).prefix(200)) is not an event subject", logger: self.logger)
                return
            }
            switch self.check.event(payload, topic: topic, receivedAt: MonotonicClock.nanoseconds()) {
            case .success(let event):
                // A drop is counted and announced by the inbox and the pump. While the link is down,
                // not queued: the outage's window, up to the first event after the link is back, is
                // the gap fill's to recover (with this event in it).
                let queued = self.linkDown.withLock { down in
                    if !down { self.deliver(.events([event])) }
                    return !down
                }
                if !queued { self.metrics.natsDropped(reason: "link_down").increment() }
            case .failure(let rejection): self.metrics.rejected("event", "\(rejection) (subject \(topic))", logger: self.logger)
            }
        }
        eventSink.withLock { $0 = sink }
        let control = NATSMessageSink { [weak self] _, payload in
            guard let self else { return }
            switch ClusterControl.read(payload) {
            // (Read first: what does not read costs a count, and takes no place of the leader's word.)
            case .success(let message): if self.admitsControl(), self.admitsNotice(message) { self.take(message) }
            case .failure(let rejection): self.metrics.rejected("control", rejection.description, logger: self.logger)
            }
        }
        // Small messages (at most 64 KiB, most a few bytes): a publisher flooding them while the sink is
        // behind makes libnats hold no more than this.
        _ = connection.subscribe(subjects.upstreamControl, sink: control, pendingBytes: 16 << 20)
        // Messages between nodes (interest, its requests, fill asks) lose no event when dropped: counted,
        // not told to every client (a publisher flooding them would make each report a pass over them).
        let between: Set<String> = [subjects.allInterest, subjects.interestRequest, subjects.fillAsk]
        connection.onSlowConsumer { [weak self] subscription in
            guard let self else { return }
            self.metrics.natsDropped(reason: "slow_consumer").increment()
            if let subject = subscription?.subject, between.contains(subject) { return }
            let topic = subscription.flatMap { self.subjects.topic(fromSubject: $0.subject) }
            self.deliver(.lost(count: 1, topics: topic.map { [$0] }, reason: "NATS dropped messages for this node: slow consumer"))
        }
    }

    /// Whether a control message arriving now is taken (within ``controlRate``). One that is not is
    /// counted, and the clients are told at most once a second that events may be missing.
    private func admitsControl() -> Bool {
        admits(
            within: controlRate, dropped: "control_rate",
            told: "control messages came on NATS faster than this relay node takes them (\(controlsPerSecond) a second); the rest were dropped")
    }

    /// Whether a message arriving now is within `rate`. One that is not is counted (`dropped`), and the
    /// clients are told at most once a second, as an outage (`told`, and that events may be missing):
    /// as for control messages past the queue's bound, one dropped may have been the leader's word of an
    /// outage or a loss, so the history is broken here and the gap fill asked, never a resume across it
    /// taken as whole.
    private func admits(within rate: borrowing Mutex<MessageRate>, dropped: String, told: String) -> Bool {
        let now = ContinuousClock.now
        let (admitted, tell) = rate.withLock { rate in rate.admit(at: now) ? (true, false) : (false, rate.tellsRefusal(at: now)) }
        guard !admitted else { return true }
        metrics.natsDropped(reason: dropped).increment()
        if tell { deliver(.connectionLost(reason: "\(told); events may be missing"), pastControlBound: true) }
        return false
    }

    /// Whether an outage or a loss arriving now is taken (within ``noticeRate``); any other control
    /// message is. One that is not is counted, and the clients are told at most once a second.
    private func admitsNotice(_ message: ClusterControl) -> Bool {
        switch message {
        case .upstreamDown, .loss: break
        case .epoch, .refused, .forgotten: return true
        }
        return admits(
            within: noticeRate, dropped: "notice_rate",
            told: "the cluster leader's word of outages and losses came faster than this relay node takes it (\(noticesPerSecond) a second); the rest was dropped")
    }

    /// What the lease held at a read every 250 ms: a term (the term it held before ended, and a late
    /// announcement of its epoch is stale), none (`nil`, or this node's own term ended), or a holder
    /// whose value names no term (`termless`: an older release, whose epochs are taken as they come).
    /// `askedAt`: when the read was asked; a read asked after an epoch the lease did not vouch for
    /// was heard says whose it is (``Held``). `nil`: no read (this node's own term ended).
    func leaseRead(term: String?, termless: Bool = false, askedAt: ContinuousClock.Instant?) {
        // A read asked before one already told (a slow one) says nothing newer: checked and told under
        // one lock, so two reads told at once land in the order they were asked.
        let told = newestRead.withLock { newest in
            if let askedAt {
                if let newest, askedAt < newest { return false }
                newest = askedAt
            }
            epochs.withLock { termless ? $0.leaseHeldWithoutTerm() : $0.leaseRead(term) }
            return true
        }
        guard told, let askedAt else { return }
        held.withLock { held in
            guard let since = held?.since, askedAt > since else { return }
            release(&held, taking: false)
        }
    }

    // MARK: epochs the lease has not vouched for

    /// An epoch announced that the lease did not hold at the last read: a new leader's whose term this
    /// node has not read yet (it reads every 250 ms; the leader takes the lease before it announces),
    /// or one made up by whoever may publish control messages, which would restart every node's
    /// history and tell every client a leader went. It is held, with every message after it in order,
    /// until a lease read asked after it (on the leader, a renewal): each epoch held that the lease
    /// holds then is taken in its place, any other refused and counted, and the events are the
    /// epochs' they follow. Bounded as the inbox is: at most ``maxQueuedEvents`` events and
    /// ``SourceInbox/maxControlMessages`` control messages held, past them dropped and told in place
    /// (a loss, an outage). Past `epochHoldLimit` without such a read (NATS failing, a foreign value in
    /// the lease), or when the node's NATS link is lost, what was held is taken as it came: this node
    /// cannot tell.
    private struct Held {
        enum Item {
            case message(SourceMessage, pastControlBound: Bool)
            case epoch(String)
            /// Events and control messages dropped here (told here: before what was kept next).
            case dropped(events: Int, controls: Int)
        }
        var items: [Item]
        /// Events held, by weight (``SourceInbox/weight(of:)``).
        var events = 0
        var controls = 1
        /// Dropped since the last item kept: told before the next one kept, or at the end.
        var droppedEvents = 0
        var droppedControls = 0
        /// Dropped in all (tests).
        var dropped = (events: 0, controls: 0)
        let since: ContinuousClock.Instant

        /// Appends `item`, after a word of what was dropped before it.
        mutating func keep(_ item: Item) {
            if droppedEvents > 0 || droppedControls > 0 {
                items.append(.dropped(events: droppedEvents, controls: droppedControls))
                (droppedEvents, droppedControls) = (0, 0)
            }
            items.append(item)
        }
    }

    /// The longest an epoch is held without a lease read asked after it: two lease reads of a
    /// follower's, one renewal of the leader's, and more (``ClusterNode`` sets it).
    private let epochHoldLimit: Duration

    /// The events (by weight) and control messages held at most: the inbox's bounds (less in tests).
    private let holdBounds: (events: Int, controls: Int)

    /// Whether an epoch is held now (tests).
    var holdsAnEpoch: Bool { held.withLock { $0 != nil } }

    /// What is held now, kept and dropped (tests; `nil`: nothing).
    var heldCounts: (events: Int, controls: Int, droppedEvents: Int, droppedControls: Int)? {
        held.withLock { held in held.map { ($0.events, $0.controls, $0.dropped.events, $0.dropped.controls) } }
    }

    /// Queues a message for the hub, behind what is held.
    private func deliver(_ message: SourceMessage, pastControlBound: Bool = false) {
        held.withLock { held in
            if held == nil {
                inbox.push(message, pastControlBound: pastControlBound)
            } else {
                hold(.message(message, pastControlBound: pastControlBound), in: &held)
            }
        }
    }

    /// Appends `item` to what is held, in place (one reference to the items), within the bounds.
    private func hold(_ item: Held.Item, in held: inout Held?) {
        guard held != nil else { return }
        var (events, weight) = (0, 0)
        var own = false
        if case .message(let message, let pastControlBound) = item {
            switch message {
            case .events(let some), .recovered(_, let some, _): (events, weight) = (some.count, SourceInbox.weight(of: some))
            // The node's own asking (bounded by its wanted topics) and its own word of itself.
            case .seed, .leaderStamped: own = true
            default: own = pastControlBound
            }
        }
        if events > 0 {
            // Weighed as the inbox weighs them (their bytes too); dropped ones told by their count.
            guard held!.events + weight <= holdBounds.events else {
                held!.droppedEvents += events
                held!.dropped.events += events
                return
            }
            held!.events += weight
        } else if !own {
            // A control message (an empty batch of events counts as one).
            guard held!.controls < holdBounds.controls else {
                held!.droppedControls += 1
                held!.dropped.controls += 1
                return
            }
            held!.controls += 1
        }
        held!.keep(item)
    }

    /// Queues what was held, taking the epochs the lease vouches for now (all of them with `taking`).
    private func release(_ held: inout Held?, taking: Bool) {
        guard var kept = held else { return }
        held = nil
        if kept.droppedEvents > 0 || kept.droppedControls > 0 { kept.items.append(.dropped(events: kept.droppedEvents, controls: kept.droppedControls)) }
        for item in kept.items {
            switch item {
            case .message(let message, let pastControlBound): inbox.push(message, pastControlBound: pastControlBound)
            case .epoch(let epoch):
                guard taking || epochs.withLock({ $0.vouches(for: epoch) }) else {
                    metrics.rejected("control", "epoch \(ClusterText.visible(epoch, limit: 64)) is not the term the lease holds", logger: logger)
                    continue
                }
                take(epoch: epoch)
            case .dropped(let events, let controls):
                metrics.natsDropped(reason: "epoch_held").increment(by: events + controls)
                if events > 0 {
                    inbox.push(.lost(count: events, topics: nil, reason: "this relay node held more events than it may while it read whose a new epoch is"))
                }
                if controls > 0 {
                    inbox.push(
                        .connectionLost(
                            reason: "\(controls) control messages were dropped while this relay node read whose a new epoch is; events may be missing"),
                        pastControlBound: true)
                }
            }
        }
    }

    /// An epoch announced: held when the lease does not vouch for it (``Held``), else taken.
    private func heard(epoch: String) {
        held.withLock { held in
            if held != nil {
                hold(.epoch(epoch), in: &held)
            } else if epochs.withLock({ $0.vouches(for: epoch) }) {
                take(epoch: epoch)
            } else {
                let since = ContinuousClock.now
                held = Held(items: [.epoch(epoch)], since: since)
                // Taken as it came if no read says whose it is in time.
                let limit = epochHoldLimit
                Task { [weak self] in
                    try? await Task.sleep(for: limit)
                    guard let self else { return }
                    self.held.withLock { held in
                        if held?.since == since { self.release(&held, taking: true) }
                    }
                }
            }
        }
    }

    /// Takes an announced epoch: a new term's begins here (its outage first), an ended one's is stale.
    private func take(epoch: String) {
        switch epochs.withLock({ $0.heard(epoch) }) {
        case .stale:
            metrics.rejected("control", "epoch \(ClusterText.visible(epoch, limit: 64)) ended already (a late announcement of an old term)", logger: logger)
            return
        case .next(let ended):
            // A new term after another: the outage starts now, before its first event (after a
            // kill -9 no word comes from the old leader, and the lease is read every 250 ms).
            let old: String
            switch holder(ended) {
            case .thisProcess?: old = "this node's term as the cluster leader ended"
            case .node(let name)?: old = "the cluster leader \(ClusterText.visible(name, limit: 64)) is gone"
            case nil: old = "the cluster's leader changed"
            }
            inbox.push(.connectionLost(reason: "\(old): a new term began; events between the last leader's and the new one's may be missing"))
        case .current, .first:
            break
        }
        inbox.push(.epoch(epoch))
    }

    /// The leader's control message, in order with the events.
    private func take(_ message: ClusterControl) {
        switch message {
        case .epoch(let epoch):
            heard(epoch: epoch)
        case .upstreamDown(let reason):
            // In the leader's words; whoever may publish here writes them, so they came bounded and printable.
            deliver(.connectionLost(reason: reason.isEmpty ? "the cluster leader lost its upstream connection" : reason))
        case .loss(let count):
            deliver(
                .lost(
                    count: count, topics: nil,
                    reason: "the cluster leader lost them on their way to NATS: it fell behind its upstream, or a message was too large for it or for NATS"))
        case .refused(let topics, let code, let reason):
            deliver(.refused(topics: topics, code: code, reason: reason))
        case .forgotten(let node):
            // Another node's: not this node's clients' business.
            guard node == self.node else { return }
            deliver(.connectionLost(reason: "the cluster leader did not hear from this relay node for a while (its NATS link stalled); events may be missing"))
        }
    }

    // MARK: what this node wants

    /// Makes the NATS subscriptions equal to `wanted()` (the hub's wanted set, in which no ticker is
    /// covered by a wildcard, so no event arrives twice). New ticker topics are seeded from the
    /// cluster's last-value store. The set is read under the subscriptions' lock: two batches that
    /// overlap apply in the order they read it, so an older set never lands after a newer one.
    func setWanted(_ wanted: () -> Set<Topic>) {
        let (added, removed): ([Topic], [(Topic, NATSSubscription)]) = subscriptions.withLock { current in
            // Read under the lock ``stop()`` empties the subscriptions after: a stopped feed subscribes nothing.
            guard let sink = eventSink.withLock({ $0 }) else { return ([], []) }
            let topics = wanted()
            let added = topics.filter { current[$0] == nil }
            var removed: [(Topic, NATSSubscription)] = []
            for topic in current.keys where !topics.contains(topic) {
                if let subscription = current.removeValue(forKey: topic) { removed.append((topic, subscription)) }
            }
            for topic in added {
                // One event a message (64 KiB at most, news aside): 100,000 of them, or 64 MB, wait at most
                // while the sink is behind, not libnats's 256 MB for each of thousands of topics.
                if let subscription = connection.subscribe(subjects.subject(for: topic), sink: sink, pendingBytes: 64 << 20) {
                    current[topic] = subscription
                }
            }
            return (Array(added), removed)
        }
        for (_, subscription) in removed { subscription.cancel() }
        if !removed.isEmpty { unseed(removed.map(\.0)) }
        // A last value seeds a snapshot or a folded state: a hub that gives neither (news without its
        // snapshot) is not sent items of megabytes it would drop.
        let hub = self.hub
        let seeds = added.filter { !$0.isWildcard && (hub.snapshotOnSubscribe || hub.folding?.eventTypes.contains($0.eventType) == true) }
        seed(seeds)
    }

    /// Topics waiting to be seeded from the last-value store, each once, in the groups their batches
    /// brought them, and how many tasks seed them. At most ``seedingTasks`` read the store at once; each
    /// takes ``seedingTurn`` entries of the first group, then that group goes to the back, so a client's
    /// one new topic does not wait behind another's ten thousand. A topic dropped from the wanted set
    /// leaves `queued` at once; its entry in a group is skipped when reached, and the groups are
    /// compacted when they hold far more entries than `queued` topics, so clients churning their
    /// subscriptions while NATS is slow queue at most about the wanted set.
    private struct Seeding {
        var groups = CircularBuffer<ArraySlice<Topic>>()
        var queued: Set<Topic> = []
        /// Entries in `groups`, stale ones included.
        var entries = 0
        var tasks = 0

        mutating func compactIfStale() {
            guard entries > 2 * queued.count + 1_024 else { return }
            let queued = self.queued
            var kept = CircularBuffer<ArraySlice<Topic>>()
            for group in groups {
                let live = group.filter { queued.contains($0) }
                if !live.isEmpty { kept.append(live[...]) }
            }
            groups = kept
            entries = queued.count
        }
    }

    private let seeding = Mutex(Seeding())
    static let seedingTasks = 4
    static let seedingTurn = 16

    private func seed(_ topics: [Topic]) {
        guard !topics.isEmpty else { return }
        let start = seeding.withLock { seeding in
            let group = topics.filter { seeding.queued.insert($0).inserted }
            guard !group.isEmpty else { return false }
            seeding.groups.append(group[...])
            seeding.entries += group.count
            seeding.compactIfStale()
            guard seeding.tasks < Self.seedingTasks else { return false }
            seeding.tasks += 1
            return true
        }
        if start { Task { await self.seedQueued() } }
    }

    /// Topics no longer wanted are not seeded.
    private func unseed(_ topics: [Topic]) {
        seeding.withLock { seeding in
            for topic in topics { seeding.queued.remove(topic) }
            seeding.compactIfStale()
        }
    }

    private func seedQueued() async {
        while true {
            let turn: [Topic]? = seeding.withLock { seeding in
                guard let group = seeding.groups.popFirst() else {
                    seeding.tasks -= 1
                    return nil
                }
                let taken = group.prefix(Self.seedingTurn)
                seeding.entries -= taken.count
                if group.count > taken.count { seeding.groups.append(group.dropFirst(taken.count)) }
                // Entries of topics dropped meanwhile, or taken by another turn, are skipped.
                return taken.filter { seeding.queued.remove($0) != nil }
            }
            guard let turn else { return }
            for topic in turn {
                if let event = await lastValues(topic) { deliver(.seed(event)) }
            }
        }
    }

    /// The lease says its holder had stamped `term`'s events through `through`: the hub is told (in
    /// order, behind what is held), once per new mark.
    func leaderStamped(term: String, through: UInt64, freshFor: Duration) {
        let new = lastMark.withLock { last in
            guard last?.term != term || last?.through != through else { return false }
            last = (term, through)
            return true
        }
        if new { deliver(.leaderStamped(epoch: term, through: through, freshFor: freshFor)) }
    }

    /// How many subjects this node is subscribed to.
    var subscriptionCount: Int { subscriptions.withLock { $0.count } }

    /// Queues a message for this node's hub, in order with the events (the gap fill's results).
    func push(_ message: SourceMessage) {
        deliver(message)
    }

    /// Tells every subscriber of this node that events stopped (once per outage; the first event after
    /// it announces the gap). With `linkDown`, NATS's events are not taken until ``linkBack()``.
    ///
    /// The node's own word, queued past the inbox's control bound: a flood of control messages on
    /// NATS must not drop it (the bound's own notice would come only with the first event after the
    /// link is back, and the outage would end as it began, its window never filled).
    func announceLost(_ reason: String, linkDown: Bool = false) {
        self.linkDown.withLock { down in
            if linkDown { down = true }
            // What came before the loss goes before its notice; whose an epoch is cannot be read
            // while the link is down.
            if linkDown { held.withLock { release(&$0, taking: true) } }
            deliver(.connectionLost(reason: reason), pastControlBound: true)
        }
    }

    /// This node's NATS link is back: its events are taken again.
    func linkBack() {
        linkDown.withLock { $0 = false }
    }

    // MARK: the queue

    /// Feeds the hub until ``stop()``.
    func run() async {
        let metrics = self.metrics
        let logger = self.logger
        await withTaskGroup(of: Void.self) { group in
            group.addTask {
                await HubPump.run(self.inbox, into: self.hub, lossReason: "this relay node fell behind the cluster") { count in
                    metrics.natsIn.increment(by: count)
                } dropped: { count in
                    metrics.natsDropped(reason: "node_queue_full").increment(by: count)
                    metrics.warn("node_queue_full", "cluster events dropped: this node's queue was full (\(count))", logger: logger)
                }
            }
            if hub.folding != nil { group.addTask { await self.askForWholeStates() } }
            // The pump ends with the inbox (``stop()``); the asking with it.
            await group.next()
            group.cancelAll()
        }
    }

    /// How often a folded topic this node cannot vouch for is asked of the store again.
    static let wholeStateInterval: Duration = .milliseconds(500)

    /// A folded topic (an order book) this node's clients hold and its hub cannot vouch for (the node
    /// began receiving it after the vendor's whole book went by, or lost events since) is asked of the
    /// last-value store, where the leader keeps each book whole, until the hub takes one: twice a
    /// second, at most 100 topics a round.
    private func askForWholeStates() async {
        while !Task.isCancelled {
            do {
                try await Task.sleep(for: Self.wholeStateInterval)
            } catch {
                return
            }
            // At random among many, so none waits behind the same hundred.
            for topic in await hub.foldsNotWhole().shuffled().prefix(100) {
                if let event = await lastValues(topic) { deliver(.seed(event)) }
            }
        }
    }

    func stop() {
        // A batch of the wanted set still due subscribes nothing on the closed connection.
        eventSink.withLock { $0 = nil }
        inbox.finish()
        let all = subscriptions.withLock { current in
            defer { current.removeAll() }
            return Array(current.values)
        }
        for subscription in all { subscription.cancel() }
    }
}
