import AsyncSupport
import Dashboard
import Foundation
import Hummingbird
import HummingbirdCore
import HummingbirdTLS
import NIOHTTP1
import Logging
import MarketDataHub
import Metrics
import NIOCore
import NIOWebSocket
import MarketCore
import Prometheus
import ServiceLifecycle
import Synchronization

/// The relay's downstream face: each served market's Polygon WebSocket endpoint at its own path
/// (`/stocks`, `/crypto`, …) and the HTTP routes on the same port (`/healthz`, `/healthz/{market}`,
/// `/v1/last/{market}/{topic}`, `/v1/last/{topic}` for the first market).
///
/// `Sendable`; a `Service` whose ``run()`` serves until graceful shutdown or cancellation.
public final class RelayServer: Service, Sendable {
    public let configuration: RelayServerConfiguration
    /// The served markets, in the order configured (the first answers the routes that name none).
    let markets: [MarketRoute]
    /// What every connection of each market shares (in ``markets``' order).
    private let connectionDependencies: [MarketConnection.Dependencies]
    private let port = ReadySignal<Int>()
    private let sessions = SessionRegistry()
    private let logger: Logger
    private let registry: PrometheusCollectorRegistry
    private let metrics: DownstreamMetrics
    private let keyConnections: KeyConnections
    /// Push streams open, in all and per key (``RelayServerConfiguration/ConnectionLimits/pushStreams``).
    private let pushCount: PushStreamCount
    /// Refusals outsiders may cause as often as they like, logged a line per reason per 10 s.
    private let refusals: ThrottledLog
    private let extraRoutes: @Sendable (RouterGroup<RelayRequestContext>, RequestKeys) -> Void
    private let pushStreams: [PushStream]
    private let addresses: AddressGuard
    private let drains: LoopDrains
    /// Each loop's ping deadlines, and its sign-in deadlines: one queue and one armed task per loop,
    /// not a scheduled task per connection.
    private let pings = PerLoop { LoopDeadlineQueue<WebSocketConnectionHandler>(loop: $0, delay: RelayServer.pingInterval) { $0.pingOrDrop() } }
    private let signIns: PerLoop<LoopDeadlineQueue<MarketConnection>>
    /// Each loop's limit on connections with hub changes under way.
    private let hubSlots = PerLoop { _ in HubChangeSlots<MarketConnection>(limit: RelayServer.hubChangesPerLoop) }
    private let statusBoard: StatusBoard
    /// `/healthz`'s answer under way, shared by the requests that come meanwhile.
    private let healthAnswers = SharedAnswer<(HTTPResponse.Status, ByteBuffer)>()
    /// `/v1/status`'s (each request then names its own viewer).
    private let statusAnswers = SharedAnswer<StatusBoard.Status>()
    /// `/healthz/{market}`'s, per market served (at most one each).
    private let marketHealthAnswers: [Market: SharedAnswer<(HTTPResponse.Status, ByteBuffer)>]
    /// When the gauges read from the hubs (the fullest buffer: a look at every subscriber's) were last
    /// recorded: at most once a second, so requests in a burst cost one look.
    private let gaugesRead = Mutex<ContinuousClock.Instant?>(nil)
    let keyQuotas = KeyQuotas()
    /// The bytes of REST gateway answers being sent, bounded (`rest.answersInFlightMB`).
    let answersInFlight: AnswersInFlight
    let dashboard: Dashboard

