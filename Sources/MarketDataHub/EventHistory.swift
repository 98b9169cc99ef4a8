import NIOCore
import MarketCore

/// How much of a market's recent events the hub keeps for clients that come back. Value type, `Sendable`.
public struct HistoryLimits: Sendable, Equatable {
    /// Events kept per topic (a topic resumes at most this far back).
    public var eventsPerTopic: Int
    /// How long an event is kept.
    public var maxAge: Duration
    /// Memory the history may take, counted as the process holds it: every buffer its events are slices
    /// of, whole, while any of them is kept, plus ``EventHistory/overheadPerEvent`` per event; past it
    /// the oldest events go first, whatever their topic.
    public var memoryBytes: Int
    /// The most events one resume may replay; a resume that would need more gets `gap` for its largest
    /// topics instead (never a partial replay of a topic).
    public var eventsPerResume: Int
    /// What one client key's connections together are replayed a minute, in resumes' bounds
    /// (``eventsPerResume`` each): each connection has one bound a minute of its own, and a key's many
    /// connections share this.
    public var resumesPerKey: Int

    public init(
        eventsPerTopic: Int = 10_000, maxAge: Duration = .seconds(300), memoryBytes: Int = 64 << 20, eventsPerResume: Int = 100_000,
        resumesPerKey: Int = 10
    ) {
        self.eventsPerTopic = eventsPerTopic
        self.maxAge = maxAge
        self.memoryBytes = memoryBytes
        self.eventsPerResume = eventsPerResume
        self.resumesPerKey = resumesPerKey
    }
}

/// One market's recent events in arrival order, and the positions the hub gives each new event.
///
/// Owned by the hub and confined to it (not `Sendable`). Every event has a market sequence and a
/// sequence of its topic, both contiguous from 1 in each epoch: a single relay assigns them
/// (``assign(_:)``), a cluster node adopts the leader's (written in the bytes). The events are held once,
/// in one ring in arrival order, and each topic keeps the market sequences of its own events in a ring of
/// its own. Eviction: a topic past ``HistoryLimits/eventsPerTopic`` loses its oldest (the slot lets go of
/// the bytes); the whole history past its memory or age bound loses its oldest slots, whatever their topic.
///
/// What decides whether a resume can be whole: per topic and per event type, the highest market sequence
/// evicted, and the market sequence from which every event has been received ("whole from"). A topic is
/// whole only while the relay was asked for it: when it stops being wanted (nobody held it, so the upstream
/// or NATS stopped sending it) it is not received (``notReceived``) until it is wanted again; when the
/// upstream is lost, or a cluster node sees a topic sequence skip, its whole run starts again at the next
/// event; so a resume from before then is a `gap`. A restart (``restarted(after:stoppedAt:now:leap:)``)
/// keeps the previous run's events and tells the time between as a `gap` of its own; a restart and an
/// upstream loss each take a market sequence of their own (no event has it), so a client that stood just
/// before one is never taken for one that came after it.
final class EventHistory {
    /// Bookkeeping counted per event beside the buffer it is a slice of: its slot (``slotBytes``) and
    /// its place in its topic's ring (``ringBytes``).
    static let overheadPerEvent = slotBytes + ringBytes
    /// A slot (``Slot``, 128 bytes with its optional event) and its place in its event type's ring (16):
    /// counted until it leaves the arrival ring, also when its topic let its event go earlier (the slot
    /// stays, empty, until then).
    static let slotBytes = 144
    /// A place in a topic's ring (8 bytes, in a ring of a power of two).
    static let ringBytes = 16

    /// What a buffer costs beside its capacity: its storage object and two allocations' headers.
    static let overheadPerBuffer = 96

    /// One buffer the history's events are slices of (a publish's stamped events share a few). Counted
    /// whole, its capacity and its header, from the first event of it kept to the last one let go:
    /// that is what the process holds, however few of its events are left, so the memory bound holds in
    /// the process's resident memory, not only in the bytes of the events.
    final class Buffer {
        let cost: Int
        var events = 0

        init(cost: Int) { self.cost = cost }
    }

    /// One event's slot in arrival order.
    struct Slot {
        let sequence: UInt64
        let topic: TopicLine
        let topicSequence: UInt64
        /// Wall time it arrived, Unix ms.
        let arrivedAt: Int64
        /// The buffer its bytes lie in.
        let buffer: Buffer
        /// `nil` once its topic evicted it.
        var event: MarketEvent?
    }

    /// A topic's (or type's) whole run: every event from market sequence `sequence` (received from
    /// `since`) until `until` (Unix ms) was received.
    struct Run {
        let sequence: UInt64
        let since: Int64
        let until: Int64
    }

    /// One topic's line: its next sequence and the market sequences of its events still held.
    final class TopicLine {
        let topic: Topic
        /// Its event type's line (each topic's events are its type's too).
        let type: TypeLine
        /// The sequence the next event of the topic gets (or, adopted, is expected to have).
        var nextSequence: UInt64 = 1
        /// Market sequences of its held events, oldest first, contiguous in topic sequence from
        /// `firstSequence` (but for a ``leap``).
        var held = CircularBuffer<UInt64>()
        var firstSequence: UInt64 = 1
        /// The highest market sequence of this topic that was evicted (0: none), and when it had arrived.
        var evictedThrough: UInt64 = 0
        var evictedArrival: Int64 = .min
        /// Every event of this topic from this market sequence on was received (1: all of the epoch's),
        /// and the wall time from which that holds, as last set for this topic
        /// (``EventHistory/notReceived`` while the relay does not receive the topic); an interruption of
        /// every topic since (``EventHistory/interruptions``, past `wholeSetIn`) stands in for them
        /// (``EventHistory/whole(_:)`` reads them, ``EventHistory/setWhole(_:from:since:)`` sets them).
        fileprivate var ownWholeFrom: UInt64 = 1
        fileprivate var ownWholeSince: Int64 = .min
        fileprivate var wholeSetIn: UInt64
        /// Whole from, as it stood when it was last received, and until when (Unix ms): at a restart,
        /// or when it stopped being wanted (the clients of a stopping relay leave before it stops).
        var lastRun: Run?
        /// ``lastRun`` as it stood when the run before a restart stopped (`nil`: not received then).
        var beforeRestart: Run?

