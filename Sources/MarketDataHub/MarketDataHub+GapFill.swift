import NIOCore
import MarketCore

/// After an upstream outage: the window no event arrived in, and the topics subscribers hold by name
/// (most held first), each with the last event the relay had of it. `Sendable`.
public struct GapFillRequest: Sendable {
    public struct Held: Sendable {
        public let topic: Topic
        /// Subscribers holding it by name.
        public let holders: Int
        /// Its last event before the outage, if the relay had one.
        public let lastBefore: MarketEvent?

        public init(topic: Topic, holders: Int, lastBefore: MarketEvent?) {
            self.topic = topic
            self.holders = holders
            self.lastBefore = lastBefore
        }

        /// The order a fill takes topics in (it takes at most so many): those the relay had an event of
        /// before the outage (`hadEvent`) first, then those held by the most subscribers, then by name. A
        /// ticker no event was ever seen of (made up, held on many connections to come first) comes last.
        public static func fillsFirst(_ a: (Held, hadEvent: Bool), _ b: (Held, hadEvent: Bool)) -> Bool {
            (a.hadEvent ? 1 : 0, a.0.holders, b.0.topic) > (b.hadEvent ? 1 : 0, b.0.holders, a.0.topic)
        }
    }

    /// Unix ms: the last event before the outage (or when it was lost), and the first after it.
    public let from: Int64
    public let through: Int64
    public let topics: [Held]
    /// Numbers the requests of one hub (a fill's end settles its request's gaps and earlier ones).
    public let generation: Int

    public init(from: Int64, through: Int64, topics: [Held], generation: Int) {
        self.from = from
        self.through = through
        self.topics = topics
        self.generation = generation
    }
}

/// What a fill recovered, per topic, and what it could not: told to the holders of those topics as a
/// `recovered` status. `Sendable`.
public struct GapFillSummary: Sendable {
    public var from: Int64
    public var through: Int64
    /// Events delivered per topic filled.
    public var recovered: [Topic: Int] = [:]
    /// Topics not (wholly) filled, and why.
    public var missing: [Topic: String] = [:]

    public init(from: Int64, through: Int64) {
        self.from = from
        self.through = through
    }

    public var isComplete: Bool { missing.isEmpty }
}

/// How a fill ended, as a cluster's leader tells the nodes it filled for. `Sendable`.
public enum RecoveryEnd: Sendable {
    /// It was made: what it recovered and what is missing.
    case filled(GapFillSummary)
    /// Not made: the window is longer than the fill covers.
    case skipped
    /// Not made: none of the topics has a REST history.
    case nothing
}

/// The gap fills of a market since start, as the hub saw them end. `Sendable`.
public struct GapFillCounts: Sendable, Equatable, Encodable {
    public var fills = 0
    public var incomplete = 0
    /// Outages longer than the fill covers: their notice only.
    public var skipped = 0
    public var recovered = 0
    public var last: Last?

    public struct Last: Sendable, Equatable, Encodable {
        /// The outage's window (Unix ms), when the fill ended (Unix ms), what it recovered.
        public var from: Int64
        public var through: Int64
        public var endedAt: Int64
        public var events: Int
        public var topics: Int
        public var complete: Bool
        public var missing: Int
    }

    public init() {}
}

/// Where a fill's results go: the market's source inbox on a single relay (``InboxOutlet``), NATS on a
/// cluster's leader (each node then hands them to its own hub through its feed's inbox). Either way they
/// reach a hub through its source's inbox, in order with the events. `Sendable`.
public protocol RecoveryOutlet: Sendable {
    /// A topic's recovered events, oldest first, each flagged; returns how many were passed on.
    func deliverRecovered(_ topic: Topic, _ events: [MarketEvent], order: RecoveryOrder) async -> Int
    /// The fill of request `generation` ended: what it recovered and what is missing.
    func announceRecovered(_ summary: GapFillSummary, generation: Int) async
    /// The fill of request `generation` was not made: its window is longer than the fill covers.
    func noteFillSkipped(generation: Int) async
    /// The fill of request `generation` ended without a summary (nothing to ask for, or cancelled).
    func finishFill(generation: Int) async
}

