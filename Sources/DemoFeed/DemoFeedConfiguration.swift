import PolygonWire
/// How the synthetic market behaves. Value type, `Sendable`.
public struct DemoFeedConfiguration: Sendable {
    public var host: String
    /// 0 picks a free port; read the bound one from ``DemoFeed/listeningPort()``.
    public var port: Int
    /// The path the feed serves, `/stocks`.
    public var market: String
    /// Every market the feed serves, each at its own path (`nil`: only ``market``).
    public var markets: [Market]?
    /// Each market's tickers (benchmarks); a market without one uses ``universe`` or its majors.
    public var universes: [Market: [String]] = [:]
    /// Every market at ``eventsPerSecond`` (benchmarks); otherwise markets beside stocks at a quarter.
    public var evenRates = false
    /// The key clients must send; `nil` accepts any non-empty key.
    public var apiKey: String?
    /// Quotes and trades per second across the whole universe.
    public var eventsPerSecond: Double
    /// How often events are generated and sent (each tick's events share frames).
    public var tickInterval: Duration
    /// Events per frame at most, as Polygon batches them.
    public var maxEventsPerFrame: Int
    /// How often `AM` aggregates are emitted (a minute in a real market).
    public var aggregateInterval: Duration
    /// How many generated tickers join AAPL, MSFT, NVDA and the other majors.
    public var generatedTickers: Int
    /// Seed for a repeatable market; `nil` seeds from the system.
    public var seed: UInt64?
    /// When set, every frame is sent as WebSocket fragments of this many bytes (tests reassembly).
    public var fragmentSize: Int?
    /// When set, the feed pings every client this often and drops one that does not answer.
    public var pingInterval: Duration?
    /// When set, the feed waits this long after the WebSocket opens before saying `connected`.
    public var handshakeDelay: Duration?
    /// When set, the feed serves `wss://` with this certificate and key (PEM files).
    public var tls: TLSFiles?
    /// When set, the market is exactly these tickers, uniformly (instead of the majors plus
    /// `generatedTickers`), and no `AM` bars: the benchmark's market.
    public var universe: [String]?
    /// Add `"rt"`, the send time in Unix nanoseconds, to every quote and trade.
    public var stampNanoseconds = false
    /// When set, every REST answer waits this long first (a slow data source, for tests).
    public var restDelay: Duration?
    /// The first this-many REST requests are answered 503 (for testing retries).
    public var restFailures = 0
    /// REST requests answered per minute (a plan's limit, e.g. 5 on Polygon's free plan); past it 429
    /// with `Retry-After`, as the vendor does. `nil`: no limit.
    public var restPerMinute: Int?
    /// Whether the feed keeps what it generated for 30 minutes, so that `/v3/trades`, `/v3/quotes` and
    /// minute aggregates answer with exactly the events it streamed (the relay's gap fill). Benchmarks at
    /// high rates turn it off.
    public var keepsTape = true

    /// A PEM certificate chain and its private key.
    public struct TLSFiles: Sendable {
        public var certificatePath: String
        public var privateKeyPath: String

        public init(certificatePath: String, privateKeyPath: String) {
            self.certificatePath = certificatePath
            self.privateKeyPath = privateKeyPath
        }
    }

    /// Speak Alpaca's protocol instead of Polygon's: stocks at `/v2/iex` (and `/v2/sip`,
    /// `/v2/delayed_sip`, `/v2/test`), crypto at `/v1beta3/crypto/us` (and `/v1beta2/crypto`); the key
    /// is ``apiKey`` (the secret is not checked). Only stocks, crypto, options (`/v1beta1/indicative`,
    /// `/v1beta1/opra`) and news (`/v1beta1/news`) are served; news only in Alpaca's protocol.
    public var alpaca = false
    /// In Alpaca's protocol, the topics one connection may hold (Alpaca's plans limit symbols): a
    /// subscribe past it is answered with 405 and changes nothing. `nil`: the session's default.
    public var alpacaTopicLimit: Int?
    /// Between two stories of the news market (Alpaca's protocol).
    public var newsInterval: Duration = .seconds(5)

    /// The markets served: ``markets``, or the one ``market`` names.
    public var servedMarkets: [Market] {
        let served = markets ?? [Market(rawValue: market) ?? .stocks]
        return alpaca ? served.filter { [.stocks, .crypto, .options, .news].contains($0) } : served.filter { $0 != .news }
    }

    public init(
        host: String = "127.0.0.1",
        port: Int = 9009,
        market: String = "stocks",
        apiKey: String? = nil,
        eventsPerSecond: Double = 500,
        tickInterval: Duration = .milliseconds(20),
        maxEventsPerFrame: Int = 50,
        aggregateInterval: Duration = .seconds(60),
        generatedTickers: Int = 300,
        seed: UInt64? = nil,
        fragmentSize: Int? = nil,
        pingInterval: Duration? = nil,
        handshakeDelay: Duration? = nil,
        tls: TLSFiles? = nil
    ) {
        self.host = host
        self.port = port
        self.market = market
        self.apiKey = apiKey
        self.eventsPerSecond = eventsPerSecond
        self.tickInterval = tickInterval
        self.maxEventsPerFrame = maxEventsPerFrame
        self.aggregateInterval = aggregateInterval
        self.generatedTickers = generatedTickers
        self.seed = seed
        self.fragmentSize = fragmentSize
        self.pingInterval = pingInterval
        self.handshakeDelay = handshakeDelay
        self.tls = tls
    }
}
