import AlpacaWire
import AsyncHTTPClient
import AsyncSupport
import Cluster
import DemoFeed
import GapFill
import Foundation
import Logging
import MarketCore
import MarketDataHub
import NIOPosix
import PolygonWire
import Portfolio
import PortfolioData
import PortfolioDomain
import PolygonRESTClient
import MarketREST
import PortfolioHTTP
import RelayConfiguration
import RESTGateway
import Prometheus
import RelayServer
import Tape
import TapeReplay
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
    let readiness = ReadySignal<Components>()
    private let signals: [UnixSignal]
    let logger: Logger

    /// - Parameter gracefulShutdownSignals: signals that start a graceful shutdown (the CLI passes
    ///   SIGTERM and SIGINT; tests trigger shutdown through their own group).
    public init(settings: RelaySettings, gracefulShutdownSignals: [UnixSignal] = [], logger: Logger = Logger(label: "relay")) {
        var settings = settings
        // Settings built by hand (tests) speak every vendor too.
        if settings.vendors.isEmpty { settings.vendors = Self.vendors }
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
    struct SourcePlan: Sendable {
        var market: Market
        var apiKey: String
        var endpoint: @Sendable () async throws -> UpstreamConfiguration.Endpoint
        var caFile: String?
        var description: String
        /// Whose protocol the upstream speaks, and so the protocol served downstream.
        var vendor: WireVendor
        /// That protocol, for this market.
        var wire: any WireProtocol
        /// The upstream URL's path, when known (recorded on the tape with the vendor).
        var upstreamPath: String?
        /// A recorded day replayed instead of the upstream.
        var replay: ReplayPlan?

        /// The main path its WebSocket is served at.
        var mainPath: String { wire.servedPaths(of: market).first ?? "/\(market)" }
    }

    /// The vendors the relay speaks: the one place that names them. The first is the default protocol
    /// (an upstream no vendor recognises, the demo feed). A new protocol is a module with its
    /// ``WireProtocol`` conformance and its ``WireVendor``, and a line here (docs/protocols.md).
    public static let vendors: [WireVendor] = [
        .polygon,
        .alpaca,
    ]

    /// One market's running parts.
    struct MarketParts: Sendable {
        var plan: SourcePlan
        var hub: MarketDataHub
        var interest: LocalInterest
        /// A single relay's upstream source (`nil` on a cluster node).
        var upstream: UpstreamSource?
        /// Where its events come from.
        var source: any MarketSource
        /// Its tape recorder, while the tape is on (a single relay's).
        var recorder: TapeRecorder?
        /// A cluster node's: the cluster's tape of the market (a JetStream stream), and what this node
        /// recorded there.
        var clusterArchive: TapeArchive?
        var clusterTape: (@Sendable () -> TapeReport)?
    }

    /// The configured upstreams, one per market; `nil`: none configured (the demo feed serves every market).
    func configuredSources() -> [SourcePlan]? {
        guard !settings.upstreams.isEmpty else { return nil }
        return settings.upstreams.map { upstream in
            let endpoint = upstream.endpoint
            let vendor = settings.vendor(of: upstream) ?? Self.vendors[0]
            return SourcePlan(
                market: upstream.market, apiKey: upstream.apiKey ?? settings.upstreamKey ?? "", endpoint: { endpoint },
                caFile: upstream.caFile ?? settings.upstreamCAFile, description: endpoint.description, vendor: vendor,
                wire: vendor.wireProtocol(market: upstream.market, path: endpoint.path), upstreamPath: endpoint.path)
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
        var upstream = try upstreamSources()
        if let gateway = settings.gateway {
            // A cluster's nodes share each account's one budget through NATS.
            func budget(_ rate: RESTRate, account: String) -> any AccountBudget {
                guard let cluster = settings.cluster else { return RESTBudget(rate: rate, maxWaiting: gateway.queue, maxWait: gateway.maxWait) }
                return SharedRESTBudget(
                    rate: rate, maxWaiting: gateway.queue, maxWait: gateway.maxWait, cluster: cluster, account: account,
                    logger: logger.with(label: "relay.rest-budget"))
            }
            if upstream.restURL != nil { upstream.restBudget = budget(gateway.budget, account: "polygon") }
            if upstream.alpacaREST != nil { upstream.alpacaBudget = budget(gateway.alpacaBudget, account: "alpaca") }
        }
        let rest = RESTClientBox(
            reading: ReadingBytes(limit: (settings.gateway ?? GatewaySettings()).answersInFlightBytes, factory: metricsFactory))
        let assembly = try assembleMarkets(upstream, rest: rest, metricsFactory: metricsFactory)
        for market in assembly.markets { await goOnFromTape(market) }
        guard let primary = assembly.markets.first else {
            throw RelaySettings.InvalidSetting(description: "upstream: no market configured")
        }
        let hubs = MarketHubs(Dictionary(uniqueKeysWithValues: assembly.markets.map { ($0.plan.market, $0.hub) }))
        let sidecar = try portfolioSidecar(hubs: hubs, upstream: upstream, rest: rest, metricsFactory: metricsFactory)
        // Held until the relay stops: one valuation sidecar per portfolio directory.
        defer { withExtendedLifetime(sidecar.lock) {} }
        // A single relay's hubs hand their outages to their fillers; a cluster node's ask the leader.
        if settings.cluster == nil {
            for parts in assembly.markets {
                guard let filler = assembly.gapFillers[parts.plan.market], let link = parts.upstream else { continue }
                await filler.start(into: InboxOutlet { try? await link.upstream().inbox })
            }
        }
        let gateways = makeGateways(upstream, rest: rest, markets: assembly.markets, metricsFactory: metricsFactory)
        let server = makeServer(
            authentication: authentication, markets: assembly.markets, routes: sidecar.routes, registry: registry, gateways: gateways)
        for market in assembly.markets { await restoreSessions(market, into: server) }
        let checkpoint = Task { await checkpointSessions(of: server, markets: assembly.markets) }
        // Start order; they stop in reverse.
        var parts: [(String, any Service)] = []
        if let demoFeed = upstream.demoFeed { parts.append(("demo feed", demoFeed)) }
        for market in assembly.markets where market.upstream != nil {
            parts.append(("\(market.plan.market) upstream", market.source))
        }
        if let portfolio = sidecar.service { parts.append(("portfolio", portfolio)) }
        parts.append(("server", server))
        for market in assembly.markets where market.upstream == nil { parts.append(("\(market.plan.market) cluster node", market.source)) }
        parts.append(("memory trim", MemoryTrim()))
        let group = ServiceGroup(
            configuration: .init(
                services: parts.map { name, service in
                    .init(service: BoundedShutdown(name: name, service: service, deadline: Self.partShutdownDeadline, logger: logger))
                },
                gracefulShutdownSignals: signals, logger: logger))
        // The gap fills and the REST client stop with the relay, whichever way it stops.
        do {
            try await run(group, server: server, primary: primary, upstream: upstream, assembly: assembly, sidecar: sidecar, authentication: authentication)
        } catch {
            for filler in assembly.gapFillers.values { await filler.stop() }
            try? await rest.client?.shutdown()
            for budget in [upstream.restBudget, upstream.alpacaBudget] { await (budget as? SharedRESTBudget)?.close() }
            await saveSessions(of: server, markets: assembly.markets, checkpoint: checkpoint)
            await stopRecording(assembly.markets)
            throw error
        }
        for filler in assembly.gapFillers.values { await filler.stop() }
        try? await rest.client?.shutdown()
        for budget in [upstream.restBudget, upstream.alpacaBudget] { await (budget as? SharedRESTBudget)?.close() }
        await saveSessions(of: server, markets: assembly.markets, checkpoint: checkpoint)
        await stopRecording(assembly.markets)
    }

    /// What each tape holds in memory goes to disk, then its stop (the upstream has stopped: nothing
    /// more comes), so the next start goes on in the same epoch. The recorders wait for the disk: on
    /// threads made for blocking, not the cooperative pool.
    private func stopRecording(_ markets: [MarketParts]) async {
        for market in markets {
            guard let recorder = market.recorder else { continue }
            await BlockingWork.run { recorder.stop() }
        }
    }

    /// Where a recorded market's broken tagged sessions wait for the next start: beside its tape.
    private func sessionsFile(_ market: MarketParts) -> String? {
        guard market.recorder != nil, settings.history != nil, let tape = settings.tape else { return nil }
        return "\(tape.directory)/\(market.plan.market.rawValue)/sessions.json"
    }

    /// What was last written of each market's sessions file, and what last failed to be (told once).
    private struct SessionFiles {
        var written: [Market: Data] = [:]
        var failed: [Market: Data] = [:]
    }

    /// Writes each recorded market's tagged sessions beside its tape when they differ from what was
    /// written last (a market with none and no file is left alone); a checkpoint that fails is told once
    /// per change, the final save tries again. `saved`: the stop's final save (told in the log). The
    /// encoding and the writes run on threads made for blocking (the disk may be slow), not the
    /// cooperative pool.
    private func writeSessions(
        _ sessions: [Market: [SavedSession]], of markets: [MarketParts], saved: Bool, files: SessionFiles
    ) async -> SessionFiles {
        await BlockingWork.run {
            var files = files
            self.writeSessionFiles(sessions, of: markets, saved: saved, files: &files)
            return files
        }
    }

    private func writeSessionFiles(_ sessions: [Market: [SavedSession]], of markets: [MarketParts], saved: Bool, files: inout SessionFiles) {
        for market in markets {
            let name = market.plan.market
            let list = sessions[name] ?? []
            guard let path = sessionsFile(market), let data = try? JSONEncoder().encode(list), saved || data != files.failed[name] else { continue }
            guard data != files.written[name] else {
                if saved, !list.isEmpty { logger.info("\(name): \(list.count) tagged sessions saved for the next start") }
                continue
            }
            // Written even when empty, once there is a file: the sessions it held were all let go since.
            guard !list.isEmpty || FileManager.default.fileExists(atPath: path) else { continue }
            do {
                let url = URL(fileURLWithPath: path)
                try FileManager.default.createDirectory(at: url.deletingLastPathComponent(), withIntermediateDirectories: true)
                try data.write(to: url, options: .atomic)
                files.written[name] = data
                if saved { logger.info("\(name): \(list.count) tagged sessions saved for the next start") }
            } catch {
                files.failed[name] = data
                logger.warning("\(name): tagged sessions not \(saved ? "saved" : "checkpointed"): \(error)")
            }
        }
    }

    /// Every second while the relay runs, each recorded market's tagged sessions (kept and open, where
    /// each stands) go beside its tape when they changed: a start after a crash takes them back from
    /// there. Returns what it wrote, once cancelled (the stop saves them once more, settled).
    private func checkpointSessions(of server: RelayServer, markets: [MarketParts]) async -> SessionFiles {
        var files = SessionFiles()
        while !Task.isCancelled {
            try? await Task.sleep(for: .seconds(1))
            guard !Task.isCancelled else { break }
            files = await writeSessions(server.checkpointSessions(), of: markets, saved: false, files: files)
        }
        return files
    }

    /// Stops the checkpoint, then saves each recorded market's tagged sessions, settled (the stop
    /// closed their connections with 1012: their clients come back to the next start, which goes on in
    /// the same epoch).
    private func saveSessions(of server: RelayServer, markets: [MarketParts], checkpoint: Task<SessionFiles, Never>) async {
        checkpoint.cancel()
        let files = await checkpoint.value
        _ = await writeSessions(await server.savedSessions(), of: markets, saved: true, files: files)
    }

    /// Shelves the tagged sessions the last run saved, before any client connects (those it cannot are
    /// told `gap` when their clients come back). (The file stays: this run's checkpoint replaces it
    /// within a second, with these sessions in it while they are kept.)
    private func restoreSessions(_ market: MarketParts, into server: RelayServer) async {
        guard let path = sessionsFile(market), let data = await BlockingWork.run({ FileManager.default.contents(atPath: path) }) else { return }
        // Bounded like the shelf itself: a larger file is not the relay's.
        guard data.count <= 64 << 20, let sessions = try? JSONDecoder().decode([SavedSession].self, from: data) else {
            logger.warning("\(market.plan.market): the saved tagged sessions could not be read; none restored")
            return
        }
        let restored = await server.restore(sessions, market: market.plan.market)
        logger.info("\(market.plan.market): \(restored) of \(sessions.count) saved tagged sessions restored")
    }

    /// A recorded market whose tape ends with a clean stop (or whose crashed run reserved its positions)
    /// goes on from that run (its epoch, positions
    /// and recent history, ``MarketDataHub/goOn(from:)``) before anything is received, and the time it
    /// was down goes on the tape as a gap. Otherwise it begins a new epoch, and the log says why.
    ///
    /// Its tape is also the hub's archive: a resume from a position older than the memory holds is
    /// read from it.
    private func goOnFromTape(_ market: MarketParts) async {
        if let archive = market.clusterArchive { await market.hub.setArchive(archive) }
        guard let recorder = market.recorder, let limits = settings.history, let tape = settings.tape else { return }
        let name = market.plan.market.rawValue
        let check = eventCheck(market.plan.market, wire: market.hub.wire)
        await market.hub.setArchive(TapeArchive(directory: tape.directory, market: name, check: check))
        do {
            // Reading the tape back blocks on the disk: on threads made for that, not the cooperative pool.
            let (directory, maxAge, maxBytes) = (tape.directory, limits.maxAge, limits.memoryBytes)
            let tail = try await BlockingWork.run { () throws(TapeTail.NotResumable) in
                try TapeTail.read(directory: directory, market: name, maxAge: maxAge, maxBytes: maxBytes, check: check)
            }
            let events = await market.hub.goOn(from: tail)
            recorder.note(.gap(from: tail.stoppedAt &* 1_000_000, to: WallClock.nowNanoseconds()))
            logger.info(
                "\(name): going on from the last run (\(tail.clean ? "its tape ends with a clean stop" : "after a crash: past its reserved positions"))",
                metadata: ["epoch": "\(tail.epoch)", "eventsReadBack": "\(events)", "downMs": "\(WallClock.nowMilliseconds() - tail.stoppedAt)"])
        } catch {
            logger.info("\(name): a new epoch: \(error)")
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