        /// Its topic sequences skip from `after` to `to` (a restart after a crash: the numbers the
        /// crashed run may have given and not recorded are never given again).
        var leap: (after: UInt64, to: UInt64)?

        /// Let go of by the history (``EventHistory/dropIfIdle(_:)``): a new line stands for its topic.
        var isDropped = false
        /// The ``EventHistory/assign(_:)`` call that last gave it a sequence, and the next one it gives in
        /// that call (a topic seen twice in one publish gets two consecutive sequences).
        var assignRound: UInt64 = 0
        var assignNext: UInt64 = 0

        init(topic: Topic, type: TypeLine, interruptions: UInt64) {
            self.topic = topic
            self.type = type
            wholeSetIn = interruptions
        }

        /// Where topic sequence `sequence` (from `firstSequence`, below `nextSequence`) lies in `held`;
        /// `nil`: in a leap's hole (no event of this history has it).
        func offset(of sequence: UInt64) -> Int? {
            guard let leap, firstSequence <= leap.after, sequence > leap.after else { return Int(sequence - firstSequence) }
            guard sequence >= leap.to else { return nil }
            return Int(sequence - firstSequence - (leap.to - leap.after - 1))
        }

        /// The oldest held event was let go.
        func advanceFirst() {
            firstSequence += 1
            if let leap, firstSequence == leap.after + 1 {
                firstSequence = leap.to
                self.leap = nil
            }
        }
    }

    /// One event type's line: what a wildcard of the type resumes from. Every topic line of the type holds
    /// it, so an event reaches it without a lookup.
    final class TypeLine {
        /// The market sequences of the type's slots, oldest first (emptied ones too, until their slot
        /// leaves): a wildcard's resume reads its own type's events, not every slot after its position.
        var slots = CircularBuffer<UInt64>()
        /// The highest market sequence of the type that was evicted (0: none), and when it had arrived.
        var evictedThrough: UInt64 = 0
        var evictedArrival: Int64 = .min
        /// Whole from (as for a topic line): every event of the type from then on was received. `nil`:
        /// never wholly received (a wildcard resume of it is a gap) unless the history is whole by default.
        var whole: (sequence: UInt64, since: Int64)?
        /// Its wildcard is wanted and its first event since has not arrived yet.
        var pending = false
        /// Its last whole run once its wildcard stopped being wanted, and as it stood at the restart.
        var lastRun: Run?
        var beforeRestart: Run?
    }

    /// Its epoch (empty while a cluster node has not yet been told the leader's).
    var epoch: String
    var limits: HistoryLimits
    /// In segments: its growth never copies what it holds (a doubling ring would stall the hub).
    private var slots = SegmentedQueue<Slot>()
    /// The event types seen or wanted, each once (a market has a handful).
    private var types: [String: TypeLine] = [:]
    /// The sequence the next event of the market gets (the newest seen, plus one).
    private(set) var nextMarketSequence: UInt64 = 1
    private var lines: [Topic: TopicLine] = [:]
    /// Whether a type is whole from the epoch's start until told otherwise (a single relay's upstream is
    /// asked for a wildcard only while one is wanted, so: no; kept for tests of the bare history).
    private let wholeByDefault: Bool
    /// The furthest one event's market sequence may leap past the newest kept: 2³² (twelve hours at
    /// 100,000 events a second).
    static let maxLeap: UInt64 = 1 << 32
    /// Events not kept because their position was out of range or leapt too far.
    private(set) var implausible = 0
    /// Events not kept because their market sequence came below the next one (a cluster node's: one
    /// the leader's numbers had passed, or every event after a forged leap).
    private(set) var outOfOrder = 0
    /// Events not kept because their market sequence leapt past what the leader had stamped
    /// (``leaderStamped(through:until:)``).
    private(set) var pastLeader = 0
    /// A cluster node's: the newest market sequence the lease said the leader had stamped in this epoch,
    /// how far past it an event may be, and until when (Unix ms) the word holds (``leaderStamped(through:until:)``).
    /// `nil`: not told (a single relay, or not yet).
    private(set) var leaderMark: (through: UInt64, margin: UInt64, until: Int64)?
    /// What the leader stamped between each of the last marks and the one before (at most 8).
    private var markSteps: [UInt64] = []
    /// The least an event may come past the leader's mark: the leader renews its lease every fifth of
    /// it and its upstream closes 3/5 of a lease after the last renewal, so the events it stamps past
    /// its last word are a few renewals' worth; 2²⁰ is 10 s at 100,000 events a second, and a gap fill
    /// of 100,000 events stamped at once after an outage (when the steps before were small) fits.
    static let minimumMarkMargin: UInt64 = 1 << 20
    /// Memory counted (``overheadPerEvent`` per event plus its bytes, ``overheadPerLine`` per topic
    /// line).
    private(set) var memory = 0
    /// Bookkeeping counted per topic line: its object (about 230 bytes as malloc holds it), its ring
    /// (16 places of 8 bytes and the storage's header at first), its place in the table.
    static let overheadPerLine = 448
    /// Tickers and wildcard types the relay is asked for now: a line of a topic that is neither, once
    /// it holds no event, is let go (distinct topics seen in an epoch would otherwise grow without bound).
    private var wantedTickers = Set<Topic>()
    private var wantedTypes = Set<String>()
    /// The newest market sequence, and its arrival, when a line was last let go (0: none yet). A topic
    /// with no line may have had events up to then: a resume from before is a gap, and a new line starts
    /// its topic sequence past every number the old one could have used.
    private var droppedThrough: UInt64 = 0
    /// The lines past which idle lines of tickers wanted only under a wildcard are let go, besides half the
    /// memory bound (``letGoOfIdleLines()``).
    private var idleLinesAbove = 0
    private var droppedArrival: Int64 = .min
    /// Events held (slots whose bytes are still here).
    private(set) var eventCount = 0

