/// One setting of `relay serve`, declared once: its file key, its command-line flag, its environment
/// variable, its default and its help. The command line is parsed from these declarations, the
/// environment is read through them, and `relay serve --help` is written from them, so the three can
/// neither miss a setting nor drift apart (``RelaySettings/resolve(commandLine:environment:)``).
/// Each value's check lives with the code that reads it, which names the setting in its refusal. Value
/// type, `Sendable`.
public struct SettingDeclaration: Sendable, Equatable {
    /// How a flag takes its value.
    public enum Form: Sendable, Equatable {
        /// `--flag VALUE` (or `--flag=VALUE`).
        case value
        /// `--flag VALUE`, repeatable; the values are joined with commas.
        case repeatable
        /// `--flag` alone sets the value given here (`--no-snapshot` sets `false`).
        case presence(String)
    }

    /// The configuration file's key, e.g. `limits.topics`; what the other two spellings set.
    public var key: String
    /// The command-line flag without its dashes (`listen` for `--listen`); `nil`: none.
    public var flag: String?
    public var form: Form
    /// The environment variable; `nil`: none.
    public var environment: String?
    /// The default, as the help shows it.
    public var defaultValue: String
    public var help: String
    /// Whether the value is a secret (never shown, kept secret in the configuration reader).
    public var secret: Bool

    init(
        _ key: String, flag: String? = nil, _ form: Form = .value, env: String? = nil, default defaultValue: String = "",
        secret: Bool = false, _ help: String
    ) {
        self.key = key
        self.flag = flag
        self.form = form
        self.environment = env
        self.defaultValue = defaultValue
        self.help = help
        self.secret = secret
    }
}

