import AlpacaWire
import AsyncHTTPClient
import Cluster
import DemoFeed
import Foundation
import GapFill
import Logging
import MarketCore
import MarketDataHub
import MarketREST
import PolygonRESTClient
import PolygonWire
import RESTGateway
import AlpacaREST
import Portfolio
import PortfolioData
import PortfolioDomain
import PortfolioHTTP
import Prometheus
import RelayConfiguration
import RelayServer
import Tape
import TapeReplay
import ServiceLifecycle
import Synchronization
import Upstream

/// The parts ``Relay/run()`` puts together, each built by a function of its own: where each market's
/// events come from, each market (hub, source, gap filler, cluster node), the portfolio sidecar, and
/// the server.
extension Relay {
    /// Every market's upstream, and the REST API the fills and the portfolio ask.
    struct UpstreamSources: Sendable {
        var sources: [SourcePlan]
        /// The in-process demo feed, when no upstream is configured.
        var demoFeed: DemoFeed?
        /// The REST API's base URL (the demo feed's is known once it listens), `nil`: REST is off.
        var restURL: (@Sendable () async throws -> String)?
        /// The key REST requests carry.
        var restKey: String
        /// The account's REST budget, shared by the gateway's clients, gap fill and the portfolio.
        var restBudget: (any AccountBudget)?
        /// Alpaca's data REST API and its account's credentials, when an Alpaca market is served.
        var alpacaREST: AlpacaAccount?
        var alpacaBudget: (any AccountBudget)?
    }

    /// An Alpaca account's data REST API: where it is, the key id and secret.
    struct AlpacaAccount: Sendable {
        var url: @Sendable () async throws -> String
        var key: String
        var secret: String
    }

    /// Each market's running parts, its cluster node (when clustered) and its gap filler (with a REST API).
    struct Assembly: Sendable {
        var markets: [MarketParts] = []
        var clusterNodes: [ClusterNode] = []
        var gapFillers: [Market: GapFiller] = [:]
    }

    /// The portfolio sidecar's parts (all `nil` when it is off).
    struct Sidecar: Sendable {
        var service: PortfolioService?
        var browser: SecurityBrowser?
        /// Held until the relay stops: one valuation sidecar per portfolio directory.
        var lock: SidecarLock?
        var routes: PortfolioRoutes?
    }

    /// One REST client for the fills and the portfolio, made when the first needs it. `Sendable`: the
    /// client behind a `Mutex`.
    final class RESTClientBox: Sendable {
        private let made = Mutex<HTTPClient?>(nil)
        /// The bytes of vendor answers being read by every REST client of the relay (fills, portfolio,
        /// the gateway), bounded together (`rest.answersInFlightMB`).
        let reading: ReadingBytes

        init(reading: ReadingBytes) {
            self.reading = reading
        }

        /// The client, if one was made.
        var client: HTTPClient? { made.withLock { $0 } }

        /// The client, made now if none was. A client of this relay's own: the shared one would keep
        /// pooled connections across relays in one process (tests), and a later relay on a reused port
        /// got the earlier one's dead ones.
        func shared() -> HTTPClient {
            made.withLock { client in
                if let client { return client }
                let new = VendorHTTPClient.make()
                client = new
                return new
            }
        }
    }

    // MARK: the upstreams

