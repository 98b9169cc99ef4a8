/// At most `limit` requests at a time; a foreground request (someone is waiting for it) goes ahead of
/// every queued background one (a prefetch). Cancelling a waiting task takes it out of the queue.
///
/// An actor. AsyncHTTPClient's connection pool limits connections per host but knows no priorities,
/// which is what this adds.
public actor RequestGate {
    public enum Priority: Sendable {
        case foreground, background
    }

    public let limit: Int
    private var running = 0
    private var waiting: [Priority: [(id: UInt64, continuation: CheckedContinuation<Void, any Error>)]] = [:]
    private var nextID: UInt64 = 0

    public init(limit: Int) {
        self.limit = max(1, limit)
    }

    /// Requests running now, and waiting (for tests and metrics).
    public var load: (running: Int, waiting: Int) { (running, waiting.values.reduce(0) { $0 + $1.count }) }

    /// Runs `body` once a slot is free; throws `CancellationError` if cancelled while waiting.
    public nonisolated func run<T: Sendable>(_ priority: Priority, _ body: @Sendable () async throws -> T) async throws -> T {
        try await enter(priority)
        do {
            let value = try await body()
            await leave()
            return value
        } catch {
            await leave()
            throw error
        }
    }

    private func enter(_ priority: Priority) async throws {
        try Task.checkCancellation()
        if running < limit {
            running += 1
            return
        }
        nextID += 1
        let id = nextID
        try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { continuation in
                waiting[priority, default: []].append((id, continuation))
            }
        } onCancel: {
            Task { await self.cancelWaiter(id) }
        }
    }

    private func cancelWaiter(_ id: UInt64) {
        for priority in [Priority.foreground, .background] {
            if let index = waiting[priority]?.firstIndex(where: { $0.id == id }), let waiter = waiting[priority]?.remove(at: index) {
                waiter.continuation.resume(throwing: CancellationError())
            }
        }
    }

    private func leave() {
        for priority in [Priority.foreground, .background] where !(waiting[priority]?.isEmpty ?? true) {
            // The slot passes straight to the next waiter: `running` stays as it is.
            waiting[priority]?.removeFirst().continuation.resume()
            return
        }
        running -= 1
    }
}
