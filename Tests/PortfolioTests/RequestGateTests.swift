import Synchronization
import Testing

@testable import Portfolio
@testable import MarketREST
@testable import PolygonRESTClient

/// The names served, in order.
final class ServedLog: Sendable {
    let names = Mutex<[String]>([])
}

@Suite("Request gate")
struct RequestGateTests {
    /// Occupies the gate's only slot until `release` is called, then lets queued requests in one by one.
    func order(of queued: [(String, RequestGate.Priority, Bool)]) async throws -> [String] {
        let gate = RequestGate(limit: 1)
        let served = ServedLog()
        let (hold, release) = AsyncStream.makeStream(of: Void.self)
        let holder = Task { try await gate.run(.foreground) { for await _ in hold { return } } }
        while await gate.load.running == 0 { await Task.yield() }
        var tasks: [Task<Void, any Error>] = []
        for (name, priority, urgent) in queued {
            let urgency = RequestGate.Urgency()
            if urgent { urgency.escalate() }
            tasks.append(
                Task {
                    try await RequestGate.$urgency.withValue(urgency) {
                        try await gate.run(priority) { served.names.withLock { $0.append(name) } }
                    }
                })
            // Queue them in this order.
            let expected = tasks.count
            let deadline = ContinuousClock.now + .seconds(5)
            while await gate.load.waiting < expected, ContinuousClock.now < deadline { try await Task.sleep(for: .milliseconds(1)) }
        }
        release.yield()
        try await holder.value
        for task in tasks { try await task.value }
        return served.names.withLock { $0 }
    }

    @Test func foregroundThenPrefetchesThenBulkEachInArrivalOrder() async throws {
        let served = try await order(of: [
            ("bulk1", .bulk, false), ("prefetch1", .background, false), ("user", .foreground, false), ("prefetch2", .background, false),
        ])
        #expect(served == ["user", "prefetch1", "prefetch2", "bulk1"])
    }

    @Test func anUrgentPrefetchJumpsTheQueue() async throws {
        let served = try await order(of: [("prefetch1", .background, false), ("caught-up", .background, true)])
        #expect(served == ["caught-up", "prefetch1"])
    }

    @Test func aCancelledWaiterLeavesTheQueue() async throws {
        let gate = RequestGate(limit: 1)
        let (hold, release) = AsyncStream.makeStream(of: Void.self)
        let holder = Task { try await gate.run(.foreground) { for await _ in hold { return } } }
        while await gate.load.running == 0 { await Task.yield() }
        let waiter = Task { try await gate.run(.background) { "ran" } }
        while await gate.load.waiting == 0 { await Task.yield() }
        waiter.cancel()
        await #expect(throws: CancellationError.self) { try await waiter.value }
        #expect(await gate.load.waiting == 0)
        release.yield()
        try await holder.value
        #expect(await gate.load.running == 0)
    }
}