    /// The configured upstreams, or the built-in demo feed serving every market.
    func upstreamSources() throws -> UpstreamSources {
        if let replay = settings.replay { return UpstreamSources(sources: try replaySources(replay), restURL: nil, restKey: "") }
        if let configured = configuredSources() {
            // A market its vendor does not stream (Polygon's news) would be served with nothing to take.
            if let empty = configured.first(where: { $0.wire.eventTypes(of: $0.market).isEmpty }) {
                throw RelaySettings.InvalidSetting(
                    description:
                        "upstream \(empty.description): \(empty.vendor.name) has no \(empty.market) stream (news is Alpaca's: wss://stream.data.alpaca.markets/v1beta1/news)"
                )
            }
            let rest = settings.upstreamRESTURL ?? settings.upstream.flatMap(Self.restURL(for:))
            guard let key = Self.restKey(settings, alpacaUpstream: configured.contains { $0.vendor.signsInWithSecret }) else {
                if rest != nil { logger.warning("REST off: an Alpaca upstream's key is not sent to \(rest ?? ""); give the REST API's own key with --rest-key") }
                var sources = UpstreamSources(sources: configured, restURL: nil, restKey: "")
                sources.alpacaREST = alpacaAccount(configured)
                return sources
            }
            var sources = UpstreamSources(sources: configured, restURL: rest.map { url in { @Sendable in url } }, restKey: key)
            sources.alpacaREST = alpacaAccount(configured)
            return sources
        }
        let apiKey = "demo-" + UUID().uuidString
        let vendor = settings.upstreamVendor ?? Self.vendors[0]
        let alpaca = vendor == .alpaca
        var feedConfiguration = DemoFeedConfiguration(port: 0, apiKey: apiKey, eventsPerSecond: settings.demoRate)
        // In Alpaca's protocol (`--upstream-vendor alpaca`): its stock feed, crypto, options and news.
        feedConfiguration.markets = alpaca ? [.stocks, .crypto, .options, .news] : Market.trading
        feedConfiguration.alpaca = alpaca
        feedConfiguration.restDelay = settings.demoRESTDelayMilliseconds.map { .milliseconds($0) }
        let feed = DemoFeed(configuration: feedConfiguration, logger: logger.with(label: "relay.demo-feed"))
        let sources = feedConfiguration.servedMarkets.map { market in
            SourcePlan(
                market: market, apiKey: apiKey,
                endpoint: {
                    let url = try await feed.url(for: market)
                    guard let endpoint = UpstreamConfiguration.Endpoint(url) else { throw UpstreamError.invalidURL(url) }
                    return endpoint
                }, caFile: nil, description: alpaca ? "the built-in demo feed (Alpaca's protocol)" : "the built-in demo feed",
                vendor: vendor, wire: vendor.wireProtocol(market: market))
        }
        let restURL: @Sendable () async throws -> String =
            settings.upstreamRESTURL.map { url in { @Sendable in url } } ?? { @Sendable in "http://127.0.0.1:\(try await feed.listeningPort())" }
        // Another REST source (`--rest-url`) gets the upstream key, never the demo feed's.
        let restKey = settings.upstreamRESTURL == nil ? apiKey : settings.upstreamRESTKey ?? settings.upstreamKey ?? ""
        logger.info("no upstream configured: serving the built-in demo feed for every market")
        var upstreamSources = UpstreamSources(sources: sources, demoFeed: feed, restURL: restURL, restKey: restKey)
        if alpaca {
            // The demo feed answers Alpaca's REST paths too, with its own key.
            let url: @Sendable () async throws -> String =
                settings.gateway?.alpacaURL.map { url in { @Sendable in url } } ?? { @Sendable in "http://127.0.0.1:\(try await feed.listeningPort())" }
            upstreamSources.alpacaREST = AlpacaAccount(url: url, key: apiKey, secret: "demo")
        }
        return upstreamSources
    }

    /// What an event of `market` the relay did not read from its upstream itself (from its tape, or from
    /// NATS) must be to be taken: what its upstream lets through.
    func eventCheck(_ market: Market, wire: any WireProtocol) -> EventCheck {
        Self.eventCheck(market, wire: wire, settings: settings)
    }

    /// ``eventCheck(_:wire:)`` under `settings`' bounds.
    static func eventCheck(_ market: Market, wire: any WireProtocol, settings: RelaySettings) -> EventCheck {
        // A news item can be megabytes; other markets keep their cap (a folded book: as the upstream's).
        let news = market == .news ? settings.news.maxBytes : nil
        return EventCheck(
            market: market, wire: wire, maxBytes: news ?? settings.upstreamTuning.maxEventBytes,
            maxFoldedBytes: news ?? settings.upstreamTuning.maxFoldedBytes)
    }

    /// What an event of `market` recorded from `source` (a tape's `source` record: its vendor and
    /// upstream path; `nil`: the default vendor's) must be to be taken into a tape's folder (`relay tape
    /// pull`), under `settings`' bounds.
    public static func tapeCheck(_ market: Market, source: (vendor: String, path: String?)?, settings: RelaySettings) -> EventCheck {
        eventCheck(market, wire: recordedVendor(source).wireProtocol(market: market, path: source?.path), settings: settings)
    }

    /// The vendor a tape's `source` record names (one it does not know, or none: the default).
    static func recordedVendor(_ source: (vendor: String, path: String?)?) -> WireVendor {
        source.flatMap { told in vendors.first { $0.name == told.vendor } } ?? vendors[0]
    }

