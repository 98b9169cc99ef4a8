import NIOCore
import PolygonWire

/// How much of a market's recent events the hub keeps for clients that come back. Value type, `Sendable`.
public struct HistoryLimits: Sendable, Equatable {
    /// Events kept per topic (a topic resumes at most this far back).
    public var eventsPerTopic: Int
    /// How long an event is kept.
    public var maxAge: Duration
    /// Memory the history may take, counted as each event's bytes plus ``EventHistory/overheadPerEvent``;
    /// past it the oldest events go first, whatever their topic.
    public var memoryBytes: Int
    /// The most events one resume may replay; a resume that would need more gets `gap` for its largest
    /// topics instead (never a partial replay of a topic).
    public var eventsPerResume: Int

    public init(eventsPerTopic: Int = 10_000, maxAge: Duration = .seconds(300), memoryBytes: Int = 256 << 20, eventsPerResume: Int = 100_000) {
        self.eventsPerTopic = eventsPerTopic
        self.maxAge = maxAge
        self.memoryBytes = memoryBytes
        self.eventsPerResume = eventsPerResume
    }
}

/// One market's recent events in arrival order, and the positions the hub gives each new event.
///
/// Owned by the hub and confined to it (not `Sendable`). Every event gets the next market sequence and
/// the next sequence of its topic; both are contiguous and start at 1 in each epoch. The events are held
/// once, in one ring in arrival order (a slot per market sequence), and each topic keeps the market
/// sequences of its own events in a ring of its own, so a topic's position finds its place in O(1) and a
/// wildcard's in O(1) too. Eviction: a topic past ``HistoryLimits/eventsPerTopic`` loses its oldest
/// (the slot keeps its place but lets go of the bytes); the whole history past its memory or age bound
/// loses its oldest slots, whatever their topic. What was evicted is remembered per topic and per event
/// type as the highest market sequence lost, which is what tells whether a resume can be whole.
final class EventHistory {
    /// Bookkeeping counted per event beside its bytes (its slot, its place in its topic's ring, the
    /// share of its message's buffer header).
    static let overheadPerEvent = 96

    /// One event's slot in arrival order.
    struct Slot {
        let topic: TopicLine
        let topicSequence: UInt64
        /// Wall time it arrived, Unix ms.
        let arrivedAt: Int64
        /// `nil` once its topic evicted it.
        var event: MarketEvent?
    }

    /// One topic's line: its next sequence and the market sequences of its events still held.
    final class TopicLine {
        let topic: Topic
        /// The sequence the next event of the topic gets.
        var nextSequence: UInt64 = 1
        /// Market sequences of its held events, oldest first; the first has topic sequence `firstSequence`.
        var held = CircularBuffer<UInt64>()
        var firstSequence: UInt64 = 1
        /// The highest market sequence of this topic that was evicted (0: none), and when it had arrived.
        var evictedThrough: UInt64 = 0
        var evictedArrival: Int64 = .min

        init(topic: Topic) { self.topic = topic }
    }

    let epoch: String
    var limits: HistoryLimits
    private var slots = CircularBuffer<Slot>()
    /// The market sequence of `slots.first`.
    private var firstSlotSequence: UInt64 = 1
    /// The sequence the next event of the market gets.
    private(set) var nextMarketSequence: UInt64 = 1
    private var lines: [Topic: TopicLine] = [:]
    /// Per event type, the highest market sequence of that type that was evicted.
    private var typeEvictedThrough: [String: UInt64] = [:]
    private var typeEvictedArrival: [String: Int64] = [:]
    /// Memory counted (``overheadPerEvent`` per event plus its bytes).
    private(set) var memory = 0
    /// Events held (slots whose bytes are still here).
    private(set) var eventCount = 0

    init(limits: HistoryLimits, epoch: String = EventPosition.newEpoch()) {
        self.limits = limits
        self.epoch = epoch
    }

    /// The positions the next events get (one per event, in order), without keeping them yet.
    func assign(_ events: [MarketEvent]) -> [EventPosition] {
        var positions: [EventPosition] = []
        positions.reserveCapacity(events.count)
        var market = nextMarketSequence
        // A topic seen twice in one publish gets two consecutive sequences.
        var pendingTopic: [Topic: UInt64] = [:]
        for event in events {
            let topic = event.topic
            let next = pendingTopic[topic] ?? lines[topic]?.nextSequence ?? 1
            pendingTopic[topic] = next + 1
            positions.append(EventPosition(topic: next, market: market))
            market += 1
        }
        return positions
    }

