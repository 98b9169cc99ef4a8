import AsyncSupport
import DemoFeed
import Foundation
import Logging
import MarketDataHub
import PolygonWire
import Portfolio
import Prometheus
import RelayServer
import ServiceLifecycle
import Upstream

/// The whole relay: the upstream client, the hub, the downstream server, and, with no upstream
/// configured, the demo feed in-process (reached through the same libwebsockets client over loopback).
///
/// `Sendable`; a `Service`. ``run()`` starts the parts, publishes them through ``ready()`` and runs
/// until graceful shutdown or cancellation; the CLI and the tests start it the same way. Shutdown goes
/// in reverse order of the data path: downstream clients are closed (1012), the hub pump stops, the
/// upstream connection is closed cleanly, and last the demo feed stops.
public final class Relay: Service, Sendable {
    /// The running parts, for tests and tools.
    public struct Components: Sendable {
        public let hub: MarketDataHub
        public let upstream: PolygonWebSocket
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
    }

    public let settings: RelaySettings
    private let readiness = ReadySignal<Components>()
    private let logger: Logger

    public init(settings: RelaySettings, logger: Logger = Logger(label: "relay")) {
        self.settings = settings
        self.logger = logger
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
            let authentication = try ClientAuthentication.resolve(keys: settings.clientKeys, listenHost: settings.listen.host)
            var services: [ServiceGroupConfiguration.ServiceConfiguration] = []
            let pipeline: Pipeline
            if let endpoint = settings.upstream {
                pipeline = Pipeline(relay: self, authentication: authentication, demoFeed: nil) {
                    (endpoint, self.settings.upstreamKey ?? "", self.settings.upstreamRESTURL ?? Self.restURL(for: endpoint))
                }
            } else {
                let apiKey = "demo-" + UUID().uuidString
                var feedConfiguration = DemoFeedConfiguration(port: 0, apiKey: apiKey, eventsPerSecond: settings.demoRate)
                feedConfiguration.restDelay = settings.demoRESTDelayMilliseconds.map { .milliseconds($0) }
                let feed = DemoFeed(configuration: feedConfiguration, logger: logger.with(label: "relay.demo-feed"))
                pipeline = Pipeline(relay: self, authentication: authentication, demoFeed: feed) {
                    let url = try await feed.url()
                    guard let endpoint = UpstreamConfiguration.Endpoint(url) else { throw UpstreamError.invalidURL(url) }
                    self.logger.info("no upstream configured: serving the built-in demo feed", metadata: ["feed": "\(url)"])
                    return (endpoint, apiKey, "http://127.0.0.1:\(try await feed.listeningPort())")
                }
                services.append(.init(service: feed))
            }
            services.append(.init(service: pipeline))
            // A group of its own, so parts stop in reverse order when the relay is asked to stop.
            try await ServiceGroup(configuration: .init(services: services, logger: logger)).run()
        } catch {
            readiness.fail(error)
            throw error
        }
        readiness.fail(CancellationError())
    }

    /// Upstream → hub → server, built once the upstream's address is known.
    private struct Pipeline: Service {
        let relay: Relay
        let authentication: ClientAuthentication
        let demoFeed: DemoFeed?
        /// The upstream's address, its key, and its REST base URL if any.
        let endpoint: @Sendable () async throws -> (UpstreamConfiguration.Endpoint, String, String?)

        func run() async throws {
            let settings = relay.settings
            let logger = relay.logger
            let (endpoint, apiKey, restURL) = try await self.endpoint()
            let registry = PrometheusCollectorRegistry()
            let metricsFactory = PrometheusMetricsFactory(registry: registry)
            var upstreamConfiguration = settings.upstreamTuning
            upstreamConfiguration.endpoint = endpoint
            upstreamConfiguration.apiKey = apiKey
            upstreamConfiguration.caFile = settings.upstreamCAFile
            upstreamConfiguration.metricsFactory = metricsFactory
            let upstream = PolygonWebSocket(configuration: upstreamConfiguration, logger: logger.with(label: "relay.upstream"))
            let hub = MarketDataHub(
                policy: settings.slowConsumerPolicy, snapshotOnSubscribe: settings.snapshotOnSubscribe,
                logger: logger.with(label: "relay.hub"), metricsFactory: metricsFactory
            ) { topics in
                upstream.setWantedTopics(topics)
            }
            var portfolio: PortfolioService?
            var browser: SecurityBrowser?
            if let portfolioSettings = settings.portfolio {
                guard let calendar = DayCalendar(timeZone: portfolioSettings.timeZone) else {
                    throw RelaySettings.InvalidSetting(description: "time zone: unknown zone \(portfolioSettings.timeZone)")
                }
                let store = try PortfolioStore(directory: portfolioSettings.dataDirectory)
                let rest = restURL.map { PolygonREST(baseURL: $0, apiKey: apiKey) }
                let service = PortfolioService(
                    store: store, hub: hub, calendar: calendar, rule: PriceRule(staleAfter: portfolioSettings.staleAfterSeconds),
                    pushInterval: .milliseconds(portfolioSettings.pushIntervalMilliseconds),
                    referencePrices: rest.map(ReferencePrices.init(rest:)),
                    logger: logger.with(label: "relay.portfolio"))
                portfolio = service
                browser = SecurityBrowser(
                    service: service, loader: SecurityDetailLoader(store: store, hub: hub, rest: rest, calendar: calendar),
                    capacity: portfolioSettings.securityCacheSize, idleTimeout: .seconds(portfolioSettings.clientIdleSeconds),
                    metrics: SecurityCacheMetrics(factory: metricsFactory), logger: logger.with(label: "relay.securities"))
                logger.info("portfolio sidecar on", metadata: ["database": "\(store.path)", "time_zone": "\(portfolioSettings.timeZone)"])
            }
            let routes = portfolio.map { PortfolioRoutes(service: $0, browser: browser) }
            let server = RelayServer(
                configuration: RelayServerConfiguration(
                    host: settings.listen.host, port: settings.listen.port,
                    market: endpoint.market, authentication: authentication),
                hub: hub, upstream: upstream, registry: registry, logger: logger.with(label: "relay.server"),
                extraRoutes: { router in routes?.add(to: router) { $0.channel } },
                extraWebSocketRoutes: { router in routes?.addWebSocket(to: router) })
            var services: [ServiceGroupConfiguration.ServiceConfiguration] = [
                .init(service: upstream), .init(service: HubPump(upstream: upstream, hub: hub)),
            ]
            if let portfolio { services.append(.init(service: portfolio)) }
            services.append(.init(service: server))
            let group = ServiceGroup(
                configuration: .init(
                    services: services,
                    logger: logger))
            try await withThrowingTaskGroup(of: Void.self) { tasks in
                tasks.addTask { try await group.run() }
                let port = try await server.listeningPort()
                let demoPort = try await demoFeed?.listeningPort()
                relay.readiness.succeed(
                    Components(
                        hub: hub, upstream: upstream, server: server, demoFeed: demoFeed, portfolio: portfolio, securities: browser,
                        port: port,
                        demoFeedPort: demoPort
                    ))
                logger.info(
                    "relay listening",
                    metadata: [
                        "ws": "ws://\(settings.listen.host):\(port)/\(endpoint.market)",
                        "upstream": "\(endpoint)",
                        "client_auth": authentication == .anyKeyOnLoopback ? "any key (loopback only)" : "client keys",
                    ])
                try await tasks.waitForAll()
            }
        }
    }

    /// Feeds every upstream event to the hub, in order, until the upstream stops or shutdown begins.
    private struct HubPump: Service {
        let upstream: PolygonWebSocket
        let hub: MarketDataHub

        func run() async throws {
            await cancelWhenGracefulShutdown {
                for await message in upstream.messages {
                    switch message {
                    case .events(let events): await hub.publish(events)
                    case .connectionLost(let reason): await hub.upstreamLost(reason: reason)
                    case .authenticated: break  // the first event after it ends an outage
                    }
                }
            }
        }
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