    /// The vendor, protocol and upstream path a day file of `market` was recorded in (its `source`
    /// record; a tape that does not say: the default vendor's): what its replay and export speak.
    public static func recordedProtocol(of path: String, market: Market) throws -> (vendor: WireVendor, wire: any WireProtocol, path: String?) {
        let source = try TapeReader(path: path).source()
        let vendor = recordedVendor(source)
        return (vendor, vendor.wireProtocol(market: market, path: source?.path), source?.path)
    }

    /// A recorded day's markets, each in the protocol its vendor spoke when it was recorded.
    func replaySources(_ replay: ReplaySettings) throws -> [SourcePlan] {
        let recorded = TapeFile.markets(directory: replay.directory).compactMap { name in
            Market(rawValue: name).map { ($0, TapeFile.days(directory: replay.directory, market: name)) }
        }
        // The newest day of the markets asked for (of every market when none is named).
        let candidates = replay.markets.map { asked in recorded.filter { asked.contains($0.0) } } ?? recorded
        guard let day = replay.day ?? candidates.flatMap({ $0.1.map(\.day) }).max() else {
            throw RelaySettings.InvalidSetting(description: "replay.date: the tape in \(replay.directory) holds no day to replay")
        }
        let markets = replay.markets ?? recorded.filter { $0.1.contains { $0.day == day } }.map(\.0)
        var plans: [SourcePlan] = []
        for market in markets {
            var plan = ReplayPlan(directory: replay.directory, market: market.rawValue, day: day, loop: replay.loop)
            guard let days = recorded.first(where: { $0.0 == market })?.1, days.contains(where: { $0.day == day }) else {
                throw RelaySettings.InvalidSetting(description: "replay: the tape in \(replay.directory) has no \(market) for \(day)")
            }
            plan.speed = ReplayPlan.Speed(replay.speed) ?? .times(1)
            for (text, isStart) in [(replay.from, true), (replay.to, false)] {
                guard let text else { continue }
                guard let time = ReplayPlan.time(text, on: day) else {
                    throw RelaySettings.InvalidSetting(description: "replay.\(isStart ? "from" : "to"): \"\(text)\" is not a time of \(day)")
                }
                if isStart { plan.from = time } else { plan.to = time }
            }
            let recorded = try Self.recordedProtocol(of: plan.path, market: market)
            plans.append(
                SourcePlan(
                    market: market, apiKey: "", endpoint: { throw UpstreamError.invalidURL("a replay has no upstream") }, caFile: nil,
                    description: "the tape (\(market) \(day))", vendor: recorded.vendor, wire: recorded.wire, upstreamPath: recorded.path,
                    replay: plan))
        }
        guard !plans.isEmpty else { throw RelaySettings.InvalidSetting(description: "replay: the tape in \(replay.directory) has no market for \(day)") }
        logger.info("replaying the tape instead of the live upstreams", metadata: ["day": "\(day)", "markets": "\(markets.map(\.rawValue))"])
        return plans
    }

    // MARK: the markets

    /// Every market's parts, one after the other (a cluster node per market, each its own lease and
    /// NATS connection, spreading leadership).
    func assembleMarkets(_ upstream: UpstreamSources, rest: RESTClientBox, metricsFactory: PrometheusMetricsFactory) throws -> Assembly {
        let spread = settings.cluster.map { LeadershipSpread(node: $0.nodeID) }
        // Gap fill: each upstream market, from the same REST API, at one shared pace (a cluster node
        // fills only while it leads).
        let gapFillPace = settings.gapFill.map { RequestPace(perSecond: $0.requestsPerSecond) }
        if settings.gapFill != nil, upstream.restURL == nil, settings.replay == nil {
            logger.info("gap fill off: no REST API is known for this upstream (set --rest-url)")
        }
        var assembly = Assembly()
        for source in upstream.sources {
            try assemble(source, upstream: upstream, spread: spread, gapFillPace: gapFillPace, rest: rest, metricsFactory: metricsFactory, into: &assembly)
        }
        return assembly
    }

