import Foundation
import RelayBench
import RelayConfiguration
import Testing

/// `relay bench` end to end at a small scale: its feed, the relay binary of this build as a child
/// process, and its subscribers in each protocol and codec. Figures are not checked (this is a debug
/// build on a shared machine); that every event arrives, and is counted, is.
@Suite("relay bench, small", .serialized)
struct RelayBenchTests {
    static func small(_ scenario: BenchScenario) -> BenchScenario {
        var scenario = scenario
        scenario.subscribers = 4
        scenario.symbolsPerSubscriber = 5
        scenario.universe = 20
        scenario.rate = 1_000
        scenario.frameEvents = 10
        scenario.durationSeconds = 1.5
        scenario.warmupSeconds = 1
        return scenario
    }

    @Test(arguments: ["fanout", "alpaca", "alpaca-json"])
    func everyEventReachesTheSubscribers(name: String) async throws {
        let named = try #require(BenchScenario.named.first { $0.name == name })
        let runner = BenchRunner(scenario: Self.small(named), relayBinary: RelayProcess.siblingBinary(), progress: { _ in })
        let result = try await runner.run()
        #expect(result.upstreamEvents > 0)
        #expect(result.expected > 0 && result.delivered > 0, "\(name): \(result.delivered) of \(result.expected) delivered")
        #expect(result.deliveryRatio >= 0.99, "\(name): ratio \(result.deliveryRatio), \(result.delivered) of \(result.expected)")
        #expect(result.laggingNoticesFast == 0)
    }

    /// The relay a bench starts is configured by the bench alone: settings in the environment it was
    /// started from (a cluster that is not there, client keys the subscribers do not have, a tape
    /// folder that cannot be made) are not the relay's.
    @Test func theBenchesRelayIgnoresTheOperatorsSettings() async throws {
        let named = try #require(BenchScenario.named.first { $0.name == "fanout" })
        var runner = BenchRunner(scenario: Self.small(named), relayBinary: RelayProcess.siblingBinary(), progress: { _ in })
        runner.environment.merge(["RELAY_CLUSTER": "nats://127.0.0.1:1", "RELAY_CLIENT_KEYS": "not-the-bench", "RELAY_TAPE_DIR": "/proc/relay-bench-tape"]) { $1 }
        let result = try await runner.run()
        #expect(result.deliveryRatio >= 0.99, "ratio \(result.deliveryRatio), \(result.delivered) of \(result.expected)")
    }

    /// A series with several labels counts under each one alone: the hub's drops carry the market's
    /// label before their reason (read by the reason alone, they were always 0).
    @Test func aSeriesIsCountedUnderEachOfItsLabels() {
        var values: [String: Double] = [:]
        BenchRunner.add(
            metrics: "# TYPE relay_events_dropped_total counter\nrelay_events_dropped_total{market=\"stocks\",reason=\"buffer_full\"} 5\n"
                + "relay_events_dropped_total{market=\"crypto\",reason=\"buffer_full\"} 2\nrelay_events_dropped_total{market=\"crypto\",reason=\"evicted\"} 7\n",
            to: &values)
        #expect(values[#"relay_events_dropped_total{reason="buffer_full"}"#] == 7)
        #expect(values[#"relay_events_dropped_total{market="crypto"}"#] == 9)
        #expect(values["relay_events_dropped_total"] == 14)
    }

    /// A bench refuses counts and times its run cannot be, with a message, before it starts (a
    /// negative count or a rate that is not a number trapped in the run).
    @Test(arguments: [["--subscribers", "-1"], ["--stalled", "-2"], ["--symbols", "0"], ["--rate", "nan"], ["--duration", "inf"], ["--nodes", "2"]])
    func aBenchRefusesWhatItsRunCannotBe(arguments: [String]) throws {
        let ended = try runRelayCommand(["bench", "fanout"] + arguments)
        #expect(ended.reason == .exit && ended.status != 0, "\(arguments): \(ended.output)")
        #expect(ended.output.contains(arguments[0]), "\(arguments): \(ended.output)")
    }

    /// Every variable the relay reads a setting from is one the bench leaves out.
    @Test func everyDeclaredVariableIsLeftOutOfTheBenchesRelay() {
        let variables = RelaySettings.declarations.compactMap(\.environment)
        #expect(variables.count > 50)
        #expect(variables.filter { !RelayProcess.isSetting($0) }.isEmpty)
    }
}

@Suite("A relay child process")
struct RelayProcessTests {
    struct Thrown: Error {}

    /// A test that throws before it stops its relay (a failed `#require`) leaves no relay running.
    @Test func aRelayNeverAskedToStopIsKilledWithItsOwner() async throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("relay-owner-\(UUID().uuidString)").path
        defer { try? FileManager.default.removeItem(atPath: directory) }
        var pid: Int32 = 0
        func started() async throws {
            let relay = RelayProcess(
                binary: RelayProcess.siblingBinary(), arguments: ["serve", "--listen", "127.0.0.1:0", "--data-dir", directory], showLogs: false)
            _ = try await relay.start()
            pid = relay.process.processIdentifier
            throw Thrown()
        }
        await #expect(throws: Thrown.self) { try await started() }
        try #require(pid > 0)
        // Killed at once; reaped by Foundation's process monitor a moment later.
        let deadline = ContinuousClock.now + .seconds(10)
        while kill(pid, 0) == 0, ContinuousClock.now < deadline { try await Task.sleep(for: .milliseconds(20)) }
        #expect(kill(pid, 0) != 0, "relay \(pid) still runs")
    }
}
