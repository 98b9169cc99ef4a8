import AlpacaWire
import AsyncHTTPClient
import AsyncSupport
import Cluster
import DemoFeed
import GapFill
import Foundation
import Logging
import MarketDataHub
import NIOPosix
import PolygonWire
import Portfolio
import PortfolioData
import PortfolioDomain
import PolygonRESTClient
import PortfolioHTTP
import RelayConfiguration
import Prometheus
import RelayServer
import ServiceLifecycle
import UnixSignals
import Upstream

/// The whole relay: the upstream side (one upstream connection, or a cluster node on NATS), the hub,
/// the portfolio sidecar, the downstream server, and, with no upstream configured, the demo feed
/// in-process (reached through the same libwebsockets client over loopback).
///
/// `Sendable`; a `Service`. ``run()`` builds every part and runs them in one flat, ordered
/// `ServiceGroup` — demo feed, upstream, portfolio, server (and, on a cluster node, the cluster node
/// last, so it is the first to stop and hands the upstream to a successor at once) — publishes them
/// through ``ready()``, and runs until graceful shutdown or cancellation. Parts stop in reverse order,
/// each within ``partShutdownDeadline`` or abandoned with a log line naming it.
public final class Relay: Service, Sendable {
    /// The running parts, for tests and tools.
    public struct Components: Sendable {
        /// The first market's hub.
        public let hub: MarketDataHub
        /// A single relay's upstream client of the first market; `nil` on a cluster node (see ``cluster``).
        public let upstream: UpstreamClient?
        /// This relay's cluster node, when clustered.
        public let cluster: ClusterNode?
        public let server: RelayServer
        public let demoFeed: DemoFeed?
        /// The valuation sidecar, when enabled.
        public let portfolio: PortfolioService?
        /// Holdings views and security details, with the portfolio.
        public let securities: SecurityBrowser?
        /// The port the relay listens on.
        public let port: Int
        /// The in-process demo feed's port, if it runs.
        public let demoFeedPort: Int?
        /// Every served market's hub (``hub`` is the first market's).
        public let markets: [Market: MarketDataHub]
        /// A single relay's upstream client per market.
        public let upstreams: [Market: UpstreamClient]
        /// Each market's gap filler (single relays with a REST API).
        public let gapFillers: [Market: GapFiller]
    }

    /// How long each part may take to stop once shutdown reaches it.
    public static let partShutdownDeadline: Duration = .seconds(5)

    public let settings: RelaySettings
    private let readiness = ReadySignal<Components>()
    private let signals: [UnixSignal]
    private let logger: Logger

    /// - Parameter gracefulShutdownSignals: signals that start a graceful shutdown (the CLI passes
    ///   SIGTERM and SIGINT; tests trigger shutdown through their own group).
    public init(settings: RelaySettings, gracefulShutdownSignals: [UnixSignal] = [], logger: Logger = Logger(label: "relay")) {
        self.settings = settings
        self.signals = gracefulShutdownSignals
        self.logger = logger
    }

    /// The key REST requests carry: the REST API's own, else the upstream's, but an Alpaca key id never
    /// goes to another vendor's REST API (`nil`: none, REST is off).
    package static func restKey(_ settings: RelaySettings, alpacaUpstream: Bool) -> String? {
        settings.upstreamRESTKey ?? (alpacaUpstream ? nil : settings.upstreamKey)
    }

    /// Polygon's (and Massive's) REST host for their WebSocket hosts; `nil` for any other upstream.
    static func restURL(for endpoint: UpstreamConfiguration.Endpoint) -> String? {
        let host = endpoint.host.lowercased()
        for domain in ["polygon.io", "massive.com"] where host == domain || host.hasSuffix(".\(domain)") {
            return "https://api.\(domain)"
        }
        return nil
    }

    /// Waits until every part runs and the relay listens.
    public func ready() async throws -> Components { try await readiness.wait() }

    public func run() async throws {
        do {
            try await runParts()
        } catch {
            readiness.fail(error)
            throw error
        }
        readiness.fail(CancellationError())
    }

