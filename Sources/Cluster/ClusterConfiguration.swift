import Foundation
import MarketDataHub
import MarketCore
import Synchronization

/// How a relay node joins a cluster. Value type, `Sendable`.
///
/// Timing follows from the lease: the leader renews every fifth of it and drops its upstream
/// connection when half of it has passed without a successful renewal, so the connection is closed
/// (within `UpstreamConfiguration.closeTimeout`) before the lease can lapse and another node take it.
public struct ClusterConfiguration: Sendable, Equatable {
    /// NATS servers, `nats://host:port`.
    public var servers: [String]
    /// Separates clusters sharing one NATS; part of every subject and bucket name.
    public var name: String
    /// This node's name in the cluster (health, logs, the lease's value).
    public var nodeID: String
    /// How long the upstream lease lives without renewal.
    public var leaseDuration: Duration
    /// How often a follower checks the lease (and so how fast it takes over a released one).
    public var leasePollInterval: Duration = .milliseconds(250)
    /// How often a node repeats its interest; a node silent for 3.5 times this stops counting.
    public var interestHeartbeat: Duration = .seconds(1)
    /// How often the leader writes changed last values to the cluster's last-value store.
    public var lastValueInterval: Duration = .milliseconds(250)
    /// The most topics one node's clients may have the cluster ask upstream for (and the most the
    /// leader takes from one node).
    public var maxTopicsPerNode = 100_000
    /// The most distinct topics the leader asks its upstream for, whatever every node wants together:
    /// a node's topics past it are refused to its clients (as topics the upstream refused).
    public var maxTopics = 100_000
    /// The most the cluster's last-value store of a market holds, in bytes (in the memory of the NATS
    /// servers, which reserve it against their JetStream memory): past it, the values written longest
    /// ago go first. Whoever may write the store cannot make it hold more, nor a value larger than an
    /// event a node takes.
    public var lastValueBytes: Int64 = 256 << 20
    /// How often a node that goes on without its last-value store (it could not be made to its bounds)
    /// tries to bind it again.
    public var lastValueRetry: Duration = .seconds(30)
    /// How this node proves itself to NATS and checks NATS's certificate.
    public var security = Security()

    /// TLS and credentials for the NATS connection (libnats'). Value type, `Sendable`.
    public struct Security: Sendable, Equatable {
        /// CA certificates (PEM) the servers' certificates must chain to; implies TLS.
        public var caFile: String?
        /// This node's certificate and key (PEM), for servers that verify clients (mutual TLS).
        public var certificateFile: String?
        public var keyFile: String?
        /// A NATS credentials file (user JWT and NKey seed, as `nsc` writes it).
        public var credentialsFile: String?
        /// A file holding an NKey user seed (`SU…`); the public key is derived from it.
        public var nkeySeedFile: String?
        /// A token for servers with `authorization { token }`.
        public var token: String?

        public init() {}

        /// Whether the connection must use TLS (`tls://` URLs also ask for it).
        public var requiresTLS: Bool { caFile != nil || certificateFile != nil }
    }

    public init(servers: [String], name: String = "relay", nodeID: String, leaseDuration: Duration = .seconds(5)) {
        self.servers = servers
        self.name = name
        self.nodeID = nodeID
        self.leaseDuration = leaseDuration
    }

    public var renewInterval: Duration { leaseDuration / 5 }
    /// The TTL of the lease bucket these nodes make (and expect to find): the lease, at least 100 ms.
    public var leaseBucketTTL: Duration { max(leaseDuration, .milliseconds(100)) }
    /// Without a successful renewal for this long, the leader closes its upstream connection.
    public var dropUpstreamAfter: Duration { leaseDuration / 2 }
    /// The leader's upstream client is handed a deadline of this long after each renewal was sent (or
    /// the lease taken), enforced on its own service thread: a backstop that closes the socket before
    /// the lease can lapse even when no Swift task gets to run.
    public var upstreamDeadlineAfter: Duration { leaseDuration * 3 / 5 }
    public var interestTTL: Duration { interestHeartbeat * 3.5 }

    /// The servers as logs, `/healthz` and errors show them: without user, password or token.
    public var displayServers: String { servers.map(Self.redacted).joined(separator: ",") }

    /// Parses `nats://host:port[,tls://host:port…]` (`user:password@` or `token@` may precede the host;
    /// libnats sends them). `tls://` requires TLS.
    public static func servers(from text: String) throws(ClusterError) -> [String] {
        let parts = text.split(separator: ",").map { $0.trimmingCharacters(in: .whitespaces) }.filter { !$0.isEmpty }
        guard !parts.isEmpty else { throw .invalidURL(redacted(text)) }
        for part in parts {
            guard let url = URLComponents(string: part), let scheme = url.scheme?.lowercased(), scheme == "nats" || scheme == "tls",
                url.host?.isEmpty == false
            else {
                throw .invalidURL(redacted(part))
            }
        }
        return parts
    }

    /// `url` with any user information (`user:password@`, `token@`) replaced by `***@`.
    public static func redacted(_ url: String) -> String {
        let start = url.range(of: "://")?.upperBound ?? url.startIndex
        let authorityEnd = url[start...].firstIndex(where: { $0 == "/" || $0 == "?" || $0 == "#" }) ?? url.endIndex
        guard let at = url[start..<authorityEnd].lastIndex(of: "@") else { return url }
        return String(url[..<start]) + "***" + String(url[at...])
    }
}
