import AlpacaWire
import AsyncSupport
import Hummingbird
import HummingbirdCore
import HummingbirdTLS
import HummingbirdWebSocket
import Logging
import NIOCore
import NIOWebSocket
import PolygonWire
import ServiceLifecycle
import Synchronization

#if canImport(Glibc)
    import Glibc
#endif

/// A synthetic, Polygon-compatible market on a WebSocket: the relay's default upstream, and the real
/// server the upstream client is tested against.
///
/// It speaks the server side of the Polygon protocol (``ServerSession``), generates a random-walk
/// market (``DemoMarket``) at a configured rate, and sends every connection the events of the topics
/// it subscribed to, wildcards included, in frames of up to `maxEventsPerFrame` events.
///
/// `Sendable`; a `Service`: ``run()`` serves until graceful shutdown or cancellation.
public final class DemoFeed: Service, Sendable {
    public let configuration: DemoFeedConfiguration
    /// What clients did, for tests and diagnostics.
    public let monitor = DemoFeedMonitor()
    private let port = ReadySignal<Int>()
    let connections = Mutex<[Int: FeedConnection]>([:])
    private let nextConnection = Mutex(1)
    /// The last news item's id (``publishNews(symbols:headline:contentBytes:)``).
    let nextNewsID = Mutex<Int64>(0)
    /// The last story published, for ``publishLastNewsAgain()``.
    let lastNews = Mutex<(bytes: ByteBuffer, symbols: [String])?>(nil)
    private let tally = Mutex<Tally?>(nil)
    /// Markets whose new connections are reset until then (`drop?seconds=N`).
    private let refusals = Mutex<[Market: ContinuousClock.Instant]>([:])
    /// What the REST endpoints answer.
    let restState = Mutex(RestState())
    /// REST requests per endpoint and ticker, and what became of them.
    let restCounts = Mutex(RestTally())
    /// The current minute's REST requests (``DemoFeedConfiguration/restPerMinute``): its start, its count.
    let restWindow = Mutex<(start: Int64, count: Int)>((0, 0))
    /// What each market generated, for the REST history endpoints.
    let tapes: [Market: DemoTape]
    private let logger: Logger

    struct FeedConnection: Sendable {
        let market: Market
        /// Alpaca's protocol in this codec; `nil`: Polygon's.
        let alpaca: AlpacaCodec?
        var topics: Set<Topic> = []
        /// Order books it subscribed to and has not been sent whole yet (Alpaca symbols).
        var booksOwed: Set<String> = []
        let outputs: AsyncStream<FeedOutput>.Continuation

        func wants(_ event: MarketEvent) -> Bool {
            topics.covers(event.topic)
        }
    }

    public init(configuration: DemoFeedConfiguration = DemoFeedConfiguration(), logger: Logger = Logger(label: "relay.demo-feed")) {
        self.configuration = configuration
        self.logger = logger
        tapes = configuration.keepsTape
            ? Dictionary(uniqueKeysWithValues: configuration.servedMarkets.map { ($0, DemoTape(market: $0)) }) : [:]
    }

    /// The port the feed listens on, once it does.
    public func listeningPort() async throws -> Int { try await port.wait() }

    /// The URL a client connects to, once the feed listens.
    /// The first market's WebSocket URL.
    public func url() async throws -> String {
        try await url(for: configuration.servedMarkets.first ?? .stocks)
    }

    /// A market's WebSocket URL.
    public func url(for market: Market) async throws -> String {
        "\(configuration.tls == nil ? "ws" : "wss")://\(configuration.host):\(try await listeningPort())\(Self.paths(of: market, alpaca: configuration.alpaca)[0])"
    }

    /// Where a market is served: `/<market>` in Polygon's protocol; Alpaca's paths in Alpaca's.
    static func paths(of market: Market, alpaca: Bool) -> [String] {
        guard alpaca else { return ["/\(market)"] }
        return AlpacaFeed.allCases.filter { $0.market == market }.flatMap(\.paths)
    }

    /// How long a graceful shutdown waits for the server's open connections (a client's kept-alive HTTP
    /// connection, a WebSocket not closed yet) before it cuts them.
    static let shutdownGrace: Duration = .seconds(5)