    /// One market's upstream: where it is and its key; the demo feed's address is known only once it
    /// listens, hence the closure.
    private struct MarketSource: Sendable {
        var market: Market
        var apiKey: String
        var endpoint: @Sendable () async throws -> UpstreamConfiguration.Endpoint
        var caFile: String?
        var description: String
        /// Whose protocol the upstream speaks, and so the protocol served downstream.
        var vendor: UpstreamVendor = .polygon
        var wire: ServedWire = .polygon
    }

    /// One market's running parts.
    private struct MarketParts: Sendable {
        var source: MarketSource
        var hub: MarketDataHub
        var interest: LocalInterest
        var link: UpstreamLink?
        var feed: any FeedStatus
    }

    /// The configured upstreams, one per market; `nil`: none configured (the demo feed serves every market).
    private func configuredSources() -> [MarketSource]? {
        guard !settings.upstreams.isEmpty else { return nil }
        return settings.upstreams.map { upstream in
            let endpoint = upstream.endpoint
            let vendor = settings.vendor(of: upstream)
            return MarketSource(
                market: upstream.market, apiKey: upstream.apiKey ?? settings.upstreamKey ?? "", endpoint: { endpoint },
                caFile: upstream.caFile ?? settings.upstreamCAFile, description: endpoint.description, vendor: vendor,
                wire: vendor == .alpaca ? .alpaca(AlpacaFeed(path: endpoint.path) ?? .standard(for: upstream.market)) : .polygon)
        }
    }