    /// One market: its hub, how its upstream client is made, its gap filler, and its source (a cluster
    /// node, or a single relay's upstream link).
    private func assemble(
        _ source: SourcePlan, upstream: UpstreamSources, spread: LeadershipSpread?, gapFillPace: RequestPace?, rest: RESTClientBox,
        metricsFactory: PrometheusMetricsFactory, into assembly: inout Assembly
    ) throws {
        let settings = self.settings
        let clustered = settings.cluster != nil
        let marketLogger = logger.with(label: "relay.\(source.market)")
        let marketMetrics = MarketMetricsFactory(base: metricsFactory, market: source.market.rawValue)
        let interest = LocalInterest()
        let wire = source.wire
        // The tape records what the hub publishes (a cluster's tape is the leader's: its cluster node records it).
        var recorder: TapeRecorder?
        if let tape = settings.tape, !clustered {
            var recording = TapeRecorder.Settings(directory: tape.directory, market: source.market.rawValue)
            recording.vendor = source.vendor.name
            recording.upstreamPath = source.upstreamPath
            recording.flushInterval = tape.flushInterval
            recording.retentionDays = tape.retentionDays
            recording.retentionBytes = tape.retentionBytes
            recording.logger = marketLogger
            do {
                recorder = try TapeRecorder(settings: recording, metricsFactory: marketMetrics)
            } catch {
                // Delivery does not depend on the tape: the relay runs, unrecorded, and says why.
                marketLogger.warning("the tape is not recorded: \(error)")
            }
        }
        let hub = MarketDataHub(
            // News: an item is no state of its symbol, so a subscription gets the last one only when asked.
            // News keeps the default: a story can be megabytes (a key's own buffer still applies).
            wire: wire, policy: settings.slowConsumerPolicy,
            bufferLimit: source.market == .news ? MarketDataHub.defaultBufferLimit : settings.subscriberBuffer,
            snapshotOnSubscribe: source.market == .news ? settings.news.snapshot : settings.snapshotOnSubscribe,
            snapshotless: wire.snapshotless(of: source.market),
            folding: wire.folding(of: source.market, limits: settings.foldLimits),
            keepsUnwantedLastValues: !clustered,
            // News without its snapshot: no last story kept per symbol (nothing would read it).
            keepsLastValues: source.market != .news || settings.news.snapshot,
            // In a cluster the leader gives the positions and every node adopts them. A replay at `max`
            // keeps none: its memory would hold about a second of it, too little to resume from, at
            // half the replay's CPU.
            history: source.replay?.speed == .max ? nil : settings.history, adoptsPositions: clustered, wildcardLinger: settings.wildcardLinger, logger: marketLogger.with(label: "relay.hub.\(source.market)"), metricsFactory: marketMetrics,
            tap: recorder
        ) { change in
            interest.apply(change)
        }
        if let replay = source.replay {
            let tape = TapeSource(
                plan: replay, hub: hub, interest: interest, logger: marketLogger.with(label: "relay.replay.\(source.market)"), metricsFactory: marketMetrics)
            assembly.markets.append(MarketParts(plan: source, hub: hub, interest: interest, upstream: nil, source: tape))
            return
        }
        // The built-in feed checks the key only: any secret does.
        let demoSecret: String? = upstream.demoFeed == nil ? nil : "demo"
        let makeUpstream: @Sendable () async throws -> UpstreamClient = {
            var configuration = settings.upstreamTuning
            configuration.endpoint = try await source.endpoint()
            configuration.apiKey = source.apiKey
            configuration.caFile = source.caFile
            configuration.wire = wire
            configuration.market = source.market
            // A news item can be megabytes; other markets keep their cap.
            if source.market == .news {
                configuration.maxMessageBytes = settings.news.maxBytes
                configuration.maxEventBytes = settings.news.maxBytes
            }
            if source.vendor.signsInWithSecret { configuration.secret = demoSecret ?? settings.upstreamSecret }
            configuration.metricsFactory = marketMetrics
            // A cluster leader must be gone well inside its lease once it decides to go.
            if clustered { configuration.closeTimeout = .seconds(1) }
            return UpstreamClient(configuration: configuration, logger: marketLogger.with(label: "relay.upstream.\(source.market)"))
        }
        // The fill maps Polygon's REST results: Alpaca's markets get the outage notices only.
        if let gapFill = settings.gapFill, let restURL = upstream.restURL, let gapFillPace, source.vendor == .polygon {
            // The demo feed's REST wants its own key; another source the REST API's own key
            // (`--rest-key`) when one is given, else the market's upstream key.
            let key = upstream.demoFeed != nil || settings.upstreamRESTKey != nil || source.apiKey.isEmpty ? upstream.restKey : source.apiKey
            var client = PolygonREST(resolvingBaseURL: restURL, apiKey: key, timeout: gapFill.requestTimeout, client: rest.shared())
            client.budget = upstream.restBudget
            client.reading = rest.reading
            assembly.gapFillers[source.market] = GapFiller(
                market: source.market, hub: hub,
                history: PolygonHistory(market: source.market, rest: client),
                pace: gapFillPace, settings: gapFill, metricsFactory: marketMetrics, logger: logger.with(label: "relay.gap-fill.\(source.market)"))
        }
        guard let cluster = settings.cluster else {
            // The built-in feed's loopback address is nobody's business (its port served its faults).
            let link = UpstreamSource(
                hub: hub, interest: interest, shownURL: upstream.demoFeed == nil ? nil : source.description, makeUpstream: makeUpstream)
            assembly.markets.append(MarketParts(plan: source, hub: hub, interest: interest, upstream: link, source: link, recorder: recorder))
            return
        }
        let hook = assembly.gapFillers[source.market].map { filler in
            ClusterGapFillHook(maxTopics: settings.gapFill?.maxTopics ?? 0, maxWindow: settings.gapFill?.maxWindow ?? .seconds(15 * 60)) { request, outlet in
                await filler.fill(request, into: outlet)
            }
        }
        // A cluster's tape is a JetStream stream per market, recorded by the leader, read by every node.
        let clusterTape = settings.tape.map { tape in
            var stream = ClusterTapeSettings()
            stream.replicas = tape.replicas
            stream.maxAge = .seconds(tape.retentionDays * 86_400)
            stream.maxBytes = tape.retentionBytes
            stream.flushInterval = tape.flushInterval
            stream.vendor = source.vendor.name
            stream.upstreamPath = source.upstreamPath
            return stream
        }
        let node = try ClusterNode(
            configuration: cluster, market: source.market.rawValue, hub: hub, localInterest: interest, metricsFactory: marketMetrics,
            logger: logger.with(label: "relay.cluster"), spread: spread, stampsPositions: settings.history != nil,
            gapFill: hook, tape: settings.history == nil ? nil : clusterTape,
            maxEventBytes: source.market == .news ? settings.news.maxBytes : ClusterChecks.maxEventBytes,
            check: eventCheck(source.market, wire: wire), makeUpstream: makeUpstream)
        assembly.clusterNodes.append(node)
        var parts = MarketParts(plan: source, hub: hub, interest: interest, upstream: nil, source: ClusterSource(node: node, upstream: source.description))
        parts.clusterArchive = node.archive
        if let recorder = node.recorder { parts.clusterTape = { recorder.report } }
        assembly.markets.append(parts)
    }

