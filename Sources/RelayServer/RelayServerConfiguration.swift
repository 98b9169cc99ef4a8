import MarketCore
import NIOCore
import RESTGateway

/// How the downstream server listens and whom it lets in. Value type, `Sendable`.
public struct RelayServerConfiguration: Sendable {
    public var host: String
    /// 0 picks a free port; read the bound one from ``RelayServer/listeningPort()``.
    public var port: Int
    /// Polygon's ticker cap per upstream connection on the event types a market caps (options `Q` and
    /// `FMV`: 1,000 contracts); the subscriptions past it are refused with an error status.
    public var cappedTickers: Int = 1_000
    /// Tagged sessions (`KEY#tag`): how long a broken one is kept, how far back it resumes, how many.
    public var resume = ResumeSettings()
    public var authentication: ClientAuthentication
    /// How long a market client may stay connected without authenticating (``ConnectionLimits/authTimeout``).
    public var authTimeout: Duration {
        get { connectionLimits.authTimeout }
        set { connectionLimits.authTimeout = newValue }
    }
    /// Largest client message accepted (a long subscribe list is large; Polygon's own limit is unknown).
    public var maxClientMessageBytes: Int
    /// Serve `/metrics` without a client key (for a Prometheus that cannot send one).
    public var metricsPublic: Bool = false
    /// Whether the portfolio's routes are served (the dashboard shows its pages only then).
    public var portfolio: Bool = false
    /// Serve the dashboard's files from this directory instead of the embedded ones (working on the
    /// page: edit, reload). `RELAY_DASHBOARD_DIR`.
    public var dashboardDirectory: String?
    /// What one downstream connection may ask for.
    public var limits = SessionLimits()
    /// What every connection may hold: connections in all and per address, time, unread bytes, topics.
    public var connectionLimits = ConnectionLimits()

    /// The server-wide bounds on what clients can make the relay hold. Each is answered as the README's
    /// limits table says. Value type, `Sendable`.
    public struct ConnectionLimits: Sendable, Equatable {
        /// Market and push WebSockets in all (then `max_connections`, close 1008).
        public var total: Int
        /// Market and push WebSockets per remote address (an IPv6 /64 is one address).
        public var perAddress: Int
        /// HTTP connections (their first request not a WebSocket upgrade) in all, and per address; one
        /// more is answered `503` and closed. In all at most a quarter of the open-file limit, whatever
        /// this says, so HTTP clients never hold the descriptors market clients need.
        public var httpConnections = 4_096
        public var httpConnectionsPerAddress = 256
        /// Push streams (the portfolio's live valuation) in all, and per client key (with keys): each is
        /// a connection and a write per update, and a key's dashboards need a few. One more is told
        /// `max_connections` and closed (1008). They count in ``total`` and ``perAddress`` too.
        public var pushStreams = 1_024
        public var pushStreamsPerKey = 16
        /// Accepted connections of one address that have not yet sent a request head or authenticated;
        /// one more is closed at once.
        public var pendingPerAddress: Int
        /// The same, of every address together: however many addresses open connections that never sign
        /// in, they hold at most this many places, and the rest of ``total`` stays for clients that do.
        public var pending = 10_000
        /// Open files kept free of client connections (the upstream, NATS, SQLite, files): connections
        /// past the open-file limit less this are closed at once.
        public var descriptorReserve: Int
        /// How long a new connection has to send its first request head.
        public var headTimeout: Duration
        /// How long a kept-alive HTTP connection may wait for its next request head.
        public var keepAliveTimeout: Duration
        /// How long a market client may stay connected without authenticating (`auth_timeout`, 1008).
        public var authTimeout: Duration = .seconds(10)
        /// Bytes written to a client and not yet taken by its socket, past which it is closed (1008).
        public var outboundBytes: Int
        /// Largest client message before authentication (then any up to ``RelayServerConfiguration/maxClientMessageBytes``).
        public var preAuthMessageBytes: Int
        /// Distinct topics the connections of one key hold together, and all connections together.
        public var topicsPerKey: Int
        public var topics: Int
        /// Subscriptions (a topic as many times as it is held) the connections and kept sessions of one
        /// key hold together, and all of them together, per market.
        public var subscriptionsPerKey = 100_000
        public var subscriptions = 1_000_000
        /// Failed authentications from one address within this window delay the answer to the next.
        public var failureWindow: Duration
        /// The delay after the second failure in a window, doubling with each further one, at most `maxFailureDelay`.
        public var failureDelay: Duration
        public var maxFailureDelay: Duration
        /// Delayed failure answers one address may be waiting for at once; past it, that address's
        /// authentications are refused unchecked until some are answered.
        public var failuresInFlightPerAddress: Int = 10

        public init(
            total: Int = 50_000, perAddress: Int = 10_000, pendingPerAddress: Int = 1_000, descriptorReserve: Int = 128,
            headTimeout: Duration = .seconds(10), keepAliveTimeout: Duration = .seconds(30), outboundBytes: Int = 1 << 20,
            preAuthMessageBytes: Int = 4096, topicsPerKey: Int = 20_000, topics: Int = 50_000, failureWindow: Duration = .seconds(60),
            failureDelay: Duration = .milliseconds(500), maxFailureDelay: Duration = .seconds(10)
        ) {
            self.total = total
            self.perAddress = perAddress
            self.pendingPerAddress = pendingPerAddress
            self.descriptorReserve = descriptorReserve
            self.headTimeout = headTimeout
            self.keepAliveTimeout = keepAliveTimeout
            self.outboundBytes = outboundBytes
            self.preAuthMessageBytes = preAuthMessageBytes
            self.topicsPerKey = topicsPerKey
            self.topics = topics
            self.failureWindow = failureWindow
            self.failureDelay = failureDelay
            self.maxFailureDelay = maxFailureDelay
        }
    }

    /// Serve `wss://` and `https://` on the same port with this certificate chain and key (PEM files).
    public var tls: TLSFiles?

    /// A PEM certificate chain and its private key.
    public struct TLSFiles: Sendable, Equatable {
        public var certificatePath: String
        public var privateKeyPath: String

        public init(certificatePath: String, privateKeyPath: String) {
            self.certificatePath = certificatePath
            self.privateKeyPath = privateKeyPath
        }
    }

    /// The event loops the server runs on (`nil`: NIO's shared group, as usual). A test that holds a
    /// server's loops still gives it a group of its own.
    public var eventLoopGroup: (any EventLoopGroup)?

    /// The REST gateways (one per upstream account), served at their vendors' paths.
    public var gateways: [RESTGateway] = []
    /// The address a client reaches the relay at, for the links a REST page carries back
    /// (`rest.publicURL`); `nil`: the `Host` the client sent.
    public var restPublicURL: String?
    /// The bytes of the gateways' answers being sent at once, at most (`rest.answersInFlightMB`).
    public var gatewayAnswerBytes = 256 << 20
    /// How long a client may take to read 64 KiB of a gateway answer before its connection is closed.
    public var gatewayPieceTimeout: TimeAmount = AnswersInFlight.pieceTimeout

    public init(
        host: String = "127.0.0.1",
        port: Int = 8080,
        authentication: ClientAuthentication = .anyKeyOnLoopback,
        authTimeout: Duration = .seconds(10),
        maxClientMessageBytes: Int = 1 << 20
    ) {
        self.host = host
        self.port = port
        self.authentication = authentication
        self.maxClientMessageBytes = maxClientMessageBytes
        self.authTimeout = authTimeout
    }
}
