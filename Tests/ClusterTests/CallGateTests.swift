import RelayTestSupport
import Synchronization
import Testing

@testable import Cluster

/// The turns of calls to a shared store: a cap, a bounded line in arrival order, deadlines,
/// cancellation, a 429 ahead of the line, and a failed store asked again one call at a time.
@Suite("CallGate: calls to a shared store, at most a few at once")
struct CallGateTests {
    /// The order in which waiters got their turns.
    final class Order: Sendable {
        let names = Mutex<[String]>([])
        var seen: [String] { names.withLock { $0 } }
        func append(_ name: String) { names.withLock { $0.append(name) } }
    }

    func gate(afterFailure: Duration = .seconds(60)) -> CallGate {
        CallGate(maxInFlight: 2, maxWaiting: 3, afterFailure: afterFailure)
    }

    /// Starts a task that waits for a turn and records the order in which turns came.
    func waiter(_ gate: CallGate, _ entry: CallGate.Entry = .waits(until: nil), name: String, order: Order) async throws
        -> Task<CallGate.Turn, Never>
    {
        let before = gate.counts.waiting
        let task = Task {
            let turn = await gate.enter(entry)
            order.append(name)
            return turn
        }
        try await eventually("\(name) to wait its turn") { gate.counts.waiting == before + 1 }
        return task
    }

    @Test func callsPastTheCapWaitInArrivalOrderAndTheLineIsBounded() async throws {
        let gate = gate()
        #expect(await gate.enter(.waits(until: nil)) == .starts)
        #expect(await gate.enter(.waits(until: nil)) == .starts)
        let order = Order()
        let a = try await waiter(gate, name: "a", order: order)
        let b = try await waiter(gate, name: "b", order: order)
        let c = try await waiter(gate, name: "c", order: order)
        #expect(gate.counts == CallGate.Counts(inFlight: 2, waiting: 3))
        #expect(await gate.enter(.waits(until: nil)) == .busy, "a fourth waiter is past the line's bound")
        #expect(await gate.enter(.atOnce) == .busy, "a status view does not wait")
        gate.leave()
        #expect(await a.value == .starts)
        gate.leave()
        #expect(await b.value == .starts)
        gate.leave()
        #expect(await c.value == .starts)
        #expect(order.seen == ["a", "b", "c"])
        #expect(gate.counts == CallGate.Counts(inFlight: 2, waiting: 0), "each turn passed on, still counted")
        #expect(gate.started == 5, "two calls, then three turns passed on; the refused started none")
        gate.leave()
        gate.leave()
        #expect(gate.counts == CallGate.Counts(inFlight: 0, waiting: 0))
    }

    @Test func aVendors429GoesAheadOfTheLineAndPastItsBound() async throws {
        let gate = gate()
        for _ in 0..<2 { #expect(await gate.enter(.waits(until: nil)) == .starts) }
        let order = Order()
        var waiters: [Task<CallGate.Turn, Never>] = []
        for name in ["a", "b", "c"] { waiters.append(try await waiter(gate, name: name, order: order)) }
        let pause = try await waiter(gate, .first, name: "pause", order: order)
        gate.leave()
        #expect(await pause.value == .starts)
        for _ in 0..<3 { gate.leave() }
        for waiter in waiters { #expect(await waiter.value == .starts) }
        #expect(order.seen == ["pause", "a", "b", "c"])
    }

    @Test func aWaiterPastItsDeadlineOrCancelledIsToldBusyAndLeavesTheLine() async throws {
        let gate = gate()
        for _ in 0..<2 { #expect(await gate.enter(.waits(until: nil)) == .starts) }
        let order = Order()
        let late = try await waiter(gate, .waits(until: .now + .milliseconds(100)), name: "late", order: order)
        #expect(await late.value == .busy)
        #expect(gate.counts == CallGate.Counts(inFlight: 2, waiting: 0))
        let cancelled = try await waiter(gate, name: "cancelled", order: order)
        cancelled.cancel()
        #expect(await cancelled.value == .busy)
        #expect(gate.counts == CallGate.Counts(inFlight: 2, waiting: 0))
        // A deadline already passed is told at once, never put in the line.
        #expect(await gate.enter(.waits(until: .now - .seconds(1))) == .busy)
        #expect(gate.counts == CallGate.Counts(inFlight: 2, waiting: 0))
        // A vendor's 429 stays in line when the request that saw it is cancelled: it is still written.
        let pause = try await waiter(gate, .first, name: "pause", order: order)
        pause.cancel()
        gate.leave()
        #expect(await pause.value == .starts)
        // A turn that ends now goes to nobody: the count goes down.
        gate.leave()
        #expect(gate.counts == CallGate.Counts(inFlight: 1, waiting: 0))
    }

    @Test func aFailedStoreLetsEveryWaiterGoThenIsAskedAgainOneCallAtATime() async throws {
        let gate = gate(afterFailure: .milliseconds(200))
        for _ in 0..<2 { #expect(await gate.enter(.waits(until: nil)) == .starts) }
        let order = Order()
        let a = try await waiter(gate, name: "a", order: order)
        let b = try await waiter(gate, name: "b", order: order)
        gate.failed()
        #expect(await a.value == .local)
        #expect(await b.value == .local)
        gate.leave()
        gate.leave()
        let failedAt = ContinuousClock.now
        #expect(await gate.enter(.waits(until: nil)) == .local, "within the interval after a failure, callers count on their own")
        #expect(await gate.enter(.first) == .local)
        try await Task.sleep(until: failedAt + .milliseconds(250))
        #expect(await gate.enter(.atOnce) == .local, "a status view is never the call that asks again")
        #expect(await gate.enter(.waits(until: nil)) == .starts, "one call asks again")
        #expect(await gate.enter(.waits(until: nil)) == .local, "while it asks, the others count on their own")
        gate.answered()
        #expect(await gate.enter(.waits(until: nil)) == .starts, "answered: calls go to the store again")
        gate.leave()
        gate.leave()
        #expect(gate.counts == CallGate.Counts(inFlight: 0, waiting: 0))
    }
}