extension MarketDataHub {
    /// Asks `handler` to fill each outage once the upstream is back (the relay's gap fill); `nil` stops it.
    public func setRecoveryHandler(_ handler: (@Sendable (GapFillRequest) -> Void)?) {
        recoveryHandler = handler
        if handler == nil { finishFill(generation: gapLedger.generation) }
    }

    /// The upstream is back: each topic held by name gets a pending gap, watched for its first live
    /// event, and the handler gets one request covering every gap not filled yet (``GapLedger``).
    func requestFill(from: Int64, through: Int64) {
        guard let recoveryHandler else { return }
        let holders = entries.compactMap { topic, entry in entry.subscribers.isEmpty ? nil : (topic, entry.subscribers.count, entry.ownLast) }
        let (request, released) = gapLedger.open(from: from, through: through, holders: holders)
        pass(released)
        recoveryHandler(request)
    }

    /// A topic's first live event after an outage closes its open gaps: the recovered events held for
    /// them that lie before it are delivered (ahead of it), the rest were on their way live.
    func watchFirstLive(_ events: [MarketEvent]) {
        pass(gapLedger.firstLive(events))
    }

    /// Recovered events of `topic` to its named holders now, as a replay outside their buffer's bound,
    /// with positions and into the history (on a cluster node they have the leader's already).
    private func pass(_ topic: Topic, _ events: [MarketEvent]) {
        guard !events.isEmpty else { return }
        var events = events
        if let history, !adoptsPositions {
            let received = events
            let positions: [EventPosition]
            (events, positions) = history.keepPositioned(events, at: WallClock.nowMilliseconds())
            metrics.record(history)
            // On the tape too: their positions were given (a restart must not give them again).
            tap?.take(received, positions: positions, epoch: history.epoch)
        }
        let holders = entries[topic]?.subscribers.members ?? []
        // Outside the buffer like a replay, and bounded like one: a connection that has a resume's worth
        // queued and unread is told instead (through its buffer).
        let bound = history?.limits.eventsPerResume ?? HistoryLimits().eventsPerResume
        for subscriber in holders where !subscriber.parked {
            let queued = subscriber.queue.replaying.load(ordering: .relaxed)
            guard queued + events.count <= bound else {
                let notice = Notice(
                    .gap,
                    message: "\(topic): \(events.count) recovered events of the outage not sent: this connection has \(queued) replayed events it has not read yet (at most \(bound))",
                    details: ["topic": .text(topic.description)])
                enqueue(HubDelivery([wire.render(notice)]), to: subscriber)
                continue
            }
            _ = yield(HubDelivery(replay: events), count: 0, to: subscriber)
        }
        tell(holders)
    }

    /// A new epoch begins: the recovered events held of the old one go out now (``GapLedger/releaseHeld()``).
    func releaseHeldRecoveries() {
        pass(gapLedger.releaseHeld())
    }

    private func pass(_ released: GapLedger.Released) {
        for (topic, events) in released { pass(topic, events) }
    }

    /// Delivers a topic's recovered events (oldest first, each already flagged) to the subscribers that
    /// hold it by name, as a replay outside their buffer's bound: only those that fall in one of the
    /// topic's pending gaps (after what the hub had, before the first live event, not delivered yet),
    /// so nothing arrives twice however often a window is fetched. They get positions and enter the
    /// history like any event; the topic's last value stays the live one. On a cluster node every
    /// recovered event the leader published enters the history under the leader's positions, delivered
    /// or not, so positions stay the same on every node. Returns how many were delivered.
    public func deliverRecovered(_ topic: Topic, _ events: [MarketEvent], order: RecoveryOrder) -> Int {
        var events = events
        if adoptsPositions, let history {
            events = adopt(events, into: history, at: WallClock.nowMilliseconds())
            metrics.record(history)
        }
        let (accepted, released) = gapLedger.accept(topic, events, order: order)
        pass(released)
        return accepted
    }

