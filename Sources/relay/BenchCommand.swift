import ArgumentParser
import Foundation
import PolygonWire
import RelayBench

struct BenchCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "bench",
        abstract: "End-to-end throughput and latency over loopback: synthetic upstream → relay (child process) → subscribers.",
        discussion: """
            Scenarios: fanout (100 subscribers, 20 of 100 symbols, 50k events/s in frames of 50),
            many-clients (10,000 mostly idle subscribers, 50 events/s), firehose (4 wildcard subscribers, 200k events/s),
            slow-consumer (fanout plus one subscriber that never reads), cluster (fanout on one relay, then
            the same spread over three cluster nodes on a NATS server the bench starts, then a kill -9 and a
            SIGTERM of the leader, timed), markets (fanout's load split across stocks, crypto and options at
            once, each with its own upstream connection), alpaca (fanout in Alpaca's protocol: the feed and the
            relay's upstream speak it, the subscribers are MessagePack clients as Alpaca's SDKs are), alpaca-json
            (the same with JSON subscribers, whose JSON the relay makes once per event), bars (derived 5-second
            bars of 10,000 symbols built from 100,000 trades/s). Flags
            override a scenario's knobs; --market runs a
            scenario on another market (its tickers, channels and path).
            Build in release mode for figures worth quoting: swift build -c release.
            """
    )

    @Argument(help: "fanout, many-clients, firehose, slow-consumer, cluster or markets.")
    var scenario: String = "fanout"

    @Option(help: "Fast subscriber connections.") var subscribers: Int?
    @Option(help: "Symbols per subscriber (quotes and trades of each).") var symbols: Int?
    @Option(help: "Symbols in the upstream market.") var universe: Int?
    @Option(help: "Upstream events per second.") var rate: Double?
    @Option(name: .customLong("frame-events"), help: "Events per upstream frame.") var frameEvents: Int?
    @Option(help: "Subscribe to Q.* and T.* (true/false).") var wildcard: Bool?
    @Option(name: .customLong("stalled"), help: "Extra subscribers that never read.") var stalled: Int?
    @Option(help: "Measured seconds.") var duration: Double?
    @Option(help: "Seconds before measuring.") var warmup: Double?
    @Option(help: "Relay processes; more than one runs a cluster on NATS.") var nodes: Int?
    @Option(help: "Run the scenario on this market (stocks, options, forex, crypto, indices, futures).") var market: String?
    @Option(help: "The share of subscribers (0 to 1) that also hold 5-second derived bars of their symbols (AM.AAPL@5s).") var bars: Double?
    @Flag(help: "Print the result as JSON on standard output.") var json = false
    @Flag(name: .customLong("relay-logs"), help: "Show the relay's own log lines.") var relayLogs = false
    @Option(name: .customLong("relay-binary"), help: "The relay executable to test (default: this one).") var relayBinary: String?

    /// Counts and times within what a run can be (a negative count, or a rate or time that is not a
    /// number, trapped deep in the run).
    func validate() throws {
        func check<T: Comparable>(_ value: T?, _ flag: String, _ range: ClosedRange<T>) throws {
            guard let value, !range.contains(value) else { return }
            throw ValidationError("--\(flag): \(range.lowerBound) to \(range.upperBound), got \(value)")
        }
        try check(subscribers, "subscribers", 0...1_000_000)
        try check(symbols, "symbols", 1...1_000_000)
        try check(universe, "universe", 1...1_000_000)
        try check(frameEvents, "frame-events", 1...100_000)
        try check(stalled, "stalled", 0...100_000)
        try check(nodes, "nodes", 1...9)
        // Not-a-number is in no range.
        try check(rate, "rate", 0.001...10_000_000)
        try check(duration, "duration", 0.1...86_400)
        try check(warmup, "warmup", 0...3_600)
        // A cluster run stops its leader twice, timing each failover: a third node is left to watch.
        if let nodes, nodes == 2 { throw ValidationError("--nodes: 1, or 3 and more (a cluster run stops two leaders in turn)") }
    }

    func run() async throws {
        guard var chosen = BenchScenario.named.first(where: { $0.name == scenario }) else {
            throw ValidationError("unknown scenario \(scenario); one of \(BenchScenario.named.map(\.name).joined(separator: ", "))")
        }
        if let subscribers { chosen.subscribers = subscribers }
        if let symbols { chosen.symbolsPerSubscriber = symbols }
        if let universe { chosen.universe = universe }
        if let rate { chosen.rate = rate }
        if let frameEvents { chosen.frameEvents = frameEvents }
        if let wildcard { chosen.wildcard = wildcard }
        if let stalled { chosen.stalledSubscribers = stalled }
        if let duration { chosen.durationSeconds = duration }
        if let warmup { chosen.warmupSeconds = warmup }
        if let nodes { chosen.nodes = max(nodes, 1) }
        if let bars {
            guard (0...1).contains(bars) else { throw ValidationError("--bars is a share from 0 to 1, got \(bars)") }
            chosen.barShare = bars
        }
        if let market {
            guard let named = Market(rawValue: market), named != .news else {
                throw ValidationError("unknown market \(market); one of \(Market.trading.map(\.rawValue).joined(separator: ", ")) (news has no bench scenario)")
            }
            chosen.markets = [named]
        }
        let binary =
            relayBinary ?? (try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe")) ?? CommandLine.arguments[0]
        let progress: @Sendable (String) -> Void = { line in FileHandle.standardError.write(Data((line + "\n").utf8)) }
        var results: [BenchResult] = []
        if chosen.nodes > 1 {
            // The single relay first, in the same run, so the cluster's cost is read against it.
            var single = chosen
            single.name = "\(chosen.name) (single relay, for comparison)"
            single.nodes = 1
            results.append(try await BenchRunner(scenario: single, relayBinary: binary, showRelayLogs: relayLogs, progress: progress).run())
        }
        results.append(try await BenchRunner(scenario: chosen, relayBinary: binary, showRelayLogs: relayLogs, progress: progress).run())
        if json {
            let encoder = JSONEncoder()
            encoder.outputFormatting = [.prettyPrinted, .sortedKeys]
            let data = results.count == 1 ? try encoder.encode(results[0]) : try encoder.encode(results)
            FileHandle.standardOutput.write(data + Data("\n".utf8))
        } else {
            print(results.map(\.table).joined(separator: "\n\n"))
            if results.count == 2 {
                let extra = results[1].latencyMs.p99 - results[0].latencyMs.p99
                print("\ncluster p99 − single relay p99: \(BenchResult.format(extra, digits: 3)) ms")
            }
        }
    }
}