    /// Keeps stamped events (each with the positions ``assign(_:)`` gave, in order), then evicts what
    /// the limits no longer allow.
    func append(_ events: [MarketEvent], positions: [EventPosition], at now: Int64) {
        for index in events.indices {
            let event = events[index]
            let position = positions[index]
            let topic = event.topic
            let line: TopicLine
            if let existing = lines[topic] {
                line = existing
            } else {
                line = TopicLine(topic: topic)
                lines[topic] = line
            }
            line.nextSequence = position.topic + 1
            if line.held.isEmpty { line.firstSequence = position.topic }
            line.held.append(position.market)
            slots.append(Slot(topic: line, topicSequence: position.topic, arrivedAt: now, event: event))
            nextMarketSequence = position.market + 1
            memory += event.bytes.readableBytes + Self.overheadPerEvent
            eventCount += 1
            if line.held.count > limits.eventsPerTopic { evictOldest(of: line) }
        }
        evict(now: now)
    }

    /// Drops the oldest slots while the history is past its memory bound or older than its age bound.
    func evict(now: Int64) {
        let oldestKept = now - limits.maxAge.milliseconds
        while let first = slots.first, memory > limits.memoryBytes || first.arrivedAt < oldestKept {
            let slot = slots.removeFirst()
            let sequence = firstSlotSequence
            firstSlotSequence += 1
            guard let event = slot.event else { continue }
            // Its topic's oldest held event is this one (a topic's ring is in arrival order too).
            let line = slot.topic
            if line.held.first == sequence {
                line.held.removeFirst()
                line.firstSequence += 1
            }
            forget(event, sequence: sequence, arrivedAt: slot.arrivedAt, line: line)
        }
    }

    private func evictOldest(of line: TopicLine) {
        let sequence = line.held.removeFirst()
        line.firstSequence += 1
        let index = Int(sequence - firstSlotSequence)
        guard index >= 0, index < slots.count else { return }
        let position = slots.index(slots.startIndex, offsetBy: index)
        guard let event = slots[position].event else { return }
        slots[position].event = nil
        forget(event, sequence: sequence, arrivedAt: slots[position].arrivedAt, line: line)
    }

    private func forget(_ event: MarketEvent, sequence: UInt64, arrivedAt: Int64, line: TopicLine) {
        memory -= event.bytes.readableBytes + Self.overheadPerEvent
        eventCount -= 1
        line.evictedThrough = max(line.evictedThrough, sequence)
        line.evictedArrival = max(line.evictedArrival, arrivedAt)
        let type = line.topic.eventType
        typeEvictedThrough[type] = max(typeEvictedThrough[type] ?? 0, sequence)
        typeEvictedArrival[type] = max(typeEvictedArrival[type] ?? .min, arrivedAt)
    }

    // MARK: reading

    /// What a topic missed after a position: every held event after it, or why that cannot be whole.
    enum Missed {
        /// The events, oldest first (possibly none).
        case events([MarketEvent])
        /// Some of them are no longer held: `from ... through` names the missing range in the position's
        /// own numbering (topic sequences for `.topic`, market sequences otherwise).
        case gap(from: UInt64, through: UInt64, unit: GapUnit, reason: String)
    }

    /// What a gap's range counts.
    enum GapUnit: String {
        case topicSequence = "topic_sequence"
        case marketSequence = "market_sequence"
        case unixMilliseconds = "unix_ms"
    }

    /// Where a client stands on one topic.
    enum Since {
        /// The topic sequence of the last event it has (ticker topics).
        case topic(UInt64)
        /// The market sequence of the last event it has.
        case market(UInt64)
        /// It wants every event that arrived at or after this Unix ms.
        case time(Int64)
    }

