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
/// A node makes at most four calls to the shared bucket at once; more wait their turn (at most 64;
/// past them a request tries again shortly, within its own wait bound). When NATS does
/// not answer, the node falls back to its own bucket (it cannot be worse than one node alone) and says
/// so in the log; it asks again a second later, one call at a time until NATS answers.
///
/// `Sendable`: immutable parts, the bound bucket behind a `Mutex`.
public final class SharedRESTBudget: AccountBudget {
    public let rate: RESTRate
    public let local: RESTBudget
    private let connection: NATSConnection
    private let bucketName: String
    private let key: String
    private let bucket = Mutex<KeyValueBucket?>(nil)
    private let warned = Mutex(false)
    /// Calls to the shared bucket under way, those waiting to start, and whether NATS last failed to
    /// answer. While NATS stalls, each call holds a thread of the NATS pool for up to the request
    /// timeout, and a node's requests (100 a second by default) would start calls faster than they end.
    /// So at most ``maxCallsInFlight`` run at once and the others wait their turn (a cap waits: a node
    /// that counted on its own whenever the shared bucket was busy would overspend in bursts). When a
    /// call finds NATS not answering, those waiting and those that come in the next second count on
    /// the node's own bucket; then one call at a time asks again until one is answered.
    let calls = Mutex(SharedCalls())
    struct SharedCalls {
        var inFlight = 0
        /// Waiting for a call to end, in arrival order (the node's gate let them through in priority
        /// order): resumed with `starts` to make theirs, `local` to count on their own (NATS failed
        /// to answer meanwhile).
        var waiting: [CheckedContinuation<Entry, Never>] = []
        /// Set when NATS failed to answer (when to ask again), `nil` once it answers.
        var askAgainAt: ContinuousClock.Instant?
    }
    /// Calls to the shared bucket a node makes at once for an account (a read and a write each, a few
    /// milliseconds while NATS answers: far more than the account's rate needs).
    static let maxCallsInFlight = 4
    /// Requests that may wait for one of those calls to end; past them (NATS answers, but slowly) a
    /// request tries again after ``busyWait``, within its own bound, so the queue never grows with
    /// the request rate.
    static let maxCallsWaiting = 64
    static let busyWait: Duration = .milliseconds(100)
    /// After NATS failed to answer, the node counts on its own this long before asking again.
    static let localAfterFailure: Duration = .seconds(1)
    private let logger: Logger

    public init(
        rate: RESTRate, burst: Int? = nil, maxWaiting: Int = 256, maxWait: Duration = .seconds(10), cluster: ClusterConfiguration,
        account: String = "account", logger: Logger = Logger(label: "relay.rest-budget")
    ) {
        key = account
        self.rate = rate
        local = RESTBudget(rate: rate, burst: burst, maxWaiting: maxWaiting, maxWait: maxWait)
        connection = NATSConnection(
            servers: cluster.servers, name: "relay \(cluster.name)/\(cluster.nodeID) REST budget", security: cluster.security, logger: logger)
        bucketName = "\(cluster.name)-rest-budget"
        self.logger = logger
    }

