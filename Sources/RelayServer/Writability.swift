import Synchronization

/// Whether a connection can take more bytes now, readable from any thread: the handler sets it on its
/// loop, the client's drain checks it before taking events, and is told when it turns writable again. `Sendable` behind a `Mutex`.
final class Writability: Sendable {
    private let writable = Atomic<Bool>(true)
    private let closed = Atomic<Bool>(false)
    private let whenWritable = Mutex<(@Sendable () -> Void)?>(nil)

    var isWritable: Bool { writable.load(ordering: .acquiring) && !closed.load(ordering: .acquiring) }
    var isClosed: Bool { closed.load(ordering: .acquiring) }

    /// Called each time the connection turns writable again, and when it closes.
    func onWritable(_ action: @escaping @Sendable () -> Void) {
        whenWritable.withLock { $0 = action }
    }

    func set(writable isWritable: Bool) {
        let was = writable.exchange(isWritable, ordering: .acquiringAndReleasing)
        if isWritable, !was { whenWritable.withLock { $0 }?() }
    }

    func close() {
        closed.store(true, ordering: .releasing)
        whenWritable.withLock { action in
            defer { action = nil }
            return action
        }?()
    }
}
