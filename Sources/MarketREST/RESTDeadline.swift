import Synchronization

/// A bound on a REST call as a whole, head and body.
public enum RESTDeadline {
    /// The whole of `operation` within `limit`, else ``TimedOut``; cancelling the caller throws
    /// `CancellationError` at once. Either way the operation is cancelled (an AsyncHTTPClient request
    /// closes its connection) and **not waited for**: the caller is bound by `limit` even when the
    /// operation is slow to honour its cancellation (a task group would wait for it to end, and a
    /// request that missed its cancellation held its caller, and whatever the caller held, for minutes).
    /// The operation runs in a task of its own, with the caller's task-local values and priority (an
    /// escalation of the caller's priority later does not reach it). An operation that ignores its
    /// cancellation runs on unwaited: the relay's HTTP client ends a stalled read on its own.
    public static func within<T: Sendable>(_ limit: Duration, _ operation: @escaping @Sendable () async throws -> T) async throws -> T {
        let race = DeadlineRace<T>()
        return try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { continuation in
                race.start(continuation, limit: limit, operation: operation)
            }
        } onCancel: {
            race.finish(.failure(CancellationError()))
        }
    }

    public struct TimedOut: Error, CustomStringConvertible {
        public var limit: Duration
        public var description: String { "no whole answer within \(limit.components.seconds) s" }
    }
}

/// The operation, its timer and the caller's cancellation race to one end: the first finishes the
/// caller's wait and cancels the other two.
private final class DeadlineRace<T: Sendable>: Sendable {
    private struct State {
        var continuation: CheckedContinuation<T, any Error>?
        var tasks: [Task<Void, Never>] = []
        var finished = false
    }

    private let state = Mutex(State())

    func start(_ continuation: CheckedContinuation<T, any Error>, limit: Duration, operation: @escaping @Sendable () async throws -> T) {
        // Under the lock: a caller cancelled before this starts nothing (no request sent for nothing),
        // and one cancelled after finds the tasks to cancel.
        let cancelled = state.withLock { state in
            guard !state.finished else { return true }
            state.continuation = continuation
            let work = Task {
                do { self.finish(.success(try await operation())) } catch { self.finish(.failure(error)) }
            }
            let timer = Task {
                guard (try? await Task.sleep(for: limit)) != nil else { return }
                self.finish(.failure(RESTDeadline.TimedOut(limit: limit)))
            }
            state.tasks = [work, timer]
            return false
        }
        if cancelled { continuation.resume(throwing: CancellationError()) }
    }

    func finish(_ result: Result<T, any Error>) {
        let (continuation, tasks) = state.withLock { state -> (CheckedContinuation<T, any Error>?, [Task<Void, Never>]) in
            guard !state.finished else { return (nil, []) }
            state.finished = true
            defer {
                state.continuation = nil
                state.tasks = []
            }
            return (state.continuation, state.tasks)
        }
        for task in tasks { task.cancel() }
        continuation?.resume(with: result)
    }
}
