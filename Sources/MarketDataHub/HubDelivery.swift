import NIOCore
import MarketCore
import Synchronization

/// A subscriber's share of one published message, or a few events of its own (a notice, a snapshot on
/// subscribe): what its stream element (``DeliveryBatch``) is made of.
///
/// `Sendable`, small, and allocation-free on the hot path: the events of a publish are held once, by a
/// shared ``PublishedEvents``, and each subscriber's element names its events in it with a bit mask over
/// a window of up to 64 of them. A publish thus costs one retain per subscriber instead of a copy of
/// every matching event into an array of its own.
public struct HubDelivery: Sendable {
    @usableFromInline
    enum Content: Sendable {
        /// The events of `published.events[base ..< base + 64]` whose bits are set in `mask`.
        case selected(PublishedEvents, base: Int, mask: UInt64)
        /// A subscriber's own events; `epoch`: they are the notice that the market's positions start
        /// again under that epoch.
        case events([MarketEvent], epoch: String?)
        /// Events outside the subscriber's bound: a resume's replay (bounded by the history and by
        /// ``HistoryLimits/eventsPerResume`` instead).
        case replay(ArraySlice<MarketEvent>)
    }

    @usableFromInline let content: Content

    init(_ published: PublishedEvents, base: Int, mask: UInt64) {
        content = .selected(published, base: base, mask: mask)
    }

    init(_ events: [MarketEvent]) {
        content = .events(events, epoch: nil)
    }

    /// The notice that positions start again under `epoch`, on its own.
    init(epochNotice notice: MarketEvent, epoch: String) {
        content = .events([notice], epoch: epoch)
    }

    private init(content: Content) {
        self.content = content
    }

    init(replay events: [MarketEvent]) {
        content = .replay(events[...])
    }

    /// What it counts against the subscriber's bound (a replay: nothing).
    var pendingWeight: Int {
        if case .replay = content { return 0 }
        return count
    }

    /// What it counts outside the bound (a replay: all its events).
    public var replayWeight: Int {
        if case .replay(let events) = content { return events.count }
        return 0
    }

    /// How many events it carries (notices included).
    public var count: Int {
        switch content {
        case .selected(_, _, let mask): mask.nonzeroBitCount
        case .events(let events, _): events.count
        case .replay(let events): events.count
        }
    }

    /// How many market events it carries (notices not counted).
    public var marketEventCount: Int {
        switch content {
        case .selected(_, _, let mask): mask.nonzeroBitCount
        case .events(let events, _): events.reduce(0) { $0 + ($1.isNotice ? 0 : 1) }
        case .replay(let events): events.reduce(0) { $0 + ($1.isNotice ? 0 : 1) }
        }
    }

    /// The payload bytes its events take in a frame: each event's bytes and one separator.
    public var framedBytes: Int {
        var size = 0
        forEachEventAddress { size += $0.pointee.bytes.readableBytes + 1 }
        return size
    }

    /// The newest market sequence among its events (0: none has one).
    public var lastSequence: UInt64 {
        var newest: UInt64 = 0
        forEachEventAddress { newest = max(newest, $0.pointee.sequence) }
        return newest
    }

    /// The epoch its `epoch` notice starts (a cluster's new leadership term: the market sequences of the
    /// events after it count afresh), if it carries one. Such a notice comes on its own.
    public var epochStarted: String? {
        guard case .events(_, let epoch) = content else { return nil }
        return epoch
    }

    /// Appends its events, in order, to an array.
    public func append(to array: inout [MarketEvent]) {
        forEachEventAddress { array.append($0.pointee) }
    }

    /// Calls `body` with each of its events, in order, and its form made by `convert`. The form of an
    /// event of a publish is made once and shared by every subscriber that asks (see
    /// ``PublishedEvents``), so every caller of one hub must pass the same conversion; a subscriber's
    /// own events (a notice, a snapshot, a replay) are converted for it alone.
    public func forEachEvent(
        convertedBy convert: (borrowing MarketEvent) -> ByteBuffer?, _ body: (borrowing MarketEvent, ByteBuffer?) -> Void
    ) {
        switch content {
        case .selected(let published, let base, var mask):
            while mask != 0 {
                let index = base + mask.trailingZeroBitCount
                body(published.events[index], published.converted(at: index, convert))
                mask &= mask &- 1
            }
        case .events(let events, _):
            for event in events { body(event, convert(event)) }
        case .replay(let events):
            for event in events { body(event, convert(event)) }
        }
    }

