import Synchronization

/// A bounded, ordered, loss-counting queue from any thread (a C library's callback thread:
/// libwebsockets', libnats') into Swift concurrency, with one consumer.
///
/// Producers ``push(_:)`` without waiting: an element is kept while the queued weight (e.g. events)
/// stays within `capacity`, otherwise it is dropped and noted in a `Loss` summary; the summary is handed
/// to the consumer **in order**, ahead of the next element that was kept (or when the queue empties), so a
/// consumer can tell exactly where events went missing. Elements of weight 0 (control messages) are kept,
/// up to a bound of their own when one is given (`controlBound`): past it those it covers are dropped
/// and counted, and the consumer is handed one element saying how many in their place. A producer may
/// merge an element into the one queued last
/// (``init(capacity:emptyLoss:weight:noteDrop:merge:controlBound:)``), so a stream of small messages
/// costs one queued item per run rather than one per message.
///
/// `Sendable`: all state sits behind one `Mutex`; the consumer is woken through an `AsyncStream` that keeps
/// at most one pending wake-up. One consumer at a time (``drain(_:)``).
public final class BoundedInbox<Element: Sendable, Loss: Sendable>: Sendable {
    /// What the consumer gets, in order.
    public enum Item: Sendable {
        case element(Element)
        /// `count` (by weight) dropped since the previous item, summarized.
        case lost(Loss, count: Int)
    }

    private struct State {
        var items: [Item] = []
        var weight = 0
        var droppedWeight = 0
        var loss: Loss
        var finished = false
        /// Control elements (weight 0, under the bound) queued, and dropped since the last told.
        var controls = 0
        var droppedControls = 0
        /// Producers waiting for room (``push(_:waitingBelow:)``), woken when the consumer is done with a run.
        var roomWaiters: [CheckedContinuation<Void, Never>] = []
    }

    public let capacity: Int
    private let emptyLoss: Loss
    private let weigh: @Sendable (Element) -> Int
    private let noteDrop: @Sendable (inout Loss, Element) -> Void
    private let merge: (@Sendable (inout Element, Element) -> Bool)?
    /// The most control elements queued at once, which elements of weight 0 it covers, and the element
    /// that tells how many were dropped.
    private let controlBound: (count: Int, covers: @Sendable (Element) -> Bool, dropped: @Sendable (Int) -> Element)?
    private let state: Mutex<State>
    private let wakes: AsyncStream<Void>
    private let wake: AsyncStream<Void>.Continuation
    /// Weight taken by the consumer and not yet done with (see ``drain(_:)``).
    private let inFlight = Atomic<Int>(0)
    /// Whether a producer waits for room (read by the consumer without the lock).
    private let hasRoomWaiters = Atomic<Bool>(false)

    /// - Parameters:
    ///   - capacity: the most weight queued (and being handled by the consumer) at once.
    ///   - emptyLoss: the summary of no loss.
    ///   - weight: an element's weight (0: kept, within `controlBound` if it covers it).
    ///   - noteDrop: adds a dropped element to the summary.
    ///   - merge: merges an element into the last one queued, returning whether it did.
    ///   - controlBound: the most elements of weight 0 that `covers` queued at once (`nil`: no bound);
    ///     past it they are dropped (a producer that can wait waits), and `dropped(count)` is queued in
    ///     their place before what is kept next.
    public init(
        capacity: Int, emptyLoss: Loss, weight: @escaping @Sendable (Element) -> Int,
        noteDrop: @escaping @Sendable (inout Loss, Element) -> Void,
        merge: (@Sendable (inout Element, Element) -> Bool)? = nil,
        controlBound: (count: Int, covers: @Sendable (Element) -> Bool, dropped: @Sendable (Int) -> Element)? = nil
    ) {
        self.capacity = capacity
        self.emptyLoss = emptyLoss
        self.weigh = weight
        self.noteDrop = noteDrop
        self.merge = merge
        self.controlBound = controlBound
        state = Mutex(State(loss: emptyLoss))
        (wakes, wake) = AsyncStream.makeStream(of: Void.self, bufferingPolicy: .bufferingNewest(1))
    }

    /// Queues an element (from any thread, without waiting); returns `false` when it was dropped.
    ///
    /// With `pastControlBound`, a control element is queued even past the control bound (still counted
    /// in it): for a producer's own few messages about itself (its link lost), which must not be lost
    /// to a flood of others'. Dropped, such a message would be told only at the next element queued,
    /// which may come much later.
    @discardableResult
    public func push(_ element: Element, pastControlBound: Bool = false) -> Bool {
        let kept = state.withLock { state in
            enqueue(element, weight: weigh(element), within: capacity, into: &state, pastControlBound: pastControlBound) ?? false
        }
        if kept { wake.yield() }
        return kept
    }

