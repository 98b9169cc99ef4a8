import Foundation
import RelayBench
import Synchronization
import Testing

@testable import Cluster

/// A NATS connection's state changes, told to its change handlers on the thread that makes them, before
/// any watcher hears of them: what a node must do in order with the messages libnats delivers around a
/// disconnection (tell the loss, stop taking events) cannot wait for a task to read a stream.
@Suite(
    "NATS connection: changes told as they happen", .serialized, .timeLimit(.minutes(1)),
    .enabled(
        if: NATSServerProcess.binary != nil || ProcessInfo.processInfo.environment["RELAY_REQUIRE_NATS"] == "1",
        "nats-server is not installed (scripts/test installs it)"))
struct NATSConnectionChangeTests {
    @Test func aChangeReachesItsHandlersBeforeAnyWatcher() async throws {
        let nats = try NATSServerProcess()
        let url = try await nats.start()
        let connection = try await connectedNATS(url, name: "changes")
        let told = Mutex<[String]>([])
        connection.onChange { old, new in told.withLock { $0.append("handler \(old.rawValue)→\(new.rawValue)") } }
        let updates = connection.stateUpdates()
        let watcher = Task {
            for await state in updates {
                told.withLock { $0.append("watcher \(state.rawValue)") }
                if state == .reconnecting { return }
            }
        }
        // The server goes: the connection is reconnecting.
        await nats.stop()
        await watcher.value
        let order = told.withLock { $0 }
        let handler = try #require(order.firstIndex(of: "handler connected→reconnecting"), "\(order)")
        let heard = try #require(order.firstIndex(of: "watcher reconnecting"), "\(order)")
        #expect(handler < heard, "\(order)")
        await connection.close()
    }
}