    // MARK: the portfolio and the server

    /// The valuation sidecar on the markets' hubs, with its holdings views and security details.
    func portfolioSidecar(hubs: MarketHubs, upstream: UpstreamSources, rest: RESTClientBox, metricsFactory: PrometheusMetricsFactory) throws -> Sidecar {
        guard let portfolioSettings = settings.portfolio else { return Sidecar() }
        let lock = try SidecarLock(directory: portfolioSettings.dataDirectory)
        guard let calendar = DayCalendar(timeZone: portfolioSettings.timeZone) else {
            throw RelaySettings.InvalidSetting(description: "time zone: unknown zone \(portfolioSettings.timeZone)")
        }
        let store = try PortfolioStore(
            directory: portfolioSettings.dataDirectory,
            limits: PortfolioLimits(
                accounts: portfolioSettings.maxAccounts, transactionsPerAccount: portfolioSettings.maxTransactionsPerAccount,
                updatesPerAccount: portfolioSettings.maxUpdatesPerAccount, symbols: portfolioSettings.maxSymbols))
        let client = upstream.restURL.map { url in
            var client = PolygonREST(resolvingBaseURL: url, apiKey: upstream.restKey, client: rest.shared())
            client.budget = upstream.restBudget
            client.reading = rest.reading
            return client
        }
        let service = PortfolioService(
            store: store, hubs: hubs, calendar: calendar, rule: PriceRule(staleAfter: portfolioSettings.staleAfterSeconds),
            pushInterval: .milliseconds(portfolioSettings.pushIntervalMilliseconds),
            referencePrices: client.map(ReferencePrices.init(rest:)), closeHistory: portfolioSettings.closeHistory,
            logger: logger.with(label: "relay.portfolio"))
        let browser = SecurityBrowser(
            service: service, loader: SecurityDetailLoader(store: store, hubs: hubs, rest: client, calendar: calendar),
            capacity: portfolioSettings.securityCacheSize, maxLoads: portfolioSettings.securityLoads,
            maxWait: .seconds(portfolioSettings.securityWaitSeconds), idleTimeout: .seconds(portfolioSettings.clientIdleSeconds),
            metrics: SecurityCacheMetrics(factory: metricsFactory), logger: logger.with(label: "relay.securities"))
        logger.info("portfolio sidecar on", metadata: ["database": "\(store.path)", "time_zone": "\(portfolioSettings.timeZone)"])
        return Sidecar(service: service, browser: browser, lock: lock, routes: PortfolioRoutes(service: service, browser: browser))
    }

