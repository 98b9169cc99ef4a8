import Foundation
import RelayTestSupport
import Synchronization
import Testing

@testable import Portfolio
import PortfolioData
import PortfolioDomain

@Suite("Prefetch window")
struct PrefetchWindowTests {
    let five = ["A", "B", "C", "D", "E"]

    @Test(arguments: [
        (0, ["B"], ["C"]), (1, ["A", "C"], ["D"]), (2, ["B", "D"], ["A", "E"]), (3, ["C", "E"], ["B"]), (4, ["D"], ["C"]),
    ])
    func neighboursAtEveryPositionIncludingTheEdges(index: Int, immediate: [String], delayed: [String]) {
        let window = PrefetchWindow(order: five, viewing: index)
        #expect(window.immediate == immediate)
        #expect(window.delayed == delayed)
    }

    @Test func oneAndTwoSecurities() {
        #expect(PrefetchWindow(order: ["A"], viewing: 0) == PrefetchWindow(order: [], viewing: 0).with(covered: ["A"]))
        let two = PrefetchWindow(order: ["A", "B"], viewing: 1)
        #expect(two.immediate == ["A"])
        #expect(two.delayed.isEmpty)
        #expect(PrefetchWindow(order: five, viewing: 9).covered.isEmpty)
    }
}

extension PrefetchWindow {
    func with(covered: Set<String>) -> PrefetchWindow {
        var copy = self
        copy.covered = covered
        return copy
    }
}

/// Records what the data source was asked for, and what it saw cancelled.
final class LoadRecorder: Sendable {
    let started = Mutex<[String]>([])
    let cancelled = Mutex<[String]>([])
    let finished = Mutex<[String]>([])

    /// A slow source: each load takes `duration` unless cancelled, which it notices at once.
    func load(_ symbol: String, duration: Duration) async -> String {
        started.withLock { $0.append(symbol) }
        do {
            try await Task.sleep(for: duration)
        } catch {
            cancelled.withLock { $0.append(symbol) }
            return "cancelled"
        }
        finished.withLock { $0.append(symbol) }
        return "detail of \(symbol)"
    }

    private let releases = AsyncStream<Void>.makeStream()

    /// A load that finishes only when the test says so (`release()`), or is cancelled: for tests whose
    /// point is what happens while a load is under way, however slowly the machine runs them.
    func heldLoad(_ symbol: String) async -> String {
        started.withLock { $0.append(symbol) }
        var iterator = releases.stream.makeAsyncIterator()
        _ = await iterator.next()
        if Task.isCancelled {
            cancelled.withLock { $0.append(symbol) }
            return "cancelled"
        }
        finished.withLock { $0.append(symbol) }
        return "detail of \(symbol)"
    }

    func release() { releases.continuation.yield() }
}

@Suite("Security cache and prefetching")
struct SecurityCacheTests {
    func cache(_ recorder: LoadRecorder, capacity: Int = 10, duration: Duration = .milliseconds(1)) -> SecurityCache<String> {
        SecurityCache(capacity: capacity, isComplete: { $0.hasPrefix("detail") }) { symbol in
            await recorder.load(symbol, duration: duration)
        }
    }