    private func runParts() async throws {
        let authentication = try ClientAuthentication.resolve(
            keys: settings.clientKeys, withRights: settings.clientKeyRights, listenHost: settings.listen.host)
        if settings.tls == nil, !ClientAuthentication.isLoopback(settings.listen.host) {
            logger.warning(
                "listening on \(settings.listen.host) without TLS: client keys and data cross the network in the clear; use --tls-cert and --tls-key")
        }
        let registry = PrometheusCollectorRegistry()
        let metricsFactory = PrometheusMetricsFactory(registry: registry)
        let settings = self.settings
        let logger = self.logger

        var demoFeed: DemoFeed?
        let sources: [MarketSource]
        /// The portfolio's REST API and the key it carries.
        let restURL: (@Sendable () async throws -> String)?
        let restKey: String
        if let configured = configuredSources() {
            sources = configured
            let rest = settings.upstreamRESTURL ?? settings.upstream.flatMap(Self.restURL(for:))
            if let key = Self.restKey(settings, alpacaUpstream: configured.contains { $0.vendor == .alpaca }) {
                restURL = rest.map { url in { @Sendable in url } }
                restKey = key
            } else {
                if rest != nil { logger.warning("REST off: an Alpaca upstream's key is not sent to \(rest ?? ""); give the REST API's own key with --rest-key") }
                restURL = nil
                restKey = ""
            }
        } else {
            let apiKey = "demo-" + UUID().uuidString
            let alpaca = settings.upstreamVendor == .alpaca
            var feedConfiguration = DemoFeedConfiguration(port: 0, apiKey: apiKey, eventsPerSecond: settings.demoRate)
            // In Alpaca's protocol (`--upstream-vendor alpaca`): its stock feed, crypto and options.
            feedConfiguration.markets = alpaca ? [.stocks, .crypto, .options] : Market.allCases
            feedConfiguration.alpaca = alpaca
            feedConfiguration.restDelay = settings.demoRESTDelayMilliseconds.map { .milliseconds($0) }
            let feed = DemoFeed(configuration: feedConfiguration, logger: logger.with(label: "relay.demo-feed"))
            demoFeed = feed
            sources = feedConfiguration.servedMarkets.map { market in
                MarketSource(
                    market: market, apiKey: apiKey,
                    endpoint: {
                        let url = try await feed.url(for: market)
                        guard let endpoint = UpstreamConfiguration.Endpoint(url) else { throw UpstreamError.invalidURL(url) }
                        return endpoint
                    }, caFile: nil, description: alpaca ? "the built-in demo feed (Alpaca's protocol)" : "the built-in demo feed",
                    vendor: alpaca ? .alpaca : .polygon, wire: alpaca ? .alpaca(.standard(for: market)) : .polygon)
            }
            restURL = settings.upstreamRESTURL.map { url in { @Sendable in url } } ?? { @Sendable in
                "http://127.0.0.1:\(try await feed.listeningPort())"
            }
            // Another REST source (`--rest-url`) gets the upstream key, never the demo feed's.
            restKey = settings.upstreamRESTURL == nil ? apiKey : settings.upstreamRESTKey ?? settings.upstreamKey ?? ""
            logger.info("no upstream configured: serving the built-in demo feed for every market")
        }
        // One cluster node per market (each its own lease and NATS connection), spreading leadership.
        let spread = settings.cluster.map { LeadershipSpread(node: $0.nodeID) }

        let clustered = settings.cluster != nil
        // The built-in feed checks the key only: any secret does.
        let demoSecret: String? = demoFeed == nil ? nil : "demo"
        var markets: [MarketParts] = []
        var clusterNodes: [ClusterNode] = []
        // Gap fill: each upstream market, from the same REST API, at one shared pace (a cluster node
        // fills only while it leads).
        var restClient: HTTPClient?
        var gapFillers: [Market: GapFiller] = [:]
        let gapFillPace = settings.gapFill.map { RequestPace(perSecond: $0.requestsPerSecond) }
        if settings.gapFill != nil, restURL == nil {
            logger.info("gap fill off: no REST API is known for this upstream (set --rest-url)")
        }
        for source in sources {
            let marketLogger = logger.with(label: "relay.\(source.market)")
            let marketMetrics = MarketMetricsFactory(base: metricsFactory, market: source.market.rawValue)
            let interest = LocalInterest()
            let hub = MarketDataHub(
                policy: settings.slowConsumerPolicy, snapshotOnSubscribe: settings.snapshotOnSubscribe,
                snapshotless: source.vendor == .alpaca ? AlpacaChannel.snapshotless : [],
                keepsUnwantedLastValues: !clustered,
                // In a cluster the leader gives the positions and every node adopts them.
                history: settings.history, adoptsPositions: clustered, logger: marketLogger.with(label: "relay.hub.\(source.market)"), metricsFactory: marketMetrics
            ) { change in
                interest.apply(change)
            }
            let makeUpstream: @Sendable () async throws -> UpstreamClient = {
                var configuration = settings.upstreamTuning
                configuration.endpoint = try await source.endpoint()
                configuration.apiKey = source.apiKey
                configuration.caFile = source.caFile
                configuration.vendor = source.vendor
                configuration.market = source.market
                if source.vendor == .alpaca { configuration.secret = demoSecret ?? settings.upstreamSecret }
                configuration.metricsFactory = marketMetrics
                // A cluster leader must be gone well inside its lease once it decides to go.
                if clustered { configuration.closeTimeout = .seconds(1) }
                return UpstreamClient(configuration: configuration, logger: marketLogger.with(label: "relay.upstream.\(source.market)"))
            }
            // The fill maps Polygon's REST results: Alpaca's markets get the outage notices only.
            if let gapFill = settings.gapFill, let restURL, let gapFillPace, source.vendor == .polygon {
                let client = restClient ?? HTTPClient(eventLoopGroup: MultiThreadedEventLoopGroup.singleton)
                restClient = client
                // The demo feed's REST wants its own key; another source the REST API's own key
                // (`--rest-key`) when one is given, else the market's upstream key.
                let key = demoFeed != nil || settings.upstreamRESTKey != nil || source.apiKey.isEmpty ? restKey : source.apiKey
                gapFillers[source.market] = GapFiller(
                    market: source.market, hub: hub, rest: PolygonREST(resolvingBaseURL: restURL, apiKey: key, timeout: gapFill.requestTimeout, client: client),
                    pace: gapFillPace, settings: gapFill, metricsFactory: marketMetrics, logger: logger.with(label: "relay.gap-fill.\(source.market)"))
            }
            if let cluster = settings.cluster {
                let hook = gapFillers[source.market].map { filler in
                    ClusterGapFillHook(maxTopics: settings.gapFill?.maxTopics ?? 0, maxWindow: settings.gapFill?.maxWindow ?? .seconds(15 * 60)) { request, outlet in
                        await filler.fill(request, into: outlet)
                    }
                }
                let node = try ClusterNode(
                    configuration: cluster, market: source.market.rawValue, hub: hub, localInterest: interest, metricsFactory: marketMetrics,
                    logger: logger.with(label: "relay.cluster"), spread: spread, stampsPositions: settings.history != nil,
                    gapFill: hook, vendor: source.vendor,
                    makeUpstream: makeUpstream)
                clusterNodes.append(node)
                markets.append(
                    MarketParts(
                        source: source, hub: hub, interest: interest, link: nil,
                        feed: ClusterFeedStatus(node: node, upstream: source.description)))
            } else {
                // The built-in feed's loopback address is nobody's business (its port served its faults).
                let link = UpstreamLink(
                    hub: hub, interest: interest, shownURL: demoFeed == nil ? nil : source.description, makeUpstream: makeUpstream)
                markets.append(MarketParts(source: source, hub: hub, interest: interest, link: link, feed: link))
            }
        }
        guard let primary = markets.first else {
            throw RelaySettings.InvalidSetting(description: "upstream: no market configured")
        }
        let hub = primary.hub
        let hubs = MarketHubs(
            Dictionary(uniqueKeysWithValues: markets.map { ($0.source.market, $0.hub) }),
            alpaca: Set(markets.filter { $0.source.vendor == .alpaca }.map(\.source.market)))

        var portfolio: PortfolioService?
        var browser: SecurityBrowser?
        // Held until the relay stops: one valuation sidecar per portfolio directory.
        var sidecarLock: SidecarLock?
        defer { withExtendedLifetime(sidecarLock) {} }
        if let portfolioSettings = settings.portfolio {
            sidecarLock = try SidecarLock(directory: portfolioSettings.dataDirectory)
            guard let calendar = DayCalendar(timeZone: portfolioSettings.timeZone) else {
                throw RelaySettings.InvalidSetting(description: "time zone: unknown zone \(portfolioSettings.timeZone)")
            }
            let store = try PortfolioStore(directory: portfolioSettings.dataDirectory)
            // A client of this relay's own: the shared one would keep pooled connections across relays
            // in one process (tests), and a later relay on a reused port got the earlier one's dead ones.
            let client = restClient ?? HTTPClient(eventLoopGroup: MultiThreadedEventLoopGroup.singleton)
            restClient = client
            let rest = restURL.map { PolygonREST(resolvingBaseURL: $0, apiKey: restKey, client: client) }
            let service = PortfolioService(
                store: store, hubs: hubs, calendar: calendar, rule: PriceRule(staleAfter: portfolioSettings.staleAfterSeconds),
                pushInterval: .milliseconds(portfolioSettings.pushIntervalMilliseconds),
                referencePrices: rest.map(ReferencePrices.init(rest:)), closeHistory: portfolioSettings.closeHistory,
                logger: logger.with(label: "relay.portfolio"))
            portfolio = service
            browser = SecurityBrowser(
                service: service, loader: SecurityDetailLoader(store: store, hubs: hubs, rest: rest, calendar: calendar),
                capacity: portfolioSettings.securityCacheSize, idleTimeout: .seconds(portfolioSettings.clientIdleSeconds),
                metrics: SecurityCacheMetrics(factory: metricsFactory), logger: logger.with(label: "relay.securities"))
            logger.info("portfolio sidecar on", metadata: ["database": "\(store.path)", "time_zone": "\(portfolioSettings.timeZone)"])
        }
        // A single relay's hubs hand their outages to their fillers; a cluster node's ask the leader.
        if !clustered {
            for parts in markets {
                guard let filler = gapFillers[parts.source.market], let link = parts.link else { continue }
                await filler.start(into: InboxOutlet { try? await link.upstream().inbox })
            }
        }
        let routes = portfolio.map { PortfolioRoutes(service: $0, browser: browser) }
        let server = RelayServer(
            configuration: {
                var configuration = RelayServerConfiguration(
                    host: settings.listen.host, port: settings.listen.port, authentication: authentication)
                configuration.metricsPublic = settings.metricsPublic
                configuration.limits = settings.limits
                configuration.cappedTickers = settings.optionsContracts
                configuration.resume = settings.resume
                configuration.tls = settings.tls
                configuration.connectionLimits = settings.connectionLimits
                configuration.portfolio = routes != nil
                configuration.dashboardDirectory = ProcessInfo.processInfo.environment["RELAY_DASHBOARD_DIR"]
                return configuration
            }(),
            markets: markets.map { ServedMarket(market: $0.source.market, hub: $0.hub, feed: $0.feed, wire: $0.source.wire) }, registry: registry, logger: logger.with(label: "relay.server"),
            extraRoutes: { router in
                routes?.add(to: router, connection: { $0.channel }, entitlement: { authentication.entitlement(of: $0) })
            },
            pushStreams: routes.map { routes in
                [PushStream(path: "/v1/portfolio/stream", needsPortfolioRight: true) { await routes.valuationFrames() }]
            } ?? [])

        // Start order; they stop in reverse.
        var parts: [(String, any Service)] = []
        if let demoFeed { parts.append(("demo feed", demoFeed)) }
        for market in markets {
            if let link = market.link { parts.append(("\(market.source.market) upstream", link)) }
        }
        if let portfolio { parts.append(("portfolio", portfolio)) }
        parts.append(("server", server))
        for node in clusterNodes { parts.append(("\(node.market) cluster node", node)) }
        parts.append(("memory trim", MemoryTrim()))
        let group = ServiceGroup(
            configuration: .init(
                services: parts.map { name, service in
                    .init(service: BoundedShutdown(name: name, service: service, deadline: Self.partShutdownDeadline, logger: logger))
                },
                gracefulShutdownSignals: signals, logger: logger))

        // The gap fills and the REST client stop with the relay, whichever way it stops.
        do {
            try await runServices(group)
        } catch {
            for filler in gapFillers.values { await filler.stop() }
            try? await restClient?.shutdown()
            throw error
        }
        for filler in gapFillers.values { await filler.stop() }
        try? await restClient?.shutdown()
        func runServices(_ group: ServiceGroup) async throws {
            try await withThrowingTaskGroup(of: Void.self) { tasks in
                tasks.addTask { try await group.run() }
                let port = try await server.listeningPort()
                let demoPort = try await demoFeed?.listeningPort()
                var upstreams: [Market: UpstreamClient] = [:]
                for market in markets {
                    if let link = market.link { upstreams[market.source.market] = try await link.upstream() }
                }
                readiness.succeed(
                    Components(
                        hub: hub, upstream: upstreams[primary.source.market], cluster: clusterNodes.first, server: server, demoFeed: demoFeed,
                        portfolio: portfolio, securities: browser, port: port, demoFeedPort: demoPort,
                        markets: Dictionary(uniqueKeysWithValues: markets.map { ($0.source.market, $0.hub) }), upstreams: upstreams,
                        gapFillers: gapFillers))
                let scheme = settings.tls == nil ? "ws" : "wss"
                var metadata: Logger.Metadata = [
                    "ws": "\(scheme)://\(settings.listen.host):\(port)\(primary.source.wire.path(of: primary.source.market))",
                    "upstream": "\(primary.source.description)",
                    "client_auth": authentication == .anyKeyOnLoopback ? "any key (loopback only)" : "client keys",
                ]
                if markets.count > 1 {
                    metadata["markets"] = "\(markets.map { $0.source.wire.path(of: $0.source.market) }.joined(separator: " "))"
                }
                if let cluster = settings.cluster { metadata["cluster"] = "\(cluster.name)/\(cluster.nodeID)" }
                // Where the portfolio's details, histories and reference prices come from.
                if settings.portfolio != nil {
                    metadata["rest"] = "\((try? await restURL?()) ?? "none: prices from the stream only")"
                }
                logger.info("relay listening", metadata: metadata)
                try await tasks.waitForAll()
            }
        }
    }
}