    /// The Alpaca account of the configured upstreams' Alpaca markets (their key id, the upstream secret).
    func alpacaAccount(_ configured: [SourcePlan]) -> AlpacaAccount? {
        guard let source = configured.first(where: { $0.vendor == .alpaca }), !source.apiKey.isEmpty else { return nil }
        let url = settings.gateway?.alpacaURL ?? "https://data.alpaca.markets"
        return AlpacaAccount(url: { url }, key: source.apiKey, secret: settings.upstreamSecret ?? "")
    }

    /// The REST gateway for the account's REST API, when there is one and a Polygon market: its
    /// dialect, the budget gap fill and the portfolio share, the cache file, the served markets' values.
    func makeGateways(
        _ upstream: UpstreamSources, rest: RESTClientBox, markets: [MarketParts], metricsFactory: PrometheusMetricsFactory
    ) -> [RESTGateway] {
        guard let gatewaySettings = settings.gateway else { return [] }
        var cache: GatewayCache?
        if let path = gatewaySettings.cachePath {
            do {
                cache = try GatewayCache(path: path, maxBytes: gatewaySettings.cacheBytes)
            } catch {
                logger.warning("REST gateway: no cache (\(path) could not be opened: \(error)); every answer comes from the vendor")
            }
        }
        var gatewayConfiguration = RESTGateway.Settings()
        gatewayConfiguration.timeout = gatewaySettings.timeout
        gatewayConfiguration.referenceTTL = gatewaySettings.referenceTTL
        gatewayConfiguration.flightsPerKey = gatewaySettings.flightsPerKey
        // The bodies being read from the vendors, together (the fills' and the portfolio's too): the same
        // bound as the answers being sent.
        gatewayConfiguration.reading = rest.reading
        let values = ServedLiveValues(markets: markets.map(served))
        var gateways: [RESTGateway] = []
        // One gateway per vendor account, each with its dialect and budget; one cache for both.
        if let restURL = upstream.restURL, let budget = upstream.restBudget, markets.contains(where: { $0.plan.vendor == .polygon }) {
            gateways.append(
                RESTGateway(
                    dialect: PolygonGatewayDialect(referenceTTL: gatewaySettings.referenceTTL), upstreamBase: restURL,
                    credentials: RESTCredentials(key: upstream.restKey), budget: budget, cache: cache, values: values, settings: gatewayConfiguration,
                    client: rest.shared(), metricsFactory: metricsFactory, logger: logger.with(label: "relay.rest-gateway.polygon")))
        }
        if let alpaca = upstream.alpacaREST, let budget = upstream.alpacaBudget, markets.contains(where: { $0.plan.vendor == .alpaca }) {
            gateways.append(
                RESTGateway(
                    dialect: AlpacaGatewayDialect(referenceTTL: gatewaySettings.referenceTTL), upstreamBase: alpaca.url,
                    credentials: RESTCredentials(key: alpaca.key, secret: alpaca.secret), budget: budget, cache: cache, values: values,
                    settings: gatewayConfiguration, client: rest.shared(), metricsFactory: metricsFactory,
                    logger: logger.with(label: "relay.rest-gateway.alpaca")))
        }
        for gateway in gateways {
            logger.info(
                "REST gateway on", metadata: ["vendor": "\(gateway.dialect.name)", "budget": "\(gateway.budget.rate)", "cache": "\(cache?.path ?? "none")"])
        }
        return gateways
    }