    /// - Parameters:
    ///   - registry: the Prometheus registry `/metrics` serves; the hub and upstream should record into
    ///     it too.
    ///   - extraRoutes: more HTTP routes (the portfolio's), added behind the client-key check with the
    ///     portfolio right, told what each request's key may do.
    ///   - pushStreams: server-push WebSocket routes (the portfolio's live valuation).
    package init(
        configuration: RelayServerConfiguration, markets served: [ServedMarket],
        registry: PrometheusCollectorRegistry = PrometheusCollectorRegistry(), logger: Logger = Logger(label: "relay.server"),
        extraRoutes: @escaping @Sendable (RouterGroup<RelayRequestContext>, RequestKeys) -> Void = { _, _ in },
        pushStreams: [PushStream] = []
    ) {
        self.extraRoutes = extraRoutes
        self.pushStreams = pushStreams
        self.configuration = configuration
        self.logger = logger
        self.registry = registry
        var factory = PrometheusMetricsFactory(registry: registry)
        // Delivery latency is usually well under the default buckets' first bound (5 ms).
        factory.durationHistogramBuckets["relay_delivery_latency_seconds"] = [
            .microseconds(250), .microseconds(500), .milliseconds(1), .milliseconds(2), .milliseconds(3), .milliseconds(5),
            .milliseconds(10), .milliseconds(25), .milliseconds(50), .milliseconds(100), .milliseconds(250), .seconds(1),
        ]
        self.metrics = DownstreamMetrics(factory: factory)
        self.answersInFlight = AnswersInFlight(limit: configuration.gatewayAnswerBytes, factory: factory)
        self.drains = LoopDrains(metrics: metrics)
        self.signIns = MarketConnection.signInDeadlines(configuration.authTimeout)
        self.keyConnections = KeyConnections(factory: PrometheusMetricsFactory(registry: registry))
        self.pushCount = PushStreamCount(limits: configuration.connectionLimits)
        self.addresses = AddressGuard(limits: configuration.connectionLimits)
        let markets = served.map { MarketRoute($0, configuration: configuration, factory: factory) }
        self.markets = markets
        marketHealthAnswers = Dictionary(markets.map { ($0.market, SharedAnswer()) }, uniquingKeysWith: { first, _ in first })
        let refusals = ThrottledLog()
        self.refusals = refusals
        self.connectionDependencies = markets.map { [metrics, keyConnections] route in
            MarketConnection.Dependencies(
                hub: route.hub, shelf: route.shelf, configuration: configuration, limits: route.limits, metrics: metrics, delivery: route.delivery,
                keyConnections: keyConnections, logger: logger, refusals: refusals,
                shelfReserve: { [ledger = route.ledger] topics, key in _ = ledger.reserve(topics, for: key, checked: false) },
                shelfRelease: { [ledger = route.ledger] topics, key in ledger.release(topics, for: key) })
        }
        self.statusBoard = StatusBoard(markets: markets, sessions: sessions, tally: metrics.tally, gateways: configuration.gateways)
        self.dashboard = Dashboard(directory: configuration.dashboardDirectory)
    }

    /// The port the server listens on, once it does.
    public func listeningPort() async throws -> Int { try await port.wait() }

    /// The close code downstream clients get when the relay stops: "service restart", so Polygon's
    /// official clients reconnect (1000 and 1001 would stop them for good).
    public static let shutdownCloseCode = WebSocketErrorCode(codeNumber: 1012)

    public func run() async throws {
        let application: any ApplicationProtocol
        do {
            application = try makeApplication()
        } catch {
            port.fail(error)
            throw error
        }
        // The application runs in a group of its own, detached so that our graceful shutdown does not
        // reach it directly: first every client is closed with 1012, then the application is stopped.
        let applicationGroup = ServiceGroup(
            configuration: .init(services: [.init(service: application)], logger: logger))
        let running = Task.detached { try await applicationGroup.run() }
        let statusBoard = self.statusBoard
        let sampling = Task { await statusBoard.run() }
        defer { sampling.cancel() }
        let sessions = self.sessions
        let logger = self.logger
        do {
            try await withTaskCancellationHandler {
                try await withGracefulShutdownHandler {
                    try await running.value
                } onGracefulShutdown: {
                    Task {
                        let count = sessions.count
                        await sessions.closeAll(code: Self.shutdownCloseCode, reason: "service restart", timeout: .seconds(3))
                        logger.info("closed downstream clients for shutdown", metadata: ["clients": "\(count)", "code": "1012"])
                        await applicationGroup.triggerGracefulShutdown()
                    }
                }
            } onCancel: {
                running.cancel()
            }
        } catch {
            port.fail(error)
            throw error
        }
        port.fail(CancellationError())
    }