    public func take(_ priority: RequestGate.Priority, bounded: Bool) async -> RESTBudget.Admission {
        let started = ContinuousClock.now
        let turn = await local.take(priority, bounded: bounded)
        guard turn == .granted else { return turn }
        while true {
            switch await takeShared() {
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
        let until = WallClock.nowMilliseconds() + min(max(retryAfter, .milliseconds(100)), .seconds(3600)).milliseconds
        _ = await changeShared { state in
            state.pausedUntil = max(state.pausedUntil, until)
            state.tokens = min(state.tokens, 0)
            return true
        }
    }

    /// What the budget holds: the shared bucket's tokens and pause when a call to it may start at once,
    /// else the node's own (a status page never waits behind the requests).
    public func snapshot() async -> RESTBudget.State {
        var state = await local.snapshot()
        guard await enterShared(waits: false) == .starts else { return state }
        defer { leaveShared() }
        guard let bucket = await boundBucket() else { return state }
        do {
            if let entry = try await bucket.get(key), let shared = Shared(entry.text) {
                let now = WallClock.nowMilliseconds()
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

    private func takeShared() async -> SharedTake {
        var wait: Duration = .zero
        let changed = await changeShared { state in
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
        /// ``maxCallsInFlight`` calls run and ``maxCallsWaiting`` wait: try again a little later (the
        /// request's own bound then says whether it may wait that long).
        case busy
        /// NATS did not answer, or refused the bucket outright: this node counts on its own.
        case unavailable
    }

    /// Reads the bucket, lets `change` decide (and alter the state), and writes it back on the revision
    /// read; a write that lost to another node's is tried again (at most 8 times).
    private func changeShared(_ change: (inout Shared) -> Bool) async -> Change {
        switch await enterShared(waits: true) {
        case .starts: break
        case .local: return .unavailable
        case .busy: return .busy
        }
        defer { leaveShared() }
        guard let bucket = await boundBucket() else { return .unavailable }
        for _ in 0..<8 {
            let now = WallClock.nowMilliseconds()
            let entry: KeyValueBucket.Entry?
            do { entry = try await bucket.get(key) } catch {
                unavailable(error)
                return .unavailable
            }
            answered()
            var state = (entry.flatMap { Shared($0.text) } ?? Shared(tokens: Double(local.burst), updated: now, pausedUntil: 0))
                .refilled(at: now, rate: rate, burst: local.burst)
            guard change(&state) else { return .declined }
            do {
                if let entry {
                    _ = try await bucket.update(key, state.text, last: entry.revision)
                } else {
                    _ = try await bucket.create(key, state.text)
                }
                return .changed
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

    enum Entry { case starts, local, busy }

    /// Whether a call to the shared bucket starts (then ``leaveShared()`` when it ends), the request
    /// counts on the node's own bucket (`local`), or it should try again shortly (`busy`). While NATS
    /// answers: at once while fewer than ``maxCallsInFlight`` run, else (`waits`) after waiting its
    /// turn among at most ``maxCallsWaiting``. After NATS failed to answer: none for
    /// ``localAfterFailure``, then one at a time.
    private func enterShared(waits: Bool) async -> Entry {
        enum First { case entered(Entry), queue }
        let first = calls.withLock { calls -> First in
            if let askAgainAt = calls.askAgainAt {
                guard ContinuousClock.now >= askAgainAt, calls.inFlight == 0 else { return .entered(.local) }
            } else if calls.inFlight >= Self.maxCallsInFlight {
                return waits && calls.waiting.count < Self.maxCallsWaiting ? .queue : .entered(.busy)
            }
            calls.inFlight += 1
            return .entered(.starts)
        }
        guard case .entered(let entry) = first else {
            // Not cancellable: the wait is bounded by the calls ahead (at most ``maxCallsWaiting``, each
            // at most the request timeout, and the first to fail lets every waiter go).
            return await withCheckedContinuation { continuation in
                let decided = calls.withLock { calls -> Entry? in
                    // Decided again under the lock: a call may have ended, or failed, since.
                    if calls.askAgainAt != nil { return .local }
                    guard calls.inFlight >= Self.maxCallsInFlight else {
                        calls.inFlight += 1
                        return .starts
                    }
                    guard calls.waiting.count < Self.maxCallsWaiting else { return .busy }
                    calls.waiting.append(continuation)
                    return nil
                }
                if let decided { continuation.resume(returning: decided) }
            }
        }
        return entry
    }

    /// A call ended: the next waiting starts its own (its turn passed on, still counted in flight).
    private func leaveShared() {
        let next = calls.withLock { calls -> CheckedContinuation<Entry, Never>? in
            guard calls.askAgainAt == nil, !calls.waiting.isEmpty else {
                calls.inFlight -= 1
                return nil
            }
            return calls.waiting.removeFirst()
        }
        next?.resume(returning: .starts)
    }

    /// NATS answered: every request asks the shared bucket again.
    private func answered() {
        calls.withLock { $0.askAgainAt = nil }
    }

    private func unavailable(_ error: any Error) {
        // The next call binds again (a rebuilt connection leaves the old handle failing), after a while.
        bucket.withLock { $0 = nil }
        let waiting = calls.withLock { calls in
            calls.askAgainAt = ContinuousClock.now + Self.localAfterFailure
            defer { calls.waiting = [] }
            return calls.waiting
        }
        // Those waiting their turn count on their own now, as those that come in the next second do.
        for waiter in waiting { waiter.resume(returning: .local) }
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
