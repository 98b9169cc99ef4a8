import AsyncSupport
import DemoFeed
import Foundation
import Logging
import MarketDataHub
import PolygonWire
import RelayServer
import ServiceLifecycle
import Upstream

/// The whole relay: the upstream client, the hub, the downstream server, and, with no upstream
/// configured, the demo feed in-process (reached through the same libwebsockets client over loopback).
///
/// `Sendable`; a `Service`. ``run()`` starts the parts, publishes them through ``ready()`` and runs
/// until graceful shutdown or cancellation; the CLI and the tests start it the same way.
public final class Relay: Service, Sendable {
    /// The running parts, for tests and tools.
    public struct Components: Sendable {
        public let hub: MarketDataHub
        public let upstream: PolygonWebSocket
        public let server: RelayServer
        public let demoFeed: DemoFeed?
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

    /// Waits until every part runs and the relay listens.
    public func ready() async throws -> Components { try await readiness.wait() }

    public func run() async throws {
        let authentication = try ClientAuthentication.resolve(keys: settings.clientKeys, listenHost: settings.listen.host)
        do {
            try await withThrowingTaskGroup(of: Void.self) { group in
                var endpoint = settings.upstream
                var apiKey = settings.upstreamKey ?? ""
                var demoFeed: DemoFeed?
                var demoPort: Int?
                if endpoint == nil {
                    apiKey = "demo-" + UUID().uuidString
                    let feed = DemoFeed(
                        configuration: DemoFeedConfiguration(port: 0, apiKey: apiKey, eventsPerSecond: settings.demoRate),
                        logger: logger.with(label: "relay.demo-feed"))
                    group.addTask { try await feed.run() }
                    let port = try await feed.listeningPort()
                    endpoint = UpstreamConfiguration.Endpoint("ws://127.0.0.1:\(port)/stocks")
                    demoFeed = feed
                    demoPort = port
                    logger.info(
                        "no upstream configured: serving the built-in demo feed", metadata: ["feed": "ws://127.0.0.1:\(port)/stocks"])
                }
                guard let endpoint else { throw UpstreamError.invalidURL("(none)") }

                let upstream = PolygonWebSocket(
                    configuration: UpstreamConfiguration(endpoint: endpoint, apiKey: apiKey, caFile: settings.upstreamCAFile),
                    logger: logger.with(label: "relay.upstream"))
                let hub = MarketDataHub(logger: logger.with(label: "relay.hub")) { topics in
                    upstream.setWantedTopics(topics)
                }
                let server = RelayServer(
                    configuration: RelayServerConfiguration(
                        host: settings.listen.host, port: settings.listen.port,
                        market: endpoint.market, authentication: authentication),
                    hub: hub, upstream: upstream, logger: logger.with(label: "relay.server"))

                group.addTask { try await upstream.run() }
                group.addTask {
                    for await events in upstream.events { await hub.publish(events) }
                }
                group.addTask { try await server.run() }

                let port = try await server.listeningPort()
                readiness.succeed(
                    Components(hub: hub, upstream: upstream, server: server, demoFeed: demoFeed, port: port, demoFeedPort: demoPort))
                logger.info(
                    "relay listening",
                    metadata: [
                        "ws": "ws://\(settings.listen.host):\(port)/\(endpoint.market)",
                        "upstream": "\(endpoint)",
                        "client_auth": authentication == .anyKeyOnLoopback ? "any key (loopback only)" : "client keys",
                    ])
                // On graceful shutdown every part winds down by itself; a part that ends otherwise takes
                // the relay down with it.
                try await group.next()
                if Task.isShuttingDownGracefully {
                    try await group.waitForAll()
                } else {
                    logger.error("a part of the relay stopped unexpectedly; stopping the relay")
                    upstream.shutdown()
                    group.cancelAll()
                }
            }
        } catch {
            readiness.fail(error)
            throw error
        }
        readiness.fail(CancellationError())
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
