import Synchronization

/// One answer made at a time: callers that ask while one is being made share it, and a caller that
/// asks after it was made gets a new one (never an old answer). So a flood of concurrent requests for
/// something that costs work (a health report reading every hub) costs one making, however many ask at
/// once. `Sendable`: the answer under way behind a `Mutex`.
public final class SharedAnswer<Value: Sendable>: Sendable {
    private let making = Mutex<Task<Value, any Error>?>(nil)

    public init() {}

    /// The answer under way, or a new one made by `make`.
    public func value(_ make: @escaping @Sendable () async throws -> Value) async throws -> Value {
        let task = making.withLock { making in
            if let task = making { return task }
            let task = Task { try await make() }
            making = task
            return task
        }
        defer { making.withLock { if $0 == task { $0 = nil } } }
        return try await task.value
    }
}
