import AsyncSupport
import Logging
import MarketDataHub
import NIOCore
import MarketCore
import Synchronization

/// How a cluster node fills outages: the fill itself (the relay's `GapFiller`, given to it by the
/// composition root) and how many topics one ask names. `Sendable`.
public struct ClusterGapFillHook: Sendable {
    public var maxTopics: Int
    /// The longest outage the fill covers (`gapFill.maxWindowSeconds`): the leader fills no ask whose
    /// window is longer or reaches further back (``FillWire/fillable(_:maxWindow:now:)``).
    public var maxWindow: Duration
    /// Fills one request, handing the results to the outlet; ends early when its task is cancelled.
    public var fill: @Sendable (GapFillRequest, any RecoveryOutlet) async -> Void

    public init(
        maxTopics: Int, maxWindow: Duration = .seconds(15 * 60),
        fill: @escaping @Sendable (GapFillRequest, any RecoveryOutlet) async -> Void
    ) {
        self.maxTopics = maxTopics
        self.maxWindow = maxWindow
        self.fill = fill
    }
}

/// The positions of the leader's current term, given under one lock by the live publisher and by the
/// gap fill's, so every event on NATS carries the next position in the order NATS carries them.
/// `Sendable`: a `Mutex`.
///
/// What it stamps is recorded on the cluster's tape too (``tap``, the leader's recorder), under the
/// same lock, so the tape holds the events in the order NATS carries them, with their positions.
final class TermSequencer: Sendable {
    private let state = Mutex<PositionSequencer?>(nil)
    /// The term's epoch and the market sequence of its last event stamped, under a lock of its own: the
    /// lease's renewal reads it without waiting for a batch being published under ``state``'s.
    private let stamped = Mutex<(epoch: String, last: UInt64)?>(nil)
    private let tap: (any EventTap)?

    init(tap: (any EventTap)? = nil) {
        self.tap = tap
    }

    /// A new term, its positions in an epoch named like the term (its name in the lease, so every node
    /// knows whose term an epoch was), or none (`stamps` false: no positions).
    func begin(stamps: Bool, term: String) { state.withLock { $0 = stamps ? PositionSequencer(epoch: term) : nil } }
    func end() {
        state.withLock { $0 = nil }
        stamped.withLock { $0 = nil }
    }

    var epoch: String? { state.withLock { $0?.epoch } }

    /// The market sequence of the last event stamped in `term` (`nil`: another term, none stamped yet,
    /// or no positions).
    func stampedThrough(term: String) -> UInt64? {
        stamped.withLock { stamped in
            guard let stamped, stamped.epoch == term else { return nil }
            return stamped.last
        }
    }

    /// Topics the upstream stopped sending for a while this term: their next events skip a sequence.
    func interrupt(_ topics: Set<Topic>) {
        guard !topics.isEmpty else { return }
        state.withLock { $0?.interrupt(topics) }
    }

    /// Stamps `events` (when the term gives positions) and hands them to `publish` under the lock.
    func stamp(_ events: [MarketEvent], _ publish: ([MarketEvent]) -> Void) {
        state.withLock { sequencer in
            guard let epoch = sequencer?.epoch, let positions = sequencer?.positions(of: events) else {
                tap?.take(events, epoch: nil)
                publish(events)
                return
            }
            tap?.take(events, positions: positions, epoch: epoch)
            if let last = positions.last?.market { stamped.withLock { $0 = (epoch, last) } }
            publish(EventPosition.stamp(events, positions))
        }
    }
}