/// A single relay's upstream side: one upstream client, made once the upstream's address is known,
/// whose events feed the hub in order, and whose subscriptions follow what the hub wants.
///
/// `Sendable`; a `Service`. Reports the connection's health to the server (``FeedStatus``).
final class UpstreamLink: Service, FeedStatus {
    private let hub: MarketDataHub
    private let interest: LocalInterest
    private let makeUpstream: @Sendable () async throws -> UpstreamClient
    private let made = ReadySignal<UpstreamClient>()
    /// What the health report says instead of the upstream's URL (`nil`: the URL).
    private let shownURL: String?

    init(
        hub: MarketDataHub, interest: LocalInterest, shownURL: String? = nil,
        makeUpstream: @escaping @Sendable () async throws -> UpstreamClient
    ) {
        self.hub = hub
        self.interest = interest
        self.shownURL = shownURL
        self.makeUpstream = makeUpstream
    }

    /// The upstream client, once made.
    func upstream() async throws -> UpstreamClient { try await made.wait() }

    func run() async throws {
        let upstream: UpstreamClient
        do {
            upstream = try await makeUpstream()
        } catch {
            made.fail(error)
            throw error
        }
        made.succeed(upstream)
        // At most one upstream change per 50 ms: a crowd reconnecting after a restart makes a handful
        // of subscribe messages, not one per client.
        let batch = Debouncer(delay: .milliseconds(50))
        interest.listen { _ in batch.poke { upstream.setWantedTopics(self.interest.topics) } }
        let hub = self.hub
        try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask { try await upstream.run() }
            // Ends when the client stops and its inbox finishes.
            group.addTask { await HubPump.run(upstream.inbox, into: hub, lossReason: "the relay fell behind its upstream") }
            try await group.waitForAll()
        }
    }

    func report() async -> FeedReport {
        guard let upstream = made.value else {
            return FeedReport(healthy: false, upstream: UpstreamReport(state: "idle", url: "not known yet"))
        }
        var report = UpstreamReport(upstream)
        if let shownURL { report.url = shownURL }
        return FeedReport(
            healthy: upstream.state == .authenticated, upstream: report,
            lastUpstreamMessageAge: upstream.lastMessageAt.map { ContinuousClock.now - $0 })
    }
}