    /// The market sequence of the last event that arrived before `time` (Unix ms): a time resume starts
    /// after it. When nothing held is that old, the sequence before the oldest held slot.
    func marketSequence(before time: Int64) -> UInt64 {
        // Slots are in arrival order, so their times do not decrease: binary search.
        var low = 0
        var high = slots.count
        while low < high {
            let middle = (low + high) / 2
            if slots[slots.index(slots.startIndex, offsetBy: middle)].arrivedAt < time { low = middle + 1 } else { high = middle }
        }
        return firstSlotSequence + UInt64(low) - 1
    }

    /// The events of `topic` after where the client stands (a wildcard takes `.market` or `.time`).
    func missed(_ topic: Topic, since: Since) -> Missed {
        let ahead = "the position is ahead of this relay's history"
        let lost = "no longer held"
        // Market-ordered positions: the last one the client has, and whether what was evicted is past it.
        let after: UInt64
        let evictedSequence = topic.isWildcard ? typeEvictedThrough[topic.eventType] ?? 0 : lines[topic]?.evictedThrough ?? 0
        switch since {
        case .topic(let position):
            guard !topic.isWildcard else { return missed(topic, since: .market(position)) }
            guard let line = lines[topic] else {
                return position == 0 ? .events([]) : .gap(from: 1, through: position, unit: .topicSequence, reason: ahead)
            }
            guard position < line.nextSequence else { return .gap(from: line.nextSequence, through: position, unit: .topicSequence, reason: ahead) }
            guard position + 1 >= line.firstSequence else {
                return .gap(from: position + 1, through: line.firstSequence - 1, unit: .topicSequence, reason: lost)
            }
            return .events(events(of: line, fromOffset: Int(position + 1 - line.firstSequence)))
        case .market(let position):
            guard position < nextMarketSequence else {
                return .gap(from: nextMarketSequence, through: position, unit: .marketSequence, reason: ahead)
            }
            guard evictedSequence <= position else {
                return .gap(from: position + 1, through: evictedSequence, unit: .marketSequence, reason: lost)
            }
            after = position
        case .time(let time):
            after = marketSequence(before: time)
            let evictedAt = topic.isWildcard ? typeEvictedArrival[topic.eventType] ?? .min : lines[topic]?.evictedArrival ?? .min
            guard evictedAt < time else {
                return .gap(from: UInt64(max(time, 0)), through: UInt64(max(evictedAt, 0)), unit: .unixMilliseconds, reason: lost)
            }
        }
        if topic.isWildcard {
            var events: [MarketEvent] = []
            var sequence = max(after + 1, firstSlotSequence)
            while sequence < nextMarketSequence {
                if let slot = slot(at: sequence), slot.topic.topic.eventType == topic.eventType, let event = slot.event { events.append(event) }
                sequence += 1
            }
            return .events(events)
        }
        guard let line = lines[topic] else { return .events([]) }
        // Its held market sequences are in order: the first one past `after`.
        var low = 0
        var high = line.held.count
        while low < high {
            let middle = (low + high) / 2
            if line.held[line.held.index(line.held.startIndex, offsetBy: middle)] <= after { low = middle + 1 } else { high = middle }
        }
        return .events(events(of: line, fromOffset: low))
    }

    private func events(of line: TopicLine, fromOffset first: Int) -> [MarketEvent] {
        var events: [MarketEvent] = []
        events.reserveCapacity(max(line.held.count - first, 0))
        var index = line.held.index(line.held.startIndex, offsetBy: first)
        while index != line.held.endIndex {
            if let event = slot(at: line.held[index])?.event { events.append(event) }
            index = line.held.index(after: index)
        }
        return events
    }

    private func slot(at sequence: UInt64) -> Slot? {
        guard sequence >= firstSlotSequence else { return nil }
        let offset = Int(sequence - firstSlotSequence)
        guard offset < slots.count else { return nil }
        return slots[slots.index(slots.startIndex, offsetBy: offset)]
    }

    /// The topic sequence of a topic's newest event (0: none yet).
    func lastSequence(of topic: Topic) -> UInt64 { (lines[topic]?.nextSequence ?? 1) - 1 }

    /// Topics with a line (seen at least once this epoch).
    var topicCount: Int { lines.count }
}

extension Duration {
    /// Whole milliseconds.
    var milliseconds: Int64 {
        components.seconds * 1000 + components.attoseconds / 1_000_000_000_000_000
    }
}