    /// A market connection's session, in the protocol its market speaks. `transferring`: the topics of
    /// the session its connection took back and has not subscribed again (``TopicLedger``).
    private func session(
        for route: MarketRoute, contentType: String?, transferring: TransferableTopics = TransferableTopics()
    ) -> any DownstreamSession {
        let authentication = configuration.authentication
        return route.served.wire.downstreamSession(
            DownstreamContext(
                market: route.market, limits: route.limits, budget: route.ledger.budget { transferring.topics }, contentType: contentType,
                grants: { authentication.grant(for: $0) }))
    }

    /// What a connection past a limit is told (in its protocol's words: Polygon's `max_connections`,
    /// Alpaca's 406; then close 1008).
    static func refusal(_ refusal: AddressGuard.Refusal) -> ConnectionRefusal {
        switch refusal {
        case .total(let limit): ConnectionRefusal(message: "Maximum number of websocket connections exceeded (\(limit) in all).", reason: "connections")
        case .perAddress(let limit):
            ConnectionRefusal(message: "Maximum number of websocket connections exceeded (\(limit) per address).", reason: "connections-per-address")
        }
    }

    /// Why the server cannot start with its TLS files.
    public struct TLSSetupError: Error, Sendable, CustomStringConvertible {
        public var description: String
    }

    /// How long a client has to answer our close frame before the connection is closed anyway.
    static let closeTimeout = TimeAmount.seconds(3)
    /// A client that does not answer a ping within this long is dropped (and idle clients are pinged).
    static let pingInterval = TimeAmount.seconds(30)
    /// Connections of one loop with hub changes under way at once (``HubChangeSlots``).
    static let hubChangesPerLoop = 256

    /// The WebSocket side of the port: which upgrades are accepted, and the handlers that then run them.
    private func webSocketRoutes() -> RelayChildChannel.Routes {
        let paths = Dictionary(
            markets.enumerated().flatMap { index, route in route.served.paths.map { ($0, index) } }, uniquingKeysWith: { first, _ in first })
        let served = markets.flatMap(\.served.paths).joined(separator: ", ")
        let pushStreams = self.pushStreams
        let authentication = configuration.authentication
        let sessions = self.sessions
        return RelayChildChannel.Routes(
            addresses: addresses, headTimeout: TimeAmount(configuration.connectionLimits.headTimeout),
            keepAliveTimeout: TimeAmount(configuration.connectionLimits.keepAliveTimeout), logger: logger,
            decide: { [addresses] head, channel in
                // Stopping: a client closed with 1012 that comes straight back would be served by this
                // relay for a moment and closed again (its session shelved here, after what the stop
                // saves for the next start). Refused, it tries again and finds the next start.
                if sessions.isClosing { return .refuse(.init(status: .serviceUnavailable, message: "the relay is stopping; connect again in a moment")) }
                // Loopback without keys: not for pages of other sites (``LoopbackOrigin``).
                if !authentication.requiresKeys,
                    let problem = LoopbackOrigin.problem(
                        host: head.headers.first(name: "host"), origin: head.headers.first(name: "origin"),
                        fetchSite: head.headers.first(name: "sec-fetch-site"))
                {
                    return .refuse(.init(status: .forbidden, message: problem))
                }
                let path = head.uri.split(separator: "?", maxSplits: 1, omittingEmptySubsequences: false).first.map(String.init) ?? head.uri
                if let index = paths[path] { return .accept(.market(index, contentType: head.headers.first(name: "content-type"))) }
                guard let index = pushStreams.firstIndex(where: { $0.path == path }) else {
                    if let market = Market(rawValue: String(path.dropFirst())) {
                        return .refuse(.init(status: .notFound, message: "the \(market) market is not configured on this relay (it serves \(served))"))
                    }
                    return .refuse(.init(status: .notFound, message: "no WebSocket at \(path) (the market feeds are at \(served))"))
                }
                // The push streams take the client key the way the HTTP routes do.
                var admitted: ClientKey?
                if authentication.requiresKeys {
                    let address = channel.remoteAddress?.ipAddress ?? "unknown"
                    if addresses.isGuessing(address) { return .refuse(.guessing) }
                    let presented = ClientKeyMiddleware.key(
                        authorization: head.headers.first(name: "authorization"), uri: URI(head.uri))
                    guard let presented, let key = authentication.identify(presented) else {
                        // A wrong key (not none) is a guess: counted and delayed where it is answered.
                        return .refuse(
                            .init(
                                status: .unauthorized, message: "a client key is required: send Authorization: Bearer KEY or ?apiKey=KEY",
                                wrongKeyOf: presented == nil ? nil : address))
                    }
                    if pushStreams[index].needsPortfolioRight, key.portfolio < .read {
                        let message = "key \"\(key.name)\" may not read the portfolio (its right: \(key.portfolio.rawValue))"
                        return .refuse(.init(status: .forbidden, message: message))
                    }
                    admitted = key
                }
                return .accept(.push(index, admitted))
            },
            install: { [self] accepted, channel, ticket in try self.install(accepted, on: channel, ticket: ticket) },
            maxFrameSize: configuration.maxClientMessageBytes)
    }

