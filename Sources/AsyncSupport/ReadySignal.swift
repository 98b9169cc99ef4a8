import Synchronization

/// A value that becomes available once (a bound port, a set of started components) and that any
/// number of tasks can wait for.
///
/// `Sendable`; the state sits behind a `Mutex`. Waiting is cancellable; a signal that is failed (its
/// owner stopped before it was ready) throws to every waiter.
public final class ReadySignal<Value: Sendable>: Sendable {
    private enum State {
        case waiting([UInt64: CheckedContinuation<Value, any Error>], next: UInt64)
        case ready(Value)
        case failed(any Error)
    }

    private let state = Mutex(State.waiting([:], next: 0))

    public init() {}

    /// Makes the value available; later calls are ignored.
    public func succeed(_ value: Value) {
        let waiters: [CheckedContinuation<Value, any Error>] = state.withLock { state in
            guard case .waiting(let waiters, _) = state else { return [] }
            state = .ready(value)
            return Array(waiters.values)
        }
        for waiter in waiters { waiter.resume(returning: value) }
    }

    /// Fails every current and future waiter; ignored once ready.
    public func fail(_ error: any Error) {
        let waiters: [CheckedContinuation<Value, any Error>] = state.withLock { state in
            guard case .waiting(let waiters, _) = state else { return [] }
            state = .failed(error)
            return Array(waiters.values)
        }
        for waiter in waiters { waiter.resume(throwing: error) }
    }

    /// The value, if it is ready.
    public var value: Value? {
        state.withLock { state in
            if case .ready(let value) = state { return value }
            return nil
        }
    }

    /// Waits for the value.
    public func wait() async throws -> Value {
        let id: UInt64 = state.withLock { state in
            if case .waiting(let waiters, let next) = state {
                state = .waiting(waiters, next: next + 1)
                return next
            }
            return 0
        }
        return try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { continuation in
                let immediate: Result<Value, any Error>? = state.withLock { state in
                    switch state {
                    case .ready(let value): return .success(value)
                    case .failed(let error): return .failure(error)
                    case .waiting(var waiters, let next):
                        if Task.isCancelled { return .failure(CancellationError()) }
                        waiters[id] = continuation
                        state = .waiting(waiters, next: next)
                        return nil
                    }
                }
                if let immediate { continuation.resume(with: immediate) }
            }
        } onCancel: {
            let waiter: CheckedContinuation<Value, any Error>? = state.withLock { state in
                guard case .waiting(var waiters, let next) = state else { return nil }
                let waiter = waiters.removeValue(forKey: id)
                state = .waiting(waiters, next: next)
                return waiter
            }
            waiter?.resume(throwing: CancellationError())
        }
    }
}