extension RelaySettings {
    /// Every setting of `relay serve`.
    public static let declarations: [SettingDeclaration] = [
        .init("config", flag: "config", env: "RELAY_CONFIG", default: "none", "A YAML configuration file (see config/relay.yaml)."),
        .init("listen", flag: "listen", env: "RELAY_LISTEN", default: "127.0.0.1:8080", "HOST:PORT to listen on."),
        .init(
            "upstream.url", flag: "upstream", .repeatable, env: "RELAY_UPSTREAM", default: "none: the built-in demo feed serves every market",
            "Upstream WebSocket URL, e.g. wss://socket.massive.com/stocks; repeat (or comma-separate) for more markets: the last path segment names the market."
        ),
        .init(
            "upstream.markets", flag: "markets", env: "RELAY_MARKETS", default: "none",
            "Markets to connect, comma-separated (stocks, options, forex, crypto, indices, futures; news is Alpaca's, by its URL), each at wss://UPSTREAM-HOST/MARKET."),
        .init(
            "upstream.host", flag: "upstream-host", env: "RELAY_UPSTREAM_HOST", default: "socket.massive.com",
            "The host --markets connects to (delayed.massive.com for the 15-minute delayed feed)."),
        .init(
            "upstream.key", flag: "upstream-key", env: "POLYGON_API_KEY", default: "required with an upstream", secret: true,
            "The upstream API key, every market's unless its upstreams entry names its own (never sent downstream)."),
        .init(
            "upstream.vendor", flag: "upstream-vendor", env: "RELAY_UPSTREAM_VENDOR",
            default: "the URL's host tells for Polygon's and Alpaca's; polygon otherwise",
            "Whose protocol the upstream speaks: polygon or alpaca (for a URL that is neither's own host, e.g. a test server; with no upstream, alpaca runs the demo feed in Alpaca's protocol)."),
        .init(
            "upstream.keyId", env: "APCA_API_KEY_ID", default: "none", secret: true,
            "Alpaca's key id, the upstream key of an Alpaca upstream when upstream.key is not set."),
        .init(
            "upstream.secret", flag: "upstream-secret", env: "APCA_API_SECRET_KEY", default: "required with an Alpaca upstream", secret: true,
            "Alpaca's secret key (sent only in the upstream auth; never logged, never sent downstream)."),
        .init(
            "upstreams", default: "none",
            "File only: a list of upstreams, one per market, each with market and/or url, key or keyEnv (an environment variable holding it), caFile."),
        .init(
            "upstream.silentAfterSeconds", env: "RELAY_UPSTREAM_SILENT_AFTER_SECONDS", default: "300",
            "No event for this long while topics are subscribed and the market is open: the upstream is silent (shown, reconnected once); 0: not watched."),
        .init("upstream.caFile", flag: "upstream-ca-file", env: "RELAY_UPSTREAM_CA_FILE", default: "system trust store", "Extra trusted CA certificates (PEM) for wss:// upstreams."),
        .init(
            "upstream.restURL", flag: "rest-url", env: "RELAY_REST_URL", default: "api.polygon.io / api.massive.com for their hosts; the demo feed's",
            "The upstream's REST API (portfolio reference prices and history)."),
        .init(
            "upstream.restKey", flag: "rest-key", env: "RELAY_REST_KEY", default: "the upstream key with a Polygon upstream; none with an Alpaca one",
            secret: true,
            "The REST API's key, when it is not the upstream's (an Alpaca key id is never sent to Polygon's REST API: with an Alpaca upstream, REST needs this)."),
        .init(
            "client.keys", flag: "client-keys", env: "RELAY_CLIENT_KEYS", default: "none: any key, loopback only", secret: true,
            "Comma-separated keys downstream clients authenticate with (the file may give keys with rights)."),
        .init("demo.rate", flag: "demo-rate", env: "RELAY_DEMO_RATE", default: "500", "Events per second of the built-in demo feed's stocks (other markets a quarter)."),
        .init(
            "demo.restDelayMs", flag: "demo-rest-delay-ms", env: "RELAY_DEMO_REST_DELAY_MS", default: "0",
            "Delay each REST answer of the built-in demo feed by this many ms (a slow data source)."),
        .init("log.level", flag: "log-level", env: "RELAY_LOG_LEVEL", default: "info", "trace, debug, info, notice, warning, error or critical."),
        .init(
            "subscribers.slowConsumer", flag: "slow-consumer", env: "RELAY_SLOW_CONSUMER", default: "drop",
            "When a client's buffer (subscribers.buffer) is full: drop (count, tell it later) or disconnect (close 1013)."),
        .init(
            "subscribers.buffer", flag: "subscriber-buffer", env: "RELAY_SUBSCRIBER_BUFFER", default: "1000",
            "Events each client's buffer holds before the slow-consumer policy applies (1000 to 1000000; news keeps 1000; a key's buffer overrides it). More rides out longer stalls of a client or of this machine at a high rate (1,000 events are 3 ms at 300,000 events/s); while a client is behind, each of its queued events can keep its whole upstream message in memory."),
        .init(
            "subscribers.snapshotOnSubscribe", flag: "no-snapshot", .presence("false"), env: "RELAY_SNAPSHOT_ON_SUBSCRIBE", default: "true",
            "Send a topic's last event when a client subscribes to it (--no-snapshot: do not)."),
        .init(
            "subscribers.wildcardLingerMs", flag: "wildcard-linger-ms", env: "RELAY_WILDCARD_LINGER_MS", default: "5000",
            "How long a wildcard (T.*) stays asked of the upstream after its last client dropped it (at most 600000; 0: let go at once): a client taking and dropping one again and again changes nothing upstream within it."),
        .init(
            "books.levels", flag: "book-levels", env: "RELAY_BOOK_LEVELS", default: "1000",
            "Price levels per side the relay keeps of each order book it carries (Alpaca's crypto orderbooks) for clients that join late; the best ones (at most 1000)."),
        .init(
            "bars.graceMs", flag: "bar-grace-ms", env: "RELAY_BAR_GRACE_MS", default: "1000",
            "How long past a derived time bar's window (AM.AAPL@5m) the relay waits for late trades before it sends the bar, when no later trade finished it first."),
        .init(
            "news.maxBytes", flag: "news-max-bytes", env: "RELAY_NEWS_MAX_BYTES", default: "4194304",
            "The largest news message (Alpaca's news stream) taken from the upstream and room for one in each news client's unread bytes; a larger one is dropped, counted and told to the news clients. Other markets keep their limits."),
        .init(
            "news.snapshot", flag: "news-snapshot", .presence("true"), env: "RELAY_NEWS_SNAPSHOT", default: "false",
            "A news subscription gets each symbol's last item at once (Alpaca sends none: off by default)."),
        .init("metrics.public", flag: "public-metrics", .presence("true"), env: "RELAY_METRICS_PUBLIC", default: "false", "Serve /metrics without a client key."),
        .init("tls.cert", flag: "tls-cert", env: "RELAY_TLS_CERT", default: "none", "Serve wss:// and https:// with this PEM certificate chain (needs tls.key)."),
        .init("tls.key", flag: "tls-key", env: "RELAY_TLS_KEY", default: "none", "The PEM private key of tls.cert."),
        .init("rest.gateway", flag: "no-rest-gateway", .presence("false"), env: "RELAY_REST_GATEWAY", default: "true", "Serve the vendor's REST API through the relay (--no-rest-gateway: do not)."),
        .init(
            "rest.budget", flag: "rest-budget", env: "RELAY_REST_BUDGET", default: "100/s",
            "The account's REST plan (5/min on Polygon's free plan, 200/min on Alpaca's basic): every client, gap fill and the portfolio share it."),
        .init("rest.alpacaBudget", env: "RELAY_REST_ALPACA_BUDGET", default: "200/min", "Alpaca's REST plan, when an Alpaca market is served (its own account)."),
        .init("rest.alpacaURL", env: "RELAY_REST_ALPACA_URL", default: "https://data.alpaca.markets; the demo feed's", "Alpaca's market-data REST API."),
        .init("rest.queue", env: "RELAY_REST_QUEUE", default: "256", "REST requests waiting for the budget at most; past it a client gets 429."),
        .init(
            "rest.flightsPerKey", env: "RELAY_REST_FLIGHTS_PER_KEY", default: "64",
            "Vendor calls one key's REST requests started that are under way (waiting for the budget or at the vendor) at most; past it that key gets 429."),
        .init("rest.maxWaitSeconds", env: "RELAY_REST_MAX_WAIT_SECONDS", default: "10", "The longest a REST request waits for the budget; longer is a 429 with Retry-After."),
        .init("rest.timeoutSeconds", env: "RELAY_REST_TIMEOUT_SECONDS", default: "10", "The longest the vendor may take to answer a gateway request (then 504)."),
        .init("rest.cachePath", env: "RELAY_REST_CACHE_PATH", default: "the data directory's rest-cache.sqlite", "The REST gateway's cache (SQLite)."),
        .init("rest.cacheMB", env: "RELAY_REST_CACHE_MB", default: "256", "The REST cache's bound; the least recently used answers go first."),
        .init(
            "rest.answersInFlightMB", env: "RELAY_REST_ANSWERS_IN_FLIGHT_MB", default: "256",
            "The REST answers being sent at once, at most, in megabytes, and apart the vendor bodies being read; past it a 503 (one alone always goes)."),
        .init(
            "rest.sendTimeoutSeconds", env: "RELAY_REST_SEND_TIMEOUT_SECONDS", default: "30",
            "A REST client that takes longer than this to read 64 KiB of an answer is disconnected (its answer's bytes go back)."),
        .init("rest.referenceTTLSeconds", env: "RELAY_REST_REFERENCE_TTL_SECONDS", default: "3600", "How long reference data (tickers, exchanges, holidays) is cached."),
        .init("rest.publicURL", env: "RELAY_REST_PUBLIC_URL", default: "the Host clients send", "The relay's address in a REST page's next_url (behind a proxy)."),
        .init("tape.enabled", flag: "no-tape", .presence("false"), env: "RELAY_TAPE", default: "true", "Record every market's events on the tape (--no-tape: do not)."),
        .init("tape.dir", flag: "tape-dir", env: "RELAY_TAPE_DIR", default: "the data directory's tape/", "Where the tape is kept: a folder per market, a file per UTC day."),
        .init("tape.retentionDays", env: "RELAY_TAPE_RETENTION_DAYS", default: "7", "Days of tape kept per market (today's included); older days are deleted, oldest first."),
        .init("tape.maxGB", env: "RELAY_TAPE_MAX_GB", default: "20", "Gigabytes of tape kept per market; past them the oldest days are deleted, and today's file stops at them (recording waits for the next UTC day)."),
        .init("tape.replicas", env: "RELAY_TAPE_REPLICAS", default: "1", "On a cluster: the tape stream's replicas on the NATS servers (1 to 5)."),
        .init(
            "tape.flushMs", env: "RELAY_TAPE_FLUSH_MS", default: "500",
            "The longest a received event waits in memory before its block is written to the tape (what a crash can lose)."),
        .init(
            "replay.date", flag: "replay-date", env: "RELAY_REPLAY_DATE", default: "none: live",
            "Serve a recorded UTC day from the tape instead of the live upstreams (yyyy-mm-dd, or last: the newest day recorded)."),
        .init("replay.markets", flag: "replay-markets", env: "RELAY_REPLAY_MARKETS", default: "every market recorded that day", "The markets a replay serves, comma-separated."),
        .init(
            "replay.speed", flag: "replay-speed", env: "RELAY_REPLAY_SPEED", default: "1",
            "How fast a replay goes: 1 as recorded, 10 ten times faster, max as fast as the slowest client reads (it waits for the first)."),
        .init("replay.from", flag: "replay-from", env: "RELAY_REPLAY_FROM", default: "the day's start", "Where a replay starts in its day, HH:MM[:SS] UTC."),
        .init("replay.to", flag: "replay-to", env: "RELAY_REPLAY_TO", default: "the day's end", "Where a replay ends, HH:MM[:SS] UTC."),
        .init("replay.loop", flag: "replay-loop", .presence("true"), env: "RELAY_REPLAY_LOOP", default: "false", "Start the replay again at its end (an off-hours test stream)."),
        .init("portfolio.enabled", flag: "no-portfolio", .presence("false"), env: "RELAY_PORTFOLIO", default: "true", "Run the portfolio valuation sidecar (--no-portfolio: do not)."),
        .init("portfolio.dataDir", flag: "data-dir", env: "RELAY_DATA_DIR", default: "./data", "Where the portfolio sidecar keeps its SQLite file."),
        .init("portfolio.timeZone", flag: "time-zone", env: "RELAY_TIME_ZONE", default: "UTC", "IANA zone of the portfolio's days."),
        .init("portfolio.pushIntervalMs", env: "RELAY_PORTFOLIO_PUSH_MS", default: "500", "Least time between two valuations pushed to a stream client."),
        .init("portfolio.staleAfterSeconds", default: "900", "A price older than this is stale (left out of the total, named)."),
        .init(
            "portfolio.securityCacheSize", flag: "security-cache-size", env: "RELAY_SECURITY_CACHE_SIZE", default: "10",
            "Security details kept in the cache, prefetched ones included."),
        .init("portfolio.clientIdleSeconds", default: "120", "A named portfolio client unseen this long is forgotten."),
        .init(
            "portfolio.securityLoads", default: "16",
            "Security details loading at once, at most; a request for one more is answered 503 (prefetches take at most half)."),
        .init(
            "portfolio.securityWaitSeconds", default: "30",
            "How long a security detail request waits for its load before it is answered 503 (the load goes on into the cache)."),
        .init(
            "portfolio.closeHistory", flag: "no-close-history", .presence("false"), env: "RELAY_CLOSE_HISTORY", default: "true",
            "Value past days from daily closes fetched over REST (--no-close-history: keep the live values recorded then)."),
        .init("portfolio.maxAccounts", default: "100", "Accounts the portfolio holds at most, closed ones included (past it a new one is refused, 409)."),
        .init("portfolio.maxTransactionsPerAccount", default: "100000", "Transactions one account holds at most (past it a new one is refused, 409)."),
        .init("portfolio.maxUpdatesPerAccount", default: "100000", "Value updates one savings account holds at most (past it a new one is refused, 409)."),
        .init(
            "portfolio.maxSymbols", default: "2000",
            "Distinct symbols the portfolio's transactions name at most (each held is followed live and priced over REST; at most 10000; past it a new one is refused, 409)."),
        .init(
            "cluster.url", flag: "cluster", env: "RELAY_CLUSTER", default: "none: a single relay", secret: true,
            "Run as a node of a cluster on NATS: nats://HOST:PORT[,…]. One node holds each market's upstream connection."),
        .init("cluster.nodeId", flag: "node-id", env: "RELAY_NODE_ID", default: "hostname and port", "This node's name in the cluster."),
        .init("cluster.name", flag: "cluster-name", env: "RELAY_CLUSTER_NAME", default: "relay", "Separates clusters sharing one NATS."),
        .init("cluster.leaseSeconds", env: "RELAY_CLUSTER_LEASE_SECONDS", default: "5", "The upstream lease's lifetime (the same on every node)."),
        .init("cluster.tlsCA", flag: "cluster-tls-ca", env: "RELAY_CLUSTER_TLS_CA", default: "none", "Connect to NATS over TLS, trusting these CA certificates (PEM)."),
        .init("cluster.tlsCert", flag: "cluster-tls-cert", env: "RELAY_CLUSTER_TLS_CERT", default: "none", "This node's certificate chain (PEM) for NATS servers that verify clients."),
        .init("cluster.tlsKey", flag: "cluster-tls-key", env: "RELAY_CLUSTER_TLS_KEY", default: "none", "The PEM private key of cluster.tlsCert."),
        .init("cluster.credentials", flag: "cluster-credentials", env: "RELAY_CLUSTER_CREDENTIALS", default: "none", "A NATS credentials file (user JWT and NKey seed)."),
        .init("cluster.nkeySeed", flag: "cluster-nkey-seed", env: "RELAY_CLUSTER_NKEY_SEED", default: "none", "A file holding this node's NATS NKey user seed (SU…)."),
        .init(
            "cluster.token", flag: "cluster-token", env: "RELAY_CLUSTER_TOKEN", default: "none", secret: true,
            "A NATS authorization token (the environment keeps it out of ps)."),
        .init(
            "cluster.maxTopicsPerNode", flag: "cluster-max-topics-per-node", env: "RELAY_CLUSTER_MAX_TOPICS_PER_NODE", default: "100000",
            "The most topics this node's clients may have the cluster ask for."),
        .init(
            "cluster.maxTopics", flag: "cluster-max-topics", env: "RELAY_CLUSTER_MAX_TOPICS", default: "100000",
            "The most distinct topics the leader asks its upstream for, for every node together."),
        .init(
            "cluster.lastValueMB", flag: "cluster-last-value-mb", env: "RELAY_CLUSTER_LAST_VALUE_MB", default: "256",
            "The most the cluster's last-value store of a market holds in the NATS servers' memory; the oldest values go first."),
        .init("limits.topicsPerMessage", env: "RELAY_LIMIT_TOPICS_PER_MESSAGE", default: "1000", "Topics in one subscribe or unsubscribe message."),
        .init("limits.topicsPerConnection", env: "RELAY_LIMIT_TOPICS_PER_CONNECTION", default: "10000", "Topics one connection holds."),
        .init("limits.messagesPerSecond", env: "RELAY_LIMIT_MESSAGES_PER_SECOND", default: "50", "Client messages per second per connection, after a burst of 1,000."),
        .init("limits.connections", env: "RELAY_LIMIT_CONNECTIONS", default: "50000", "Market and portfolio-stream WebSockets in all."),
        .init("limits.connectionsPerAddress", env: "RELAY_LIMIT_CONNECTIONS_PER_ADDRESS", default: "10000", "Market and portfolio-stream WebSockets per address."),
        .init(
            "limits.httpConnections", env: "RELAY_LIMIT_HTTP_CONNECTIONS", default: "4096",
            "HTTP connections in all (at most a quarter of the open-file limit)."),
        .init(
            "limits.httpConnectionsPerAddress", env: "RELAY_LIMIT_HTTP_CONNECTIONS_PER_ADDRESS", default: "256", "HTTP connections per address."),
        .init("limits.pushStreams", env: "RELAY_LIMIT_PUSH_STREAMS", default: "1024", "Portfolio-stream WebSockets in all."),
        .init("limits.pushStreamsPerKey", env: "RELAY_LIMIT_PUSH_STREAMS_PER_KEY", default: "16", "Portfolio-stream WebSockets per client key."),
        .init(
            "limits.pendingPerAddress", env: "RELAY_LIMIT_PENDING_PER_ADDRESS", default: "1000",
            "Connections of one address not yet authenticated (or without a first request head)."),
        .init(
            "limits.pending", env: "RELAY_LIMIT_PENDING", default: "10000",
            "Connections not yet authenticated (or without a first request head), of every address together."),
        .init(
            "limits.authTimeoutSeconds", env: "RELAY_LIMIT_AUTH_TIMEOUT_SECONDS", default: "10",
            "How long a market client may stay connected without authenticating (then auth_timeout, close 1008)."),
        .init("limits.outboundBytes", env: "RELAY_LIMIT_OUTBOUND_BYTES", default: "1048576", "Bytes written to a client and not yet taken by its socket."),
        .init("limits.topicsPerKey", env: "RELAY_LIMIT_TOPICS_PER_KEY", default: "20000", "Distinct topics the connections of one key hold together, per market."),
        .init("limits.topics", env: "RELAY_LIMIT_TOPICS", default: "50000", "Distinct topics all connections hold together, per market."),
        .init(
            "limits.subscriptionsPerKey", env: "RELAY_LIMIT_SUBSCRIPTIONS_PER_KEY", default: "100000",
            "Subscriptions (a topic as many times as it is held) the connections and kept sessions of one key hold together, per market."),
        .init(
            "limits.subscriptions", env: "RELAY_LIMIT_SUBSCRIPTIONS", default: "1000000",
            "Subscriptions all connections and kept sessions hold together, per market."),
        .init(
            "limits.optionsContracts", flag: "options-contracts", env: "RELAY_LIMIT_OPTIONS_CONTRACTS", default: "1000",
            "Polygon's cap on options Q and FMV contracts per upstream connection."),
        .init(
            "history.enabled", flag: "no-history", .presence("false"), env: "RELAY_HISTORY", default: "true",
            "Keep recent events per market and give every event a position (_s, _m) so clients can resume (--no-history: do not)."),
        .init("history.eventsPerTopic", env: "RELAY_HISTORY_EVENTS_PER_TOPIC", default: "10000", "Events kept per topic for resumes."),
        .init("history.maxAgeSeconds", env: "RELAY_HISTORY_MAX_AGE_SECONDS", default: "300", "How long an event is kept for resumes."),
        .init(
            "history.memoryMB", flag: "history-memory-mb", env: "RELAY_HISTORY_MEMORY_MB", default: "64",
            "Memory the history of each market may take; past it the oldest events go first."),
        .init("history.eventsPerResume", env: "RELAY_HISTORY_EVENTS_PER_RESUME", default: "100000", "The most events one resume replays (past it: gap)."),
        .init(
            "history.resumesPerKey", env: "RELAY_HISTORY_RESUMES_PER_KEY", default: "10",
            "Resumes' worth of events (history.eventsPerResume each) one client key's connections together are replayed a minute on each market."),
        .init(
            "resume.windowSeconds", env: "RELAY_RESUME_WINDOW_SECONDS", default: "60",
            "How long a tagged session (KEY#tag) is kept after its connection breaks."),
        .init(
            "resume.marginBytes", env: "RELAY_RESUME_MARGIN_BYTES", default: "65536",
            "Bytes before the last acknowledged one that a tagged session gets again (what a proxy or a receive buffer may have held)."),
        .init("resume.sessions", env: "RELAY_RESUME_SESSIONS", default: "10000", "Broken tagged sessions kept at once per market (the oldest go first)."),
        .init(
            "gapFill.enabled", flag: "no-gap-fill", .presence("false"), env: "RELAY_GAP_FILL", default: "true",
            "After an upstream outage, fetch the missed trades, quotes and minute bars of topics held by name from the REST API (--no-gap-fill: do not)."),
        .init("gapFill.maxWindowSeconds", env: "RELAY_GAP_FILL_MAX_WINDOW_SECONDS", default: "900", "The longest outage filled; a longer one gets its notice only."),
        .init("gapFill.maxTopics", env: "RELAY_GAP_FILL_MAX_TOPICS", default: "500", "Topics one fill asks for: those the relay had an event of first, then those held by the most clients."),
        .init(
            "gapFill.requestsPerSecond", env: "RELAY_GAP_FILL_REQUESTS_PER_SECOND", default: "20",
            "REST requests per second of all fills together (Polygon asks paid plans to stay under 100)."),
        .init("gapFill.eventsPerTopic", env: "RELAY_GAP_FILL_EVENTS_PER_TOPIC", default: "100000", "The most events one fill recovers for a topic."),
        .init("gapFill.pagesPerTopic", env: "RELAY_GAP_FILL_PAGES_PER_TOPIC", default: "50", "The most REST pages (next_url) one fill reads for a topic."),
        .init("gapFill.maxDurationSeconds", env: "RELAY_GAP_FILL_MAX_DURATION_SECONDS", default: "180", "The longest one fill may take; topics not filled by then are told missing."),
        .init(
            "gapFill.requestTimeoutSeconds", env: "RELAY_GAP_FILL_REQUEST_TIMEOUT_SECONDS", default: "10",
            "The longest one REST request of a fill may take, its whole body included."),
    ]

