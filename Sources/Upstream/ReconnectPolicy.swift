import PolygonWire

/// When to try the upstream again after a connection ends.
///
/// Exponential backoff with full jitter: the n-th retry waits a random time in `0...min(maxDelay,
/// initialDelay·2ⁿ)`. The attempt count resets only after a connection stayed authenticated for
/// `healthyAfter`, not on `auth_success` itself, which is what makes naive clients loop hot against a
/// server that accepts and then drops them. A rejected key or a taken connection slot waits long.
public struct ReconnectPolicy: Sendable {
    public var initialDelay: Duration
    public var maxDelay: Duration
    public var healthyAfter: Duration
    public var authFailedDelay: Duration
    public var maxConnectionsDelay: Duration

    public init(
        initialDelay: Duration = .milliseconds(500),
        maxDelay: Duration = .seconds(30),
        healthyAfter: Duration = .seconds(30),
        authFailedDelay: Duration = .seconds(120),
        maxConnectionsDelay: Duration = .seconds(60)
    ) {
        self.initialDelay = initialDelay
        self.maxDelay = maxDelay
        self.healthyAfter = healthyAfter
        self.authFailedDelay = authFailedDelay
        self.maxConnectionsDelay = maxConnectionsDelay
    }

    /// The ceiling of the jittered delay before retry number `attempt` (0-based).
    public func ceiling(attempt: Int) -> Duration { backoff.ceiling(attempt: attempt) }

    /// A random delay in `0...ceiling(attempt:)`.
    public func delay(attempt: Int, using generator: inout some RandomNumberGenerator) -> Duration {
        backoff.delay(attempt: attempt, using: &generator)
    }

    private var backoff: Backoff { Backoff(initial: initialDelay, cap: maxDelay) }

    /// The delay after a connection ended for `cause`.
    func delay(after cause: ConnectionEnd.Cause, attempt: Int) -> Duration {
        var rng = SystemRandomNumberGenerator()
        switch cause {
        case .authFailed: return authFailedDelay
        case .maxConnections: return maxConnectionsDelay
        case .closed, .failed, .dead, .handshakeTimeout: return delay(attempt: attempt, using: &rng)
        }
    }
}

/// Why one upstream connection ended, as the service thread reports it to the reconnect loop.
struct ConnectionEnd: Sendable {
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
}