    /// A fill is over: the gaps of request `generation` and earlier are settled, and each holder of a
    /// topic it covered is told what it was given and what is missing of its own topics (`recovered`,
    /// with `complete`).
    public func announceRecovered(_ summary: GapFillSummary, generation: Int) {
        let settled = settle(through: generation)
        var delivered: [Topic: Int] = [:]
        for (topic, gaps) in settled { delivered[topic] = gaps.reduce(0) { $0 + $1.delivered } }
        let covered = Set(summary.recovered.keys).union(summary.missing.keys).filter { settled[$0] != nil }
        let events = covered.reduce(0) { $0 + (delivered[$1] ?? 0) }
        let missingCount = covered.filter { summary.missing[$0] != nil }.count
        gapLedger.counts.fills += 1
        if missingCount > 0 { gapLedger.counts.incomplete += 1 }
        gapLedger.counts.recovered += events
        gapLedger.counts.last = GapFillCounts.Last(
            from: summary.from, through: summary.through, endedAt: WallClock.nowMilliseconds(), events: events,
            topics: covered.count - missingCount, complete: missingCount == 0, missing: missingCount)
        var perSubscriber: [SubscriberID: (subscriber: Subscriber, topics: [Topic])] = [:]
        for topic in covered {
            for subscriber in entries[topic]?.subscribers.members ?? [] where !subscriber.parked {
                perSubscriber[subscriber.id, default: (subscriber, [])].topics.append(topic)
            }
        }
        var told: [Subscriber] = []
        for (_, held) in perSubscriber {
            let topics = held.topics.sorted()
            let recovered = topics.filter { summary.recovered[$0] != nil || delivered[$0, default: 0] > 0 }.map { topic in
                Notice.Detail(topic.description, .number(Int64(delivered[topic] ?? 0)))
            }
            let missing = topics.compactMap { topic in summary.missing[topic].map { Notice.Detail(topic.description, .text($0)) } }
            let complete = missing.isEmpty
            let count = topics.reduce(0) { $0 + (delivered[$1] ?? 0) }
            var details: [String: Notice.Value] = [
                "from": .number(summary.from), "through": .number(summary.through), "topics": .object(recovered), "complete": .flag(complete),
            ]
            if !complete { details["missing"] = .object(missing) }
            let notice = Notice(
                .recovered,
                message: complete
                    ? "recovered \(count) events of the outage from \(summary.from) to \(summary.through) (Unix ms), each flagged \"_r\":1"
                    : "recovered \(count) events of the outage from \(summary.from) to \(summary.through) (Unix ms); incomplete: see missing",
                details: details)
            _ = yield(HubDelivery(replay: [wire.render(notice)]), count: 0, to: held.subscriber)
            told.append(held.subscriber)
        }
        tell(told)
    }

    /// An outage longer than the fill covers: counted, its gaps given up (the notice was all).
    public func noteFillSkipped(generation: Int) {
        gapLedger.counts.skipped += 1
        finishFill(generation: generation)
    }

    /// The gap fills since start.
    public var gapFillStatistics: GapFillCounts { gapLedger.counts }

    /// A fill is over without a summary (skipped, cancelled, or with nothing to ask for): the gaps of
    /// request `generation` and earlier are settled.
    public func finishFill(generation: Int) {
        _ = settle(through: generation)
    }

    /// The request generation of the latest recovery (a cluster node names it in its fill request).
    public var latestFillGeneration: Int { gapLedger.generation }

    /// Settles the gaps of requests up to `generation`, delivering what they held; returns them per topic.
    private func settle(through generation: Int) -> [Topic: [PendingGap]] {
        let (settled, released) = gapLedger.settle(through: generation)
        pass(released)
        return settled
    }
}