    /// What ended in the feed's task group.
    private enum Ended { case server, generator, grace }

    public func run() async throws {
        do {
            let app = try makeApplication()
            // Unstructured, so that a cut need not wait for it: a connection that never sent a request
            // holds Hummingbird's server past any cancellation (it waits on a future for the first
            // one), and a client's pool parks such connections (up to 10 minutes).
            let server = Task { try await app.run() }
            try await withThrowingTaskGroup(of: Ended.self) { group in
                group.addTask {
                    try await Self.endOrLeave(server)
                    return .server
                }
                let markets = configuration.servedMarkets
                for market in markets where market == .news {
                    let seed = configuration.seed ?? UInt64.random(in: 0...UInt64.max)
                    group.addTask {
                        await cancelWhenGracefulShutdown { await self.generateNews(seed: seed) }
                        return .generator
                    }
                }
                for market in markets where market != .news {
                    // One market alone trades at the configured rate; beside stocks, the others at a quarter.
                    let share = markets.filter({ $0 != .news }).count == 1 || market == .stocks || configuration.evenRates ? 1.0 : 0.25
                    group.addTask {
                        await cancelWhenGracefulShutdown { await self.generate(market, rateShare: share) }
                        return .generator
                    }
                }
                _ = try await group.next()
                guard Task.isShuttingDownGracefully else {
                    group.cancelAll()
                    return
                }
                // The server stops taking connections and waits for its open ones, but not for ever: a
                // client that keeps one open would hold the feed (and whoever waits for it) indefinitely.
                group.addTask {
                    try? await Task.sleep(for: Self.shutdownGrace)
                    return .grace
                }
                while let ended = try await group.next() {
                    if ended == .grace {
                        logger.warning("the feed's connections did not close within \(Self.shutdownGrace): cut")
                        group.cancelAll()
                    } else if ended == .server {
                        // Done: the rest (the grace's timer) is cancelled and awaited as the group ends.
                        group.cancelAll()
                        break
                    }
                }
            }
        } catch {
            port.fail(error)
            throw error
        }
        port.fail(CancellationError())
    }

    /// Waits for `server` to end; cancelled, it cancels `server` and waits no more (what is left of it
    /// ends when its last connection closes).
    private static func endOrLeave(_ server: Task<Void, any Error>) async throws {
        let (ended, continuation) = AsyncStream.makeStream(of: Result<Void, any Error>.self)
        Task {
            continuation.yield(await server.result)
            continuation.finish()
        }
        try await withTaskCancellationHandler {
            // A stream's iteration ends at once when its task is cancelled.
            for await result in ended { try result.get() }
        } onCancel: {
            server.cancel()
        }
    }

    private func makeApplication() throws -> some ApplicationProtocol {
        let webSocketRouter = Router(context: FeedRequestContext.self)
        let alpaca = configuration.alpaca
        for market in configuration.servedMarkets {
            for path in Self.paths(of: market, alpaca: alpaca) {
                webSocketRouter.ws(RouterPath(path)) { inbound, outbound, context in
                    let codec = alpaca ? AlpacaCodec(contentType: context.request.headers[.contentType]) : nil
                    try await self.serve(inbound: inbound, outbound: outbound, channel: context.requestContext.channel, market: market, alpaca: codec)
                }
            }
        }
        let router = Router()
        router.get("/healthz") { _, _ in "ok" }
        addREST(to: router)
        addAlpacaREST(to: router)
        addNews(to: router)
        router.post("/faults/:name") { request, context -> String in
            // With a key set (the relay's built-in feed always has one, made at random), only its holder
            // may break the feed.
            guard self.presentsKey(request) else { throw HTTPError(.unauthorized, message: "the feed's API key is required") }
            let name = context.parameters.get("name") ?? ""
            guard let fault = DemoFeedFault(rawValue: name) else {
                throw HTTPError(
                    .notFound, message: "unknown fault \(name); one of \(DemoFeedFault.allCases.map(\.rawValue).joined(separator: ", "))")
            }
            // `?market=crypto`: only that market's connections. `drop?seconds=N`: and refuse new ones for N s.
            let market = request.uri.queryParameters.get("market").flatMap { Market(rawValue: $0) }
            // (At most a day: any number may come, and one past Int64 would trap.)
            let refusal = request.uri.queryParameters.get("seconds").flatMap { Double($0) }.flatMap { $0.isFinite ? $0 : nil }
                .map { Duration.milliseconds(Int64(min(max($0, 0), 86_400) * 1000)) }
            let count = self.inject(fault, market: market, refusingFor: fault == .drop ? refusal : nil)
            return "{\"fault\":\"\(fault.rawValue)\",\"connections\":\(count)}\n"
        }
        let port = self.port
        let ping: AutoPingSetup = configuration.pingInterval.map { .enabled(timePeriod: $0) } ?? .disabled
        var server = HTTPServerBuilder.http1WebSocketUpgrade(
            webSocketRouter: webSocketRouter, configuration: .init(ws: .init(maxFrameSize: 1 << 20, autoPing: ping)))
        if let tls = configuration.tls {
            let tlsConfiguration = TLSConfiguration.makeServerConfiguration(
                certificateChain: try NIOSSLCertificate.fromPEMFile(tls.certificatePath).map { .certificate($0) },
                privateKey: .privateKey(try NIOSSLPrivateKey(file: tls.privateKeyPath, format: .pem)))
            server = try .tls(server, tlsConfiguration: tlsConfiguration)
        }
        return Application(
            router: router,
            server: server,
            configuration: .init(address: .hostname(configuration.host, port: configuration.port), serverName: "relay-demo-feed"),
            onServerRunning: { channel in port.succeed(channel.localAddress?.port ?? 0) },
            logger: logger
        )
    }

