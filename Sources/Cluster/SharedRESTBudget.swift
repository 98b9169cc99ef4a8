import Foundation
import Logging
import MarketCore
import MarketREST
import Synchronization

/// The account's REST budget on a cluster: one token bucket for every node, kept in a JetStream
/// key-value bucket (`<cluster>-rest-budget`, a key per upstream account) as `tokens,updated_ms,paused_until_ms`
/// and changed only by compare-and-set on its revision, so two nodes never spend the same token.
///
/// A request first waits its turn on this node (a local ``RESTBudget`` with the same plan: it orders
/// the node's requests by priority and bounds their queue and wait), then takes the shared token; when
/// the shared bucket is empty it waits for the refill, or is refused with the time to the next token
/// once that passes the wait bound. A vendor's 429 is written to the bucket, so every node pauses.
/// A node makes at most four calls to the shared bucket at once per account; more wait their turn (at
/// most 64, each within its own wait bound; past them a request tries again 100 ms later). When NATS
/// does not answer, the node falls back to its own bucket (it cannot be worse than one node alone) and
/// says so in the log; it asks again a second later, one call at a time until NATS answers. See
/// ``CallGate``.
///
/// `Sendable`: immutable parts; the bound bucket and the warning's flag behind a `Mutex` each, the
/// calls' turns in a ``CallGate``.
public final class SharedRESTBudget: AccountBudget {
    public let rate: RESTRate
    public let local: RESTBudget
    private let connection: NATSConnection
    private let bucketName: String
    private let key: String
    private let bucket = Mutex<KeyValueBucket?>(nil)
    private let warned = Mutex(false)
    /// Turns for calls to the shared bucket (at most ``maxCallsInFlight`` at once, ``maxCallsWaiting``
    /// waiting), and whether NATS last failed to answer.
    let gate = CallGate(
        maxInFlight: SharedRESTBudget.maxCallsInFlight, maxWaiting: SharedRESTBudget.maxCallsWaiting,
        afterFailure: SharedRESTBudget.localAfterFailure)
    /// Calls to the shared bucket a node makes at once for an account (a read and a write each, a few
    /// milliseconds while NATS answers: far more than the account's rate needs).
    static let maxCallsInFlight = 4
    /// Requests that may wait for one of those calls to end (each within its own bound); past them
    /// (NATS answers, but slowly) a request tries again after ``busyWait``.
    static let maxCallsWaiting = 64
    static let busyWait: Duration = .milliseconds(100)
    /// After NATS failed to answer, the node counts on its own this long before asking again.
    static let localAfterFailure: Duration = .seconds(1)
    /// The longest pause the bucket may hold (the longest a vendor's `Retry-After` is taken for).
    static let maxPause = RESTBudget.maxPause
    /// How far past the longest pause another node's may end (clocks differ by a few seconds).
    static let pauseSlack: Duration = .seconds(10)
    /// How far ahead of this node's clock another node's count may be. Clocks differ; a count moved
    /// back within this would credit the nodes ahead with the difference, so it is generous: a value
    /// past it is not a clock's.
    static let maxClockAhead: Duration = .seconds(300)
    private let warnedOutOfRange = Mutex(false)
    private let logger: Logger

    public init(
        rate: RESTRate, burst: Int? = nil, maxWaiting: Int = 256, maxWait: Duration = .seconds(10), cluster: ClusterConfiguration,
        account: String = "account", requestTimeout: Duration = .seconds(1), logger: Logger = Logger(label: "relay.rest-budget")
    ) {
        key = account
        self.rate = rate
        local = RESTBudget(rate: rate, burst: burst, maxWaiting: maxWaiting, maxWait: maxWait)
        connection = NATSConnection(
            servers: cluster.servers, name: "relay \(cluster.name)/\(cluster.nodeID) REST budget", security: cluster.security,
            requestTimeout: requestTimeout, logger: logger)
        bucketName = "\(cluster.name)-rest-budget"
        self.logger = logger
    }

    public func take(_ priority: RequestGate.Priority, bounded: Bool) async -> RESTBudget.Admission {
        let started = ContinuousClock.now
        let turn = await local.take(priority, bounded: bounded)
        guard turn == .granted else { return turn }
        let deadline = bounded ? started + local.maxWait : nil
        while true {
            switch await takeShared(deadline: deadline) {
            case .granted: return .granted
            case .unavailable: return .granted
            case .wait(let wait):
                if bounded, ContinuousClock.now - started + wait > local.maxWait { return .refused(retryAfter: wait) }
                do { try await Task.sleep(for: min(wait, .seconds(1))) } catch { return .cancelled }
            }
        }
    }

