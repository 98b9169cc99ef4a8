import Synchronization

/// One answer made at a time: callers that ask while one is being made share it, and a caller that
/// asks after it was made gets a new one (never an answer that was finished before it asked). So a
/// flood of concurrent requests for something that costs work (a health report reading every hub)
/// costs one making, however many ask at once. An error is every waiting caller's, and the next caller
/// makes anew. `Sendable`: the answer under way behind a `Mutex`.
public final class SharedAnswer<Value: Sendable>: Sendable {
    private struct State {
        var making: (id: UInt64, task: Task<Value, any Error>)?
        var next: UInt64 = 0
        var waiting = 0
    }

    private let state = Mutex(State())

    public init() {}

    /// The answer under way, or a new one made by `make`.
    public func value(_ make: @escaping @Sendable () async throws -> Value) async throws -> Value {
        let task = state.withLock { state in
            state.waiting += 1
            if let making = state.making { return making.task }
            let id = state.next
            state.next += 1
            // The making lets go of its place as it ends (made under the lock: not before it has it),
            // not when its callers next run: one that asks later never gets it.
            let task = Task { [weak self] in
                defer { self?.state.withLock { if $0.making?.id == id { $0.making = nil } } }
                return try await make()
            }
            state.making = (id, task)
            return task
        }
        defer { state.withLock { $0.waiting -= 1 } }
        return try await task.value
    }

    /// Callers waiting for an answer now (tests).
    package var waiting: Int { state.withLock { $0.waiting } }
}
