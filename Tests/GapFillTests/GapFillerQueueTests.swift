import MarketCore
import MarketDataHub
import MarketREST
import RelayTestSupport
import Synchronization
import Testing

@testable import GapFill

/// A market's fills: one at a time, at most one request waiting, a newer one in its place.
@Suite("Gap filler: one fill under way, at most one waiting")
struct GapFillerQueueTests {
    /// The vendor's REST history, held: the first page asked for waits until ``release()``; each page
    /// is empty. Records the windows asked for.
    final class HeldHistory: MarketHistory {
        let asked = Mutex<[Range<Int64>]>([])
        let gate = Mutex<CheckedContinuation<Void, Never>?>(nil)
        let released = Mutex(false)

        func kind(of eventType: String) -> HistoryKind? { eventType == "T" ? .ticks : nil }

        func page(of topic: Topic, window: Range<Int64>, cursor: String?, room: Int, priority: RequestGate.Priority) async
            -> Result<HistoryPage, RESTError>
        {
            let first = asked.withLock { asked in
                asked.append(window)
                return asked.count == 1
            }
            if first {
                await withCheckedContinuation { continuation in
                    let open = released.withLock { released in
                        if !released { gate.withLock { $0 = continuation } }
                        return released
                    }
                    if open { continuation.resume() }
                }
            }
            return .success(HistoryPage())
        }

        func release() {
            let waiting = released.withLock { released in
                released = true
                return gate.withLock { gate in
                    defer { gate = nil }
                    return gate
                }
            }
            waiting?.resume()
        }
    }

    /// Where the fills' ends go: the generations each fill settled, in order.
    final class Ends: RecoveryOutlet {
        let generations = Mutex<[Int]>([])
        func deliverRecovered(_ topic: Topic, _ events: [MarketEvent], order: RecoveryOrder) async -> Int { events.count }
        func announceRecovered(_ summary: GapFillSummary, generation: Int) async { generations.withLock { $0.append(generation) } }
        func noteFillSkipped(generation: Int) async { generations.withLock { $0.append(generation) } }
        func finishFill(generation: Int) async { generations.withLock { $0.append(generation) } }
    }

    @Test func requestsArrivingDuringAFillKeepOnlyTheNewestWaiting() async throws {
        let history = HeldHistory()
        let hub = MarketDataHub(wire: .polygon, history: nil)
        let filler = GapFiller(market: .stocks, hub: hub, history: history, pace: RequestPace(perSecond: 1_000), settings: GapFillSettings())
        let ends = Ends()
        await filler.start(into: ends)
        let topic = try #require(Topic(parsing: "T.AAPL"))
        func request(_ generation: Int) -> GapFillRequest {
            let from = Int64(1_000_000 * generation)
            return GapFillRequest(from: from, through: from + 5_000, topics: [.init(topic: topic, holders: 1, lastBefore: nil)], generation: generation)
        }
        await filler.enqueue(request(1))
        try await eventually("the first fill to ask for its page") { history.asked.withLock { $0.count } == 1 }
        // Three more outages while it waits for the vendor: the newest takes the waiting place, and one
        // older than it, arriving late (requests come on tasks of their own), is covered by it.
        for generation in [2, 4, 3] { await filler.enqueue(request(generation)) }
        history.release()
        await filler.idle()
        #expect(ends.generations.withLock { $0 } == [1, 4], "the fill under way, then the newest request only")
        #expect(history.asked.withLock { $0.map(\.lowerBound) } == [1_000_000, 4_000_000], "no REST call for the windows replaced")
        await filler.stop()
    }

    /// A newer request that reaches back past what a fill covers (the waiting one's gaps and more) does
    /// not take the waiting one's place: that one is filled, then the newer one is told skipped.
    @Test func aNewerRequestPastTheWindowDoesNotTakeAFittingOnesPlace() async throws {
        let history = HeldHistory()
        let hub = MarketDataHub(wire: .polygon, history: nil)
        var settings = GapFillSettings()
        settings.maxWindow = .seconds(60)
        let filler = GapFiller(market: .stocks, hub: hub, history: history, pace: RequestPace(perSecond: 1_000), settings: settings)
        let ends = Ends()
        await filler.start(into: ends)
        let topic = try #require(Topic(parsing: "T.AAPL"))
        func request(_ generation: Int, from: Int64, through: Int64) -> GapFillRequest {
            GapFillRequest(from: from, through: through, topics: [.init(topic: topic, holders: 1, lastBefore: nil)], generation: generation)
        }
        await filler.enqueue(request(1, from: 1_000_000, through: 1_005_000))
        try await eventually("the first fill to ask for its page") { history.asked.withLock { $0.count } == 1 }
        await filler.enqueue(request(2, from: 2_000_000, through: 2_005_000))
        // Each later one covers the second's gaps and spans more than a minute: the last one waits after it.
        await filler.enqueue(request(3, from: 2_000_000, through: 2_090_000))
        await filler.enqueue(request(4, from: 2_000_000, through: 2_095_000))
        history.release()
        await filler.idle()
        #expect(ends.generations.withLock { $0 } == [1, 2, 4], "the fitting one filled, then the newest told skipped")
        #expect(history.asked.withLock { $0.map(\.lowerBound) } == [1_000_000, 2_000_000])
        await filler.stop()
    }
}
