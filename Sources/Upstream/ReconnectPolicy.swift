import MarketCore

/// When to try the upstream again after a connection ends.
///
/// Exponential backoff with full jitter: the n-th retry waits a random time in `0...min(maxDelay,
/// initialDelay·2ⁿ)`. The attempt count resets only after a connection stayed authenticated for
/// `healthyAfter`, not on `auth_success` itself, which is what makes naive clients loop hot against a
/// server that accepts and then drops them. A rejected key waits long. A taken connection slot
/// (`max_connections`: another consumer holds the account's one connection) backs off exponentially
/// from `maxConnectionsDelay` to `maxConnectionsMaxDelay` with equal jitter — a random wait in the upper
/// half of each step, so a retry never comes quickly and several relays sharing a key spread out.
public struct ReconnectPolicy: Sendable {
    public var initialDelay: Duration
    public var maxDelay: Duration
    public var healthyAfter: Duration
    public var authFailedDelay: Duration
    /// The ceiling of the first wait after `max_connections`.
    public var maxConnectionsDelay: Duration
    public var maxConnectionsMaxDelay: Duration

    public init(
        initialDelay: Duration = .milliseconds(500),
        maxDelay: Duration = .seconds(30),
        healthyAfter: Duration = .seconds(30),
        authFailedDelay: Duration = .seconds(120),
        maxConnectionsDelay: Duration = .seconds(15),
        maxConnectionsMaxDelay: Duration = .seconds(300)
    ) {
        self.initialDelay = initialDelay
        self.maxDelay = maxDelay
        self.healthyAfter = healthyAfter
        self.authFailedDelay = authFailedDelay
        self.maxConnectionsDelay = maxConnectionsDelay
        self.maxConnectionsMaxDelay = maxConnectionsMaxDelay
    }

    /// The ceiling of the jittered delay before retry number `attempt` (0-based).
    public func ceiling(attempt: Int) -> Duration { backoff.ceiling(attempt: attempt) }

    /// A random delay in `0...ceiling(attempt:)`.
    public func delay(attempt: Int, using generator: inout some RandomNumberGenerator) -> Duration {
        backoff.delay(attempt: attempt, using: &generator)
    }

    private var backoff: Backoff { Backoff(initial: initialDelay, cap: maxDelay) }

    /// The wait after `max_connections` on retry number `attempt` (0-based): in the upper half of
    /// `min(maxConnectionsMaxDelay, maxConnectionsDelay·2ⁿ)`.
    public func maxConnectionsDelay(attempt: Int, using generator: inout some RandomNumberGenerator) -> Duration {
        Self.upperHalf(of: Backoff(initial: maxConnectionsDelay, cap: maxConnectionsMaxDelay).ceiling(attempt: attempt), using: &generator)
    }

    /// The wait after a refused login on retry number `attempt` (0-based): in the upper half of
    /// `min(5·authFailedDelay, authFailedDelay·2ⁿ)`, so relays sharing a key a vendor refuses spread out,
    /// and a key that stays refused is not tried twice a minute for ever.
    public func authFailedDelay(attempt: Int, using generator: inout some RandomNumberGenerator) -> Duration {
        Self.upperHalf(of: Backoff(initial: authFailedDelay, cap: authFailedDelay * 5).ceiling(attempt: attempt), using: &generator)
    }

    /// A random wait in the upper half of `ceiling` (equal jitter: never quick, and spread out).
    private static func upperHalf(of ceiling: Duration, using generator: inout some RandomNumberGenerator) -> Duration {
        let half = ceiling.milliseconds / 2
        return .milliseconds(half + Int64.random(in: 0...max(ceiling.milliseconds - half, 1), using: &generator))
    }

    /// The delay after a connection ended for `cause`.
    /// The wait before attempt `attempt` + 1 after a connection ended for `cause`.
    func delay(after cause: ConnectionEnd.Cause, attempt: Int, using generator: inout some RandomNumberGenerator) -> Duration {
        switch cause {
        case .authFailed: return authFailedDelay(attempt: attempt, using: &generator)
        case .maxConnections: return maxConnectionsDelay(attempt: attempt, using: &generator)
        case .closed, .failed, .dead, .handshakeTimeout: return delay(attempt: attempt, using: &generator)
        }
    }
}

/// Why one upstream connection ended, as the service thread reports it to the reconnect loop.
struct ConnectionEnd: Sendable, Equatable {
    enum Cause: String, Sendable, Equatable, CaseIterable {
        /// The upstream closed the connection, or the network dropped it.
        case closed
        /// The connection could not be opened (refused, DNS, TLS).
        case failed
        /// Nothing arrived, not even a pong, for `deadAfter`.
        case dead
        /// No `auth_success` within `handshakeTimeout` of the WebSocket opening.
        case handshakeTimeout = "handshake_timeout"
        case authFailed = "auth_failed"
        case maxConnections = "max_connections"
    }

    var cause: Cause
    var reason: String
    /// How long the connection had been authenticated, if it ever was.
    var authenticatedFor: Duration?
    /// How long to wait before connecting again (set by the connection's logic).
    var retryAfter: Duration = .zero
}
