import Synchronization

/// Whether a connection can take more bytes now, readable from any thread: the handler sets it on its
/// loop, the client's drain checks it before taking events, and is told when it turns writable again.
/// It also counts the frame bytes a drain has handed to the loop that the loop has not written yet:
/// the drain runs on the pool, and while the loop is busy or descheduled the channel's own writability
/// does not change, so without this count a drain would keep taking the client's events into the
/// loop's task queue, without bound. Past ``inFlightLimit`` the connection counts as not writable: its
/// events wait in its own bounded hub buffer, where the slow-consumer policy applies. `Sendable`:
/// atomics, and the action behind a `Mutex`.
final class Writability: Sendable {
    private let writable = Atomic<Bool>(true)
    private let closed = Atomic<Bool>(false)
    /// Frame bytes handed to the loop and not yet written (``handedToLoop(_:)``, ``written(_:)``).
    private let inFlight = Atomic<Int>(0)
    /// The frame bytes that may wait for the loop (the connection's outbound limit).
    let inFlightLimit: Int
    private let whenWritable = Mutex<(@Sendable () -> Void)?>(nil)

    init(inFlightLimit: Int) {
        self.inFlightLimit = max(inFlightLimit, 1)
    }

    var isWritable: Bool {
        writable.load(ordering: .acquiring) && !closed.load(ordering: .acquiring) && inFlight.load(ordering: .acquiring) < inFlightLimit
    }
    var isClosed: Bool { closed.load(ordering: .acquiring) }

    /// Called each time the connection turns writable again, and when it closes.
    func onWritable(_ action: @escaping @Sendable () -> Void) {
        whenWritable.withLock { $0 = action }
    }

    func set(writable isWritable: Bool) {
        let was = writable.exchange(isWritable, ordering: .acquiringAndReleasing)
        if isWritable, !was { whenWritable.withLock { $0 }?() }
    }

    /// A drain handed `bytes` of frames to the loop (before its `execute`). Any thread.
    func handedToLoop(_ bytes: Int) {
        inFlight.wrappingAdd(bytes, ordering: .acquiringAndReleasing)
    }

    /// The loop wrote (or dropped) `bytes` a drain handed it; back under the limit, the drain is told.
    func written(_ bytes: Int) {
        let now = inFlight.wrappingSubtract(bytes, ordering: .acquiringAndReleasing).newValue
        if now < inFlightLimit, now + bytes >= inFlightLimit, writable.load(ordering: .acquiring) { whenWritable.withLock { $0 }?() }
    }

    func close() {
        closed.store(true, ordering: .releasing)
        whenWritable.withLock { action in
            defer { action = nil }
            return action
        }?()
    }
}