    /// The lease said the leader had stamped this epoch's events through `through` (read at each of its
    /// renewals): until `until` (Unix ms; a node whose lease reads fail hears no newer word, and an old
    /// one would refuse every event once the leader stamped past it) an event more than a margin past
    /// it is not kept. The margin is 8 times the most the leader stamped between two of the last 8
    /// marks (eight renewals at the highest rate of late), at least ``minimumMarkMargin``. A mark never
    /// goes back (a late read says less). Returns `false` when the history already holds an event past
    /// the new bound (one came before the first mark).
    func leaderStamped(through: UInt64, until: Int64) -> Bool {
        guard through <= EventPosition.maxSequence else { return true }
        if let mark = leaderMark {
            guard through >= mark.through else { return true }
            if through > mark.through {
                markSteps.append(min(through - mark.through, Self.maxLeap))
                if markSteps.count > 8 { markSteps.removeFirst() }
            }
        }
        leaderMark = (through, max(Self.minimumMarkMargin, (markSteps.max() ?? 0) * 8), until)
        guard let mark = leaderMark, nextMarketSequence > 1 else { return true }
        return nextMarketSequence - 1 <= mark.through || nextMarketSequence - 1 - mark.through <= mark.margin
    }

    /// The market sequence of the oldest slot held (the next one's when none is): what the history
    /// holds of the market starts there.
    var oldestSequence: UInt64 { slots.isEmpty ? nextMarketSequence : slots[0].sequence }

    /// The market sequence after which this history holds every event of `topic` it received: an
    /// archive is asked for what a resume missed through it, the memory answers after it.
    func archiveBoundary(of topic: Topic) -> UInt64 {
        let evicted = topic.isWildcard ? types[topic.eventType]?.evictedThrough ?? 0 : lines[topic]?.evictedThrough ?? droppedThrough
        return max(oldestSequence - 1, evicted)
    }

    /// Whether the history has a line of `topic` (it received the topic lately, or holds it now).
    func hasLine(_ topic: Topic) -> Bool { lines[topic] != nil }

    /// The reason of a gap whose events were let go (an archive may still have them).
    static let noLongerHeld = "no longer held"

    /// "Whole from" of a topic the relay does not receive now: no resume across this time is whole.
    static let notReceived = UInt64.max
    /// Interruptions of every topic so far (``interruptAll(now:marked:)``), and the last one's first
    /// market sequence and wall time.
    private var interruptions: UInt64 = 0
    private var lastInterruption: (sequence: UInt64, since: Int64) = (1, .min)

    /// Where the relay's previous run of this epoch stopped, once it went on from it (``restarted(after:stoppedAt:now:leap:)``).
    struct Restart {
        /// The market sequence the restart itself takes (no event has it): every event before it is the
        /// previous run's, every one after it this run's.
        let marker: UInt64
        /// When the previous run stopped and this one started (Unix ms): nothing was received between.
        let stoppedAt: Int64
        let startedAt: Int64
    }

    private(set) var restart: Restart?

    init(limits: HistoryLimits, epoch: String = EventPosition.newEpoch(), wholeByDefault: Bool = false) {
        self.limits = limits
        self.epoch = epoch
        self.wholeByDefault = wholeByDefault
    }

    /// Counts ``assign(_:)`` calls (``TopicLine/assignRound``).
    private var assignRound: UInt64 = 0

    /// The positions the next events get (one per event, in order), without keeping them yet, and each
    /// event's line as found (`nil`: its topic has none yet), so keeping them looks each topic up once.
    private func assign(_ events: [MarketEvent]) -> (positions: [EventPosition], lines: [TopicLine?]) {
        var positions: [EventPosition] = []
        positions.reserveCapacity(events.count)
        var found: [TopicLine?] = []
        found.reserveCapacity(events.count)
        assignRound += 1
        var market = nextMarketSequence
        // A topic seen twice in one publish gets two consecutive sequences: its line counts them, or
        // (a topic with no line yet) this table.
        var pendingNew: [Topic: UInt64] = [:]
        for event in events {
            let topic = event.topic
            let next: UInt64
            let line = lines[topic]
            if let line {
                next = line.assignRound == assignRound ? line.assignNext : line.nextSequence
                line.assignRound = assignRound
                line.assignNext = next + 1
            } else {
                next = pendingNew[topic] ?? firstTopicSequence
                pendingNew[topic] = next + 1
            }
            positions.append(EventPosition(topic: next, market: market))
            found.append(line)
            market += 1
        }
        return (positions, found)
    }

