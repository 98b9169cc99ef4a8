/// At most `perSecond` requests a second, with bursts of up to `burst`: each ``next()`` returns when
/// the caller may send its request. Polygon asks paid users to stay under 100 a second; the gap fill
/// takes its turns here. An actor.
public actor RequestPace {
    public let perSecond: Double
    public let burst: Int
    private var nextFree: ContinuousClock.Instant = .now

    public init(perSecond: Double, burst: Int? = nil) {
        self.perSecond = max(perSecond, 0.01)
        self.burst = max(burst ?? Int(perSecond.rounded(.up)), 1)
    }

    /// Waits for this request's turn; throws `CancellationError` if cancelled while waiting.
    public func next() async throws {
        let interval = Duration.seconds(1 / perSecond)
        let now = ContinuousClock.now
        // Unused turns of the past second may be spent now, up to the burst.
        let turn = max(nextFree, now - interval * (burst - 1))
        nextFree = turn + interval
        if turn > now { try await Task.sleep(until: turn, clock: .continuous) }
    }
}