    /// Calls `body` with the address of each of its events, in order, where the hub holds them (valid
    /// during the call): what a client turn's framing reads (``TurnEvents``).
    public func forEachEventAddress(_ body: (UnsafePointer<MarketEvent>) -> Void) {
        switch content {
        case .selected(let published, let base, var mask):
            published.events.withUnsafeBufferPointer { events in
                guard let start = events.baseAddress else { return }
                while mask != 0 {
                    body(start + base + mask.trailingZeroBitCount)
                    mask &= mask &- 1
                }
            }
        case .events(let events, _):
            events.withUnsafeBufferPointer { events in
                guard let start = events.baseAddress else { return }
                for index in events.indices { body(start + index) }
            }
        case .replay(let events):
            events.withUnsafeBufferPointer { events in
                guard let start = events.baseAddress else { return }
                for index in events.indices { body(start + index) }
            }
        }
    }

    /// Cuts `deliveries` where their frames would pass `bytes` inside a replay, or pass `liveBytes`
    /// before another live delivery (those are bounded by the subscriber's buffer in events, not in
    /// bytes: 1,000 news items of megabytes): keeps what fits, at least one event, and returns the rest
    /// in order (`nil` when everything fits), so a resume's replay, or a run of large events, is built
    /// into frames as the client reads, not all at once.
    public static func cut(_ deliveries: inout [HubDelivery], afterBytes bytes: Int, liveBytes: Int = .max) -> [HubDelivery]? {
        var size = 0
        for index in deliveries.indices {
            let delivery = deliveries[index]
            guard case .replay(let events) = delivery.content else {
                let framed = delivery.framedBytes
                if size > 0, size + framed > liveBytes {
                    let rest = Array(deliveries[index...])
                    deliveries.removeSubrange(index...)
                    return rest
                }
                size += framed
                continue
            }
            // Slices of the one array: cutting a replay part by part copies nothing.
            var end = events.startIndex
            while end < events.endIndex {
                let next = events[end].bytes.readableBytes + 1
                if size + next > bytes, size > 0 || end > events.startIndex { break }
                size += next
                end += 1
            }
            guard end < events.endIndex else { continue }
            var rest = [HubDelivery(content: .replay(events[end...]))]
            rest += deliveries[(index + 1)...]
            deliveries.removeSubrange(index...)
            if end > events.startIndex { deliveries.append(HubDelivery(content: .replay(events[..<end]))) }
            return rest
        }
        return nil
    }

    /// The first `count` of its events (what fits a subscriber's remaining room).
    func prefix(_ count: Int) -> HubDelivery {
        switch content {
        case .selected(let published, let base, var mask):
            var kept: UInt64 = 0
            for _ in 0..<max(count, 0) where mask != 0 {
                let lowest = mask & (~mask &+ 1)
                kept |= lowest
                mask &= ~lowest
            }
            return HubDelivery(published, base: base, mask: kept)
        case .events(let events, let epoch):
            return HubDelivery(content: .events(Array(events.prefix(max(count, 0))), epoch: count > 0 ? epoch : nil))
        case .replay:
            return self
        }
    }
}

/// The events of one publish, shared by every subscriber's ``HubDelivery`` of it. Immutable.
@usableFromInline
final class PublishedEvents: Sendable {
    @usableFromInline let events: [MarketEvent]
    /// Its events in another form, made by the first subscriber that needs each one and kept for the
    /// rest (an Alpaca hub's JSON for its JSON clients: one conversion per event, not one per client).
    /// A hub has one other form at most (its vendor's second codec), so one slot per event; empty, and
    /// allocated, only once a subscriber asks.
    private let converted = Mutex<[ConvertedForm]>([])

    init(_ events: [MarketEvent]) {
        self.events = events
    }

