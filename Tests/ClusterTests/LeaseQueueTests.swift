import Dispatch
import Foundation
import RelayBench
import Synchronization
import Testing

@testable import Cluster

/// NATS calls that wait for the server run on threads of their own: the lease's on a queue of its own,
/// the others in a pool of ``NATSConnection/requestThreads``. While every thread of the pool is held
/// (lookups of the last-value store wait up to the request timeout while NATS stalls), the lease's
/// bucket is still opened and written, and the process's timers still fire. (On a concurrent dispatch
/// queue, as before, a 100 ms sleep took 14 s behind sixteen held calls, and the lease waited as long.)
@Suite(
    "Cluster: NATS calls wait on threads of their own", .serialized, .timeLimit(.minutes(1)),
    .enabled(
        if: NATSServerProcess.binary != nil || ProcessInfo.processInfo.environment["RELAY_REQUIRE_NATS"] == "1",
        "nats-server is not installed (scripts/test installs it)"))
struct LeaseQueueTests {
    final class HeldCount: Sendable {
        let count = Mutex(0)
    }

    @Test func theLeaseIsOpenedAndWrittenAndTimersFireWhileTheRequestPoolIsHeld() async throws {
        let nats = try NATSServerProcess()
        let url = try await nats.start()
        let connection = try await connectedNATS(url, name: "lease-queue-test")
        let threads = NATSConnection.requestThreads
        let release = DispatchSemaphore(value: 0)
        let released = Mutex(false)
        @Sendable func releasePool() {
            guard released.withLock({ was in defer { was = true }; return !was }) else { return }
            for _ in 0..<threads { release.signal() }
        }
        defer { releasePool() }
        let name = "lq\(UInt32.random(in: 0...UInt32.max))"
        let shared = try await connection.keyValue(bucket: "\(name)-last", ttl: nil)

        // Every thread of the pool held, as by lookups waiting for a stalled NATS.
        let holding = HeldCount()
        let held = Task {
            await withTaskGroup(of: Void.self) { group in
                for _ in 0..<threads {
                    group.addTask {
                        await NATSConnection.blocking {
                            holding.count.withLock { $0 += 1 }
                            release.wait()
                        }
                    }
                }
            }
        }
        // Each call has a thread of the pool: all are waiting for the server at once.
        let taking = ContinuousClock.now
        while holding.count.withLock({ $0 }) < threads, ContinuousClock.now - taking < .seconds(5) {
            try await Task.sleep(for: .milliseconds(20))
        }
        #expect(holding.count.withLock { $0 } == threads, "\(threads) calls did not all get a thread within 5 s")
        // A timer of the process still fires on time.
        let asleep = ContinuousClock.now
        try await Task.sleep(for: .milliseconds(100))
        let slept = ContinuousClock.now - asleep
        #expect(slept < .seconds(3), "a 100 ms sleep took \(slept) while the NATS calls held their threads")

        // The lease's bucket is opened (as after NATS came back) and written, on its own thread.
        let written = await withTaskGroup(of: Bool.self) { group in
            group.addTask {
                guard let lease = try? await connection.keyValue(bucket: "\(name)-lease", ttl: .seconds(5), ownQueue: true) else { return false }
                return (try? await lease.create("leader", "n1")) != nil
            }
            group.addTask {
                try? await Task.sleep(for: .seconds(5))
                return false
            }
            let first = await group.next() ?? false
            // Let the pool go before the group waits for its other child.
            releasePool()
            group.cancelAll()
            return first
        }
        #expect(written, "the lease's bucket was not opened and written within 5 s while the request pool was held")
        await held.value
        // The pool goes on once released.
        #expect(try await shared.get("anything") == nil)

        await connection.close()
        await nats.stop()
    }
}