    /// Gives events the next positions, writes them into their bytes and keeps them; returns the stamped
    /// events (a single relay's: live ones, and a gap fill's recovered ones).
    func keep(_ events: [MarketEvent], at now: Int64) -> [MarketEvent] { keepPositioned(events, at: now).events }

    /// The same, with the positions given.
    func keepPositioned(_ events: [MarketEvent], at now: Int64) -> (events: [MarketEvent], positions: [EventPosition]) {
        let (positions, found) = assign(events)
        let stamped = EventPosition.stamp(events, positions)
        append(stamped, positions: positions, now: now, arrivals: nil, lines: found)
        return (stamped, positions)
    }

    /// Keeps stamped events with their positions (in order, market sequences rising), then evicts what
    /// the limits no longer allow. A topic sequence that skips (a cluster node that was not sent some)
    /// starts the topic's whole run again.
    /// Returns the topics whose run broke while this node held it whole (a topic sequence that skips
    /// forward): events of theirs never reached it, and their holders are to be told.
    @discardableResult
    func append(_ events: [MarketEvent], positions: [EventPosition], at now: Int64) -> [Topic] {
        append(events, positions: positions, now: now, arrivals: nil, lines: nil)
    }

    /// The same, each event with its own arrival (Unix ms: a previous run's, read back from its tape).
    func append(_ events: [MarketEvent], positions: [EventPosition], arrivals: [Int64]) {
        append(events, positions: positions, now: arrivals.max() ?? 0, arrivals: arrivals, lines: nil)
    }

    /// `found`: each event's line as ``assign(_:)`` found it, if it did (saves a lookup).
    @discardableResult
    private func append(_ events: [MarketEvent], positions: [EventPosition], now: Int64, arrivals: [Int64]?, lines found: [TopicLine?]?) -> [Topic] {
        var broken: [Topic] = []
        // The buffers of this call's events (a publish's share a few), by their storage.
        var buffers: [(storage: UnsafeMutableRawPointer, buffer: Buffer)] = []
        for index in events.indices {
            let event = events[index]
            let position = positions[index]
            guard position.market >= nextMarketSequence else {
                // Out of order: not kept (counted: after a forged leap every real event would be).
                outOfOrder += 1
                continue
            }
            // Positions come checked (``EventPosition/isPlausible``), so the arithmetic below cannot
            // overflow; a leap far past the history (a hostile publisher's) is not kept either, or
            // every later event would be "out of order".
            guard position.isPlausible, nextMarketSequence == 1 || position.market - nextMarketSequence < Self.maxLeap else {
                implausible += 1
                continue
            }
            // Past what the leader's lease vouches it stamped, by more than it can have stamped since: a
            // forged leap, which would make every real event after it "out of order" (not kept).
            if let mark = leaderMark, now <= mark.until, position.market > mark.through, position.market - mark.through > mark.margin {
                pastLeader += 1
                continue
            }
            let topic = event.topic
            let line: TopicLine
            if let existing = found?[index].flatMap({ $0.isDropped ? nil : $0 }) ?? lines[topic] {
                line = existing
                if position.topic != line.nextSequence {
                    if position.topic > line.nextSequence, whole(line).sequence <= (line.held.last ?? line.evictedThrough) { broken.append(topic) }
                    restart(line, at: position, now: now)
                }
            } else {
                line = TopicLine(topic: topic, type: typeLine(topic.eventType), interruptions: interruptions)
                lines[topic] = line
                memory += Self.overheadPerLine
                line.firstSequence = position.topic
                line.nextSequence = position.topic
                // Its first event of the epoch: whole from the start. Otherwise (adopted mid-stream) from here.
                if position.topic != 1 { setWhole(line, from: position.market, since: now) }
            }
            line.nextSequence = position.topic + 1
            if line.held.isEmpty { line.firstSequence = position.topic }
            line.held.append(position.market)
            let storage = event.bytes.withVeryUnsafeBytesWithStorageManagement { $1.toOpaque() }
            let buffer: Buffer
            if let known = buffers.last(where: { $0.storage == storage })?.buffer {
                buffer = known
            } else {
                buffer = Buffer(cost: event.bytes.storageCapacity + Self.overheadPerBuffer)
                buffers.append((storage, buffer))
                memory += buffer.cost
            }
            buffer.events += 1
            let type = line.type
            type.slots.append(position.market)
            slots.append(
                Slot(
                    sequence: position.market, topic: line, topicSequence: position.topic, arrivedAt: arrivals?[index] ?? now, buffer: buffer,
                    event: event))
            nextMarketSequence = position.market + 1
            if type.pending, type.whole == nil {
                type.pending = false
                type.whole = (position.market, now)
            }
            memory += Self.overheadPerEvent
            eventCount += 1
            if line.held.count > limits.eventsPerTopic { dropOldest(of: line) }
        }
        evict(now: now)
        return broken
    }

    /// A topic's run broke: what it holds is let go (a resume from before is a gap) and it is whole again
    /// from `position`.
    private func restart(_ line: TopicLine, at position: EventPosition, now: Int64) {
        while !line.held.isEmpty { dropOldest(of: line) }
        line.leap = nil
        line.firstSequence = position.topic
        setWhole(line, from: position.market, since: now)
    }

    // MARK: what is wanted

    /// The line of an event type, made when first needed.
    private func typeLine(_ eventType: String) -> TypeLine {
        if let known = types[eventType] { return known }
        let made = TypeLine()
        types[eventType] = made
        return made
    }