/// The gap fill of a cluster: every node asks, the leader fills.
///
/// After an outage (the leader's upstream dropped, a failover, this node's NATS lost) a node's hub
/// makes its request (``GapFillRequest``: the window and the topics its clients hold by name, each with
/// the last event it had). The node publishes it as an ask. The leader gathers the asks of a quarter
/// second, fills their union once from the REST API, and publishes the recovered events with its
/// positions, then how the fill ended and which asks it answered. An ask whose window the fill does not
/// cover (``FillWire/fillable(_:maxWindow:now:)``) is answered `skipped` on its own, never merged; a
/// union of fillable asks longer than the fill covers is filled in turns. Every node watches the asks
/// too, and takes recovered events only for topics an ask named (``AskedTopics``); the leader publishes
/// only the topics of the asks it answers. Every node puts every recovered event in its history (positions stay the same everywhere) and delivers to its clients only what falls in
/// its own pending gaps (``MarketDataHub/deliverRecovered(_:_:order:)``). A fill cut short by the end of
/// a term answers nobody: the nodes keep their gaps, and their next ask (after the failover) covers the
/// union of both outages, which the new leader fills.
///
/// `Sendable`; state behind `Mutex`es.
final class ClusterGapFill: Sendable {
    /// How long the leader gathers asks before filling (all nodes see a recovery within milliseconds).
    static let gathering: Duration = .milliseconds(250)

    private let hook: ClusterGapFillHook
    private let subjects: ClusterSubjects
    private let node: String
    private let hub: MarketDataHub
    private let sequencer: TermSequencer
    private let metrics: ClusterMetrics
    private let logger: Logger
    private let rules: SessionLimits
    /// What an event in an ask or a fill must be: the node's check of an event from NATS.
    private let check: EventCheck
    /// The asks the leader has not filled yet.
    private let inbox: AskInbox
    /// Receives asks while this node leads (one sink for the process: sinks live as long as it).
    private let askSink: NATSMessageSink
    /// The topics the cluster's recent asks named: the only ones this node takes recovered events of.
    private let asked = AskedTopics()
    /// The newest generation this node asked a fill for: an end naming a later one (no node's answer:
    /// the leader answers asks it read) is not taken, so a forged end cannot settle every gap to come.
    private let lastAsked = Mutex(0)

    init(
        hook: ClusterGapFillHook, subjects: ClusterSubjects, node: String, hub: MarketDataHub, sequencer: TermSequencer, check: EventCheck,
        metrics: ClusterMetrics, logger: Logger
    ) {
        self.hook = hook
        self.subjects = subjects
        self.node = node
        self.hub = hub
        self.sequencer = sequencer
        self.metrics = metrics
        self.logger = logger
        let rules = ClusterChecks.rules(ofMarket: subjects.market, wire: hub.wire)
        self.check = check
        self.rules = rules
        let inbox = AskInbox()
        self.inbox = inbox
        let maxWindow = hook.maxWindow
        askSink = NATSMessageSink { _, payload in
            guard let ask = FillWire.readAsk(payload, check: check, rules: rules) else {
                return metrics.rejected("fill_ask", "an ask that does not read (\(payload.count) bytes)", logger: logger)
            }
            guard FillWire.fillable(ask, maxWindow: maxWindow) else {
                metrics.rejected(
                    "fill_ask",
                    "ask \(ask.id) for \(ask.from)...\(ask.through) (Unix ms): not within the \(maxWindow.components.seconds) s the fill covers before now; answered skipped",
                    logger: logger)
                return inbox.refuse(ask)
            }
            inbox.add(ask)
        }
    }

    // MARK: every node

