import ArgumentParser
import Foundation
import Logging
import PolygonWire
import RelayCore
import RelayServer
import ServiceLifecycle

struct ServeCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "serve",
        abstract: "Run the relay. With no upstream it serves the built-in demo feed.",
        discussion: """
            Precedence: flag > environment > config file > default.
            Environment: RELAY_LISTEN, RELAY_UPSTREAM, POLYGON_API_KEY, RELAY_CLIENT_KEYS,
            RELAY_UPSTREAM_CA_FILE, RELAY_DEMO_RATE, RELAY_LOG_LEVEL, RELAY_SLOW_CONSUMER,
            RELAY_SNAPSHOT_ON_SUBSCRIBE, RELAY_CLUSTER, RELAY_NODE_ID, RELAY_CLUSTER_NAME,
            RELAY_CLUSTER_LEASE_SECONDS, RELAY_METRICS_PUBLIC, RELAY_TLS_CERT, RELAY_TLS_KEY, RELAY_CONFIG.
            """
    )

    @Option(help: "HOST:PORT to listen on (default 127.0.0.1:8080).")
    var listen: String?

    @Option(
        help: "Upstream WebSocket URL, e.g. wss://socket.massive.com/stocks; repeat for more markets (the last path segment names the market). Omit for the demo feed, which serves every market."
    )
    var upstream: [String] = []

    @Option(help: "Markets to connect, comma-separated (stocks,options,forex,crypto,indices,futures), each at wss://UPSTREAM-HOST/MARKET.")
    var markets: String?

    @Option(name: .customLong("upstream-host"), help: "The host --markets connects to (default socket.massive.com; delayed.massive.com for the delayed feed).")
    var upstreamHost: String?

    @Option(name: .customLong("options-contracts"), help: "Polygon's cap on options Q and FMV contracts per upstream connection (default 1000).")
    var optionsContracts: Int?

    @Option(name: .customLong("upstream-key"), help: "The upstream API key (never sent downstream).")
    var upstreamKey: String?

    @Option(name: .customLong("upstream-ca-file"), help: "Extra trusted CA certificates (PEM) for a wss:// upstream.")
    var upstreamCAFile: String?

    @Option(name: .customLong("client-keys"), help: "Comma-separated keys downstream clients authenticate with.")
    var clientKeys: String?

    @Option(name: .customLong("demo-rate"), help: "Events per second of the built-in demo feed (default 500).")
    var demoRate: Double?

    @Option(
        name: .customLong("slow-consumer"),
        help: "When a client's 1,000-event buffer is full: drop (count, tell it later) or disconnect (close 1013).")
    var slowConsumer: String?

    @Flag(name: .customLong("no-snapshot"), help: "Do not send a topic's last event when a client subscribes to it.")
    var noSnapshot = false

    @Option(name: .customLong("rest-url"), help: "The upstream's REST API, e.g. https://api.polygon.io (portfolio reference prices).")
    var restURL: String?

    @Option(name: .customLong("data-dir"), help: "Where the portfolio sidecar keeps its SQLite file (default ./data).")
    var dataDirectory: String?

    @Option(name: .customLong("time-zone"), help: "IANA zone of the portfolio's days (default UTC).")
    var timeZone: String?

    @Option(name: .customLong("security-cache-size"), help: "Security details kept in the cache, prefetched ones included (default 10).")
    var securityCacheSize: Int?

    @Option(
        name: .customLong("demo-rest-delay-ms"),
        help: "Delay each REST answer of the built-in demo feed by this much (a slow data source, to watch prefetching).")
    var demoRESTDelay: Int?

    @Option(
        name: .customLong("cluster"),
        help: "Run as a node of a cluster on NATS: nats://HOST:PORT[,nats://HOST:PORT…]. One node holds the upstream connection.")
    var cluster: String?

    @Option(name: .customLong("node-id"), help: "This node's name in the cluster (default: hostname and port).")
    var nodeID: String?

    @Option(name: .customLong("cluster-name"), help: "Separates clusters sharing one NATS (default relay).")
    var clusterName: String?

    @Option(name: .customLong("cluster-tls-ca"), help: "Connect to NATS over TLS, trusting these CA certificates (PEM).")
    var clusterTLSCA: String?

    @Option(name: .customLong("cluster-tls-cert"), help: "This node's certificate chain (PEM) for NATS servers that verify clients.")
    var clusterTLSCert: String?

    @Option(name: .customLong("cluster-tls-key"), help: "The PEM private key of --cluster-tls-cert.")
    var clusterTLSKey: String?

    @Option(name: .customLong("cluster-credentials"), help: "A NATS credentials file (user JWT and NKey seed).")
    var clusterCredentials: String?

    @Option(name: .customLong("cluster-nkey-seed"), help: "A file holding this node's NATS NKey user seed (SU…).")
    var clusterNKeySeed: String?

    @Option(name: .customLong("cluster-token"), help: "A NATS authorization token (RELAY_CLUSTER_TOKEN keeps it out of ps).")
    var clusterToken: String?

    @Option(
        name: .customLong("cluster-max-topics-per-node"),
        help: "The most topics this node's clients may have the cluster ask for (default 100000).")
    var clusterMaxTopicsPerNode: Int?

    /// The cluster's TLS and credential flags added to the others.
    func withClusterFlags(_ flags: RelaySettings.Flags) -> RelaySettings.Flags {
        var flags = flags
        flags.clusterTLSCA = clusterTLSCA
        flags.clusterTLSCert = clusterTLSCert
        flags.clusterTLSKey = clusterTLSKey
        flags.clusterCredentials = clusterCredentials
        flags.clusterNKeySeed = clusterNKeySeed
        flags.clusterToken = clusterToken
        flags.clusterMaxTopicsPerNode = clusterMaxTopicsPerNode
        return flags
    }

    @Option(name: .customLong("tls-cert"), help: "Serve wss:// and https:// with this PEM certificate chain (needs --tls-key).")
    var tlsCertificate: String?

    @Option(name: .customLong("tls-key"), help: "The PEM private key of --tls-cert.")
    var tlsKey: String?

    @Flag(name: .customLong("public-metrics"), help: "Serve /metrics without a client key.")
    var publicMetrics = false

    @Flag(name: .customLong("no-portfolio"), help: "Run without the portfolio valuation sidecar.")
    var noPortfolio = false

    @Flag(
        name: .customLong("no-close-history"),
        help: "Do not fetch daily closes over REST to value past days (they keep the live values recorded then).")
    var noCloseHistory = false

    @Option(name: .customLong("log-level"), help: "trace, debug, info, notice, warning, error or critical.")
    var logLevel: String?

    @Option(help: "A YAML configuration file (see config/relay.yaml).")
    var config: String?

    func run() async throws {
        DescriptorLimit.raiseToHardLimit()
        let settings: RelaySettings
        do {
            settings = try await RelaySettings.resolve(
                flags: withClusterFlags(.init(
                    listen: listen, upstream: upstream.isEmpty ? nil : upstream.joined(separator: ","), upstreamKey: upstreamKey, upstreamCAFile: upstreamCAFile,
                    clientKeys: clientKeys, demoRate: demoRate, logLevel: logLevel, configFile: config,
                    slowConsumer: slowConsumer, snapshotOnSubscribe: noSnapshot ? false : nil, dataDirectory: dataDirectory,
                    timeZone: timeZone, portfolioEnabled: noPortfolio ? false : nil, restURL: restURL,
                    securityCacheSize: securityCacheSize, demoRESTDelayMilliseconds: demoRESTDelay, cluster: cluster,
                    nodeID: nodeID, clusterName: clusterName, metricsPublic: publicMetrics ? true : nil, tlsCertificate: tlsCertificate,
                    tlsKey: tlsKey, closeHistory: noCloseHistory ? false : nil, markets: markets, upstreamHost: upstreamHost,
                    optionsContracts: optionsContracts)),
                environment: ProcessInfo.processInfo.environment)
        } catch {
            throw StartupError(message: "\(error)")
        }
        do {
            _ = try ClientAuthentication.resolve(
                keys: settings.clientKeys, withRights: settings.clientKeyRights, listenHost: settings.listen.host)
        } catch {
            throw StartupError(message: error.description)
        }
        bootstrapLogging(level: settings.logLevel)
        let logger = Logger(label: "relay")
        // The relay's own flat service group handles the signals: one group for the whole process.
        let relay = Relay(settings: settings, gracefulShutdownSignals: [.sigterm, .sigint], logger: logger)
        try await withThrowingTaskGroup(of: Void.self) { tasks in
            tasks.addTask { try await relay.run() }
            tasks.addTask {
                let parts = try await relay.ready()
                Self.printWelcome(
                    settings: settings, port: parts.port, markets: parts.markets.keys.sorted(), demo: parts.demoFeed != nil,
                    portfolio: parts.portfolio != nil)
            }
            try await tasks.waitForAll()
        }
    }

    static func printWelcome(settings: RelaySettings, port: Int, markets: [Market], demo: Bool, portfolio: Bool) {
        let market = markets.first ?? .stocks
        let host = settings.listen.host
        let base = "\(host.contains(":") ? "[\(host)]" : host):\(port)"
        // Never a configured key on the screen: terminals are recorded and shared.
        let keyed = !settings.clientKeys.isEmpty || !settings.clientKeyRights.isEmpty
        let key = keyed ? "YOUR-CLIENT-KEY" : "any-key"
        let secure = settings.tls != nil
        let (ws, http) = secure ? ("wss", "https") : ("ws", "http")
        let curl = "curl\(secure ? " --cacert YOUR-CA.pem" : "")\(keyed ? " -H 'Authorization: Bearer \(key)'" : "")"
        var lines = [
            "relay is up\(demo ? " on the built-in demo feed" : "")",
            "  WebSocket  \(markets.map { "\(ws)://\(base)/\($0)" }.joined(separator: " "))   (Polygon protocol; client key: \(keyed ? "one of the configured keys" : "any, loopback only"))",
            "  dashboard  \(http)://\(base)/",
            "  health     curl\(secure ? " --cacert YOUR-CA.pem" : "") \(http)://\(base)/healthz",
            "  last quote \(curl) \(http)://\(base)/v1/last/\(markets.count > 1 ? "\(market)/" : "")\(market.exampleTopic)",
            "  Python     WebSocketClient(api_key=\"\(key)\", feed=\"\(base)\", market=\"\(market)\", secure=\(secure ? "True" : "False"), subscriptions=[\"\(market.exampleTopic)\"])",
            "  stop       Ctrl-C (SIGINT) or SIGTERM",
        ]
        if portfolio {
            lines.insert("  portfolio  \(curl) \(http)://\(base)/v1/portfolio   (history: /v1/portfolio/history)", at: lines.count - 1)
        }
        // Unbuffered, so a script reading our output sees it at once.
        FileHandle.standardOutput.write(Data((lines.joined(separator: "\n") + "\n").utf8))
    }
}