/// A cluster node's feed as the server reports it: the cluster section, and this node's upstream
/// connection while it leads (`standby` while it follows).
struct ClusterFeedStatus: FeedStatus {
    let node: ClusterNode
    let upstream: String

    func report() async -> FeedReport {
        let status = node.status
        let cluster = ClusterReport(
            role: status.role, node: status.node, leader: status.leader, nats: status.nats, liveNodes: status.liveNodes,
            subscriptions: status.subscriptions)
        if let connection = node.upstream {
            return FeedReport(
                healthy: node.isHealthy && connection.state == .authenticated, upstream: UpstreamReport(connection), cluster: cluster,
                lastUpstreamMessageAge: connection.lastMessageAt.map { ContinuousClock.now - $0 })
        }
        let detail = status.leader.map { "held by the cluster leader \($0)" } ?? "no cluster leader yet"
        return FeedReport(
            healthy: node.isHealthy, upstream: UpstreamReport(state: "standby", detail: detail, url: upstream), cluster: cluster)
    }

    func lastEvent(for topic: Topic) async -> MarketEvent? { await node.lastEvent(for: topic) }
}

extension UpstreamReport {
    init(_ upstream: UpstreamClient) {
        let state = upstream.state
        let statistics = upstream.statistics
        self.init(
            state: state.name, detail: state.detail, url: upstream.configuration.endpoint.description,
            subscribedTopics: upstream.subscribedTopics.count,
            lastMessageAgeMs: upstream.lastMessageAt.map { (ContinuousClock.now - $0).milliseconds },
            messagesReceived: statistics.messagesReceived, eventsReceived: statistics.eventsReceived,
            malformedMessages: statistics.malformedMessages, oversizedMessages: statistics.oversizedMessages,
            reconnects: statistics.reconnectsByCause, lastError: statistics.lastError, silent: upstream.isSilent)
    }
}

extension Logger {
    /// The same handler and level under another label.
    func with(label: String) -> Logger {
        var logger = Logger(label: label)
        logger.logLevel = logLevel
        return logger
    }
}