    /// Sends this node's hub's requests as asks, and hands the leader's answers to `feed` (in order with
    /// the events). Call once.
    func start(connection: NATSConnection, feed: ClusterFeed) async {
        let (subjects, node, maxTopics, metrics, logger) = (self.subjects, self.node, hook.maxTopics, self.metrics, self.logger)
        await hub.setRecoveryHandler { [weak self] request in
            guard !request.topics.isEmpty else { return }  // no client holds a topic by name here
            self?.lastAsked.withLock { $0 = max($0, request.generation) }
            let ask = FillWire.Ask(
                node: node, generation: request.generation, from: request.from, through: request.through,
                topics: Array(request.topics.prefix(maxTopics)))
            let sent = FillWire.ask(ask).withUnsafeBytes { connection.publish(subjects.fillAsk, $0) }
            if !sent { metrics.publishFailed("fill_ask", logger: logger) }
        }
        // Every node reads every ask (its own too), so it knows which topics a fill may bring.
        let (asked, rules, maxWindow, check) = (self.asked, self.rules, hook.maxWindow, self.check)
        let watch = NATSMessageSink { _, payload in
            guard let ask = FillWire.readAsk(payload, check: check, rules: rules),
                FillWire.fillable(ask, maxWindow: maxWindow)
            else { return }
            asked.note(ask.topics.map(\.topic))
        }
        // Asks are up to ~1 MB each, one standing per node: 64 MB holds every node's many times over.
        _ = connection.subscribe(subjects.fillAsk, sink: watch, pendingBytes: 64 << 20)
        let mine = ClusterSubjects.token(node) + "/"
        let answers = NATSMessageSink { [weak feed, weak self] _, payload in
            guard let feed, let self else { return }
            switch payload.first {
            case UInt8(ascii: "E"):
                // Whose they are first: events no ask named are not read (each is checked as it is).
                if let topic = FillWire.eventsTopic(payload), !asked.contains(topic) {
                    return metrics.rejected("fill", "recovered events of \(topic), which no recent ask named", logger: logger)
                }
                guard let (topic, order, events) = FillWire.readEvents(payload, check: check) else {
                    return metrics.rejected("fill", "recovered events that do not read (\(payload.count) bytes)", logger: logger)
                }
                feed.push(.recovered(topic: topic, events: events, order: order))
            case UInt8(ascii: "S"):
                guard let (end, answered) = FillWire.readEnd(payload) else {
                    return metrics.rejected("fill", "a fill's end that does not read (\(payload.count) bytes)", logger: logger)
                }
                let newest = self.lastAsked.withLock { $0 }
                let generations = answered.compactMap { $0.hasPrefix(mine) ? Int($0.dropFirst(mine.count)) : nil }
                if generations.contains(where: { $0 > newest }) {
                    metrics.rejected("fill", "a fill's end naming a generation this node never asked for", logger: logger)
                }
                if let generation = generations.filter({ $0 <= newest }).max() { feed.push(.recoveryEnded(end, generation: generation)) }
            default:
                metrics.rejected("fill", "not a fill message (\(payload.count) bytes)", logger: logger)
            }
        }
        _ = connection.subscribe(subjects.fillResult, sink: answers)
    }

    // MARK: the leader

    /// While this node leads (until cancelled): gathers asks and fills them, one fill at a time. Only
    /// topics the cluster wants are filled (`wanted`: the union of the nodes' interest the upstream is
    /// asked for, read at each fill): an ask is anyone's who may publish on NATS, and each topic it names
    /// costs REST requests to the vendor.
    func lead(connection: NATSConnection, wanted: @escaping @Sendable () -> Set<Topic>) async {
        let arrivals = inbox.open()
        defer { inbox.close() }
        guard let subscription = connection.subscribe(subjects.fillAsk, sink: askSink, pendingBytes: 64 << 20) else {
            logger.error("the leader cannot subscribe to gap-fill asks: outages are not filled this term")
            return
        }
        defer { subscription.cancel() }
        var generation = 0
        for await _ in arrivals {
            try? await Task.sleep(for: Self.gathering)
            if Task.isCancelled { return }
            // Asks the fill does not cover: answered on their own, as a single relay answers them.
            let refused = inbox.takeRefused()
            if !refused.isEmpty {
                let (from, through) = (refused.map(\.from).min() ?? 0, refused.map(\.through).max() ?? 0)
                let message = FillWire.end(.skipped, from: from, through: through, answering: refused.map(\.id))
                if !message.withUnsafeBytes({ connection.publish(subjects.fillResult, $0) }) {
                    metrics.publishFailed("fill", logger: logger)
                }
            }
            let (batch, later) = Self.batch(inbox.take(), maxWindow: hook.maxWindow)
            // The rest waits for the next turn (each ask alone fits: ``FillWire/fillable(_:maxWindow:now:)``).
            if !later.isEmpty { inbox.putBack(later) }
            let (gathered, unwanted) = Self.wanted(batch, in: wanted(), metrics: metrics, logger: logger)
            guard !gathered.isEmpty else { continue }
            generation += 1
            let request = Self.merge(gathered, generation: generation, wire: hub.wire)
            logger.info(
                "filling the cluster's outage",
                metadata: [
                    "asks": "\(gathered.map(\.id).joined(separator: ","))", "window_ms": "\(request.through - request.from)",
                    "topics": "\(request.topics.count)",
                ])
            let outlet = LeaderOutlet(
                connection: connection, subject: subjects.fillResult, sequencer: sequencer, answering: gathered.map(\.id), from: request.from,
                through: request.through, topics: Set(request.topics.map(\.topic)), unwanted: unwanted, metrics: metrics, logger: logger)
            await hook.fill(request, outlet)
            if Task.isCancelled { return }
        }
    }

