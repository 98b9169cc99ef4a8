import Synchronization

/// Runs an action once, `delay` after the first of any number of pokes (the first poke's action: give
/// every poke the same one). `Sendable`.
public final class Debouncer: Sendable {
    private let scheduled = Mutex(false)
    private let delay: Duration

    public init(delay: Duration) {
        self.delay = delay
    }

    public func poke(_ action: @escaping @Sendable () -> Void) {
        let start = scheduled.withLock { scheduled in
            defer { scheduled = true }
            return !scheduled
        }
        guard start else { return }
        Task {
            try? await Task.sleep(for: delay)
            scheduled.withLock { $0 = false }
            action()
        }
    }
}
