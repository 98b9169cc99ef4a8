import ArgumentParser
import DemoFeed
import Logging
import PolygonWire
import RelayComposition
import RelayConfiguration
import ServiceLifecycle

struct DemoFeedCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "demo-feed",
        abstract: "Run the synthetic Polygon-compatible market on its own."
    )

    @Option(help: "HOST:PORT to listen on.")
    var listen: String = "127.0.0.1:9009"

    @Option(help: "The market paths served, comma-separated (stocks for ws://HOST:PORT/stocks), or all.")
    var markets: String = "all"

    /// The markets named by `--markets`.
    var servedMarkets: [Market]? {
        if markets == "all" { return Market.allCases }
        let named = markets.split(separator: ",").map { Market(rawValue: $0.trimmingCharacters(in: .whitespaces).lowercased()) }
        guard !named.isEmpty, named.allSatisfy({ $0 != nil }) else { return nil }
        return named.compactMap { $0 }
    }

    @Option(name: .customLong("api-key"), help: "The key clients must send; any non-empty key when omitted.")
    var apiKey: String?

    @Option(help: "Quotes and trades per second across the universe.")
    var rate: Double = 500

    @Option(name: .customLong("aggregate-seconds"), help: "Seconds between AM minute bars.")
    var aggregateSeconds: Int = 60

    @Option(help: "Generated tickers beside AAPL, MSFT, NVDA and the other majors.")
    var tickers: Int = 300

    @Option(help: "Seed for a repeatable market.")
    var seed: UInt64?

    @Option(name: .customLong("tls-cert"), help: "Serve wss:// with this PEM certificate chain (needs --tls-key).")
    var tlsCert: String?

    @Option(name: .customLong("tls-key"), help: "The PEM private key of --tls-cert.")
    var tlsKey: String?

    @Option(name: .customLong("log-level"))
    var logLevel: String = "info"

    func validate() throws {
        guard RelaySettings.Address(listen) != nil else { throw ValidationError("--listen: expected HOST:PORT, got \(listen)") }
        guard servedMarkets != nil else {
            throw ValidationError("--markets: a list of \(Market.allCases.map(\.rawValue).joined(separator: ", ")), or all; got \(markets)")
        }
        guard rate > 0, rate <= 10_000_000 else { throw ValidationError("--rate: events a second, above 0 and at most 10,000,000") }
        guard (1...86_400).contains(aggregateSeconds) else { throw ValidationError("--aggregate-seconds: 1 to 86,400") }
        // Records name a ticker in 16 bits, beside the majors.
        guard (0...60_000).contains(tickers) else { throw ValidationError("--tickers: 0 to 60,000") }
        guard (tlsCert == nil) == (tlsKey == nil) else { throw ValidationError("--tls-cert and --tls-key go together") }
        guard Logger.Level(rawValue: logLevel) != nil else { throw ValidationError("--log-level: unknown level \(logLevel)") }
    }

    func run() async throws {
        bootstrapLogging(level: Logger.Level(rawValue: logLevel) ?? .info)
        guard let address = RelaySettings.Address(listen) else { return }
        let logger = Logger(label: "relay.demo-feed")
        let served = servedMarkets ?? [.stocks]
        var configuration = DemoFeedConfiguration(
            host: address.host, port: address.port, market: served[0].rawValue, apiKey: apiKey, eventsPerSecond: rate,
            aggregateInterval: .seconds(aggregateSeconds), generatedTickers: tickers, seed: seed,
            tls: tlsCert.flatMap { cert in tlsKey.map { .init(certificatePath: cert, privateKeyPath: $0) } })
        configuration.markets = served
        let feed = DemoFeed(configuration: configuration, logger: logger)
        let group = ServiceGroup(
            configuration: .init(services: [.init(service: feed)], gracefulShutdownSignals: [.sigterm, .sigint], logger: logger))
        try await withThrowingTaskGroup(of: Void.self) { tasks in
            tasks.addTask { try await group.run() }
            tasks.addTask {
                var urls: [String] = []
                for market in served { urls.append(try await feed.url(for: market)) }
                print("demo feed serving \(urls.joined(separator: " ")) (\(Int(rate)) events/s on stocks)")
            }
            try await tasks.waitForAll()
        }
    }
}