    /// Queues an element once the weight queued leaves room for it within `room` (less than the
    /// capacity): for a producer that can wait, such as a REST fill, so that it never fills the queue a
    /// live producer shares with it. Returns `false` when the queue finished (the element is not queued).
    public func push(_ element: Element, waitingBelow room: Int) async -> Bool {
        let weight = weigh(element)
        while true {
            var outcome: Bool?
            await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
                let waiting = state.withLock { state -> Bool in
                    outcome = enqueue(element, weight: weight, within: room, into: &state, waiting: true)
                    guard outcome == nil else { return false }
                    state.roomWaiters.append(continuation)
                    hasRoomWaiters.store(true, ordering: .releasing)
                    return true
                }
                if !waiting { continuation.resume() }
            }
            if let outcome {
                if outcome { wake.yield() }
                return outcome
            }
        }
    }

    /// Appends `element` when the weight queued leaves room for it within `limit`. `true`: queued;
    /// `false`: not (finished, or dropped and noted); `nil`: no room, and `waiting` (nothing dropped).
    private func enqueue(
        _ element: Element, weight: Int, within limit: Int, into state: inout State, waiting: Bool = false, pastControlBound: Bool = false
    ) -> Bool? {
        guard !state.finished else { return false }
        let queued = state.weight + inFlight.load(ordering: .relaxed)
        // A waiting element heavier than its room goes once nothing else is queued.
        if weight > 0, queued + weight > limit, !(waiting && queued == 0) {
            if waiting { return nil }
            state.droppedWeight += weight
            noteDrop(&state.loss, element)
            return false
        }
        let control = weight == 0 && isControl(element)
        if control, !pastControlBound, let controlBound, state.controls >= controlBound.count {
            if waiting { return nil }
            state.droppedControls += 1
            return false
        }
        flushLoss(&state)
        state.weight += weight
        if let merge, case .element(var last)? = state.items.last {
            // Taken out first, so the merge changes a uniquely held value in place.
            state.items[state.items.count - 1] = .lost(emptyLoss, count: 0)
            let merged = merge(&last, element)
            state.items[state.items.count - 1] = .element(last)
            if merged { return true }
        }
        state.items.append(.element(element))
        if control { state.controls += 1 }
        return true
    }

    /// Whether the control bound covers `element` (of weight 0).
    private func isControl(_ element: Element) -> Bool { controlBound?.covers(element) ?? false }

    /// Wakes the producers waiting for room: each looks again.
    private func wakeRoomWaiters() {
        guard hasRoomWaiters.load(ordering: .acquiring) else { return }
        let waiters = state.withLock { state in
            defer { state.roomWaiters = [] }
            hasRoomWaiters.store(false, ordering: .releasing)
            return state.roomWaiters
        }
        for waiter in waiters { waiter.resume() }
    }

    private func flushLoss(_ state: inout State) {
        if state.droppedControls > 0, let controlBound {
            // Told in their place, past the bound itself: one element however many were dropped.
            let notice = controlBound.dropped(state.droppedControls)
            state.items.append(.element(notice))
            if weigh(notice) == 0, isControl(notice) { state.controls += 1 }
            state.droppedControls = 0
        }
        guard state.droppedWeight > 0 else { return }
        state.items.append(.lost(state.loss, count: state.droppedWeight))
        state.droppedWeight = 0
        state.loss = emptyLoss
    }

    /// No more elements: the consumer ends once it has taken what is queued.
    public func finish() {
        state.withLock { $0.finished = true }
        wake.finish()
        wakeRoomWaiters()
    }

    /// Weight queued now (for tests and gauges).
    public var queuedWeight: Int { state.withLock { $0.weight } + inFlight.load(ordering: .relaxed) }

    /// The consumer: hands `body` everything queued at each wake-up, in order (runs of up to `limit`
    /// items), until ``finish()`` and the queue is empty. A run's weight counts against the capacity until
    /// `body` returns, so the bound covers what the consumer is still handling.
    public func drain(limit: Int = 1_024, _ body: ([Item]) async -> Void) async {
        var wakes = self.wakes.makeAsyncIterator()
        while true {
            let (run, weight, finished) = state.withLock { state -> ([Item], Int, Bool) in
                if state.items.isEmpty { flushLoss(&state) }
                let count = min(state.items.count, limit)
                let run = Array(state.items.prefix(count))
                state.items.removeFirst(count)
                var weight = 0
                for item in run {
                    guard case .element(let element) = item else { continue }
                    let elementWeight = weigh(element)
                    weight += elementWeight
                    if elementWeight == 0, isControl(element) { state.controls -= 1 }
                }
                state.weight -= weight
                inFlight.add(weight, ordering: .relaxed)
                return (run, weight, state.finished)
            }
            if !run.isEmpty {
                await body(run)
                // Lowered under the lock a waiting producer checks and registers under: it sees this
                // weight gone, or it is registered and is woken now. (Lowered outside it, the two could
                // pass each other: the producer read the old weight, the consumer no waiter yet, and a
                // lone producer slept forever.)
                let waiters = state.withLock { state -> [CheckedContinuation<Void, Never>] in
                    inFlight.subtract(weight, ordering: .relaxed)
                    guard !state.roomWaiters.isEmpty else { return [] }
                    defer {
                        state.roomWaiters = []
                        hasRoomWaiters.store(false, ordering: .releasing)
                    }
                    return state.roomWaiters
                }
                for waiter in waiters { waiter.resume() }
                continue
            }
            if finished { return }
            guard await wakes.next() != nil else {
                // Finished while waiting: take what is left.
                if state.withLock({ $0.items.isEmpty && $0.droppedWeight == 0 && $0.droppedControls == 0 }) { return }
                continue
            }
        }
    }
}