    /// Puts a new WebSocket connection's handlers into its pipeline (on its loop, right after the upgrade).
    private func install(_ accepted: RelayChildChannel.Accepted, on channel: any Channel, ticket: AddressGuard.Ticket?) throws {
        let limits = configuration.connectionLimits
        // A push stream's client has nothing to say (its key came with the upgrade): what it sends is
        // read and let go within the bound of a client not signed in yet, never 1 MB a message.
        let messageLimit = ClientMessageLimit(
            initial: limits.preAuthMessageBytes, full: accepted.isMarket ? configuration.maxClientMessageBytes : limits.preAuthMessageBytes)
        let (gate, socketBytes) = try WireGate.install(in: channel, limit: messageLimit, tls: configuration.tls != nil)
        var outboundLimit = limits.outboundBytes
        if case .market(let index, _) = accepted { outboundLimit += markets[index].served.unreadRoom }
        let handler = WebSocketConnectionHandler(
            pings: pings.on(channel.eventLoop).value, closeTimeout: Self.closeTimeout, messageLimit: messageLimit, outboundLimit: outboundLimit,
            // The session's message rate and burst, and room for control frames (pings, pongs, close).
            pace: .init(perSecond: configuration.limits.messagesPerSecond + 10, burst: configuration.limits.messageBurst + 100))
        handler.socketCounter = socketBytes
        let close: @Sendable (WebSocketErrorCode, String) -> Void
        let address = channel.remoteAddress?.ipAddress ?? "unknown"
        let addresses = self.addresses
        // Market and push WebSockets both count against the connection limits; a push stream also
        // against its key's maxConnections (a market connection's is checked when it authenticates).
        let keyConnections = self.keyConnections
        var grant: ClientGrant?
        // A push stream is counted in the push streams' own bounds too, under its key (none without keys).
        var isPush = false
        let pushCount = self.pushCount
        if case .push(let index, let key) = accepted, pushStreams.indices.contains(index) { (grant, isPush) = (key?.grant, true) }
        var admission = Admission()
        let refused =
            admission.take(addresses.admit(address).map(Self.refusal)) { addresses.release(address) }
            ?? grant.flatMap { grant in admission.take(keyConnections.admit(grant)) { keyConnections.release(grant) } }
            ?? (isPush ? admission.take(pushCount.admit(key: grant?.name)) { [grant] in pushCount.release(key: grant?.name) } : nil)
        if let refused {
            let refusal = refused.message
            refusals.log(.info, refused.reason, "downstream connection refused: \(refusal)", metadata: ["address": "\(address)"], to: logger)
            // A market client in its market's own protocol (its session's connected frame, then the
            // limit: Polygon's max_connections status, Alpaca's 406); a push stream gets the status alone.
            var frames = (connected: ByteBuffer?.none, refusal: RelayStatus.frame(status: "max_connections", message: refusal), binary: false)
            if case .market(let index, let contentType) = accepted, markets.indices.contains(index) {
                let session = session(for: markets[index], contentType: contentType)
                frames = (session.connectedFrame, session.connectionLimitFrame(refusal), session.framing.isBinary)
            }
            handler.attach(
                WebSocketConversation(
                    opened: { [unowned handler] in
                        if let connected = frames.connected { handler.write(connected, binary: frames.binary, flush: false) }
                        handler.refuse(frames.refusal, binary: frames.binary, reason: "connection limit")
                    },
                    received: { _ in }, closed: {}))
            try channel.pipeline.syncOperations.addHandler(handler)
            return
        }
        switch accepted {
        case .market(let index, let contentType):
            let route = markets[index]
            let transferring = TransferableTopics()
            let session = session(for: route, contentType: contentType, transferring: transferring)
            // What the connection itself tells the client goes in its protocol's words.
            let framing = session.framing
            handler.errorFrame = { error in (framing.errorFrame(error), framing.isBinary) }
            let connection = MarketConnection(
                handler: NIOLoopBound(handler, eventLoop: channel.eventLoop), loop: channel.eventLoop, session: session,
                dependencies: connectionDependencies[index], drain: drains.drain(for: channel.eventLoop),
                signIn: signIns.on(channel.eventLoop), hubSlots: hubSlots.on(channel.eventLoop),
                hooks: .init(addresses: addresses, address: address, ticket: ticket), transferring: transferring)
            handler.attach(connection.conversation())
            close = { code, reason in connection.close(code: code, reason: reason) }
        case .push(let index, let key):
            if let ticket { addresses.settle(ticket) }
            let connection = PushConnection(
                handler: NIOLoopBound(handler, eventLoop: channel.eventLoop), loop: channel.eventLoop, stream: pushStreams[index],
                entitlement: key?.entitlement ?? .everything)
            handler.attach(connection.conversation())
            close = { code, reason in connection.close(code: code, reason: reason) }
        }
        let sessions = self.sessions
        let metrics = self.metrics
        let id = sessions.register(.init(close: close, closed: channel.closeFuture))
        metrics.connections.record(sessions.count)
        channel.closeFuture.whenComplete { [admission] _ in
            sessions.unregister(id)
            metrics.connections.record(sessions.count)
            admission.release()
        }
        // Whole frames of events skip the frame encoder (through the gate in front of it, so TLS still applies).
        handler.attach(gate)
        try channel.pipeline.syncOperations.addHandler(handler)
    }