    /// The topic sequence a topic with no line starts at: 1, or past every sequence a line let go could
    /// have used (a topic's sequence never passes the market's), so numbers never repeat in an epoch.
    private var firstTopicSequence: UInt64 { droppedThrough == 0 ? 1 : nextMarketSequence }

    /// The relay now receives every event of a topic (ticker) from the next one on.
    func wanted(_ topic: Topic, now: Int64) {
        if topic.isWildcard {
            wantedTypes.insert(topic.eventType)
            let type = typeLine(topic.eventType)
            type.pending = true
            // Its run from here: a restart before its first event has no whole run of it to tell.
            type.lastRun = nil
            return
        }
        wantedTickers.insert(topic)
        interrupt(topic, now: now)
    }

    private func isWanted(_ topic: Topic) -> Bool { wantedTickers.contains(topic) || wantedTypes.contains(topic.eventType) }

    /// Everything the relay receives now is `topics` (a tape's record of it): what joined is wanted from
    /// here, what left is not; what stayed keeps its run.
    func holding(_ topics: Set<Topic>, now: Int64) {
        let current = Set(wantedTickers).union(wantedTypes.map { Topic.wildcard($0) })
        for topic in current.subtracting(topics) { unwanted(topic, now: now) }
        for topic in topics.subtracting(current) { wanted(topic, now: now) }
    }

    /// Lets go of a line that holds no event and whose topic is not wanted.
    private func dropIfIdle(_ line: TopicLine) {
        guard line.held.isEmpty, !isWanted(line.topic) else { return }
        drop(line)
    }

    private func drop(_ line: TopicLine) {
        guard lines[line.topic] === line else { return }
        lines[line.topic] = nil
        line.isDropped = true
        memory -= Self.overheadPerLine
        droppedThrough = nextMarketSequence - 1
        droppedArrival = max(droppedArrival, line.evictedArrival)
    }

    /// The relay stopped receiving a topic (or a wildcard's type): whole again only from its next event.
    func unwanted(_ topic: Topic, now: Int64) {
        if topic.isWildcard {
            wantedTypes.remove(topic.eventType)
            if let type = types[topic.eventType] {
                type.pending = false
                if let whole = type.whole {
                    type.lastRun = Run(sequence: whole.sequence, since: whole.since, until: now)
                    type.whole = nil
                }
            }
            for line in Array(lines.values) where line.topic.eventType == topic.eventType {
                interrupt(line.topic, now: now)
                dropIfIdle(line)
            }
            return
        }
        wantedTickers.remove(topic)
        interrupt(topic, now: now)
        if let line = lines[topic] { dropIfIdle(line) }
    }

    /// Events may have been missed (the upstream was lost): every topic and type is whole again only from
    /// the next event. With `marked`, the loss takes the next market sequence itself (no event has it):
    /// a client that had every event before it resumes as `gap`, never as whole with the outage unseen,
    /// and one that came after it stands at the mark. (A cluster node adopts the leader's numbers: not
    /// marked there.)
    ///
    /// O(event types): each topic's line reads the interruption when asked (``whole(_:)``), so an upstream
    /// (or a leader on NATS) going down and back again and again costs no walk over every topic.
    func interruptAll(now: Int64, marked: Bool = false) {
        if marked, nextMarketSequence > 1 { nextMarketSequence += 1 }
        interruptions += 1
        lastInterruption = (nextMarketSequence, now)
        for type in types.values where type.whole != nil {
            type.pending = true
            type.whole = nil
        }
    }

    /// A topic's run starts again: whole from the next event while it is wanted, not received otherwise.
    private func interrupt(_ topic: Topic, now: Int64) {
        guard let line = lines[topic] else { return }
        let was = whole(line)
        guard isWanted(topic) else {
            if was.sequence != Self.notReceived { line.lastRun = Run(sequence: was.sequence, since: was.since, until: now) }
            setWhole(line, from: Self.notReceived, since: .max)
            return
        }
        setWhole(line, from: was.sequence == Self.notReceived ? nextMarketSequence : max(was.sequence, nextMarketSequence), since: now)
    }

    /// From which market sequence (and wall time) every event of `line`'s topic was received: its own,
    /// or the last interruption of every topic if one came since it was set and it was received then.
    func whole(_ line: TopicLine) -> (sequence: UInt64, since: Int64) {
        line.wholeSetIn == interruptions || line.ownWholeFrom == Self.notReceived ? (line.ownWholeFrom, line.ownWholeSince) : lastInterruption
    }

    /// Sets `line`'s ``whole(_:)``.
    private func setWhole(_ line: TopicLine, from: UInt64, since: Int64) {
        (line.ownWholeFrom, line.ownWholeSince, line.wholeSetIn) = (from, since, interruptions)
    }