    @Test func theLeastRecentlyUsedIsEvictedFirst() async throws {
        let recorder = LoadRecorder()
        let cache = cache(recorder, capacity: 3)
        for symbol in ["A", "B", "C"] { #expect(try await cache.detail(symbol).outcome == .miss) }
        #expect(try await cache.detail("A").outcome == .hit)  // A is now the most recent
        _ = try await cache.detail("D")
        #expect(await cache.evicted == ["B"])
        #expect(await cache.symbols == ["D", "A", "C"])
        #expect(await cache.prefetch("E") == .loaded)  // prefetched entries count like any other
        #expect(await cache.evicted == ["B", "C"])
        #expect(await cache.prefetch("E") == .cached)
        #expect(await cache.counters.hits == 1)
    }

    @Test func concurrentRequestsForOneSymbolFetchOnce() async throws {
        let recorder = LoadRecorder()
        let cache = cache(recorder, duration: .milliseconds(200))
        await withTaskGroup(of: String.self) { group in
            for _ in 0..<8 { group.addTask { (try? await cache.detail("AAPL").detail) ?? "refused" } }
            for await detail in group { #expect(detail == "detail of AAPL") }
        }
        #expect(recorder.started.withLock { $0 } == ["AAPL"])
        #expect(await cache.counters.joined == 7)
    }

    @Test func anIncompleteDetailIsLoadedAgain() async throws {
        let flaky = Mutex(true)
        let cache = SecurityCache<String>(isComplete: { $0 == "ok" }) { _ in
            flaky.withLock { first in
                defer { first = false }
                return first ? "partial" : "ok"
            }
        }
        #expect(try await cache.detail("X").detail == "partial")
        #expect(try await cache.detail("X").detail == "ok")
        #expect(await cache.counters.loads == 2)
    }

    @Test func openingNThenNPlusOneAndNPlusTwoIsServedFromCache() async throws {
        let recorder = LoadRecorder()
        let cache = cache(recorder, duration: .milliseconds(100))
        let prefetch = PrefetchCoordinator(cache: cache)
        let order = ["A", "B", "C", "D", "E"]
        _ = try await cache.detail("B")
        await prefetch.viewed(order: order, index: 1)
        // A and C start at once; D after half a second. Wait (bounded) until all three are cached.
        let deadline = ContinuousClock.now + .seconds(5)
        while ContinuousClock.now < deadline {
            if await cache.contains("A"), await cache.contains("C"), await cache.contains("D") { break }
            try await Task.sleep(for: .milliseconds(20))
        }
        let misses = await cache.counters.misses
        #expect(try await cache.detail("C").outcome == .hit)
        #expect(try await cache.detail("D").outcome == .hit)
        #expect(await cache.counters.misses == misses, "C and D came from the cache")
        let until = ContinuousClock.now + .seconds(5)
        while await prefetch.counters.completed < 3, ContinuousClock.now < until { try await Task.sleep(for: .milliseconds(5)) }
        #expect(await prefetch.counters.completed == 3, "the coordinator counted three completed prefetches")
    }

    @Test func movingTheWindowCancelsPrefetchesThatFellOutOfIt() async throws {
        let recorder = LoadRecorder()
        let cache = cache(recorder, duration: .seconds(30))
        let prefetch = PrefetchCoordinator(cache: cache)
        let order = ["A", "B", "C", "D", "E", "F", "G"]
        await prefetch.viewed(order: order, index: 0)  // B now, C later
        try await eventually("only B started") { recorder.started.withLock { $0 } == ["B"] }
        await prefetch.viewed(order: order, index: 6)  // window E, F, G: B and the delayed C go
        try await eventually("only B cancelled") { recorder.cancelled.withLock { $0 } == ["B"] }
        #expect(await prefetch.pending == ["F", "E"])
        #expect(!recorder.started.withLock { $0 }.contains("C"), "the delayed prefetch of C never started")
        try await eventually("F started") { recorder.started.withLock { $0 }.contains("F") }
        await prefetch.cancelAll()
        try await eventually("exactly B, F cancelled") { Set(recorder.cancelled.withLock { $0 }) == ["B", "F"] }
        #expect(await prefetch.pending.isEmpty)
    }

    @Test func aDelayedPrefetchIsReplacedByAnImmediateOneAndALoadingOneIsKept() async throws {
        let recorder = LoadRecorder()
        let cache = cache(recorder, duration: .seconds(30))
        let prefetch = PrefetchCoordinator(cache: cache)
        let order = ["A", "B", "C", "D", "E"]
        await prefetch.viewed(order: order, index: 0)  // B now, C after the delay
        try await eventually("only B started") { recorder.started.withLock { $0 } == ["B"] }
        await prefetch.viewed(order: order, index: 1)  // A and C now (C's delayed prefetch is replaced), D later
        try await eventually("exactly A, B, C started") { Set(recorder.started.withLock { $0 }) == ["A", "B", "C"] }
        #expect(await prefetch.counters.cancelled == 1, "the delayed prefetch of C was replaced")
        #expect(recorder.cancelled.withLock { $0 }.isEmpty, "B was loading and is kept, not restarted")
        await prefetch.viewed(order: order, index: 2)  // B and D now (D replaced), A and E later: A and B are loading, kept
        try await eventually("exactly A, B, C, D started") { Set(recorder.started.withLock { $0 }) == ["A", "B", "C", "D"] }
        #expect(await prefetch.counters.cancelled == 2)
        #expect(recorder.started.withLock { $0 }.count == 4, "each symbol is fetched once")
        #expect(recorder.cancelled.withLock { $0 }.isEmpty)
        await prefetch.cancelAll()
        try await eventually("exactly A, B, C, D cancelled") { Set(recorder.cancelled.withLock { $0 }) == ["A", "B", "C", "D"] }
        #expect(!recorder.started.withLock { $0 }.contains("E"), "the delayed prefetch of E never started")
    }

    @Test func aCancelledPrefetchDoesNotCancelALoadSomeoneIsWaitingFor() async throws {
        let recorder = LoadRecorder()
        let cache = SecurityCache<String>(capacity: 10, isComplete: { $0.hasPrefix("detail") }) { symbol in
            await recorder.heldLoad(symbol)
        }
        let prefetch = PrefetchCoordinator(cache: cache)
        await prefetch.viewed(order: ["A", "B"], index: 0)  // prefetches B
        try await eventually("only B started") { recorder.started.withLock { $0 } == ["B"] }
        async let request = cache.detail("B")  // joins the prefetch's load
        let deadline = ContinuousClock.now + .seconds(5)
        while await cache.counters.joined == 0, ContinuousClock.now < deadline { try await Task.sleep(for: .milliseconds(5)) }
        #expect(await cache.counters.joined == 1, "the request joined the prefetch's load")
        await prefetch.cancelAll()
        recorder.release()  // the load ends only now, so the request cannot have found it cached
        let (detail, outcome) = try await request
        #expect(outcome == .joined)
        #expect(detail == "detail of B", "the request still got the whole detail")
        #expect(recorder.cancelled.withLock { $0 }.isEmpty)
        #expect(recorder.started.withLock { $0 } == ["B"])
    }

    @Test func aNewListPrefetchesItsFirstSecurity() async throws {
        let recorder = LoadRecorder()
        let cache = cache(recorder)
        let prefetch = PrefetchCoordinator(cache: cache)
        await prefetch.listed(order: ["M", "N"])
        try await eventually("only M finished") { recorder.finished.withLock { $0 } == ["M"] }
        while await !cache.contains("M") { try await Task.sleep(for: .milliseconds(5)) }
        await prefetch.listed(order: ["M", "N"])
        #expect(await prefetch.counters.skipped == 1, "already cached: skipped")
        await prefetch.listed(order: [])
        #expect(await prefetch.counters.started == 1)
    }

    @Test func aRequestBeyondTheLoadBoundIsRefusedAndPrefetchesTakeAtMostHalf() async throws {
        let recorder = LoadRecorder()
        let cache = SecurityCache<String>(capacity: 10, maxLoads: 4, isComplete: { $0.hasPrefix("detail") }) { symbol in
            await recorder.heldLoad(symbol)
        }
        // Two prefetches take half the room; a third is not started.
        let first = Task { await cache.prefetch("P1") }
        let second = Task { await cache.prefetch("P2") }
        try await eventually("exactly P1, P2 started") { Set(recorder.started.withLock { $0 }) == ["P1", "P2"] }
        #expect(await cache.prefetch("P3") == .deferred)
        // Requests take the rest.
        let a = Task { try await cache.detail("A") }
        let b = Task { try await cache.detail("B") }
        try await eventually("4 loads started") { recorder.started.withLock { $0 }.count == 4 }
        #expect(await cache.running == 4)
        do {
            _ = try await cache.detail("C")
            Issue.record("a fifth load was started")
        } catch {
            #expect(error.retryAfter == .seconds(1))
            #expect(error.reason.contains("at most 4 at once"), "\(error.reason)")
        }
        #expect(!recorder.started.withLock { $0 }.contains("C"), "the refused request loaded nothing")
        // Joining a load under way is not a new load: never refused.
        let joined = Task { try await cache.detail("P1") }
        let deadline = ContinuousClock.now + .seconds(5)
        while await cache.counters.joined == 0, ContinuousClock.now < deadline { try await Task.sleep(for: .milliseconds(5)) }
        #expect(await cache.counters.joined == 1, "the request joined P1's load before it ended")
        for _ in 0..<4 { recorder.release() }
        #expect(try await joined.value.outcome == .joined)
        #expect(try await a.value.detail == "detail of A")
        #expect(try await b.value.detail == "detail of B")
        #expect(await first.value == .loaded)
        #expect(await second.value == .loaded)
        #expect(await cache.running == 0)
        let (counters, later) = (await cache.counters, Task { try await cache.detail("C") })
        #expect(counters.refused == 1 && counters.prefetchesDeferred == 1)
        recorder.release()
        #expect(try await later.value.outcome == .miss, "with room again, the request loads")
    }

    @Test func aRequestOutwaitingItsLoadIsAnsweredAndTheLoadEndsInTheCache() async throws {
        let recorder = LoadRecorder()
        let cache = SecurityCache<String>(capacity: 10, maxWait: .milliseconds(200), isComplete: { $0.hasPrefix("detail") }) { symbol in
            await recorder.heldLoad(symbol)
        }
        let asked = ContinuousClock.now
        do {
            _ = try await cache.detail("A")
            Issue.record("the request was answered with a detail its load never gave")
        } catch {
            #expect(error.retryAfter == .seconds(5))
            #expect(error.reason.contains("still loading"), "\(error.reason)")
        }
        #expect(ContinuousClock.now - asked < .seconds(5), "the request waited about its bound, not for the load")
        // The load was not cancelled: it goes on, and what it brings is cached.
        #expect(await cache.loadingSymbols == ["A"])
        #expect(recorder.cancelled.withLock { $0 }.isEmpty)
        recorder.release()
        try await eventually("only A finished") { recorder.finished.withLock { $0 } == ["A"] }
        let deadline = ContinuousClock.now + .seconds(5)
        while await !cache.contains("A"), ContinuousClock.now < deadline { try await Task.sleep(for: .milliseconds(5)) }
        #expect(try await cache.detail("A").outcome == .hit)
        #expect(await cache.running == 0)
        #expect(await cache.counters.timedOut == 1)
    }

    @Test func aLoadLeftRunningThatNobodyWaitsForIsGivenUpInTime() async throws {
        let recorder = LoadRecorder()
        let cache = SecurityCache<String>(
            capacity: 10, maxLoads: 1, maxWait: .milliseconds(100), keptFor: .milliseconds(300), isComplete: { $0.hasPrefix("detail") }
        ) { symbol in
            await recorder.heldLoad(symbol)
        }
        await #expect(throws: DetailUnavailable.self) { try await cache.detail("A") }
        #expect(await cache.running == 1, "kept for the cache")
        // Never released: given up, its slot free again.
        try await eventually("only A cancelled") { recorder.cancelled.withLock { $0 } == ["A"] }
        #expect(await cache.running == 0)
        #expect(await cache.counters.loadsCancelled == 1)
        #expect(!(await cache.contains("A")))
    }
}

@Suite("Security detail: REST times")
struct SecurityDetailTimeTests {
    /// A REST host's time in the future is taken as now (as a live event's is), so the live trades and
    /// quotes that follow still replace it; one in the past is kept to the nanosecond's second.
    @Test func aRESTTimeInTheFutureIsTakenAsNow() {
        let before = Date()
        let far = SecurityDetailLoader.date(nanoseconds: 4_102_444_800 * 1_000_000_000)  // 2100-01-01
        #expect(far >= before && far <= Date(), "\(far)")
        #expect(SecurityDetailLoader.date(nanoseconds: 1_700_000_000_500_000_000) == Date(timeIntervalSince1970: 1_700_000_000.5))
    }
}

/// A security's detail lists at most ``SecurityDetailLoader/maxListed`` transactions (the newest) and
/// lots (the oldest), however many an account holds; the totals count every lot.
@Suite("Security detail: bounded lists")
struct SecurityDetailListsTests {
    @Test func theListsAreBoundedAndTheTotalsCountEveryLot() async throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("relay-detail-\(UUID().uuidString)").path
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let store = try PortfolioStore(directory: directory)
        let today = DayCalendar.utc.day(of: .now)
        let start = DayCalendar.utc.day(today, addingDays: -200)
        var lines = ["account,date,kind,symbol,quantity,price,fees,amount", "A,\(start),deposit,,,,,1000000"]
        for index in 0..<1_500 { lines.append("A,\(DayCalendar.utc.day(start, addingDays: index / 10)),buy,X,1,\(index + 1)") }
        _ = try TransactionImport.apply(try TransactionImport.parse(lines.joined(separator: "\n")), to: store)
        let loader = SecurityDetailLoader(store: store, hub: nil, rest: nil)
        let ledger: Result<SecurityDetailLoader.SymbolLedger, any Error> = .success(try await store.brokerageTransactions(of: "X"))
        guard case .loaded(let transactions) = loader.transactions("X", ledger: ledger, today: today),
            case .loaded(let lots) = loader.taxLots("X", ledger: ledger, today: today)
        else {
            Issue.record("both groups load")
            return
        }
        #expect(transactions.count == SecurityDetailLoader.maxListed)
        #expect(transactions.first?.transaction.price == dec("1500"), "the newest first")
        #expect(lots.lots.count == SecurityDetailLoader.maxListed)
        #expect(lots.lots.first?.unitCost == dec("1") && lots.lots.last?.unitCost == dec("1000"), "the oldest, the next a sell takes")
        #expect(lots.sharesAvailable == dec("1500"), "every lot counted")
    }
}
