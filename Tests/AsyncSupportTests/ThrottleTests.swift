import AsyncSupport
import RelayTestSupport
import Synchronization
import Testing

@Suite("Throttle: at once, then at most once an interval")
struct ThrottleTests {
    @Test func aFloodOfRequestsIsOneActionAnInterval() async throws {
        let throttle = Throttle(interval: .seconds(1))
        let runs = Mutex(0)
        throttle.request { runs.withLock { $0 += 1 } }
        #expect(runs.withLock { $0 } == 1, "the first request runs at once")
        for _ in 0..<1_000 { throttle.request { runs.withLock { $0 += 1 } } }
        #expect(runs.withLock { $0 } == 1, "requests within the interval wait")
        try await eventually("the flood to be answered once, at the interval's end") { runs.withLock { $0 } == 2 }
        // Just answered: the next request waits for the next interval too, and is then answered once.
        throttle.request { runs.withLock { $0 += 1 } }
        #expect(runs.withLock { $0 } == 2)
        try await eventually("the next interval's request to be answered") { runs.withLock { $0 } == 3 }
    }
}
