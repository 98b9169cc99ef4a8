import ArgumentParser
import DemoFeed
import Logging
import RelayCore
import ServiceLifecycle

struct DemoFeedCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "demo-feed",
        abstract: "Run the synthetic Polygon-compatible market on its own."
    )

    @Option(help: "HOST:PORT to listen on.")
    var listen: String = "127.0.0.1:9009"

    @Option(help: "The market path served, e.g. stocks for ws://HOST:PORT/stocks.")
    var market: String = "stocks"

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
        guard rate > 0 else { throw ValidationError("--rate must be above 0") }
        guard aggregateSeconds > 0 else { throw ValidationError("--aggregate-seconds must be above 0") }
        guard (tlsCert == nil) == (tlsKey == nil) else { throw ValidationError("--tls-cert and --tls-key go together") }
        guard Logger.Level(rawValue: logLevel) != nil else { throw ValidationError("--log-level: unknown level \(logLevel)") }
    }

    func run() async throws {
        bootstrapLogging(level: Logger.Level(rawValue: logLevel) ?? .info)
        guard let address = RelaySettings.Address(listen) else { return }
        let logger = Logger(label: "relay.demo-feed")
        let feed = DemoFeed(
            configuration: DemoFeedConfiguration(
                host: address.host, port: address.port, market: market, apiKey: apiKey, eventsPerSecond: rate,
                aggregateInterval: .seconds(aggregateSeconds), generatedTickers: tickers, seed: seed,
                tls: tlsCert.flatMap { cert in tlsKey.map { .init(certificatePath: cert, privateKeyPath: $0) } }),
            logger: logger)
        let group = ServiceGroup(
            configuration: .init(services: [.init(service: feed)], gracefulShutdownSignals: [.sigterm, .sigint], logger: logger))
        try await withThrowingTaskGroup(of: Void.self) { tasks in
            tasks.addTask { try await group.run() }
            tasks.addTask {
                let url = try await feed.url()
                print("demo feed serving \(url) (\(Int(rate)) events/s)")
            }
            try await tasks.waitForAll()
        }
    }
}