    // MARK: one client

    private func serve(
        inbound: WebSocketInboundStream, outbound: WebSocketOutboundWriter, channel: any Channel, market: Market, alpaca: AlpacaCodec?
    ) async throws {
        if let until = refusals.withLock({ $0[market] }), ContinuousClock.now < until {
            try? await (channel as? any SocketOptionProvider)?.setSoLinger(linger(l_onoff: 1, l_linger: 0)).get()
            try? await channel.close()
            return
        }
        let id = nextConnection.withLock { value in
            defer { value += 1 }
            return value
        }
        let (outputs, continuation) = AsyncStream.makeStream(of: FeedOutput.self, bufferingPolicy: .bufferingOldest(10_000))
        connections.withLock { $0[id] = FeedConnection(market: market, alpaca: alpaca, outputs: continuation) }
        monitor.update { snapshot in
            snapshot.openConnections += 1
            snapshot.maxOpenConnections = max(snapshot.maxOpenConnections, snapshot.openConnections)
            snapshot.totalConnections += 1
        }
        defer {
            continuation.finish()
            connections.withLock { _ = $0.removeValue(forKey: id) }
            monitor.update { $0.openConnections -= 1 }
        }

        if let delay = configuration.handshakeDelay {
            // Hold back `connected`, but not past shutdown or the client giving up.
            let end = ContinuousClock.now + delay
            try await cancelWhenGracefulShutdown {
                while channel.isActive, ContinuousClock.now < end {
                    try await Task.sleep(for: min(.milliseconds(50), end - .now))
                }
            }
        }
        if let alpaca {
            try await send(ByteBuffer(bytes: alpaca.frame([AlpacaControl.connected])), to: outbound, binary: alpaca == .messagePack)
        } else {
            try await send(StatusMessage.connected.frame, to: outbound)
        }
        // Reader and writer are tasks of their own so the `silence` fault can stop the reader (and with
        // it the pongs, which are answered while inbound is read) without ending the connection.
        let reader = Task {
            if let alpaca {
                try await self.readAlpaca(inbound: inbound, outbound: outbound, connection: id, market: market, codec: alpaca)
            } else {
                try await self.read(inbound: inbound, outbound: outbound, connection: id, market: market)
            }
        }
        let writer = Task { try await self.write(outputs, to: outbound, channel: channel, reader: reader, alpaca: alpaca) }
        await withTaskCancellationHandler {
            _ = try? await reader.value
            if reader.isCancelled {
                // Silenced: hang on until the client gives up on us.
                _ = try? await channel.closeFuture.get()
            }
        } onCancel: {
            reader.cancel()
            writer.cancel()
        }
        writer.cancel()
    }