    /// The previous run of this epoch (rebuilt into this history from its tape) stopped at `stoppedAt`
    /// after giving market sequences through `last`; this run starts `now`, receiving nothing yet. The
    /// restart takes the next market sequence (``Restart/marker``), so a client that began after it
    /// never stands before it. Topic sequences go on from each line's; a topic with no line starts past
    /// the marker. A resume from before the restart gets the previous run's events it missed, a `gap`
    /// naming the time nothing was received, then this run's (``missed(_:since:limit:now:)``).
    ///
    /// After a crash (`leap`), numbers the crashed run gave may not be on its tape: topic sequences leap
    /// past the marker too (a topic's never passes the market's), so none is given twice.
    func restarted(after last: UInt64, stoppedAt: Int64, now: Int64, leap: Bool = false) {
        let marker = max(nextMarketSequence, last + 1)
        nextMarketSequence = marker + 1
        restart = Restart(marker: marker, stoppedAt: stoppedAt, startedAt: now)
        // What was received at the stop was, until then; what had stopped being received, until it did.
        for line in lines.values {
            if leap {
                if line.held.isEmpty { line.firstSequence = marker + 1 } else { line.leap = (line.nextSequence - 1, marker + 1) }
                line.nextSequence = marker + 1
            }
            let was = whole(line)
            line.beforeRestart = was.sequence == Self.notReceived ? line.lastRun : Run(sequence: was.sequence, since: was.since, until: stoppedAt)
            setWhole(line, from: Self.notReceived, since: .max)
        }
        for type in types.values {
            type.beforeRestart = type.whole.map { Run(sequence: $0.sequence, since: $0.since, until: stoppedAt) } ?? type.lastRun
            type.whole = nil
            type.pending = false
        }
        wantedTickers.removeAll()
        wantedTypes.removeAll()
        droppedThrough = marker
        droppedArrival = max(droppedArrival, stoppedAt)
    }

    // MARK: eviction

    /// Drops the oldest slots while the history is past its memory bound or older than its age bound.
    func evict(now: Int64) {
        // Empty lines first: what they free is room the events need not make.
        let half = limits.memoryBytes / 2 / Self.overheadPerLine
        if lines.count > Swift.max(half, idleLinesAbove) { letGoOfIdleLines() } else if lines.count <= half { idleLinesAbove = 0 }
        let oldestKept = now - limits.maxAge.milliseconds
        // The first slot's time is read in place: a copy of the slot would retain what it holds.
        while !slots.isEmpty, memory > limits.memoryBytes || slots[0].arrivedAt < oldestKept {
            let slot = slots.removeFirst()
            memory -= Self.slotBytes
            let type = slot.topic.type
            if type.slots.first == slot.sequence {
                type.slots.removeFirst()
                // An emptied ring lets go of its storage (a type may not come back).
                if type.slots.isEmpty { type.slots = CircularBuffer() }
            }
            guard slot.event != nil else { continue }
            // Its topic's oldest held event is this one (a topic's ring is in arrival order too).
            let line = slot.topic
            if line.held.first == slot.sequence {
                line.held.removeFirst()
                line.advanceFirst()
            }
            forget(slot, line: line)
        }
    }

    /// Lets go of every line that holds no event and whose ticker is wanted only under its wildcard. Such
    /// a line is kept while lines take at most half the memory bound (a resume of its ticker is answered
    /// from it); past that, a wildcard over a market of a million tickers (options' trades over a day)
    /// would fill the history with empty lines and leave no room for events. A resume of a ticker let go
    /// is answered as for any line let go: whole only after it, a gap before, never wrong events.
    private func letGoOfIdleLines() {
        for line in Array(lines.values) where line.held.isEmpty && !wantedTickers.contains(line.topic) { drop(line) }
        // Checked again only after an eighth of the bound in new lines (not once per event while lines
        // that hold events, or of tickers held by name, keep the table above the half: the memory bound
        // evicts those events), and at the latest once lines alone would take the whole bound (unless
        // they already do).
        let eighth = limits.memoryBytes / 8 / Self.overheadPerLine
        let whole = limits.memoryBytes / Self.overheadPerLine
        idleLinesAbove = lines.count >= whole ? lines.count + eighth : Swift.min(lines.count + eighth, whole)
    }

    private func dropOldest(of line: TopicLine) {
        let sequence = line.held.removeFirst()
        line.advanceFirst()
        guard let index = slotIndex(of: sequence), slots[index].event != nil else { return }
        slots[index].event = nil
        forget(slots[index], line: line)
    }

    /// An event let go: its bookkeeping, and its buffer once no event of it is left.
    private func forget(_ slot: Slot, line: TopicLine) {
        let (sequence, arrivedAt) = (slot.sequence, slot.arrivedAt)
        memory -= Self.ringBytes
        slot.buffer.events -= 1
        if slot.buffer.events == 0 { memory -= slot.buffer.cost }
        eventCount -= 1
        line.evictedThrough = max(line.evictedThrough, sequence)
        line.evictedArrival = max(line.evictedArrival, arrivedAt)
        let type = line.type
        type.evictedThrough = max(type.evictedThrough, sequence)
        type.evictedArrival = max(type.evictedArrival, arrivedAt)
        dropIfIdle(line)
    }

    // MARK: reading

    /// What a topic missed after a position: every held event after it, or why that cannot be whole.
    enum Missed {
        /// The events, oldest first (possibly none).
        case events([MarketEvent])
        /// Some of them are no longer held: `from ... through` names the missing range in the position's
        /// own numbering (topic sequences for `.topic`, market sequences otherwise).
        case gap(from: UInt64, through: UInt64, unit: GapUnit, reason: String)
        /// More than the limit asked for: none are returned (the scan stops there).
        case tooMany
        /// The position is before a restart: the previous run's events after it (`before`), nothing
        /// received from `downFrom` through `downTo` (Unix ms: the relay was down, then the topic was
        /// not received again until it was wanted), then this run's events (`after`).
        case acrossRestart(before: [MarketEvent], downFrom: Int64, downTo: Int64, after: [MarketEvent])
    }

    /// What a gap's range counts.
    enum GapUnit: String {
        case topicSequence = "topic_sequence"
        case marketSequence = "market_sequence"
        case unixMilliseconds = "unix_ms"
    }

    /// Where a client stands on one topic.
    typealias Since = ResumePoint