    /// The other form of `events[index]` (`nil`: it has none), made by `convert` if no subscriber made
    /// it yet. The conversion runs outside the lock; two drains racing on one event both convert, and
    /// the first to finish is kept.
    func converted(at index: Int, _ convert: (borrowing MarketEvent) -> ByteBuffer?) -> ByteBuffer? {
        if case .made(let form) = converted.withLock({ $0.isEmpty ? .notMade : $0[index] }) { return form }
        let form = convert(events[index])
        return converted.withLock { slots in
            if slots.isEmpty { slots = Array(repeating: .notMade, count: events.count) }
            if case .made(let kept) = slots[index] { return kept }
            slots[index] = .made(form)
            return form
        }
    }
}

/// One event's other form, as ``PublishedEvents`` keeps it.
enum ConvertedForm: Sendable {
    case notMade
    case made(ByteBuffer?)
}

/// One element of a subscriber's stream: what the hub queued for it since its reader last took an
/// element. The hub yields a batch and adds later deliveries to it until the reader takes it, so a
/// reader that is a publish or two behind takes them all with one `next()`, and the hub pays one `yield`
/// per read instead of one per publish (the stream's `yield` and `next` are most of what a delivery
/// costs outside the kernel). Order holds: a batch is added to only while it waits in the stream, and
/// once taken it is closed, so later deliveries go into the next yield of it.
///
/// Each subscriber has one, yielded again once its reader has taken it (``reopen(with:count:queue:)``):
/// it is in the stream at most once at any time, and a publish allocates nothing for it.
///
/// `Sendable`: the hub adds and the reader takes under one lock.
final class DeliveryBatch: Sendable {
    private struct State {
        var deliveries: [HubDelivery] = []
        var taken = true
    }

    private let state: Mutex<State>

    /// Sized at subscribe time (a few deliveries: what a reader one or two publishes behind finds), so
    /// the hot path only reuses it.
    init() {
        var deliveries: [HubDelivery] = []
        deliveries.reserveCapacity(4)
        state = Mutex(State(deliveries: deliveries))
    }

    /// Adds a delivery of `count` events and counts them in `queue.pending` (under the lock, so before
    /// the reader can take and subtract them); `false` once the reader has taken the batch.
    func add(_ delivery: HubDelivery, count: Int, queue: SubscriberQueue) -> Bool {
        state.withLock { state in
            guard !state.taken else { return false }
            state.deliveries.append(delivery)
            queue.pending.add(count, ordering: .relaxed)
            queue.queuedOutsideBound(delivery.replayWeight)
            return true
        }
    }

    /// Opens a taken batch again with its first delivery, to be yielded again (the hub only does this
    /// once ``add(_:count:queue:)`` said it was taken, so it is not in the stream).
    func reopen(with delivery: HubDelivery, count: Int, queue: SubscriberQueue) {
        state.withLock { state in
            state.taken = false
            state.deliveries.append(delivery)
            queue.pending.add(count, ordering: .relaxed)
            queue.queuedOutsideBound(delivery.replayWeight)
        }
    }

    /// Closes it again, uncounted, after a yield that did not enqueue it.
    func withdraw(queue: SubscriberQueue) {
        state.withLock { state in
            state.taken = true
            queue.pending.subtract(state.deliveries.reduce(0) { $0 + $1.pendingWeight }, ordering: .relaxed)
            let replayed = state.deliveries.reduce(0) { $0 + $1.replayWeight }
            queue.replaying.subtract(replayed, ordering: .relaxed)
            queue.replayedQueued.subtract(replayed, ordering: .relaxed)
            state.deliveries.removeAll(keepingCapacity: true)
        }
    }

    /// Closes the batch and appends its deliveries, in order, to `deliveries`; the number of events
    /// counted against the bound, and outside it (``SubscriberQueue/replaying``).
    func take(into deliveries: inout [HubDelivery]) -> (events: Int, replayed: Int) {
        state.withLock { state in
            state.taken = true
            var events = 0
            var replayed = 0
            for index in state.deliveries.indices {
                events += state.deliveries[index].pendingWeight
                replayed += state.deliveries[index].replayWeight
                deliveries.append(state.deliveries[index])
            }
            state.deliveries.removeAll(keepingCapacity: true)
            return (events, replayed)
        }
    }
}