    private func read(inbound: WebSocketInboundStream, outbound: WebSocketOutboundWriter, connection id: Int, market: Market) async throws {
        let expectedKey = configuration.apiKey
        var session = ServerSession { key in
            guard let expectedKey else { return !key.isEmpty }
            return key == expectedKey
        }
        for try await message in inbound.messages(maxSize: 1 << 20) {
            let buffer: ByteBuffer
            switch message {
            case .text(let text): buffer = ByteBuffer(string: text)
            case .binary(let data): buffer = data
            }
            let wasAuthenticated = session.isAuthenticated
            let reaction = session.receive(buffer)
            if let action = try? ClientAction.decode(buffer) {
                monitor.update { snapshot in
                    snapshot.record(.init(connection: id, kind: action.kind, params: action.params, market: market))
                    if !wasAuthenticated && session.isAuthenticated { snapshot.authenticatedConnections += 1 }
                }
            }
            for frame in reaction.frames { try await send(frame, to: outbound) }
            if reaction.close {
                try await outbound.close(.policyViolation, reason: "authentication failed")
                return
            }
            // In the market's topic form, as its events are routed (`XT.BTC-USD` is `XT.X:BTC-USD`).
            let topics = Set(session.topics.map(market.normalized))
            connections.withLock { $0[id]?.topics = topics }
        }
    }

    private func write(
        _ outputs: AsyncStream<FeedOutput>, to outbound: WebSocketOutboundWriter, channel: any Channel, reader: Task<Void, any Error>,
        alpaca: AlpacaCodec?
    ) async throws {
        var silenced = false
        for await output in outputs {
            switch output {
            case .frame(let frame):
                if !silenced { try await send(frame, to: outbound, binary: alpaca == .messagePack) }
            case .fault(.maxConnections) where alpaca != nil:
                let codec = alpaca ?? .json
                try await send(
                    ByteBuffer(bytes: codec.frame([AlpacaError.connectionLimitExceeded.message])), to: outbound, binary: codec == .messagePack)
                try await outbound.close(.policyViolation, reason: "connection limit exceeded")
                return
            case .fault(.relogin):
                let repeats = 1_000
                if let codec = alpaca {
                    let controls = Array(repeating: [AlpacaControl.connected, AlpacaControl.authenticated], count: repeats).flatMap { $0 }
                    try await send(ByteBuffer(bytes: codec.frame(controls)), to: outbound, binary: codec == .messagePack)
                } else {
                    let pair = StatusMessage.connected.json + "," + StatusMessage.authSuccess.json
                    try await send(ByteBuffer(string: "[" + Array(repeating: pair, count: repeats).joined(separator: ",") + "]"), to: outbound)
                }
            case .fault(.authFlip):
                // 500 pairs in one frame, then 500 frames of one pair each.
                for count in [500] + Array(repeating: 1, count: 500) {
                    if let codec = alpaca {
                        let controls = Array(repeating: [AlpacaControl.authenticated, AlpacaError.authFailed.message], count: count).flatMap { $0 }
                        try await send(ByteBuffer(bytes: codec.frame(controls)), to: outbound, binary: codec == .messagePack)
                    } else {
                        let refused = StatusMessage(status: StatusMessage.Kind.authFailed, message: "authentication failed").json
                        let pair = StatusMessage.authSuccess.json + "," + refused
                        try await send(ByteBuffer(string: "[" + Array(repeating: pair, count: count).joined(separator: ",") + "]"), to: outbound)
                    }
                }
            case .fault(.silence):
                silenced = true
                reader.cancel()
                // Nothing more is read off the socket either: what the client sends waits in the
                // kernel's buffers, and then in the client.
                try? await channel.setOption(ChannelOptions.autoRead, value: false).get()
            case .fault(.mute):
                silenced = true
            case .fault(.drop):
                // SO_LINGER 0: close sends a TCP reset.
                try? await (channel as? any SocketOptionProvider)?.setSoLinger(linger(l_onoff: 1, l_linger: 0)).get()
                try? await channel.close()
                return
            case .fault(.maxConnections):
                try await send(
                    StatusMessage(
                        status: StatusMessage.Kind.maxConnections,
                        message: "Maximum number of websocket connections exceeded. You have reached the connection limit for your account."
                    ).frame, to: outbound)
                try await outbound.close(.policyViolation, reason: "max connections")
                return
            case .fault(let fault):
                if let frame = fault.frame { try await outbound.write(.custom(WebSocketFrame(fin: true, opcode: .text, data: frame))) }
            }
        }
    }

