import Synchronization
import Testing

/// Polls `condition` every `interval` until it holds, for state that has no change signal. After
/// `timeout` it records an issue naming `what` at the caller's line and returns `false` (the test goes
/// on, so its later expectations say what else is wrong); `true` once the condition held.
@discardableResult
public func eventually(
    _ what: String, timeout: Duration = .seconds(10), every interval: Duration = .milliseconds(10),
    sourceLocation: SourceLocation = #_sourceLocation, _ condition: () async throws -> Bool
) async throws -> Bool {
    let deadline = ContinuousClock.now + timeout
    while try await !condition() {
        guard ContinuousClock.now < deadline else {
            Issue.record("not within \(timeout): \(what)", sourceLocation: sourceLocation)
            return false
        }
        try await Task.sleep(for: interval)
    }
    return true
}

/// `task`'s value, or `nil` if it has none within `timeout` (the task goes on, and nothing waits for
/// it): for a step that should answer at once, so a regression that makes it wait fails the test
/// instead of hanging it.
public func value<T: Sendable>(of task: Task<T, Never>, within timeout: Duration = .seconds(10)) async -> T? {
    let answer = Mutex<CheckedContinuation<T?, Never>?>(nil)
    return await withCheckedContinuation { continuation in
        answer.withLock { $0 = continuation }
        // Whichever comes first answers; the other finds the answer taken.
        let give: @Sendable (T?) -> Void = { value in answer.withLock { $0.take() }?.resume(returning: value) }
        let timer = Task {
            try? await Task.sleep(for: timeout)
            give(nil)
        }
        Task {
            give(await task.value)
            timer.cancel()
        }
    }
}
