import ArgumentParser
import Foundation
import RelayBench

struct BenchCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "bench",
        abstract: "End-to-end throughput and latency over loopback: synthetic upstream → relay (child process) → subscribers.",
        discussion: """
            Scenarios: fanout (100 subscribers, 20 of 100 symbols, 50k events/s in frames of 50),
            many-clients (10,000 mostly idle subscribers, 50 events/s), firehose (4 wildcard subscribers, 200k events/s),
            slow-consumer (fanout plus one subscriber that never reads). Flags override a scenario's knobs.
            Build in release mode for figures worth quoting: swift build -c release.
            """
    )

    @Argument(help: "fanout, many-clients, firehose or slow-consumer.")
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
    @Flag(help: "Print the result as JSON on standard output.") var json = false
    @Flag(name: .customLong("relay-logs"), help: "Show the relay's own log lines.") var relayLogs = false
    @Option(name: .customLong("relay-binary"), help: "The relay executable to test (default: this one).") var relayBinary: String?

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
        let binary =
            relayBinary ?? (try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe")) ?? CommandLine.arguments[0]
        let runner = BenchRunner(scenario: chosen, relayBinary: binary, showRelayLogs: relayLogs) { line in
            FileHandle.standardError.write(Data((line + "\n").utf8))
        }
        let result = try await runner.run()
        if json {
            let encoder = JSONEncoder()
            encoder.outputFormatting = [.prettyPrinted, .sortedKeys]
            FileHandle.standardOutput.write(try encoder.encode(result) + Data("\n".utf8))
        } else {
            print(result.table)
        }
    }
}