    /// `asks` with only the topics `union` wants (by name or by its wildcard), and those left out (told
    /// missing in the fill's end, and counted as refused). An ask left with none is still answered with
    /// the others (its node learns the fill ended, and why its topics were not filled).
    static func wanted(
        _ asks: [FillWire.Ask], in union: Set<Topic>, metrics: ClusterMetrics, logger: Logger
    ) -> (asks: [FillWire.Ask], unwanted: Set<Topic>) {
        var unwanted = Set<Topic>()
        let kept = asks.map { ask in
            var ask = ask
            ask.topics = ask.topics.filter { held in
                let wanted = union.covers(held.topic)
                if !wanted { unwanted.insert(held.topic) }
                return wanted
            }
            return ask
        }
        if !unwanted.isEmpty {
            metrics.rejected("fill_ask", "\(unwanted.count) topics asked to be filled that no node's interest names (not filled)", logger: logger)
        }
        return (kept, unwanted)
    }

    /// Why a topic an ask named was not filled: no node's interest names it.
    static let notWanted = "no node of the cluster wants it now (not filled)"

    /// The asks one fill takes: the newest first, as many as keep the union of their windows within
    /// `maxWindow` (the fill skips a longer one, and every ask with it); the rest for a later turn.
    static func batch(_ asks: [FillWire.Ask], maxWindow: Duration) -> (now: [FillWire.Ask], later: [FillWire.Ask]) {
        let window = maxWindow.milliseconds
        var now: [FillWire.Ask] = []
        var later: [FillWire.Ask] = []
        var from = Int64.max
        var through = Int64.min
        for ask in asks.sorted(by: { $0.through > $1.through }) {
            let (joinedFrom, joinedThrough) = (min(from, ask.from), max(through, ask.through))
            if now.isEmpty || joinedThrough - joinedFrom <= window {
                now.append(ask)
                (from, through) = (joinedFrom, joinedThrough)
            } else {
                later.append(ask)
            }
        }
        return (now, later)
    }

