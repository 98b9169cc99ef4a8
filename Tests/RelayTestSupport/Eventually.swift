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