    /// Inflicts a fault on every connection open now; returns how many there were. With `refusingFor`,
    /// connections that arrive meanwhile are reset at once (an outage of that length): the market goes
    /// on generating, and its REST history keeps what nobody received.
    @discardableResult
    public func inject(_ fault: DemoFeedFault, market: Market? = nil, refusingFor refusal: Duration? = nil) -> Int {
        if let refusal {
            let until = ContinuousClock.now + refusal
            refusals.withLock { refusals in
                for served in configuration.servedMarkets where market == nil || served == market { refusals[served] = until }
            }
        }
        let open = connections.withLock { Array($0.values.filter { market == nil || $0.market == market }) }
        for connection in open { connection.outputs.yield(.fault(fault)) }
        logger.info("fault injected", metadata: ["fault": "\(fault.rawValue)", "connections": "\(open.count)"])
        return open.count
    }

    private func send(_ frame: ByteBuffer, to outbound: WebSocketOutboundWriter, binary: Bool = false) async throws {
        if binary {
            try await outbound.write(.custom(WebSocketFrame(fin: true, opcode: .binary, data: frame)))
            return
        }
        guard let fragmentSize = configuration.fragmentSize, fragmentSize > 0, frame.readableBytes > fragmentSize else {
            try await outbound.write(.custom(WebSocketFrame(fin: true, opcode: .text, data: frame)))
            return
        }
        var remaining = frame
        try await outbound.withTextMessageWriter { writer in
            while remaining.readableBytes > 0, let piece = remaining.readSlice(length: min(fragmentSize, remaining.readableBytes)) {
                try await writer(piece)
            }
        }
    }

    // MARK: the market

    /// What the feed generated while a tally ran: events per ticker, and the first and last send stamps
    /// (Unix ns) of the ticks counted.
    public struct Tally: Sendable {
        public var eventsByTicker: [String: Int] = [:]
        public var firstStamp: Int64?
        public var lastStamp: Int64?
    }

    /// Starts counting generated quotes and trades per ticker (benchmarks).
    public func startTally() { tally.withLock { $0 = Tally() } }

    /// Stops counting and returns the tally.
    public func stopTally() -> Tally {
        tally.withLock { current in
            defer { current = nil }
            return current ?? Tally()
        }
    }

