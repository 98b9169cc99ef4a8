import NIOCore
import PolygonWire

/// After an upstream outage: the window no event arrived in, and the topics subscribers hold by name
/// (most held first), each with the last event the relay had of it. `Sendable`.
public struct GapFillRequest: Sendable {
    public struct Held: Sendable {
        public let topic: Topic
        /// Subscribers holding it by name.
        public let holders: Int
        /// Its last event before the outage, if the relay had one.
        public let lastBefore: MarketEvent?
    }

    /// Unix ms: the last event before the outage (or when it was lost), and the first after it.
    public let from: Int64
    public let through: Int64
    public let topics: [Held]
    /// Tells a fill's deliveries from a later outage's.
    public let generation: Int
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

/// The field of an event that orders it against the ones the relay received live: Polygon's `q` for
/// trades and quotes (rising per ticker), the bar's start `s`, or the time `t` where there is neither.
public enum RecoveryOrder: String, Sendable {
    case sequence = "q"
    case barStart = "s"
    case time = "t"

    /// The integer value of this field in `event`'s JSON, if present.
    public func value(of event: MarketEvent) -> Int64? {
        let view = event.bytes.readableBytesView
        let key = Array("\"\(rawValue)\":".utf8)
        var index = view.startIndex
        while let found = view[index...].firstRange(of: key)?.lowerBound {
            // A key, not the tail of a longer one or a string's content: `{` or `,` comes before it.
            let before = found > view.startIndex ? view[view.index(before: found)] : UInt8(ascii: "{")
            var position = found + key.count
            if before == UInt8(ascii: "{") || before == UInt8(ascii: ",") {
                var negative = false
                if position < view.endIndex, view[position] == UInt8(ascii: "-") {
                    negative = true
                    position += 1
                }
                var value: Int64 = 0
                var digits = 0
                while position < view.endIndex, (UInt8(ascii: "0")...UInt8(ascii: "9")).contains(view[position]), digits < 18 {
                    value = value * 10 + Int64(view[position] - UInt8(ascii: "0"))
                    position += 1
                    digits += 1
                }
                if digits > 0 { return negative ? -value : value }
            }
            index = found + 1
        }
        return nil
    }
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

extension MarketDataHub {
    /// Asks `handler` to fill each outage once the upstream is back (the relay's gap fill); `nil` stops it.
    public func setRecoveryHandler(_ handler: (@Sendable (GapFillRequest) -> Void)?) {
        recoveryHandler = handler
        if handler == nil { finishFill(generation: fillGeneration) }
    }

    /// The upstream is back: the handler gets the window and every topic held by name, and each of them
    /// is watched for its first live event.
    func requestFill(from: Int64, through: Int64) {
        guard let recoveryHandler else { return }
        fillGeneration += 1
        var held: [GapFillRequest.Held] = []
        for (topic, entry) in entries where !entry.subscribers.isEmpty {
            held.append(GapFillRequest.Held(topic: topic, holders: entry.subscribers.count, lastBefore: entry.last))
        }
        held.sort { ($0.holders, $1.topic) > ($1.holders, $0.topic) }
        fillWatch = Set(held.map(\.topic))
        firstLive = [:]
        recoveryHandler(GapFillRequest(from: from, through: through, topics: held, generation: fillGeneration))
    }

    func watchFirstLive(_ events: [MarketEvent]) {
        for event in events where fillWatch.contains(event.topic) {
            fillWatch.remove(event.topic)
            firstLive[event.topic] = event.compacted()
        }
    }

    /// Delivers a topic's recovered events (oldest first, each already flagged) to the subscribers that
    /// hold it by name, as a replay outside their buffer's bound, leaving out any at or past the first
    /// event that came live after the outage. They get positions and enter the history like any event;
    /// the topic's last value stays the live one. Returns how many were delivered.
    public func deliverRecovered(_ topic: Topic, _ events: [MarketEvent], order: RecoveryOrder, generation: Int) -> Int {
        var events = events
        if generation == fillGeneration, let live = firstLive[topic], let bound = order.value(of: live) {
            events = events.filter { (order.value(of: $0) ?? .min) < bound }
        }
        guard !events.isEmpty else { return 0 }
        if let history, !adoptsPositions {
            events = history.keep(events, at: WallClock.nowMilliseconds())
            metrics.record(history)
        }
        let holders = entries[topic]?.subscribers ?? []
        for subscriber in holders where !subscriber.parked {
            _ = yield(HubDelivery(replay: events), count: 0, to: subscriber)
        }
        tell(holders)
        return events.count
    }

    /// A fill is over: each holder of a topic it covered is told what was recovered and what is missing
    /// of its own topics (`recovered`, with `complete`).
    public func announceRecovered(_ summary: GapFillSummary, generation: Int) {
        finishFill(generation: generation)
        let events = summary.recovered.values.reduce(0, +)
        gapFillCounts.fills += 1
        if !summary.isComplete { gapFillCounts.incomplete += 1 }
        gapFillCounts.recovered += events
        gapFillCounts.last = GapFillCounts.Last(
            from: summary.from, through: summary.through, endedAt: WallClock.nowMilliseconds(), events: events,
            topics: summary.recovered.count, complete: summary.isComplete, missing: summary.missing.count)
        var perSubscriber: [SubscriberID: (subscriber: Subscriber, topics: [Topic])] = [:]
        for topic in Set(summary.recovered.keys).union(summary.missing.keys) {
            for subscriber in entries[topic]?.subscribers ?? [] where !subscriber.parked {
                perSubscriber[subscriber.id, default: (subscriber, [])].topics.append(topic)
            }
        }
        var told: [Subscriber] = []
        for (_, held) in perSubscriber {
            let topics = held.topics.sorted()
            let recovered = topics.compactMap { topic in summary.recovered[topic].map { "\(StatusMessage.quoted(topic.description)):\($0)" } }
            let missing = topics.compactMap { topic in
                summary.missing[topic].map { "\(StatusMessage.quoted(topic.description)):\(StatusMessage.quoted($0))" }
            }
            let complete = missing.isEmpty
            let count = topics.reduce(0) { $0 + (summary.recovered[$1] ?? 0) }
            var fields = ["topics": "{" + recovered.joined(separator: ",") + "}", "complete": complete ? "true" : "false"]
            if !complete { fields["missing"] = "{" + missing.joined(separator: ",") + "}" }
            let status = StatusMessage(
                status: StatusMessage.Kind.recovered,
                message: complete
                    ? "recovered \(count) events of the outage from \(summary.from) to \(summary.through) (Unix ms), each flagged \"_r\":1"
                    : "recovered \(count) events of the outage from \(summary.from) to \(summary.through) (Unix ms); incomplete: see missing",
                numbers: ["from": summary.from, "through": summary.through], fields: fields)
            _ = yield(HubDelivery(replay: [.notice(status)]), count: 0, to: held.subscriber)
            told.append(held.subscriber)
        }
        tell(told)
    }

    /// An outage longer than the fill covers: counted, nothing asked for, nothing watched any more.
    public func noteFillSkipped(generation: Int) {
        gapFillCounts.skipped += 1
        finishFill(generation: generation)
    }

    /// The gap fills since start.
    public var gapFillStatistics: GapFillCounts { gapFillCounts }

    /// A fill is over (announced, skipped, cancelled, or with nothing to ask for): its topics are no
    /// longer watched for their first live event.
    public func finishFill(generation: Int) {
        guard generation == fillGeneration else { return }
        fillWatch = []
        firstLive = [:]
    }
}
