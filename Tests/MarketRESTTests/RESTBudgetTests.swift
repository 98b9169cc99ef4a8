import MarketREST
import Testing

/// The account's token bucket on one node: the plan's burst, priorities, the bounded wait and queue,
/// a vendor's pause.
@Suite("REST budget on one node")
struct RESTBudgetTests {
    @Test func ratesAreReadAsPlansWriteThem() {
        #expect(RESTRate(parsing: "5/min") == RESTRate(requests: 5, per: .seconds(60)))
        #expect(RESTRate(parsing: "100/s") == RESTRate(requests: 100, per: .seconds(1)))
        #expect(RESTRate(parsing: "200 / minute") == RESTRate(requests: 200, per: .seconds(60)))
        #expect(RESTRate(parsing: "5") == nil)
        #expect(RESTRate(parsing: "0/s") == nil)
        #expect(RESTRate(parsing: "5/fortnight") == nil)
        #expect(RESTRate(requests: 5, per: .seconds(60)).description == "5/min")
    }

    @Test func theBurstIsGrantedAndTheRestRefusedWithWhenToComeBack() async {
        let budget = RESTBudget(rate: RESTRate(requests: 5, per: .seconds(60)), maxWait: .seconds(1))
        var granted = 0
        var refusals: [Duration] = []
        for _ in 0..<20 {
            switch await budget.take(.background, bounded: true) {
            case .granted: granted += 1
            case .refused(let after): refusals.append(after)
            case .cancelled: Issue.record("not cancelled")
            }
        }
        #expect(granted == 5)
        #expect(refusals.count == 15)
        // The next token is 12 s away (5 a minute).
        #expect(refusals.allSatisfy { $0 > .seconds(10) && $0 <= .seconds(13) }, "\(refusals)")
        let state = await budget.snapshot()
        #expect(state.granted == 5 && state.refused == 15)
    }

    @Test func waitersAreServedMostPressingFirst() async throws {
        // 20 a second, one token in hand: waiters are served every 50 ms.
        let budget = RESTBudget(rate: RESTRate(requests: 20, per: .seconds(1)), burst: 1, maxWait: .seconds(5))
        #expect(await budget.take(.foreground, bounded: true) == .granted)
        let order = OrderLog()
        await withTaskGroup(of: Void.self) { group in
            group.addTask {
                _ = await budget.take(.bulk, bounded: true)
                await order.append("bulk")
            }
            // The bulk request queues first; the foreground one arrives after it and goes before it.
            try? await Task.sleep(for: .milliseconds(10))
            group.addTask {
                _ = await budget.take(.foreground, bounded: true)
                await order.append("foreground")
            }
        }
        #expect(await order.entries == ["foreground", "bulk"])
    }

    @Test func theRelaysOwnRequestsWaitInsteadOfBeingRefused() async {
        let budget = RESTBudget(rate: RESTRate(requests: 20, per: .seconds(1)), burst: 1, maxWait: .milliseconds(1))
        #expect(await budget.take(.bulk, bounded: false) == .granted)
        let started = ContinuousClock.now
        #expect(await budget.take(.bulk, bounded: false) == .granted)
        #expect(ContinuousClock.now - started >= .milliseconds(30), "it waited for the refill")
    }

    @Test func aVendorsPauseHoldsEveryRequest() async {
        let budget = RESTBudget(rate: RESTRate(requests: 100, per: .seconds(1)), maxWait: .seconds(2))
        await budget.pause(for: .seconds(30))
        guard case .refused(let after) = await budget.take(.foreground, bounded: true) else {
            Issue.record("a paused budget granted a request")
            return
        }
        #expect(after >= .seconds(29))
        #expect(await budget.snapshot().pausedUntil != nil)
    }

    @Test func aVendorsPauseOfADayIsTakenForTwoMinutesAtMost() async {
        let budget = RESTBudget(rate: RESTRate(requests: 100, per: .seconds(1)), maxWait: .seconds(2))
        await budget.pause(for: .seconds(86_400))
        guard case .refused(let after) = await budget.take(.foreground, bounded: true) else {
            Issue.record("a paused budget granted a request")
            return
        }
        #expect(after <= RESTBudget.maxPause + .seconds(1) && after > .seconds(110), "\(after)")
    }

    @Test func aFullQueueRefusesAtOnce() async {
        let budget = RESTBudget(rate: RESTRate(requests: 1, per: .seconds(1)), burst: 1, maxWaiting: 0, maxWait: .seconds(5))
        #expect(await budget.take(.foreground, bounded: true) == .granted)
        guard case .refused = await budget.take(.foreground, bounded: true) else {
            Issue.record("a request queued past the queue's bound")
            return
        }
    }
}

actor OrderLog {
    var entries: [String] = []
    func append(_ entry: String) { entries.append(entry) }
}