    /// The market sequence of the last event that arrived before `time` (Unix ms): a time resume starts
    /// after it. When nothing held is that old, the sequence before the oldest held slot.
    func marketSequence(before time: Int64) -> UInt64 {
        var low = 0
        var high = slots.count
        while low < high {
            let middle = (low + high) / 2
            if slots[slots.index(slots.startIndex, offsetBy: middle)].arrivedAt < time { low = middle + 1 } else { high = middle }
        }
        if low < slots.count { return slots[slots.index(slots.startIndex, offsetBy: low)].sequence - 1 }
        return nextMarketSequence - 1
    }

    /// The events of `topic` after where the client stands (a wildcard takes `.market` or `.time`), or
    /// ``Missed/tooMany`` when they are more than `limit` (found out without collecting them: a
    /// wildcard's scan of the slots stops at the limit).
    func missed(_ topic: Topic, since: Since, limit: Int = .max, now: Int64 = WallClock.nowMilliseconds()) -> Missed {
        if let restart, let after = positionBefore(restart, topic, since) { return missed(topic, after: after, across: restart, limit: limit, now: now) }
        let ahead = "the position is ahead of this relay's history"
        let lost = Self.noLongerHeld
        let notReceived = "not all received by this relay (it was not subscribed to the topic, or its upstream was away)"
        let line = lines[topic]
        // A ticker with no line: never seen this epoch, or let go (then whole only after that).
        let whole: (sequence: UInt64, since: Int64)? =
            if topic.isWildcard { types[topic.eventType]?.whole ?? (wholeByDefault ? (1, .min) : nil) } else {
                line.map { self.whole($0) } ?? (droppedThrough + 1, droppedArrival)
            }
        let evictedSequence = topic.isWildcard ? types[topic.eventType]?.evictedThrough ?? 0 : line?.evictedThrough ?? droppedThrough
        // The last market sequence the client has.
        let after: UInt64
        switch since {
        case .topic(let position):
            guard !topic.isWildcard else { return missed(topic, since: .market(position), limit: limit) }
            guard let line else {
                return position == 0 ? .events([]) : .gap(from: 1, through: position, unit: .topicSequence, reason: droppedThrough > 0 ? lost : ahead)
            }
            guard position < line.nextSequence else { return .gap(from: line.nextSequence, through: position, unit: .topicSequence, reason: ahead) }
            guard position + 1 >= line.firstSequence else {
                return .gap(from: position + 1, through: line.firstSequence - 1, unit: .topicSequence, reason: lost)
            }
            // Where that event stood in the market: held, just evicted, or (position 0) the epoch's start.
            let held = position >= line.firstSequence ? line.offset(of: position) : nil
            let market: UInt64 =
                if let held { line.held[line.held.index(line.held.startIndex, offsetBy: held)] } else { position == 0 ? 0 : line.evictedThrough }
            guard self.whole(line).sequence <= market + 1 else {
                return .gap(from: position + 1, through: position + 1, unit: .topicSequence, reason: notReceived)
            }
            return events(of: line, fromOffset: held.map { $0 + 1 } ?? 0, limit: limit)
        case .market(let position):
            guard position < nextMarketSequence else {
                return .gap(from: nextMarketSequence, through: position, unit: .marketSequence, reason: ahead)
            }
            guard evictedSequence <= position else {
                return .gap(from: position + 1, through: evictedSequence, unit: .marketSequence, reason: lost)
            }
            guard let whole, whole.sequence <= position + 1 else {
                return .gap(from: position + 1, through: min(whole?.sequence ?? nextMarketSequence, nextMarketSequence) - 1, unit: .marketSequence, reason: notReceived)
            }
            after = position
        case .time(let time):
            after = marketSequence(before: time)
            let evictedAt = topic.isWildcard ? types[topic.eventType]?.evictedArrival ?? .min : line?.evictedArrival ?? droppedArrival
            guard evictedAt < time else {
                return .gap(from: UInt64(max(time, 0)), through: UInt64(max(evictedAt, 0)), unit: .unixMilliseconds, reason: lost)
            }
            guard let whole, whole.sequence <= after + 1 else {
                let through = whole.map { $0.since == .max ? now : $0.since } ?? 0
                return .gap(from: UInt64(max(time, 0)), through: UInt64(max(through, 0)), unit: .unixMilliseconds, reason: notReceived)
            }
        }
        if topic.isWildcard {
            guard let sequences = types[topic.eventType]?.slots else { return .events([]) }
            // The type's slots are in rising sequence: the first one past `after`, then each in turn.
            var events: [MarketEvent] = []
            var index = sequences.index(sequences.startIndex, offsetBy: Self.firstOffset(after: after, in: sequences))
            while index != sequences.endIndex {
                // A wildcard's events are the vendor's, never the relay's derived bars
                // (``Topic/matches(eventType:ticker:)``, as live).
                if let slot = slotIndex(of: sequences[index]), let event = slots[slot].event, topic.matches(eventType: event.eventType, ticker: event.ticker) {
                    guard events.count < limit else { return .tooMany }
                    events.append(event)
                }
                index = sequences.index(after: index)
            }
            return .events(events)
        }
        guard let line else { return .events([]) }
        // Its held market sequences are in order: the first one past `after`.
        return events(of: line, fromOffset: Self.firstOffset(after: after, in: line.held), limit: limit)
    }

