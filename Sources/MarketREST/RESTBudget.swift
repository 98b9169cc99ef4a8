import Foundation

/// A REST account's request rate, as a plan states it: `5/min`, `200/min`, `100/s`.
public struct RESTRate: Sendable, Equatable, CustomStringConvertible {
    public var requests: Int
    public var per: Duration

    public init(requests: Int, per: Duration) {
        self.requests = max(1, requests)
        self.per = per > .zero ? per : .seconds(1)
    }

    /// `N/s`, `N/sec`, `N/min`, `N/m`, `N/h`; `nil` for anything else.
    public init?(parsing text: String) {
        let parts = text.replacingOccurrences(of: " ", with: "").lowercased().split(separator: "/")
        guard parts.count == 2, let count = Int(parts[0]), count > 0, count <= 1_000_000 else { return nil }
        switch parts[1] {
        case "s", "sec", "second": self.init(requests: count, per: .seconds(1))
        case "m", "min", "minute": self.init(requests: count, per: .seconds(60))
        case "h", "hour": self.init(requests: count, per: .seconds(3600))
        default: return nil
        }
    }

    /// Tokens a second.
    public var perSecond: Double { Double(requests) / Double(per.components.seconds) }

    public var description: String {
        switch per {
        case .seconds(1): "\(requests)/s"
        case .seconds(60): "\(requests)/min"
        default: "\(requests)/h"
        }
    }
}

/// What every REST request of an account waits on: ``RESTBudget`` on one node, a bucket shared
/// through NATS on a cluster (`SharedRESTBudget`). `Sendable`.
public protocol AccountBudget: Sendable {
    /// The account's plan.
    var rate: RESTRate { get }
    /// Waits for a token (see ``RESTBudget/take(_:bounded:)``).
    func take(_ priority: RequestGate.Priority, bounded: Bool) async -> RESTBudget.Admission
    /// The vendor answered 429: nothing more is sent for `retryAfter`.
    func pause(for retryAfter: Duration) async
    /// What the budget holds now.
    func snapshot() async -> RESTBudget.State
}

