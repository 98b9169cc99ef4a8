/// Exponential backoff with full jitter: retry `n` (0-based) waits a random time in
/// `0...min(cap, initial·2ⁿ)`. Value type, `Sendable`. Used by the upstream reconnect policy and by the
/// REST client's retries.
public struct Backoff: Sendable, Equatable {
    public var initial: Duration
    public var cap: Duration

    public init(initial: Duration, cap: Duration) {
        self.initial = initial
        self.cap = cap
    }

    /// The ceiling of the jittered delay before retry number `attempt` (0-based).
    public func ceiling(attempt: Int) -> Duration {
        min(cap, initial * (1 << min(max(attempt, 0), 20)))
    }

    /// A random delay in `0...ceiling(attempt:)` (at least a millisecond of range).
    public func delay(attempt: Int, using generator: inout some RandomNumberGenerator) -> Duration {
        .milliseconds(Int64.random(in: 0...max(ceiling(attempt: attempt).milliseconds, 1), using: &generator))
    }

    public func delay(attempt: Int) -> Duration {
        var generator = SystemRandomNumberGenerator()
        return delay(attempt: attempt, using: &generator)
    }
}
