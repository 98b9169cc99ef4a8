import Synchronization

/// How many calls to a shared store (the cluster's REST budget in NATS) run at once, who waits for one
/// to end, and when a store that failed to answer is asked again.
///
/// While the store stalls, each call holds a thread of the NATS pool for up to the request timeout, and
/// requests could start calls faster than they end. So at most `maxInFlight` run at once. Others wait
/// their turn, in arrival order, at most `maxWaiting` of them: a caller that counted on its own whenever
/// the store was busy would overspend in bursts. Past them, or past a waiter's deadline, or when its
/// task is cancelled, a caller is told `busy` (it tries again later, within its own bound). When a call
/// finds the store not answering (``failed()``), every waiter and every caller of the next
/// `afterFailure` is told `local` (count on your own); then one call at a time asks again until one is
/// answered (``answered()``).
///
/// Invariant: someone waits only while `maxInFlight` calls run and the store is not known to fail.
///
/// `Sendable`: its state behind a `Mutex`; continuations are resumed outside the lock.
final class CallGate: Sendable {
    enum Turn: Equatable, Sendable {
        /// Make the call, then ``leave()``.
        case starts
        /// The store failed to answer: count on your own.
        case local
        /// No call can start within your bound: try again later.
        case busy
    }

    /// How a caller takes its turn.
    enum Entry {
        /// Waits its turn among at most `maxWaiting`, until `deadline` (`nil`: as long as it takes).
        case waits(until: ContinuousClock.Instant?)
        /// Goes ahead of every waiter (a vendor's 429, to be told to every node before more requests
        /// spend tokens), past the waiting bound; its task's cancellation does not take it out of line.
        case first
        /// Never waits and is never the call that asks a failed store again (a status view).
        case atOnce
    }

    private struct Waiter {
        let id: UInt64
        let continuation: CheckedContinuation<Turn, Never>
    }

    private struct State {
        var inFlight = 0
        var waiting: [Waiter] = []
        /// Set when the store failed to answer (when to ask again), `nil` once it answers.
        var askAgainAt: ContinuousClock.Instant?
        var nextID: UInt64 = 0
        /// Calls started since the gate was made (a turn passed on counts again).
        var started = 0
    }

    let maxInFlight: Int
    let maxWaiting: Int
    let afterFailure: Duration
    private let state = Mutex(State())

    init(maxInFlight: Int, maxWaiting: Int, afterFailure: Duration) {
        self.maxInFlight = maxInFlight
        self.maxWaiting = maxWaiting
        self.afterFailure = afterFailure
    }

    /// Calls under way and callers waiting for one.
    struct Counts: Equatable, CustomStringConvertible {
        var inFlight: Int
        var waiting: Int
        var description: String { "\(inFlight) in flight, \(waiting) waiting" }
    }

    var counts: Counts { state.withLock { Counts(inFlight: $0.inFlight, waiting: $0.waiting.count) } }

    /// Calls started since the gate was made: how often the store was asked.
    var started: Int { state.withLock { $0.started } }

    /// The caller's turn (``Turn``); after `starts` it must ``leave()`` when its call ends.
    func enter(_ entry: Entry) async -> Turn {
        enum First { case decided(Turn), queue(id: UInt64) }
        let first = state.withLock { state -> First in
            if let decided = decide(entry, &state) { return .decided(decided) }
            state.nextID &+= 1
            return .queue(id: state.nextID)
        }
        let id: UInt64
        switch first {
        case .decided(let turn): return turn
        case .queue(let queued): id = queued
        }
        let timer: Task<Void, Never>? =
            if case .waits(let deadline?) = entry {
                Task { [weak self] in
                    guard (try? await Task.sleep(until: deadline, clock: .continuous)) != nil else { return }
                    self?.expire(id)
                }
            } else { nil }
        defer { timer?.cancel() }
        return await withTaskCancellationHandler {
            await withCheckedContinuation { continuation in
                let decided = state.withLock { state -> Turn? in
                    // Decided again under the lock: a call may have ended, or failed, since.
                    if let decided = decide(entry, &state) { return decided }
                    if case .waits = entry, Task.isCancelled { return .busy }
                    let waiter = Waiter(id: id, continuation: continuation)
                    if case .first = entry { state.waiting.insert(waiter, at: 0) } else { state.waiting.append(waiter) }
                    return nil
                }
                if let decided { continuation.resume(returning: decided) }
            }
        } onCancel: {
            // A 429 (`first`) is written whatever became of the request that saw it.
            if case .waits = entry { expire(id) }
        }
    }

    /// The turn decided at once, or `nil`: the caller waits.
    private func decide(_ entry: Entry, _ state: inout State) -> Turn? {
        if let askAgainAt = state.askAgainAt {
            // One call at a time asks a failed store again, once `afterFailure` has passed.
            if case .atOnce = entry { return .local }
            guard ContinuousClock.now >= askAgainAt, state.inFlight == 0 else { return .local }
        } else if state.inFlight >= maxInFlight {
            switch entry {
            case .atOnce: return .busy
            case .waits(let deadline):
                // Decided again under the lock a waiter registers under: one whose deadline passed
                // before it was in the line (its timer found nothing to expire) is told now.
                if let deadline, ContinuousClock.now >= deadline { return .busy }
                return state.waiting.count < maxWaiting ? nil : .busy
            case .first: return nil
            }
        }
        state.inFlight += 1
        state.started += 1
        return .starts
    }

    /// A call ended: the first waiter makes its own (the turn passes on, still counted in flight).
    func leave() {
        let next = state.withLock { state -> CheckedContinuation<Turn, Never>? in
            guard !state.waiting.isEmpty else {
                state.inFlight -= 1
                return nil
            }
            state.started += 1
            return state.waiting.removeFirst().continuation
        }
        next?.resume(returning: .starts)
    }

    /// The store answered: calls go to it again.
    func answered() {
        state.withLock { $0.askAgainAt = nil }
    }

    /// The store failed to answer: every waiter, and every caller for `afterFailure`, counts on its own.
    func failed() {
        let waiting = state.withLock { state in
            state.askAgainAt = ContinuousClock.now + afterFailure
            defer { state.waiting = [] }
            return state.waiting
        }
        for waiter in waiting { waiter.continuation.resume(returning: .local) }
    }

    /// A waiter's deadline passed or its task was cancelled: it is told `busy`, if still waiting.
    private func expire(_ id: UInt64) {
        let waiter = state.withLock { state -> Waiter? in
            guard let index = state.waiting.firstIndex(where: { $0.id == id }) else { return nil }
            return state.waiting.remove(at: index)
        }
        waiter?.continuation.resume(returning: .busy)
    }
}