/// The account's REST budget: one token bucket for every request the relay sends to a vendor's REST
/// API (the gateway's clients, gap fill, the portfolio), refilled at the plan's rate, holding at most
/// `burst` tokens. Requests wait for a token in priority order (foreground, background, bulk; first
/// come first within one), at most `maxWaiting` of them and each at most `maxWait`: a request that would
/// wait longer is refused at once with the time after which a token will be free, which the gateway
/// answers as `429` with `Retry-After`. A vendor's own `429` pauses the bucket for its `Retry-After`.
///
/// An actor; the clock is injected for tests (``now``).
public actor RESTBudget: AccountBudget {
    public enum Admission: Sendable, Equatable {
        case granted
        /// Not sent: the wait for a token would pass the bound (or the queue is full); a token is free
        /// again after this long.
        case refused(retryAfter: Duration)
        case cancelled
    }

    /// What the budget holds now (the dashboard, the metrics).
    public struct State: Sendable, Equatable {
        public var tokens: Double
        public var burst: Int
        public var waiting: Int
        public var rate: RESTRate
        /// Until when a vendor's 429 pauses the account (`nil`: not paused), Unix ms.
        public var pausedUntil: Int64?
        public var granted: Int
        public var refused: Int
    }

    public nonisolated let rate: RESTRate
    public nonisolated let burst: Int
    public nonisolated let maxWaiting: Int
    public nonisolated let maxWait: Duration
    private var tokens: Double
    private var refilledAt: ContinuousClock.Instant
    private var pausedUntil: ContinuousClock.Instant?
    private var waiting: [Waiter] = []
    private var nextID: UInt64 = 0
    private var pumping = false
    private var granted = 0
    private var refusedCount = 0

    private struct Waiter {
        let id: UInt64
        let priority: RequestGate.Priority
        let deadline: ContinuousClock.Instant?
        let continuation: CheckedContinuation<Admission, Never>
    }

    public init(rate: RESTRate, burst: Int? = nil, maxWaiting: Int = 256, maxWait: Duration = .seconds(10)) {
        self.rate = rate
        self.burst = max(1, burst ?? rate.requests)
        self.maxWaiting = max(0, maxWaiting)
        self.maxWait = maxWait
        tokens = Double(self.burst)
        refilledAt = .now
    }

    public func snapshot() -> State { state }

    public var state: State {
        refill()
        return State(
            tokens: tokens, burst: burst, waiting: waiting.count, rate: rate, pausedUntil: pausedUntil.map(Self.unixMilliseconds),
            granted: granted, refused: refusedCount)
    }

    /// Waits for a token. `bounded`: the gateway's clients, refused when the wait would pass
    /// ``maxWait`` or the queue is full; the relay's own requests (gap fill, the portfolio) wait as long
    /// as it takes, as they did behind their own pace. Cancelling the task takes it out of the queue.
    public func take(_ priority: RequestGate.Priority, bounded: Bool = true) async -> Admission {
        refill()
        let now = ContinuousClock.now
        let paused = pausedUntil.map { $0 > now } ?? false
        if !paused, waiting.isEmpty, tokens >= 1 {
            tokens -= 1
            granted += 1
            return .granted
        }
        if bounded {
            let wait = estimatedWait(for: priority, now: now)
            // The queue's bound is the clients': the relay's own requests (which wait as long as it
            // takes) do not fill it.
            if waiting.filter({ $0.deadline != nil }).count >= maxWaiting || wait > maxWait {
                refusedCount += 1
                return .refused(retryAfter: max(wait, .seconds(1)))
            }
        }
        nextID += 1
        let id = nextID
        let deadline = bounded ? now + maxWait : nil
        return await withTaskCancellationHandler {
            await withCheckedContinuation { continuation in
                waiting.append(Waiter(id: id, priority: priority, deadline: deadline, continuation: continuation))
                startPump()
            }
        } onCancel: {
            Task { await self.cancel(id) }
        }
    }

    /// The longest a vendor's `Retry-After` is taken for: a host that asks for an hour (or a day) does
    /// not stop gap fill, the portfolio and the gateway for all that time; asked again, it pauses again.
    public static let maxPause: Duration = .seconds(120)

    /// The vendor answered 429: nothing more is sent for `retryAfter` (at most ``maxPause``).
    public func pause(for retryAfter: Duration) {
        let until = ContinuousClock.now + min(max(retryAfter, .milliseconds(100)), Self.maxPause)
        pausedUntil = max(pausedUntil ?? until, until)
        tokens = min(tokens, 0)
    }

    /// How long a request of `priority` arriving now would wait: the pause, then one refill interval per
    /// request ahead of it (those of its priority or a more pressing one) beyond the tokens in hand.
    private func estimatedWait(for priority: RequestGate.Priority, now: ContinuousClock.Instant) -> Duration {
        let ahead = waiting.filter { $0.priority <= priority }.count
        let pause = pausedUntil.map { $0 > now ? $0 - now : .zero } ?? .zero
        let missing = Double(ahead + 1) - max(tokens, 0)
        let refill = missing > 0 ? Duration.seconds(missing / rate.perSecond) : .zero
        return pause + refill
    }

    private func refill() {
        let now = ContinuousClock.now
        let elapsed = now - refilledAt
        refilledAt = now
        let seconds = Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) / 1e18
        tokens = min(Double(burst), tokens + seconds * rate.perSecond)
    }

    private func cancel(_ id: UInt64) {
        guard let index = waiting.firstIndex(where: { $0.id == id }) else { return }
        waiting.remove(at: index).continuation.resume(returning: .cancelled)
    }

    private func startPump() {
        guard !pumping else { return }
        pumping = true
        Task { await self.pump() }
    }

    /// Hands tokens to the waiters as they refill, most pressing first; refuses a bounded waiter whose
    /// deadline passed (a flood of more pressing requests kept it back), so no request hangs.
    private func pump() async {
        while !waiting.isEmpty {
            refill()
            let now = ContinuousClock.now
            for (index, waiter) in waiting.enumerated().reversed() where waiter.deadline.map({ $0 <= now }) ?? false {
                waiting.remove(at: index)
                refusedCount += 1
                waiter.continuation.resume(returning: .refused(retryAfter: max(estimatedWait(for: waiter.priority, now: now), .seconds(1))))
            }
            let paused = pausedUntil.map { $0 > now } ?? false
            while !paused, tokens >= 1, let best = waiting.indices.min(by: { (waiting[$0].priority, $0) < (waiting[$1].priority, $1) }) {
                tokens -= 1
                granted += 1
                waiting.remove(at: best).continuation.resume(returning: .granted)
            }
            guard !waiting.isEmpty else { break }
            var wake = paused ? (pausedUntil ?? now) : now + .seconds(max(1 - tokens, 0.001) / rate.perSecond)
            if let soonest = waiting.compactMap(\.deadline).min() { wake = min(wake, soonest) }
            try? await Task.sleep(until: max(wake, now + .milliseconds(1)), clock: .continuous)
        }
        pumping = false
    }

    static func unixMilliseconds(_ instant: ContinuousClock.Instant) -> Int64 {
        let ahead = instant - .now
        return Int64(Date().timeIntervalSince1970 * 1000) + ahead.components.seconds * 1000 + ahead.components.attoseconds / 1_000_000_000_000_000
    }
}
