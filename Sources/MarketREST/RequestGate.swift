import Synchronization

/// At most `limit` requests at a time. When a slot frees up it goes to the first waiting
/// `foreground` request (someone is waiting for it) or request marked urgent, then to `background`
/// ones (prefetches), then to `bulk` ones (reference prices). Cancelling a waiting task takes it out of
/// the queue.
///
/// An actor. AsyncHTTPClient's connection pool limits connections per host but knows no priorities,
/// which is what this adds.
public actor RequestGate {
    public enum Priority: Int, Sendable, Comparable {
        case foreground, background, bulk

        public static func < (lhs: Priority, rhs: Priority) -> Bool { lhs.rawValue < rhs.rawValue }
    }

    /// Marks the requests of a load as urgent once somebody waits for it: a prefetch that a client
    /// catches up with jumps the queue, requests already waiting included. Set through ``urgency``.
    public final class Urgency: Sendable {
        private let flag = Atomic(false)

        public init() {}

        public var isUrgent: Bool { flag.load(ordering: .relaxed) }
        public func escalate() { flag.store(true, ordering: .relaxed) }
    }

    /// The urgency of the load the current task's requests belong to.
    @TaskLocal public static var urgency: Urgency?

    public let limit: Int
    private var running = 0
    private var waiting: [Waiter] = []
    private var nextID: UInt64 = 0

    private struct Waiter {
        let id: UInt64
        let priority: Priority
        let urgency: Urgency?
        let continuation: CheckedContinuation<Void, any Error>

        var effective: Priority { urgency?.isUrgent == true ? .foreground : priority }
    }

    public init(limit: Int) {
        self.limit = max(1, limit)
    }

    /// Requests running now, and waiting (for tests and metrics).
    public var load: (running: Int, waiting: Int) { (running, waiting.count) }

    /// Runs `body` once a slot is free; throws `CancellationError` if cancelled while waiting.
    public nonisolated func run<T: Sendable>(_ priority: Priority, _ body: @Sendable () async throws -> T) async throws -> T {
        try await enter(priority, urgency: Self.urgency)
        do {
            let value = try await body()
            await leave()
            return value
        } catch {
            await leave()
            throw error
        }
    }

    private func enter(_ priority: Priority, urgency: Urgency?) async throws {
        try Task.checkCancellation()
        if running < limit {
            running += 1
            return
        }
        nextID += 1
        let id = nextID
        try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { continuation in
                waiting.append(Waiter(id: id, priority: priority, urgency: urgency, continuation: continuation))
            }
        } onCancel: {
            Task { await self.cancelWaiter(id) }
        }
    }

    private func cancelWaiter(_ id: UInt64) {
        if let index = waiting.firstIndex(where: { $0.id == id }) {
            waiting.remove(at: index).continuation.resume(throwing: CancellationError())
        }
    }

    private func leave() {
        // The first waiter of the most pressing kind; the slot passes straight to it.
        guard let best = waiting.indices.min(by: { (waiting[$0].effective, $0) < (waiting[$1].effective, $1) }) else {
            running -= 1
            return
        }
        waiting.remove(at: best).continuation.resume()
    }
}