    /// What the server serves of a market: its hub, its source's health, its recording, and room for a
    /// news item in each news client's unread bytes (twice the item: its JSON may be longer).
    private func served(_ parts: MarketParts) -> ServedMarket {
        var tape = parts.clusterTape
        if let recorder = parts.recorder { tape = { recorder.report } }
        let room = parts.plan.market == .news ? 2 * settings.news.maxBytes : 0
        return ServedMarket(market: parts.plan.market, hub: parts.hub, feed: parts.source, tape: tape, unreadRoom: room)
    }

    /// The downstream server: every market's routes, the portfolio's, metrics and the dashboard.
    func makeServer(
        authentication: ClientAuthentication, markets: [MarketParts], routes: PortfolioRoutes?, registry: PrometheusCollectorRegistry,
        gateways: [RESTGateway] = []
    ) -> RelayServer {
        var configuration = RelayServerConfiguration(host: settings.listen.host, port: settings.listen.port, authentication: authentication)
        configuration.gateways = gateways
        configuration.restPublicURL = settings.gateway?.publicURL
        if let gateway = settings.gateway {
            configuration.gatewayAnswerBytes = gateway.answersInFlightBytes
            configuration.gatewayPieceTimeout = .init(gateway.sendTimeout)
        }
        configuration.metricsPublic = settings.metricsPublic
        configuration.limits = settings.limits
        configuration.cappedTickers = settings.optionsContracts
        configuration.resume = settings.resume
        configuration.tls = settings.tls
        configuration.connectionLimits = settings.connectionLimits
        configuration.portfolio = routes != nil
        configuration.dashboardDirectory = ProcessInfo.processInfo.environment["RELAY_DASHBOARD_DIR"]
        return RelayServer(
            configuration: configuration,
            markets: markets.map(served), registry: registry,
            logger: logger.with(label: "relay.server"),
            extraRoutes: { router, keys in
                routes?.add(
                    to: router, connection: { $0.channel }, entitlement: { keys.entitlement(of: $0) }, spendREST: { await keys.spendREST(for: $0) })
            },
            pushStreams: routes.map { routes in
                [PushStream(path: "/v1/portfolio/stream", needsPortfolioRight: true) { await routes.valuationFrames(for: $0) }]
            } ?? [])
    }

    /// Runs the parts' group; once every part runs and the server listens, publishes them (``ready()``)
    /// and says where the relay listens.
    func run(
        _ group: ServiceGroup, server: RelayServer, primary: MarketParts, upstream: UpstreamSources, assembly: Assembly, sidecar: Sidecar,
        authentication: ClientAuthentication
    ) async throws {
        let settings = self.settings
        try await withThrowingTaskGroup(of: Void.self) { tasks in
            tasks.addTask { try await group.run() }
            let port = try await server.listeningPort()
            let demoPort = try await upstream.demoFeed?.listeningPort()
            var upstreams: [Market: UpstreamClient] = [:]
            for market in assembly.markets {
                if let link = market.upstream { upstreams[market.plan.market] = try await link.upstream() }
            }
            readiness.succeed(
                Components(
                    hub: primary.hub, upstream: upstreams[primary.plan.market], cluster: assembly.clusterNodes.first, server: server,
                    demoFeed: upstream.demoFeed, portfolio: sidecar.service, securities: sidecar.browser, port: port, demoFeedPort: demoPort,
                    markets: Dictionary(uniqueKeysWithValues: assembly.markets.map { ($0.plan.market, $0.hub) }), upstreams: upstreams,
                    gapFillers: assembly.gapFillers))
            let scheme = settings.tls == nil ? "ws" : "wss"
            var metadata: Logger.Metadata = [
                "ws": "\(scheme)://\(settings.listen.host):\(port)\(primary.plan.mainPath)",
                "upstream": "\(primary.plan.description)",
                "client_auth": authentication == .anyKeyOnLoopback ? "any key (loopback only)" : "client keys",
            ]
            if assembly.markets.count > 1 {
                metadata["markets"] = "\(assembly.markets.map(\.plan.mainPath).joined(separator: " "))"
            }
            if let cluster = settings.cluster { metadata["cluster"] = "\(cluster.name)/\(cluster.nodeID)" }
            // Where the portfolio's details, histories and reference prices come from.
            if settings.portfolio != nil {
                metadata["rest"] = "\((try? await upstream.restURL?()) ?? "none: prices from the stream only")"
            }
            logger.info("relay listening", metadata: metadata)
            try await tasks.waitForAll()
        }
    }
}