    /// `/v1/status`: the relay's state as the key asking may see it.
    private func statusAnswer(_ request: Request) async throws -> Response {
        let authentication = configuration.authentication
        let key = ClientKeyMiddleware.key(in: request).flatMap(authentication.identify)
        // Without keys everyone has every right.
        let right = authentication.requiresKeys ? key?.portfolio ?? .none : .write
        let viewer = StatusBoard.Status.Viewer(keysRequired: authentication.requiresKeys, key: key?.name, portfolio: right.rawValue)
        // Read of every hub (up to nine reads each) once for the requests that come meanwhile; each is
        // told who it is.
        var status = try await statusAnswers.value { [self] in await statusBoard.status(portfolio: configuration.portfolio, viewer: viewer) }
        status.viewer = viewer
        return try Self.json(status, status: .ok)
    }

    private func makeApplication() throws -> any ApplicationProtocol {
        // Every route but /healthz (and /metrics when public) needs a client key: one middleware, not
        // a check per route. The market WebSocket authenticates in the Polygon conversation instead.
        let router = Router(context: RelayRequestContext.self)
        router.get("/healthz") { _, _ in try await self.health() }
        router.get("/healthz/{market}") { _, context in try await self.health(of: context.parameters.get("market") ?? "") }
        addDashboard(to: router)
        let authentication = configuration.authentication
        let keyed = router.group().add(middleware: ClientKeyMiddleware(authentication: authentication, failures: addresses))
        // Requests are answered on their connection's event loop (`LoopTaskExecutor`); the routes that
        // may take long (the metrics' text, the status, the portfolio's recomputing) run on the global
        // executor instead, not holding up that loop's market clients.
        (configuration.metricsPublic ? router.group() : keyed).get("/metrics") { _, _ in
            await withTaskExecutorPreference(globalConcurrentExecutor) { await self.prometheusText() }
        }
        keyed.get("/v1/status") { request, _ in
            try await withTaskExecutorPreference(globalConcurrentExecutor) { try await self.statusAnswer(request) }
        }
        keyed.get("/v1/last/**") { request, context in
            // Polygon's `/v1/last/crypto/{from}/{to}` is the REST gateway's; the rest are the relay's own.
            let rest = context.parameters.getCatchAll()
            if rest.count == 3, rest[0] == "crypto", !rest[1].contains("."), self.gateway(for: request.uri.path) != nil {
                return await self.gatewayAnswer(request, context: context)
            }
            // The key's topics hold here as on the WebSocket.
            let key = ClientKeyMiddleware.key(in: request).flatMap(authentication.identify)
            return try await self.lastEvent(
                context.parameters.getCatchAll().joined(separator: "/"), entitlement: key?.entitlement ?? .everything,
                accept: request.headers[.accept])
        }
        addGateways(to: keyed)
        // The portfolio's routes (the extra ones) also need the key's portfolio right: read, or write to change.
        extraRoutes(
            router.group().add(middleware: ClientKeyMiddleware(authentication: authentication, portfolio: true, failures: addresses))
                .add(middleware: OffTheLoopMiddleware<RelayRequestContext>()),
            RequestKeys(authentication: authentication, quotas: keyQuotas))

        let port = self.port
        let routes = webSocketRoutes()
        var server = HTTPServerBuilder { responder in RelayChildChannel(responder: responder, routes: routes) }
        if let tls = configuration.tls {
            // wss:// and https:// on the one port.
            do {
                let tlsConfiguration = TLSConfiguration.makeServerConfiguration(
                    certificateChain: try NIOSSLCertificate.fromPEMFile(tls.certificatePath).map { .certificate($0) },
                    privateKey: .privateKey(try NIOSSLPrivateKey(file: tls.privateKeyPath, format: .pem)))
                server = try .tls(server, tlsConfiguration: tlsConfiguration)
            } catch {
                throw TLSSetupError(
                    description: "TLS: could not use certificate \(tls.certificatePath) and key \(tls.privateKeyPath): \(error)")
            }
        }
        return Application(
            router: router,
            server: server,
            // A deep accept queue: after a restart every client reconnects at once.
            configuration: .init(address: .hostname(configuration.host, port: configuration.port), serverName: "relay", backlog: 4096),
            onServerRunning: { channel in port.succeed(channel.localAddress?.port ?? 0) },
            eventLoopGroupProvider: configuration.eventLoopGroup.map { .shared($0) } ?? .singleton,
            logger: logger
        )
    }

