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

/// Runs an action at once, then at most once per `interval` however often it is asked for: a request
/// within the interval is answered once, at its end (the action of the last request in it). For what
/// anybody may ask for (a NATS subject others publish on), so a flood of requests costs one action an
/// interval. `Sendable`.
public final class Throttle: Sendable {
    private struct State {
        var lastRun: ContinuousClock.Instant?
        var pending: (@Sendable () -> Void)?
        var scheduled = false
    }

    private let state = Mutex(State())
    private let interval: Duration

    public init(interval: Duration) {
        self.interval = interval
    }

    public func request(_ action: @escaping @Sendable () -> Void) {
        let now = ContinuousClock.now
        let (runNow, wait): (Bool, Duration?) = state.withLock { state in
            if state.scheduled {
                state.pending = action
                return (false, nil)
            }
            if let last = state.lastRun, now - last < interval {
                state.pending = action
                state.scheduled = true
                return (false, interval - (now - last))
            }
            state.lastRun = now
            return (true, nil)
        }
        if runNow { action() }
        guard let wait else { return }
        Task {
            try? await Task.sleep(for: wait)
            let pending = self.state.withLock { state in
                defer {
                    state.pending = nil
                    state.scheduled = false
                    state.lastRun = .now
                }
                return state.pending
            }
            pending?()
        }
    }
}
