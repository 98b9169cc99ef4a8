#if canImport(Glibc)
    import Glibc
#endif
import Foundation
import RelayBench
import Testing

@Suite(
    "A test's nats-server never outlives it", .timeLimit(.minutes(1)),
    .enabled(
        if: NATSServerProcess.binary != nil || ProcessInfo.processInfo.environment["RELAY_REQUIRE_NATS"] == "1",
        "nats-server is not installed (scripts/test installs it)"))
struct NATSServerProcessTests {
    struct Thrown: Error {}

    /// A test that throws before it stops its server (a failed `#require`) leaves no server running.
    @Test func aServerNotStoppedIsKilledWithItsOwner() async throws {
        var pid: Int32 = 0
        var store = ""
        func started() async throws {
            let nats = try NATSServerProcess()
            _ = try await nats.start()
            (pid, store) = (nats.process.processIdentifier, nats.storeDirectory)
            throw Thrown()
        }
        await #expect(throws: Thrown.self) { try await started() }
        try #require(pid > 0)
        // Killed at once; reaped by Foundation's process monitor a moment later.
        let deadline = ContinuousClock.now + .seconds(10)
        while kill(pid, 0) == 0, ContinuousClock.now < deadline { try await Task.sleep(for: .milliseconds(20)) }
        #expect(kill(pid, 0) != 0, "nats-server \(pid) still runs")
        #expect(!FileManager.default.fileExists(atPath: store))
    }
}