    public func pause(for retryAfter: Duration) async {
        await local.pause(for: retryAfter)
        let until = WallClock.nowMilliseconds() + min(max(retryAfter, .milliseconds(100)), Self.maxPause).milliseconds
        // Ahead of every waiting request: each would spend a token on a vendor that refuses them.
        _ = await changeShared(.first) { state in
            state.pausedUntil = max(state.pausedUntil, until)
            state.tokens = min(state.tokens, 0)
            return true
        }
    }

    /// What the budget holds: the shared bucket's tokens and pause when a call to it may start at once,
    /// else the node's own. A status view never waits behind the requests' calls, nor is it the call
    /// that asks a failed NATS again; its own read waits at most the request timeout.
    public func snapshot() async -> RESTBudget.State {
        var state = await local.snapshot()
        guard await gate.enter(.atOnce) == .starts else { return state }
        defer { gate.leave() }
        guard let bucket = await boundBucket() else { return state }
        do {
            let now = WallClock.nowMilliseconds()
            if let entry = try await bucket.get(key), let shared = stored(entry.text, at: now)?.shared {
                state.tokens = shared.refilled(at: now, rate: rate, burst: local.burst).tokens
                state.pausedUntil = shared.pausedUntil > now ? shared.pausedUntil : nil
            }
            answered()
        } catch {
            unavailable(error)
        }
        return state
    }

    /// The stored bucket: tokens, when they were counted, until when the vendor paused the account.
    struct Shared: Equatable {
        var tokens: Double
        var updated: Int64
        var pausedUntil: Int64

        init(tokens: Double, updated: Int64, pausedUntil: Int64) {
            self.tokens = tokens
            self.updated = updated
            self.pausedUntil = pausedUntil
        }

        init?(_ text: String) {
            let parts = text.split(separator: ",")
            guard parts.count == 3, let tokens = Double(parts[0]), tokens.isFinite, let updated = Int64(parts[1]), let paused = Int64(parts[2]) else {
                return nil
            }
            self.init(tokens: tokens, updated: updated, pausedUntil: paused)
        }

        var text: String { "\(tokens),\(updated),\(pausedUntil)" }

        /// Within what the relay itself writes, read at `now`: tokens within `0...burst`, counted at
        /// most ``SharedRESTBudget/maxClockAhead`` ahead and a day back (the bucket is full long before;
        /// further back would overflow the refill), paused at most ``SharedRESTBudget/maxPause`` (and
        /// ``SharedRESTBudget/pauseSlack``) ahead.
        /// `nil` when it already is.
        ///
        /// Anyone who may publish on the cluster's NATS can write the bucket: a pause or a count in the
        /// far future would stop every node's REST calls for good (gap fill and the portfolio wait
        /// as long as it takes), a huge negative count would overflow the wait.
        func bounded(at now: Int64, burst: Int) -> Shared? {
            let within = Shared(
                tokens: min(max(tokens, 0), Double(burst)),
                updated: min(max(updated, now - 86_400_000), now + SharedRESTBudget.maxClockAhead.milliseconds),
                // A node's clock a little ahead writes a whole pause a little past this one's now.
                pausedUntil: min(pausedUntil, now + SharedRESTBudget.maxPause.milliseconds + SharedRESTBudget.pauseSlack.milliseconds))
            return within == self ? nil : within
        }

        /// Refilled up to `now` (never backwards: a node whose clock is behind adds nothing).
        func refilled(at now: Int64, rate: RESTRate, burst: Int) -> Shared {
            let elapsed = max(0, now - updated)
            return Shared(
                tokens: min(Double(burst), tokens + Double(elapsed) / 1000 * rate.perSecond), updated: max(updated, now), pausedUntil: pausedUntil)
        }
    }

    enum SharedTake: Equatable {
        case granted
        case wait(Duration)
        case unavailable
    }

    /// Takes a shared token, waiting for a turn until `deadline` (`nil`: as long as it takes).
    private func takeShared(deadline: ContinuousClock.Instant?) async -> SharedTake {
        var wait: Duration = .zero
        let changed = await changeShared(.waits(until: deadline)) { state in
            let now = WallClock.nowMilliseconds()
            if state.pausedUntil > now {
                wait = .milliseconds(state.pausedUntil - now)
                return false
            }
            guard state.tokens >= 1 else {
                wait = .seconds((1 - state.tokens) / rate.perSecond)
                return false
            }
            state.tokens -= 1
            return true
        }
        switch changed {
        case .unavailable: return .unavailable
        case .changed: return .granted
        case .declined: return .wait(max(wait, .milliseconds(10)))
        case .contended: return .wait(.milliseconds(Int64.random(in: 5...50)))
        case .busy: return .wait(Self.busyWait)
        }
    }

