import Testing

@testable import Cluster

@Suite("Leadership spreads across the cluster's nodes")
struct LeadershipSpreadTests {
    @Test func aNodeLeadingOneMarketLeavesAFreeLeaseToAnIdleNodeForABoundedWhile() {
        let spread = LeadershipSpread(node: "n1", maxDeferral: .seconds(2))
        let start = ContinuousClock.now
        // Leading nothing: take it.
        #expect(!spread.shouldDefer(market: "crypto", liveNodes: ["n1", "n2"], now: start))
        spread.observe(market: "stocks", leader: "n1")
        // Leading stocks, n2 leads none: defer, but never past the bound.
        #expect(spread.shouldDefer(market: "crypto", liveNodes: ["n1", "n2"], now: start))
        #expect(spread.shouldDefer(market: "crypto", liveNodes: ["n1", "n2"], now: start + .seconds(1)))
        #expect(!spread.shouldDefer(market: "crypto", liveNodes: ["n1", "n2"], now: start + .seconds(2)), "a market never stays leaderless")
        // No idle live node (n2 leads options): take it at once.
        spread.observe(market: "options", leader: "n2")
        #expect(!spread.shouldDefer(market: "crypto", liveNodes: ["n1", "n2"], now: start + .seconds(3)))
    }

    @Test func aNodeLeadingTwoMarketsHandsTheLastOneToAnIdleNodeOnceSettled() {
        let spread = LeadershipSpread(node: "n1", handOffAfter: .seconds(3))
        let start = ContinuousClock.now
        spread.observe(market: "stocks", leader: "n1")
        spread.observe(market: "crypto", leader: "n1")
        let idle = ["n1", "n2"]
        #expect(!spread.shouldHandOff(market: "stocks", liveNodes: idle, leadingSince: start, now: start + .seconds(1)), "too soon")
        #expect(!spread.shouldHandOff(market: "crypto", liveNodes: idle, leadingSince: start, now: start + .seconds(4)), "one at a time: the last by name")
        #expect(!spread.shouldHandOff(market: "stocks", liveNodes: ["n1"], leadingSince: start, now: start + .seconds(4)), "no idle node")
        #expect(spread.shouldHandOff(market: "stocks", liveNodes: idle, leadingSince: start, now: start + .seconds(4)))
        // Handed off, stocks has no leader for a moment: this node defers it to n2, and hands off nothing more.
        spread.observe(market: "stocks", leader: nil)
        #expect(spread.shouldDefer(market: "stocks", liveNodes: idle, now: start + .seconds(4)))
        #expect(!spread.shouldHandOff(market: "crypto", liveNodes: idle, leadingSince: start, now: start + .seconds(5)), "leads one market now")
    }

    @Test func handOffsThatComeBackAreSpacedEverFurtherUntilOneIsTaken() {
        let spread = LeadershipSpread(node: "n1", handOffAfter: .seconds(3))
        let start = ContinuousClock.now
        spread.observe(market: "crypto", leader: "n1")
        // "ghost" publishes interest and leads nothing, but never takes a lease: each hand-off comes back.
        let live = ["n1", "ghost"]
        var at = start + .seconds(3)
        var waits: [Duration] = []
        for _ in 0..<4 {
            spread.observe(market: "stocks", leader: "n1")
            var now = at
            while !spread.shouldHandOff(market: "stocks", liveNodes: live, leadingSince: start, now: now) { now += .seconds(1) }
            waits.append(now - at)
            spread.observe(market: "stocks", leader: nil)
            at = now
        }
        #expect(waits == [.zero, .seconds(6), .seconds(12), .seconds(24)], "\(waits)")
        // Taken by a node that was not idle at the hand-off (after its own deferral): twice as long again.
        spread.observe(market: "stocks", leader: "n3")
        spread.observe(market: "stocks", leader: "n1")
        #expect(!spread.shouldHandOff(market: "stocks", liveNodes: live, leadingSince: start, now: at + .seconds(47)))
        #expect(spread.shouldHandOff(market: "stocks", liveNodes: live, leadingSince: start, now: at + .seconds(48)))
        // Taken by the idle node: back to the least interval.
        spread.observe(market: "stocks", leader: "ghost")
        spread.observe(market: "stocks", leader: "n1")
        #expect(spread.shouldHandOff(market: "stocks", liveNodes: live, leadingSince: start, now: at + .seconds(51)))
    }
}
