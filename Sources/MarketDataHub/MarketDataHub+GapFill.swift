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

/// One outage a topic's holders have not had filled yet: the events they may still be given lie after
/// `after` (the last event the hub had, raised as recovered ones are delivered) and before `before`
/// (the first live one after the outage). Value type.
struct PendingGap {
    var generation: Int
    var from: Int64
    var through: Int64
    var after: MarketEvent?
    var before: MarketEvent?
    /// Recovered events delivered into this gap.
    var delivered = 0
    /// Recovered events that fall after `after` while `before` is not known yet: held until the topic's
    /// first live event bounds them (a trade stamped before the fill's window ends can still be on its
    /// way live) or the fill ends, so that none arrives both recovered and live.
    var held: [MarketEvent] = []
}

extension MarketDataHub {
    /// The most outages a topic keeps waiting for a fill; an older one is given up (its holders had the
    /// notice), as is one older than ``pendingGapLifetime`` (the fill's longest window by default: a
    /// union reaching further back would only be skipped, taking the new outage with it).
    static let pendingGapsPerTopic = 8
    static let pendingGapLifetime: Int64 = 900_000

    /// Asks `handler` to fill each outage once the upstream is back (the relay's gap fill); `nil` stops it.
    public func setRecoveryHandler(_ handler: (@Sendable (GapFillRequest) -> Void)?) {
        recoveryHandler = handler
        if handler == nil { finishFill(generation: fillGeneration) }
    }

    /// The upstream is back: each topic held by name gets a pending gap, watched for its first live
    /// event, and the handler gets one request covering every gap not filled yet (an earlier outage's
    /// fill cut short, e.g. by a cluster failover, is taken up for the union of both windows).
    func requestFill(from: Int64, through: Int64) {
        guard let recoveryHandler else { return }
        fillGeneration += 1
        // Every topic's old outages go, held or not (a topic nobody holds keeps none for long).
        for (topic, gaps) in pendingGaps {
            // What a given-up gap still held goes out first (its topic has had no live event since).
            _ = release(topic, gaps.filter { through - $0.through >= Self.pendingGapLifetime })
            let kept = gaps.filter { through - $0.through < Self.pendingGapLifetime }
            pendingGaps[topic] = kept.isEmpty ? nil : kept
        }
        recoveredThrough = recoveredThrough.filter { entries[$0.key].map { !$0.subscribers.isEmpty } ?? false }
        var held: [GapFillRequest.Held] = []
        var earliest = from
        for (topic, entry) in entries where !entry.subscribers.isEmpty {
            var gaps = pendingGaps[topic] ?? []
            // After what the topic's holders have or are held for them: its last live event, or a
            // recovered one past it (a quiet topic's last live event can be older than what an earlier
            // fill brought, delivered or held in a gap still open).
            let order = wire.recoveryOrder(of: topic.eventType)
            let candidates = [entry.last, recoveredThrough[topic]] + gaps.filter { $0.before == nil }.map(\.after)
            let after = candidates.compactMap { $0 }.max { (wire.orderValue(order, of: $0) ?? .min) < (wire.orderValue(order, of: $1) ?? .min) }
            gaps.append(PendingGap(generation: fillGeneration, from: from, through: through, after: after, before: nil))
            if gaps.count > Self.pendingGapsPerTopic {
                _ = release(topic, Array(gaps.prefix(gaps.count - Self.pendingGapsPerTopic)))
                gaps.removeFirst(gaps.count - Self.pendingGapsPerTopic)
            }
            pendingGaps[topic] = gaps
            fillWatch.insert(topic)
            earliest = Swift.min(earliest, gaps[0].from)
            held.append(GapFillRequest.Held(topic: topic, holders: entry.subscribers.count, lastBefore: gaps[0].after))
        }
        held.sort { ($0.holders, $1.topic) > ($1.holders, $0.topic) }
        recoveryHandler(GapFillRequest(from: earliest, through: through, topics: held, generation: fillGeneration))
    }

    /// A topic's first live event after an outage closes its open gaps: the recovered events held for
    /// them that lie before it are delivered (ahead of it), the rest were on their way live.
    func watchFirstLive(_ events: [MarketEvent]) {
        for event in events where fillWatch.contains(event.topic) {
            fillWatch.remove(event.topic)
            guard var gaps = pendingGaps[event.topic] else { continue }
            let first = event.compacted()
            for index in gaps.indices where gaps[index].before == nil { gaps[index].before = first }
            pendingGaps[event.topic] = release(event.topic, gaps, before: wire.orderValue(wire.recoveryOrder(of: event.topic.eventType), of: first))
        }
    }

    /// The most recovered events the hub holds for topics whose first live event has not come (a fill
    /// brings at most its settings' events; a cluster node's come from NATS). Past it, what is held is
    /// delivered at once, as it would be without a bound for it.
    static let heldRecoveredLimit = 200_000