    /// The declaration of `key`.
    static func declaration(of key: String) -> SettingDeclaration? {
        declarations.first { $0.key == key }
    }

    /// Why a command line cannot be read, named for the person who typed it.
    public struct CommandLineError: Error, Sendable, CustomStringConvertible {
        public var description: String
    }

    /// Reads `relay serve`'s arguments through the declarations: each file key given, with its raw value.
    public static func parse(commandLine arguments: [String]) throws(CommandLineError) -> [String: String] {
        var values: [String: String] = [:]
        var index = 0
        while index < arguments.count {
            let argument = arguments[index]
            index += 1
            guard argument.hasPrefix("--") else {
                throw CommandLineError(description: "unexpected argument \"\(argument)\" (settings are --name VALUE; see relay serve --help)")
            }
            var name = String(argument.dropFirst(2))
            var inline: String?
            if let equals = name.firstIndex(of: "=") {
                inline = String(name[name.index(after: equals)...])
                name = String(name[..<equals])
            }
            guard let declaration = declarations.first(where: { $0.flag == name }) else {
                throw CommandLineError(description: "unknown option --\(name) (see relay serve --help)")
            }
            switch declaration.form {
            case .presence(let value):
                guard inline == nil else { throw CommandLineError(description: "--\(name) takes no value") }
                values[declaration.key] = value
            case .value, .repeatable:
                let value: String
                if let inline {
                    value = inline
                } else {
                    guard index < arguments.count, !arguments[index].hasPrefix("--") else {
                        throw CommandLineError(description: "--\(name) needs a value")
                    }
                    value = arguments[index]
                    index += 1
                }
                if declaration.form == .repeatable, let earlier = values[declaration.key] {
                    values[declaration.key] = earlier + "," + value
                } else {
                    values[declaration.key] = value
                }
            }
        }
        return values
    }

    /// The settings part of `relay serve --help`: every setting with its flag, environment variable,
    /// file key and default, written from the declarations.
    public static var settingsHelp: String {
        var lines = ["Settings (precedence: flag > environment > config file > default):", ""]
        for declaration in declarations {
            var names: [String] = []
            if let flag = declaration.flag {
                switch declaration.form {
                case .presence: names.append("--\(flag)")
                case .value, .repeatable: names.append("--\(flag) VALUE" + (declaration.form == .repeatable ? " (repeatable)" : ""))
                }
            }
            if let environment = declaration.environment { names.append(environment) }
            names.append("file: \(declaration.key)")
            lines.append("  " + names.joined(separator: " | "))
            lines.append("      \(declaration.help) Default: \(declaration.defaultValue).")
        }
        return lines.joined(separator: "\n")
    }
}