    // MARK: HTTP

    private func prometheusText() async -> Response {
        let due = gaugesRead.withLock { last in
            let now = ContinuousClock.now
            guard last.map({ now - $0 >= .seconds(1) }) ?? true else { return false }
            last = now
            return true
        }
        if due {
            for route in markets {
                route.maxBufferFill.record(await route.hub.bufferStatistics.maxFill)
                if let age = await route.feed.report().lastUpstreamMessageAge {
                    route.upstreamLastMessageAge.record(age.seconds)
                }
            }
        }
        return Response(
            status: .ok, headers: [.contentType: "text/plain; version=0.0.4; charset=utf-8"],
            body: .init(byteBuffer: ByteBuffer(bytes: registry.emitToBuffer())))
    }

    /// One market's part of `/healthz`.
    struct MarketHealth: Encodable {
        var status: String
        var market: String
        /// Whose protocol the market speaks: `polygon` or `alpaca`.
        var vendor: String
        /// Where its WebSocket is served.
        var paths: [String]
        var upstream: UpstreamReport
        var cluster: ClusterReport?
        var subscribers: Int
        /// Its recording on the tape (absent when it is not recorded). A paused recording does not make
        /// the market degraded: delivery does not depend on it.
        var tape: TapeReport?
    }

    /// `/healthz`: the first market's fields at the top (as a one-market relay always answered), every
    /// market under `markets`; 200 only when every market's feed is healthy.
    struct Health: Encodable {
        /// The first market's fields, at the top level; `status` is every market's.
        var first: MarketHealth
        var markets: [String: MarketHealth]

