/// Where the one upstream connection stands. Value type, `Sendable`.
public enum UpstreamState: Sendable, Equatable, CustomStringConvertible {
    /// Not started yet.
    case idle
    /// Opening TCP, TLS and the WebSocket handshake.
    case connecting
    /// The WebSocket is open; waiting for `connected`, sending `auth`, waiting for the answer.
    case authenticating
    /// `auth_success` received: events flow and subscriptions follow the hub.
    case authenticated
    /// The connection ended; the reconnect policy decides when to try again.
    case disconnected(reason: String)
    /// The upstream rejected the API key (`auth_failed`); retried only on a long interval.
    case authFailed(message: String)
    /// The upstream said another connection holds the account's slot (`max_connections`).
    case rejected(message: String)
    /// Shut down for good.
    case stopped

    /// A stable name for health checks and metrics.
    public var name: String {
        switch self {
        case .idle: "idle"
        case .connecting: "connecting"
        case .authenticating: "authenticating"
        case .authenticated: "authenticated"
        case .disconnected: "disconnected"
        case .authFailed: "auth_failed"
        case .rejected: "max_connections"
        case .stopped: "stopped"
        }
    }

    /// The detail behind the state, if any.
    public var detail: String? {
        switch self {
        case .disconnected(let reason): reason
        case .authFailed(let message), .rejected(let message): message
        default: nil
        }
    }

    public var description: String {
        detail.map { "\(name) (\($0))" } ?? name
    }
}
