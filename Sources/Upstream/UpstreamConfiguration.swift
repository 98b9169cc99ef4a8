import CoreMetrics
import Foundation
import MarketCore

/// Everything the upstream client needs to hold its one connection. Value type, `Sendable`.
public struct UpstreamConfiguration: Sendable {
    /// A parsed `ws://` or `wss://` URL.
    public struct Endpoint: Sendable, Equatable, CustomStringConvertible {
        public var secure: Bool
        public var host: String
        public var port: Int
        public var path: String

        public init(secure: Bool, host: String, port: Int, path: String) {
            self.secure = secure
            self.host = host
            self.port = port
            self.path = path
        }

        /// Parses `ws://host[:port]/path` or `wss://…`; `nil` for anything else.
        public init?(_ text: String) {
            guard let components = URLComponents(string: text.trimmingCharacters(in: .whitespaces)),
                let scheme = components.scheme?.lowercased(), scheme == "ws" || scheme == "wss",
                let host = components.host, !host.isEmpty
            else { return nil }
            secure = scheme == "wss"
            self.host = host
            port = components.port ?? (secure ? 443 : 80)
            path = components.percentEncodedPath.isEmpty ? "/" : components.percentEncodedPath
        }

        /// The market the path names (`stocks` for `/stocks`), which the relay serves downstream.
        public var market: String {
            path.split(separator: "/").last.map(String.init) ?? "stocks"
        }

        public var description: String {
            "\(secure ? "wss" : "ws")://\(host):\(port)\(path)"
        }
    }

    public var endpoint: Endpoint
    /// The upstream API key. Sent only in the upstream `auth` action; never logged, never sent downstream.
    public var apiKey: String
    /// The account's secret where the vendor has one (Alpaca's `APCA_API_SECRET_KEY`); never logged,
    /// never sent downstream.
    public var secret: String?
    /// The protocol the endpoint speaks.
    public var wire: any WireProtocol
    /// A PEM file of extra trusted CAs for `wss://` (the system trust store is always used).
    public var caFile: String?
    /// Messages larger than this are dropped, counted and logged. Polygon's frames are kilobytes; the
    /// cap bounds what one bad frame can cost.
    public var maxMessageBytes: Int
    /// The most bytes one event of a type the hub folds (an order book, its whole state at once) may
    /// take, at most a message's: 1 MiB holds some 45,000 levels (the hub keeps `books.levels` a side),
    /// and the hub decodes each such event whole.
    public static let maxFoldedEventBytes = 1 << 20

    /// The most bytes one folded event may take here: ``maxFoldedEventBytes``, within a message.
    public var maxFoldedBytes: Int { min(maxMessageBytes, Self.maxFoldedEventBytes) }
    /// Give up and retry when the WebSocket has not opened this long after the attempt began (TCP, TLS,
    /// the upgrade), and close and retry when `auth_success` has not arrived this long after it opened.
    public var handshakeTimeout: Duration
    /// Where the client's metrics go (a Prometheus registry in the relay).
    public var metricsFactory: any MetricsFactory
    /// Send a ping after this long without a valid frame from the upstream.
    public var pingInterval: Duration
    /// Hang up after this long without a valid frame or pong.
    public var deadAfter: Duration
    public var reconnect: ReconnectPolicy
    /// How long a shutdown waits for the close handshake before it drops the connection anyway. A
    /// cluster leader that loses its lease must be gone well inside the lease's lifetime.
    public var closeTimeout: Duration = .seconds(2)
    /// Events that may wait between the upstream thread and the hub, each 4 KB of an event's bytes
    /// weighing one more (``SourceInbox/weight(of:)``); past it newer messages are dropped, counted and
    /// announced (a burst never becomes unbounded memory).
    public var maxQueuedEvents = 100_000
    /// Our messages (subscribes, unsubscribes) waiting for the upstream to read them; past it the
    /// upstream is not reading: the connection is dropped and the next one subscribes the wanted set
    /// whole (a whole wanted set of 50,000 topics is about 0.5 MB of messages).
    public var maxUnsentBytes = 16 << 20
    /// No event for this long while topics are subscribed and the market is open (``MarketHours``) is a
    /// silent upstream: shown, and reconnected once (``SilenceWatch``); `nil`: not watched.
    public var silentAfter: Duration? = .seconds(300)
    /// The market this connection carries (its trading hours decide when silence counts).
    public var market: Market?
    /// Upstream messages larger than this have their events copied out of the message, so a queued or
    /// cached event never keeps a large message alive.
    public var compactMessagesAbove = 16 * 1024
    /// The largest event taken from the upstream (a news market's: its `news.maxBytes`); a larger one is
    /// dropped and counted, as one from NATS is.
    public var maxEventBytes = UpstreamConfiguration.defaultMaxEventBytes
    /// A market event is far smaller than this; an item of news may be larger (its own setting).
    public static let defaultMaxEventBytes = 64 << 10
    /// How long past a derived time bar's window the relay waits for late trades before it sends the bar
    /// without a trade past the window to finish it.
    public var barGrace: Duration = .seconds(1)

    public init(
        endpoint: Endpoint,
        apiKey: String,
        wire: some WireProtocol,
        caFile: String? = nil,
        maxMessageBytes: Int = 4 << 20,
        handshakeTimeout: Duration = .seconds(15),
        pingInterval: Duration = .seconds(15),
        deadAfter: Duration = .seconds(30),
        reconnect: ReconnectPolicy = ReconnectPolicy(),
        metricsFactory: any MetricsFactory = MetricsSystem.factory
    ) {
        self.endpoint = endpoint
        self.apiKey = apiKey
        self.wire = wire
        self.caFile = caFile
        self.maxMessageBytes = maxMessageBytes
        self.handshakeTimeout = handshakeTimeout
        self.metricsFactory = metricsFactory
        self.pingInterval = pingInterval
        self.deadAfter = deadAfter
        self.reconnect = reconnect
    }
}