        private enum Keys: String, CodingKey { case markets }

        func encode(to encoder: any Encoder) throws {
            try first.encode(to: encoder)
            var container = encoder.container(keyedBy: Keys.self)
            try container.encode(markets, forKey: .markets)
        }
    }

    private func marketHealth(_ route: MarketRoute) async -> (healthy: Bool, MarketHealth) {
        let report = await route.feed.report()
        return (
            report.healthy,
            MarketHealth(
                status: report.healthy ? "ok" : "degraded", market: route.market.rawValue, vendor: route.served.vendor, paths: route.served.paths,
                upstream: report.upstream, cluster: report.cluster,
                subscribers: await route.hub.subscriberCount, tape: route.served.tape?())
        )
    }

    /// `/healthz` needs no key: requests that come while one is answered share its answer, so many at
    /// once cost one pass over the markets and one encoding (``SharedAnswer``).
    private func health() async throws -> Response {
        let (status, body) = try await healthAnswers.value { [self] in try await self.healthBody() }
        return Self.json(bytes: body, status: status)
    }

    private func healthBody() async throws -> (HTTPResponse.Status, ByteBuffer) {
        var all: [String: MarketHealth] = [:]
        var healthy = true
        var first: MarketHealth?
        for route in markets {
            let (ok, health) = await marketHealth(route)
            healthy = healthy && ok
            all[route.market.rawValue] = health
            if first == nil { first = health }
        }
        guard let first else { return (.serviceUnavailable, try Self.jsonBytes(["error": "no market is served"])) }
        var top = first
        top.status = healthy ? "ok" : "degraded"
        return (healthy ? .ok : .serviceUnavailable, try Self.jsonBytes(Health(first: top, markets: all)))
    }

    /// `/healthz/{market}`: one market, for per-market probes.
    private func health(of name: String) async throws -> Response {
        guard let route = route(named: name), let answers = marketHealthAnswers[route.market] else {
            return try Self.json(
                ["error": "the market \(name) is not served here (served: \(markets.map(\.market.rawValue).joined(separator: ", ")))"],
                status: .notFound)
        }
        let (status, body) = try await answers.value { [self] in
            let (healthy, body) = await marketHealth(route)
            return (healthy ? .ok : .serviceUnavailable, try Self.jsonBytes(body))
        }
        return Self.json(bytes: body, status: status)
    }

    private func route(named name: String) -> MarketRoute? {
        guard let market = Market(rawValue: name.lowercased()) else { return nil }
        return markets.first { $0.market == market }
    }