    private func generate(_ kind: Market, rateShare: Double) async {
        let seed = (configuration.seed ?? UInt64.random(in: 0...UInt64.max)) &+ UInt64(Market.allCases.firstIndex(of: kind) ?? 0)
        var market =
            (configuration.universes[kind] ?? configuration.universe).map { DemoMarket(tickers: $0, seed: seed, market: kind) }
            ?? DemoMarket(market: kind, generatedTickers: configuration.generatedTickers, seed: seed)
        let opened = WallClock.nowMilliseconds()
        restState.withLock { state in
            // The market opens at these prices: yesterday's close, and the last trade until one happens.
            state.previousClose.merge(market.allCents) { _, new in new }
            state.last.merge(market.allCents.mapValues { ($0, opened) }) { _, new in new }
        }
        let tape = tapes[kind]
        tape?.setTickers(market.tickers)
        // Alpaca's events are made from the records of what was generated.
        market.recording = tape != nil || configuration.alpaca
        market.recordsCryptoQuotes = configuration.alpaca
        let clock = ContinuousClock()
        let tick = configuration.tickInterval
        let perTick = max(configuration.eventsPerSecond * rateShare, 1) * tick.seconds
        var owed = 0.0
        var nextTick = clock.now
        // Bars cover whole intervals of the wall clock (whole minutes by default), as Polygon's do.
        let barLength = max(configuration.aggregateInterval.milliseconds, 1)
        var barStart = opened / barLength * barLength
        let makesBars = configuration.universe == nil && configuration.universes[kind] == nil
        // Alpaca's crypto order books, for the first pairs.
        let bookTickers = kind == .crypto && configuration.alpaca ? Array(market.tickers.prefix(Self.bookPairs)) : []
        func bookPrices() -> [String: Int64] {
            Dictionary(bookTickers.compactMap { ticker in market.cents(of: ticker).map { (AlpacaSymbol.of(ticker, market: kind), $0) } }) { first, _ in first }
        }
        var books = bookTickers.isEmpty ? nil : DemoBooks(prices: bookPrices(), seed: seed)
        while !Task.isCancelled {
            nextTick = nextTick.advanced(by: tick)
            do {
                try await clock.sleep(until: nextTick)
            } catch {
                return
            }
            let now = WallClock.nowMilliseconds()
            let stamp = configuration.stampNanoseconds ? WallClock.nowNanoseconds() : nil
            owed += perTick
            var events: [MarketEvent] = []
            events.reserveCapacity(Int(owed) + 1)
            if makesBars, now >= barStart + barLength {
                // The interval that ended, sent at the first tick after it.
                events += market.aggregates(start: barStart, end: barStart + barLength)
                barStart = now / barLength * barLength
            }
            while owed >= 1 {
                events.append(market.nextEvent(timestamp: now, stamp: stamp))
                owed -= 1
            }
            restState.withLock { state in
                for event in events where DemoMarket.setsLastPrice(event.eventType) {
                    if let cents = market.cents(of: event.ticker) { state.last[event.ticker] = (cents, now) }
                }
            }
            tally.withLock { tally in
                guard tally != nil, !events.isEmpty else { return }
                for event in events { tally?.eventsByTicker[event.ticker, default: 0] += 1 }
                if tally?.firstStamp == nil { tally?.firstStamp = stamp }
                tally?.lastStamp = stamp
            }
            if market.recording {
                let (records, bars) = market.takeRecords()
                tape?.append(records, bars: bars, now: now)
                if configuration.alpaca { events = Self.alpacaEvents(records, bars, tickers: market.tickers, market: kind, stamp: stamp) }
            }
            if var current = books {
                events += current.tick(prices: bookPrices(), nanoseconds: now * 1_000_000)
                books = current
            }
            // A machine that fell behind catches up from now rather than bursting.
            if clock.now - nextTick > tick * 10 { nextTick = clock.now }
            broadcast(events, market: kind, books: books)
        }
    }

    /// How many of the crypto pairs have order books (Alpaca's protocol).
    static let bookPairs = 16

    private func broadcast(_ events: [MarketEvent], market: Market, books: DemoBooks? = nil) {
        // Taken with the topics, in one look: a book subscribed to is sent whole before any change to it.
        let targets = connections.withLock { connections in
            var targets: [FeedConnection] = []
            for (id, connection) in connections where connection.market == market {
                targets.append(connection)
                if !connection.booksOwed.isEmpty { connections[id]?.booksOwed = [] }
            }
            return targets
        }
        guard !events.isEmpty || targets.contains(where: { !$0.booksOwed.isEmpty }) else { return }
        var frames = 0
        var sent = 0
        for connection in targets where !connection.topics.isEmpty {
            var wanted = events.filter(connection.wants)
            if !connection.booksOwed.isEmpty, let books {
                // The whole book holds this tick's change to it already.
                let owed = connection.booksOwed.contains("*") ? Set(books.symbols) : connection.booksOwed
                wanted.removeAll { $0.eventType == "o" && owed.contains($0.ticker) }
                wanted.insert(contentsOf: owed.sorted().compactMap { books.reset($0) }, at: 0)
            }
            guard !wanted.isEmpty else { continue }
            if let codec = connection.alpaca {
                for payload in AlpacaDelivery.payloads(wanted, codec: codec) {
                    connection.outputs.yield(.frame(payload))
                    frames += 1
                }
                sent += wanted.count
                continue
            }
            var start = 0
            while start < wanted.count {
                let end = min(start + max(configuration.maxEventsPerFrame, 1), wanted.count)
                for frame in FrameEncoder.frames(for: Array(wanted[start..<end])) {
                    connection.outputs.yield(.frame(frame))
                    frames += 1
                }
                start = end
            }
            sent += wanted.count
        }
        if frames > 0 { monitor.countSent(frames: frames, events: sent) }
    }

}