    /// What a read-change-write of the bucket came to.
    enum Change {
        case changed
        /// `change` declined (no token, a pause).
        case declined
        /// Every try lost to another node's write: try again shortly (never a token not counted).
        case contended
        /// No turn came within the request's bound (``maxCallsInFlight`` calls run and
        /// ``maxCallsWaiting`` wait, its deadline passed, or it was cancelled): try again a little later,
        /// if the request's own bound lets it wait that long.
        case busy
        /// NATS did not answer, or refused the bucket outright: this node counts on its own.
        case unavailable
    }

    /// Reads the bucket, lets `change` decide (and alter the state), and writes it back on the revision
    /// read; a write that lost to another node's is tried again (at most 8 times). Takes its turn at
    /// the ``gate`` as `turn` says.
    private func changeShared(_ turn: CallGate.Entry, _ change: (inout Shared) -> Bool) async -> Change {
        switch await gate.enter(turn) {
        case .starts: break
        case .local: return .unavailable
        case .busy: return .busy
        }
        defer { gate.leave() }
        // A request cancelled while it waited its turn spends no token (a vendor's 429 is written
        // whatever became of the request that saw it).
        if case .waits = turn, Task.isCancelled { return .busy }
        guard let bucket = await boundBucket() else { return .unavailable }
        for _ in 0..<8 {
            let now = WallClock.nowMilliseconds()
            let entry: KeyValueBucket.Entry?
            do { entry = try await bucket.get(key) } catch {
                unavailable(error)
                return .unavailable
            }
            answered()
            let read = entry.flatMap { stored($0.text, at: now) }
            var state = (read?.shared ?? Shared(tokens: Double(local.burst), updated: now, pausedUntil: 0))
                .refilled(at: now, rate: rate, burst: local.burst)
            let changed = change(&state)
            // A value brought within bounds is written back even when nothing else changed: read as
            // counted ahead of the clock anew each time, it would never refill.
            guard changed || read?.corrected == true else { return .declined }
            do {
                if let entry {
                    _ = try await bucket.update(key, state.text, last: entry.revision)
                } else {
                    _ = try await bucket.create(key, state.text)
                }
                return changed ? .changed : .declined
            } catch .rejected(let text) where Self.lostTheRace(text) {
                // Another node wrote first: read again.
                continue
            } catch {
                unavailable(error)
                return .unavailable
            }
        }
        return .contended
    }

    /// The bucket's stored value, read at `now` and brought within bounds (``Shared/bounded(at:burst:)``,
    /// told once in the log; `corrected`); `nil` when it is not a value at all (the bucket then starts
    /// full again).
    private func stored(_ text: String, at now: Int64) -> (shared: Shared, corrected: Bool)? {
        guard let shared = Shared(text) else { return nil }
        guard let bounded = shared.bounded(at: now, burst: local.burst) else { return (shared, false) }
        if warnedOutOfRange.withLock({ warned in
            defer { warned = true }
            return !warned
        }) {
            logger.warning(
                """
                REST budget: the cluster's shared bucket held a value out of bounds (\(text)): written by something \
                other than a node, or a node's clock is far off; read as \(bounded.text)
                """)
        }
        return (bounded, true)
    }

    /// Whether a refused write lost to another node's (the revision moved, or the key was created
    /// meanwhile), as against a bucket that refuses writes.
    static func lostTheRace(_ text: String) -> Bool {
        let lowered = text.lowercased()
        return lowered.contains("wrong last sequence") || lowered.contains("key exists")
    }

    /// Whether the shared bucket answers within `timeout` (at start, and in tests).
    public func reachable(within timeout: Duration) async -> Bool {
        let deadline = ContinuousClock.now + timeout
        while ContinuousClock.now < deadline {
            if await boundBucket() != nil { return true }
            do { try await Task.sleep(for: .milliseconds(50)) } catch { return false }
        }
        return false
    }

    private func boundBucket() async -> KeyValueBucket? {
        if let bound = bucket.withLock({ $0 }) { return bound }
        do {
            // Kept until the bucket would be full again anyway (an expired value reads as a full bucket).
            let refill = Duration.seconds(Double(local.burst) / rate.perSecond)
            let bound = try await connection.keyValue(bucket: bucketName, ttl: max(refill * 2, .seconds(60)))
            bucket.withLock { $0 = bound }
            answered()
            return bound
        } catch {
            unavailable(error)
            return nil
        }
    }

    /// NATS answered: every request asks the shared bucket again.
    private func answered() {
        gate.answered()
    }

    private func unavailable(_ error: any Error) {
        // The next call binds again (a rebuilt connection leaves the old handle failing), after a while.
        bucket.withLock { $0 = nil }
        // Those waiting their turn count on their own now, as those that come in the next second do.
        gate.failed()
        let first = warned.withLock { warned in
            defer { warned = true }
            return !warned
        }
        if first {
            logger.warning("REST budget: the cluster's shared bucket is unavailable (\(error)); this node counts on its own until NATS answers")
        }
    }

    /// Closes the budget's NATS connection.
    public func close() async { await connection.close() }
}