    /// `/v1/last/{market}/{topic}`, or `/v1/last/{topic}` on the first market. An Alpaca market's topics
    /// are Alpaca's (`t.AAPL`, `q.BTC/USD`) and its events come as Alpaca's JSON, or as their MessagePack
    /// bytes when `accept` asks for `application/msgpack`.
    private func lastEvent(_ path: String, entitlement: Entitlement, accept: String?) async throws -> Response {
        let decoded = path.removingPercentEncoding ?? path
        var text = Substring(decoded)
        var route = markets.first
        if let slash = text.firstIndex(of: "/"), let market = Market(rawValue: text[..<slash].lowercased()) {
            guard let named = markets.first(where: { $0.market == market }) else {
                return try Self.json(["error": "the \(market) market is not served here"], status: .notFound)
            }
            route = named
            text = text[text.index(after: slash)...]
        }
        guard let route else { return try Self.json(["error": "no market is served"], status: .notFound) }
        guard let parsed = Topic(parsing: text), !parsed.isWildcard else {
            return try Self.json(
                ["error": "not a topic: \(text) (expected EVENT.TICKER, e.g. \(route.served.wire.exampleTopic(of: route.market)))"], status: .badRequest)
        }
        let topic: Topic
        switch route.served.wire.lastValueTopic(parsed, market: route.market) {
        case .success(let normalized): topic = normalized
        case .failure(let problem): return try Self.json(["error": problem.reason], status: .badRequest)
        }
        guard entitlement.allows(market: route.market) else {
            return try Self.json(["error": "not authorized: this key may not use the \(route.market) market"], status: .forbidden)
        }
        let inForm = route.served.wire.entitlement(entitlement, inFormOf: route.market)
        guard inForm.allows(topic, in: route.market) else {
            return try Self.json(["error": "not authorized: this key may not read \(topic)"], status: .forbidden)
        }
        // A bar of one trade is the trade: a derived topic needs the right to its trades too (as on the feed).
        let rules = route.served.wire.barRules(of: route.market)
        guard inForm.allowsTrades(behind: topic, rules: rules, in: route.market) else {
            let source = rules?.sourceTopic(of: topic).map(\.description) ?? "its trades"
            return try Self.json(["error": "not authorized: \(topic) is made of \(source), which this key may not read"], status: .forbidden)
        }
        // This node's hub first; a cluster node asks the cluster's last values for a topic nobody here wants.
        var last = await route.hub.lastEvent(for: topic)
        if last == nil {
            switch await route.feed.lastValue(for: topic) {
            case .found(let event): last = event
            case .none: break
            case .busy:
                var busy = try Self.json(["error": "too many lookups of the cluster's last values at once; retry shortly"], status: .serviceUnavailable)
                busy.headers[.retryAfter] = "1"
                return busy
            }
        }
        guard let event = last else {
            return try Self.json(["error": "no event for \(topic) yet"], status: .notFound)
        }
        guard let answer = route.served.wire.httpAnswer(event, accept: accept) else {
            return try Self.json(["error": "the last event of \(topic) could not be read"], status: .internalServerError)
        }
        var headers: HTTPFields = [.contentType: answer.contentType]
        if answer.negotiated { headers[.vary] = "Accept" }
        return Response(status: .ok, headers: headers, body: .init(byteBuffer: answer.body))
    }

    static func json(_ value: some Encodable, status: HTTPResponse.Status) throws -> Response {
        json(bytes: try jsonBytes(value), status: status)
    }

    /// A JSON answer of bytes already encoded.
    static func json(bytes: ByteBuffer, status: HTTPResponse.Status) -> Response {
        Response(status: status, headers: [.contentType: "application/json"], body: .init(byteBuffer: bytes))
    }

    /// `value` as the relay's JSON answers are: sorted keys, ISO 8601 dates.
    static func jsonBytes(_ value: some Encodable) throws -> ByteBuffer {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys]
        encoder.dateEncodingStrategy = .iso8601
        return ByteBuffer(bytes: try encoder.encode(value))
    }
}