    /// One request for every ask gathered: the union of their windows; each topic once, held by the sum
    /// of its holders, from the earliest last event any node had of it (none if one had none).
    static func merge(_ asks: [FillWire.Ask], generation: Int, wire: any WireProtocol) -> GapFillRequest {
        var holders: [Topic: Int] = [:]
        var earliest: [Topic: MarketEvent?] = [:]
        var seen: Set<Topic> = []
        for ask in asks {
            for held in ask.topics {
                holders[held.topic, default: 0] = min(holders[held.topic, default: 0] + held.holders, FillWire.maxHolders * 1_000)
                if held.lastBefore != nil { seen.insert(held.topic) }
                let order = wire.recoveryOrder(of: held.topic.eventType)
                switch earliest[held.topic] {
                case .none: earliest[held.topic] = .some(held.lastBefore)
                case .some(.none): break
                case .some(.some(let known)):
                    guard let last = held.lastBefore else {
                        earliest[held.topic] = .some(nil)
                        break
                    }
                    if (wire.orderValue(order, of: last) ?? .min) < (wire.orderValue(order, of: known) ?? .min) { earliest[held.topic] = .some(last) }
                }
            }
        }
        let topics = holders.map { topic, count in GapFillRequest.Held(topic: topic, holders: count, lastBefore: earliest[topic] ?? nil) }
            .sorted { GapFillRequest.Held.fillsFirst(($0, seen.contains($0.topic)), ($1, seen.contains($1.topic))) }
        return GapFillRequest(
            from: asks.map(\.from).min() ?? 0, through: asks.map(\.through).max() ?? 0, topics: topics, generation: generation)
    }
}

/// Asks received while this node leads, and the wake-up of its fill loop (one per term: a finished
/// stream does not start again). `Sendable`: `Mutex`es.
final class AskInbox: Sendable {
    private let asks = Mutex<[FillWire.Ask]>([])
    /// Asks the fill does not cover, to be answered `skipped` (at most ``maxRefused`` kept).
    private let refused = Mutex<[FillWire.Ask]>([])
    private let wake = Mutex<AsyncStream<Void>.Continuation?>(nil)
    static let maxRefused = 1_000

    /// A term begins: no ask from before it is kept (each node asks again after the failover).
    func open() -> AsyncStream<Void> {
        let (stream, continuation) = AsyncStream.makeStream(of: Void.self, bufferingPolicy: .bufferingNewest(1))
        asks.withLock { $0.removeAll() }
        refused.withLock { $0.removeAll() }
        wake.withLock { $0 = continuation }
        return stream
    }

    /// An ask the fill does not cover: answered `skipped` at the next turn. Kept without its topics
    /// (the answer names its window only): a thousand asks of up to 900 KB each are not held.
    func refuse(_ ask: FillWire.Ask) {
        var kept = ask
        kept.topics = []
        refused.withLock { if $0.count < Self.maxRefused { $0.append(kept) } }
        _ = wake.withLock { $0 }?.yield()
    }

    func takeRefused() -> [FillWire.Ask] {
        refused.withLock { refused in
            defer { refused.removeAll() }
            return refused
        }
    }

    /// Asks left for a later turn (the wake-up comes again).
    func putBack(_ later: [FillWire.Ask]) {
        asks.withLock { $0.insert(contentsOf: later, at: 0) }
        _ = wake.withLock { $0 }?.yield()
    }

    func close() {
        wake.withLock { wake in
            wake?.finish()
            wake = nil
        }
    }

    /// The most nodes whose asks wait at once (a node's newest ask stands for its earlier ones).
    static let maxAsks = 64

    /// Queues an ask for the next turn. A node's later ask replaces its earlier one (a node asks for the
    /// union of every outage it has not had filled; NATS keeps one publisher's order), by arrival, not by
    /// generation: an ask naming a generation far ahead (forged, or of the node's run before a restart)
    /// does not keep the node's real asks out. Past ``maxAsks`` nodes an ask is answered `skipped`, so
    /// whoever may publish asks cannot make the leader hold more.
    func add(_ ask: FillWire.Ask) {
        let overflow: FillWire.Ask? = asks.withLock { asks in
            if let index = asks.firstIndex(where: { $0.node == ask.node }) {
                asks[index] = ask
                return nil
            }
            guard asks.count < Self.maxAsks else { return ask }
            asks.append(ask)
            return nil
        }
        if let overflow { return refuse(overflow) }
        _ = wake.withLock { $0 }?.yield()
    }