    /// Delivers the held recovered events of `topic`'s gaps in `gaps` now, those ordered before `bound`
    /// when there is one (the rest were on their way live); returns the gaps emptied.
    private func release(_ topic: Topic, _ gaps: [PendingGap], before bound: Int64? = nil) -> [PendingGap] {
        let order = wire.recoveryOrder(of: topic.eventType)
        var gaps = gaps
        var passed: [MarketEvent] = []
        for index in gaps.indices where !gaps[index].held.isEmpty {
            let held = gaps[index].held
            heldRecovered -= held.count
            gaps[index].held = []
            let kept = bound.map { bound in held.filter { (wire.orderValue(order, of: $0) ?? .max) < bound } } ?? held
            gaps[index].delivered += kept.count
            passed += kept
        }
        pass(topic, passed)
        return gaps
    }

    /// Recovered events of `topic` to its named holders now, as a replay outside their buffer's bound,
    /// with positions and into the history (on a cluster node they have the leader's already).
    private func pass(_ topic: Topic, _ events: [MarketEvent]) {
        guard !events.isEmpty else { return }
        let order = wire.recoveryOrder(of: topic.eventType)
        if let newest = events.max(by: { (wire.orderValue(order, of: $0) ?? .min) < (wire.orderValue(order, of: $1) ?? .min) }),
            (wire.orderValue(order, of: newest) ?? .min) > (recoveredThrough[topic].flatMap { wire.orderValue(order, of: $0) } ?? .min)
        {
            recoveredThrough[topic] = newest.compacted()
        }
        var events = events
        if let history, !adoptsPositions {
            events = history.keep(events, at: WallClock.nowMilliseconds())
            metrics.record(history)
        }
        let holders = entries[topic]?.subscribers ?? []
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
        guard var gaps = pendingGaps[topic], !gaps.isEmpty else { return 0 }
        var bounds = gaps.map { gap in (gap.after.flatMap { wire.orderValue(order, of: $0) } ?? .min, gap.before.flatMap { wire.orderValue(order, of: $0) } ?? .max) }
        var raised: [Int: MarketEvent] = [:]
        var now: [MarketEvent] = []
        var accepted = 0
        for event in events {
            guard let value = wire.orderValue(order, of: event),
                let index = bounds.firstIndex(where: { $0.0 < value && value < $0.1 })
            else { continue }
            bounds[index].0 = value
            raised[index] = event
            accepted += 1
            if gaps[index].before == nil {
                // Its own bytes: a held event must not hold a whole NATS message or REST page alive.
                gaps[index].held.append(event.compacted())
                heldRecovered += 1
            } else {
                gaps[index].delivered += 1
                now.append(event)
            }
        }
        for (index, event) in raised { gaps[index].after = event.compacted() }
        // Oldest first: the gaps whose first live event came lie before those still open.
        pass(topic, now)
        if heldRecovered > Self.heldRecoveredLimit {
            for (held, open) in pendingGaps where held != topic { pendingGaps[held] = release(held, open) }
            gaps = release(topic, gaps)
        }
        pendingGaps[topic] = gaps
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
        gapFillCounts.fills += 1
        if missingCount > 0 { gapFillCounts.incomplete += 1 }
        gapFillCounts.recovered += events
        gapFillCounts.last = GapFillCounts.Last(
            from: summary.from, through: summary.through, endedAt: WallClock.nowMilliseconds(), events: events,
            topics: covered.count - missingCount, complete: missingCount == 0, missing: missingCount)
        var perSubscriber: [SubscriberID: (subscriber: Subscriber, topics: [Topic])] = [:]
        for topic in covered {
            for subscriber in entries[topic]?.subscribers ?? [] where !subscriber.parked {
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
        gapFillCounts.skipped += 1
        finishFill(generation: generation)
    }

    /// The gap fills since start.
    public var gapFillStatistics: GapFillCounts { gapFillCounts }

    /// A fill is over without a summary (skipped, cancelled, or with nothing to ask for): the gaps of
    /// request `generation` and earlier are settled.
    public func finishFill(generation: Int) {
        _ = settle(through: generation)
    }

    /// The request generation of the latest recovery (a cluster node names it in its fill request).
    public var latestFillGeneration: Int { fillGeneration }

    /// Removes the gaps of requests up to `generation`; returns them per topic.
    private func settle(through generation: Int) -> [Topic: [PendingGap]] {
        var settled: [Topic: [PendingGap]] = [:]
        for (topic, gaps) in pendingGaps {
            let (done, left) = (gaps.filter { $0.generation <= generation }, gaps.filter { $0.generation > generation })
            guard !done.isEmpty else { continue }
            // The fill is over and the topic stayed quiet: what it brought is delivered now.
            settled[topic] = release(topic, done)
            if left.isEmpty {
                pendingGaps[topic] = nil
                fillWatch.remove(topic)
            } else {
                pendingGaps[topic] = left
            }
        }
        return settled
    }
}
