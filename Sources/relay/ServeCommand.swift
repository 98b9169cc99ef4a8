import AlpacaWire
import ArgumentParser
import Foundation
import Logging
import PolygonWire
import RelayComposition
import RelayConfiguration
import RelayServer
import ServiceLifecycle
import Synchronization
import UnixSignals

struct ServeCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "serve",
        abstract: "Run the relay. With no upstream it serves the built-in demo feed for every market.",
        // Every setting, written from its one declaration (RelaySettings.declarations).
        discussion: RelaySettings.settingsHelp
    )

    /// The settings, read through their declarations (`--listen HOST:PORT`, `--upstream URL` …; see the
    /// discussion above, or README "Configuration").
    @Argument(parsing: .captureForPassthrough, help: .init("Settings: --NAME VALUE, as listed below.", valueName: "settings"))
    var settingArguments: [String] = []

    func validate() throws {
        // The settings capture every argument, `--help` too: answered here.
        if settingArguments.contains(where: { $0 == "--help" || $0 == "-h" }) { throw CleanExit.helpRequest(self) }
    }

    func run() async throws {
        DescriptorLimit.raiseToHardLimit()
        let settings: RelaySettings
        do {
            settings = try await RelaySettings.resolve(
                vendors: Relay.vendors, commandLine: settingArguments, environment: ProcessInfo.processInfo.environment)
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
        let hungUp = HangUp()
        try await withThrowingTaskGroup(of: Void.self) { tasks in
            // SIGHUP (a closed terminal, or a reload asked of a relay that has none): a clean stop as on
            // SIGTERM, then exit status 129, so a supervisor that restarts on failure starts it again.
            tasks.addTask {
                for await _ in await UnixSignalsSequence(trapping: .sighup) {
                    hungUp.seen.store(true, ordering: .relaxed)
                    logger.notice("SIGHUP: the relay has no reload; stopping as on SIGTERM, exit status 129 (a supervisor starts it again)")
                    // Once started: before, SIGTERM's own handling may not be in place yet (its default
                    // action would end the relay with nothing saved). A start that fails ends it anyway.
                    guard (try? await relay.ready()) != nil else { return }
                    kill(getpid(), SIGTERM)
                    return
                }
            }
            tasks.addTask {
                let parts = try await relay.ready()
                Self.printWelcome(
                    settings: settings, port: parts.port, markets: parts.markets.keys.sorted(), demo: parts.demoFeed != nil,
                    portfolio: parts.portfolio != nil, paths: Dictionary(uniqueKeysWithValues: parts.markets.compactMap { market, hub in hub.wire.servedPaths(of: market).first.map { (market, $0) } }))
            }
            try await relay.run()
            tasks.cancelAll()
        }
        if hungUp.seen.load(ordering: .relaxed) { throw ExitCode(129) }
    }

    static func printWelcome(settings: RelaySettings, port: Int, markets: [Market], demo: Bool, portfolio: Bool, paths: [Market: String] = [:]) {
        let market = markets.first ?? .stocks
        let host = settings.listen.host
        let base = "\(host.contains(":") ? "[\(host)]" : host):\(port)"
        // Never a configured key on the screen: terminals are recorded and shared.
        let keyed = !settings.clientKeys.isEmpty || !settings.clientKeyRights.isEmpty
        let key = keyed ? "YOUR-CLIENT-KEY" : "any-key"
        let secure = settings.tls != nil
        let (ws, http) = secure ? ("wss", "https") : ("ws", "http")
        let curl = "curl\(secure ? " --cacert YOUR-CA.pem" : "")\(keyed ? " -H 'Authorization: Bearer \(key)'" : "")"
        let keyText = keyed ? "one of the configured keys" : "any, loopback only"
        if settings.upstreamVendor == .alpaca || settings.upstreams.contains(where: { settings.vendor(of: $0) == .alpaca }) {
            // Alpaca's protocol at Alpaca's paths: what an SDK user changes is the URL.
            func feed(_ market: Market) -> AlpacaFeed {
                settings.upstreams.first { $0.market == market }.flatMap { AlpacaFeed(path: $0.endpoint.path) } ?? .standard(for: market)
            }
            let stocks = feed(.stocks)
            let paths = markets.map { feed($0).path }
            let lines = [
                "relay is up\(demo ? " on the built-in demo feed, in Alpaca's protocol" : "")",
                "  WebSocket  \(paths.map { "\(ws)://\(base)\($0)" }.joined(separator: " "))   (Alpaca protocol, JSON or MessagePack; key: \(keyText))",
                "  alpaca-py  StockDataStream(\"\(key)\", \"any-secret\", url_override=\"\(ws)://\(base)\(stocks.path)\")",
                "  alpaca-trade-api  Stream(\"\(key)\", \"any-secret\", data_stream_url=\"\(http)://\(base)\", data_feed=\"\(stocks.rawValue)\")",
                "  REST       curl\(secure ? " --cacert YOUR-CA.pem" : "") -H 'APCA-API-KEY-ID: \(key)' '\(http)://\(base)/v2/stocks/snapshots?symbols=AAPL'   (Alpaca's data API through the relay)",
                "  alpaca-py  StockHistoricalDataClient(\"\(key)\", \"any-secret\", url_override=\"\(http)://\(base)\")",
                "  dashboard  \(http)://\(base)/",
                "  stop       Ctrl-C (SIGINT) or SIGTERM",
            ]
            FileHandle.standardOutput.write(Data((lines.joined(separator: "\n") + "\n").utf8))
            return
        }
        if let replay = settings.replay {
            let lines = [
                "relay is replaying the tape (\(replay.day ?? "the newest day"), speed \(replay.speed)\(replay.loop ? ", on a loop" : "")): recorded events, not live",
                "  WebSocket  \(markets.map { "\(ws)://\(base)\(paths[$0] ?? "/\($0)")" }.joined(separator: " "))   (the recorded vendor's protocol; client key: \(keyText))",
                "  dashboard  \(http)://\(base)/",
                "  stop       Ctrl-C (SIGINT) or SIGTERM",
            ]
            FileHandle.standardOutput.write(Data((lines.joined(separator: "\n") + "\n").utf8))
            return
        }
        var lines = [
            "relay is up\(demo ? " on the built-in demo feed" : "")",
            "  WebSocket  \(markets.map { "\(ws)://\(base)/\($0)" }.joined(separator: " "))   (Polygon protocol; client key: \(keyText))",
            "  dashboard  \(http)://\(base)/",
            "  health     curl\(secure ? " --cacert YOUR-CA.pem" : "") \(http)://\(base)/healthz",
            "  last quote \(curl) \(http)://\(base)/v1/last/\(markets.count > 1 ? "\(market)/" : "")\(market.exampleTopic)",
            "  Python     WebSocketClient(api_key=\"\(key)\", feed=\"\(base)\", market=\"\(market)\", secure=\(secure ? "True" : "False"), subscriptions=[\"\(market.exampleTopic)\"])",
            "  stop       Ctrl-C (SIGINT) or SIGTERM",
        ]
        if settings.gateway != nil {
            // Polygon's REST API through the relay: live from the stream, cached, or the vendor's, one budget.
            lines.insert("  REST       \(curl) \(http)://\(base)/v2/last/trade/AAPL   (and /v2/last/nbbo, /v2/snapshot/…, /v2/aggs/…, /v3/trades/…)", at: lines.count - 1)
            lines.insert("  REST (Py)  RESTClient(api_key=\"\(key)\", base=\"\(http)://\(base)\")", at: lines.count - 1)
        }
        if portfolio {
            lines.insert("  portfolio  \(curl) \(http)://\(base)/v1/portfolio   (history: /v1/portfolio/history)", at: lines.count - 1)
        }
        // Unbuffered, so a script reading our output sees it at once.
        FileHandle.standardOutput.write(Data((lines.joined(separator: "\n") + "\n").utf8))
    }
}

/// Whether the relay was told SIGHUP (``ServeCommand``): `Sendable` through its atomic.
private final class HangUp: Sendable {
    let seen = Atomic<Bool>(false)
}