    /// The market sequence a client stands at when that is before `restart` (`nil`: after it, or not
    /// known here: the usual answer applies). A time before this run started stands before it too.
    private func positionBefore(_ restart: Restart, _ topic: Topic, _ since: Since) -> UInt64? {
        switch since {
        case .market(let position):
            return position < restart.marker ? position : nil
        case .time(let time):
            return time <= restart.startedAt ? min(marketSequence(before: time), restart.marker - 1) : nil
        case .topic(let position):
            guard !topic.isWildcard else { return position < restart.marker ? position : nil }
            guard let line = lines[topic], position < line.nextSequence else { return nil }
            let market: UInt64
            if position == 0 {
                market = 0
            } else if position >= line.firstSequence {
                // In a leap's hole: the crashed run gave it and did not record it (before the restart).
                guard let offset = line.offset(of: position) else { return restart.marker - 1 }
                market = line.held[line.held.index(line.held.startIndex, offsetBy: offset)]
            } else if position + 1 == line.firstSequence {
                market = line.evictedThrough
            } else {
                return nil
            }
            return market < restart.marker ? market : nil
        }
    }

    /// What a topic missed after market sequence `after`, a position before `restart`: whole only if the
    /// previous run held the topic whole from there to its stop; then its events after `after`, the time
    /// nothing was received (from the stop until the topic was received again: now, if it is not yet),
    /// and this run's events from then on.
    private func missed(_ topic: Topic, after: UInt64, across restart: Restart, limit: Int, now: Int64) -> Missed {
        let type = types[topic.eventType]
        let line = lines[topic]
        let evicted = topic.isWildcard ? type?.evictedThrough ?? 0 : line?.evictedThrough ?? droppedThrough
        guard evicted <= after else {
            return .gap(from: after + 1, through: evicted, unit: .marketSequence, reason: Self.noLongerHeld)
        }
        let before = topic.isWildcard ? type?.beforeRestart : line?.beforeRestart
        guard let before, before.sequence <= after + 1 else {
            return .gap(
                from: after + 1, through: restart.marker - 1, unit: .marketSequence,
                reason: "not all received by this relay before it restarted (it was not subscribed to the topic, or its upstream was away)")
        }
        let whole: (sequence: UInt64, since: Int64)? = topic.isWildcard ? type?.whole : line.map { self.whole($0) }
        let received = whole.flatMap { $0.sequence == Self.notReceived ? nil : $0 }
        let sequences: CircularBuffer<UInt64>? = topic.isWildcard ? type?.slots : line?.held
        var earlier: [MarketEvent] = []
        var later: [MarketEvent] = []
        if let sequences {
            var index = sequences.index(sequences.startIndex, offsetBy: Self.firstOffset(after: after, in: sequences))
            while index != sequences.endIndex {
                let sequence = sequences[index]
                index = sequences.index(after: index)
                // This run's events count only from where it received the topic whole.
                guard sequence < restart.marker || (received.map { sequence >= $0.sequence } ?? false) else { continue }
                guard let slot = slotIndex(of: sequence), let event = slots[slot].event else { continue }
                if topic.isWildcard, !topic.matches(eventType: event.eventType, ticker: event.ticker) { continue }
                guard earlier.count + later.count < limit else { return .tooMany }
                if sequence < restart.marker { earlier.append(event) } else { later.append(event) }
            }
        }
        return .acrossRestart(before: earlier, downFrom: min(before.until, restart.stoppedAt), downTo: received?.since ?? now, after: later)
    }

    /// The offset of the first of `sequences` (rising) past `after`: a binary search.
    private static func firstOffset(after: UInt64, in sequences: CircularBuffer<UInt64>) -> Int {
        var low = 0
        var high = sequences.count
        while low < high {
            let middle = (low + high) / 2
            if sequences[sequences.index(sequences.startIndex, offsetBy: middle)] <= after { low = middle + 1 } else { high = middle }
        }
        return low
    }

    private func events(of line: TopicLine, fromOffset first: Int, limit: Int) -> Missed {
        guard line.held.count - first <= limit else { return .tooMany }
        var events: [MarketEvent] = []
        events.reserveCapacity(max(line.held.count - first, 0))
        var index = line.held.index(line.held.startIndex, offsetBy: first)
        while index != line.held.endIndex {
            if let slotIndex = slotIndex(of: line.held[index]), let event = slots[slotIndex].event { events.append(event) }
            index = line.held.index(after: index)
        }
        return .events(events)
    }

    /// The index of the first slot whose sequence is past `sequence`.
    private func firstSlotIndex(after sequence: UInt64) -> Int {
        var low = 0
        var high = slots.count
        while low < high {
            let middle = (low + high) / 2
            if slots[slots.index(slots.startIndex, offsetBy: middle)].sequence <= sequence { low = middle + 1 } else { high = middle }
        }
        return slots.index(slots.startIndex, offsetBy: low)
    }

    /// The index of the slot of `sequence`, if it is held (slots are in rising sequence: binary search;
    /// O(1) when the sequences have no holes, as on a single relay).
    private func slotIndex(of sequence: UInt64) -> Int? {
        guard !slots.isEmpty, sequence >= slots[0].sequence else { return nil }
        let guess = Int(min(sequence - slots[0].sequence, UInt64(slots.count)))
        if guess < slots.count {
            let index = slots.index(slots.startIndex, offsetBy: guess)
            if slots[index].sequence == sequence { return index }
        }
        let index = firstSlotIndex(after: sequence - 1)
        guard index != slots.endIndex, slots[index].sequence == sequence else { return nil }
        return index
    }

    /// Slots in the per-type rings (each slot is in its type's once).
    var typeSlotCount: Int { types.values.reduce(0) { $0 + $1.slots.count } }

    /// Topics with a line (seen at least once this epoch).
    var topicCount: Int { lines.count }
}