    func take() -> [FillWire.Ask] {
        asks.withLock { asks in
            defer { asks.removeAll() }
            return asks
        }
    }
}

/// The topics the cluster's asks named lately (every node's, as each node reads them on NATS): a node
/// takes recovered events only of these, so a fill message about a topic nobody asked for goes nowhere.
/// Each is kept ``lifetime`` after the last ask naming it (a hub gives up an outage's gaps after as
/// long), at most ``maxTopics`` (past it the ones noted longest ago go, down to ``keptAfterTrim``, so
/// a full list is trimmed once per 10,000 new topics, not sorted again for each). `Sendable`: a `Mutex`.
final class AskedTopics: Sendable {
    static let lifetime: Duration = .seconds(15 * 60)
    static let maxTopics = 100_000
    static let keptAfterTrim = maxTopics / 10 * 9
    private let noted = Mutex<[Topic: ContinuousClock.Instant]>([:])

    func note(_ topics: [Topic], at now: ContinuousClock.Instant = .now) {
        noted.withLock { noted in
            for topic in topics { noted[topic] = now }
            guard noted.count > Self.maxTopics else { return }
            noted = noted.filter { now - $0.value < Self.lifetime }
            if noted.count > Self.keptAfterTrim {
                let oldest = noted.sorted { $0.value < $1.value }.prefix(noted.count - Self.keptAfterTrim).map(\.key)
                for topic in oldest { noted[topic] = nil }
            }
        }
    }

    /// The topics noted and not yet let go (for tests).
    var count: Int { noted.withLock { $0.count } }

    func contains(_ topic: Topic, at now: ContinuousClock.Instant = .now) -> Bool {
        noted.withLock { noted in
            guard let at = noted[topic] else { return false }
            guard now - at < Self.lifetime else {
                noted[topic] = nil
                return false
            }
            return true
        }
    }
}

/// The leader's outlet: recovered events onto NATS with the term's positions, then the fill's end
/// naming the asks it answered. A fill cancelled by the end of the term answers nobody. Only the
/// topics of the asks it answers are published. `Sendable`.
struct LeaderOutlet: RecoveryOutlet {
    let connection: NATSConnection
    let subject: String
    let sequencer: TermSequencer
    let answering: [String]
    let from: Int64
    let through: Int64
    /// The topics the answered asks named.
    let topics: Set<Topic>
    /// Those they named that no node wants now: told missing, not filled.
    let unwanted: Set<Topic>
    let metrics: ClusterMetrics
    let logger: Logger

    func deliverRecovered(_ topic: Topic, _ events: [MarketEvent], order: RecoveryOrder) async -> Int {
        guard topics.contains(topic) else {
            metrics.rejected("fill", "the fill brought \(topic), which no ask it answers named: not published", logger: logger)
            return 0
        }
        var published = 0
        sequencer.stamp(events) { stamped in
            for message in FillWire.events(topic, order: order, stamped) {
                if message.withUnsafeBytes({ connection.publish(subject, $0) }) {
                    published += 1
                } else {
                    metrics.publishFailed("fill", logger: logger)
                }
            }
        }
        return published > 0 ? events.count : 0
    }

    func announceRecovered(_ summary: GapFillSummary, generation: Int) async {
        var summary = summary
        for topic in unwanted where summary.missing[topic] == nil { summary.missing[topic] = ClusterGapFill.notWanted }
        end(.filled(summary))
    }
    func noteFillSkipped(generation: Int) async { end(.skipped) }
    func finishFill(generation: Int) async {
        // Cancelled: the term ended, and the next leader takes the asks up (the nodes keep their gaps).
        if !Task.isCancelled { end(.nothing) }
    }

    private func end(_ end: RecoveryEnd) {
        let message = FillWire.end(end, from: from, through: through, answering: answering)
        if !message.withUnsafeBytes({ connection.publish(subject, $0) }) { metrics.publishFailed("fill", logger: logger) }
    }
}
