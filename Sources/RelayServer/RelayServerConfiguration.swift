import PolygonWire

/// How the downstream server listens and whom it lets in. Value type, `Sendable`.
public struct RelayServerConfiguration: Sendable {
    public var host: String
    /// 0 picks a free port; read the bound one from ``RelayServer/listeningPort()``.
    public var port: Int
    /// The market path clients connect to, `stocks` for `/stocks` (the upstream's market).
    public var market: String
    public var authentication: ClientAuthentication
    /// How long a client may stay connected without authenticating.
    public var authTimeout: Duration
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
    /// Market WebSocket connections in all and per remote address, and failed authentications per
    /// address within a window before that address is refused until the window has passed.
    public var connectionLimits = ConnectionLimits()

    public struct ConnectionLimits: Sendable, Equatable {
        public var total: Int
        public var perAddress: Int
        public var failedAuthentications: Int
        public var failureWindow: Duration

        public init(total: Int = 50_000, perAddress: Int = 10_000, failedAuthentications: Int = 10, failureWindow: Duration = .seconds(60)) {
            self.total = total
            self.perAddress = perAddress
            self.failedAuthentications = failedAuthentications
            self.failureWindow = failureWindow
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

    public init(
        host: String = "127.0.0.1",
        port: Int = 8080,
        market: String = "stocks",
        authentication: ClientAuthentication = .anyKeyOnLoopback,
        authTimeout: Duration = .seconds(10),
        maxClientMessageBytes: Int = 1 << 20
    ) {
        self.host = host
        self.port = port
        self.market = market
        self.authentication = authentication
        self.authTimeout = authTimeout
        self.maxClientMessageBytes = maxClientMessageBytes
    }
}
