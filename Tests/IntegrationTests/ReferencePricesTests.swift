import AsyncHTTPClient
import DemoFeed
import Foundation
import MarketDataHub
import Portfolio
import PortfolioData
import PortfolioDomain
import MarketREST
import PolygonRESTClient
import RelayComposition
import RelayConfiguration
import Synchronization
import Testing
import PolygonWire

/// The REST client against the demo feed's Polygon-style endpoints, over loopback.
@Suite("Reference prices over REST", .timeLimit(.minutes(2)))
struct ReferencePricesTests {
    func feed(failures: Int = 0) -> DemoFeed {
        var configuration = DemoFeedConfiguration(port: 0, apiKey: "rest-key", eventsPerSecond: 100, seed: 4)
        configuration.restFailures = failures
        return DemoFeed(configuration: configuration, logger: testLogger)
    }

    @Test func eachSymbolGetsItsOwnResult() async throws {
        let feed = feed()
        try await withServices([feed]) {
            let source = ReferencePrices(rest: PolygonREST(baseURL: "http://127.0.0.1:\(try await feed.listeningPort())", apiKey: "rest-key", client: vendorTestClient))
            let results = await source.fetch(["AAPL", "MSFT", "NOPE"])
            let aapl = try results["AAPL"]?.get()
            #expect(aapl?.lastTrade?.source == .restLastTrade)
            #expect((aapl?.previousClose ?? 0) > 0)
            #expect(try results["MSFT"]?.get().lastTrade != nil)
            guard case .failure(.status(404, _)) = results["NOPE"] else {
                Issue.record("expected a 404 for an unknown symbol, got \(String(describing: results["NOPE"]))")
                return
            }
        }
    }

    @Test func aRESTURLGivenWithTheDemoFeedIsUsedWithTheUpstreamKey() async throws {
        // The relay runs its built-in demo feed for the stream, but its REST comes from elsewhere.
        let other = feed()
        try await withServices([other]) {
            let directory = FileManager.default.temporaryDirectory.appendingPathComponent("relay-rest-\(UUID().uuidString)").path
            defer { try? FileManager.default.removeItem(atPath: directory) }
            var settings = RelaySettings(listen: .init(host: "127.0.0.1", port: 0), demoRate: 50, portfolio: .init(dataDirectory: directory))
            settings.upstreamRESTURL = "http://127.0.0.1:\(try await other.listeningPort())"
            settings.upstreamKey = "rest-key"
            let relay = Relay(settings: settings, logger: testLogger)
            try await withServices([relay]) {
                let parts = try await within(.seconds(10), "the relay to start") { try await relay.ready() }
                let base = "http://127.0.0.1:\(parts.port)"
                let id = try await createBrokerageAccount(base)
                let bought = try await httpSend(
                    "POST", "\(base)/v1/accounts/\(id)/transactions",
                    json: #"{"date":"2024-01-02","kind":"buy","symbol":"AAPL","quantity":"1","price":"100"}"#)
                #expect(bought.status == 201)
                // Reference prices for the holding were asked of the other source, with the upstream key
                // (it answers 401 to any other key), and the built-in feed's REST was not used.
                try await eventually("AAPL's reference price from the other source") {
                    other.restCount("trade", "AAPL").completed > 0 || other.restCount("prev", "AAPL").completed > 0
                }
                let demo = try #require(parts.demoFeed)
                #expect(demo.restRequests == 0, "the demo feed's own REST was not used")
                let refused = other.restCountsByKey.values.reduce(0) { $0 + $1.unauthorized }
                #expect(refused == 0, "requests with a key the other source refused: \(other.restCountsByKey)")
            }
        }
    }

    @Test func serverErrorsAreRetriedWithBackoffAndClientErrorsAreNot() async throws {
        let feed = feed(failures: 3)
        try await withServices([feed]) {
            let base = "http://127.0.0.1:\(try await feed.listeningPort())"
            let source = ReferencePrices(rest: PolygonREST(baseURL: base, apiKey: "rest-key", attempts: 4, initialBackoff: .milliseconds(20), client: vendorTestClient))
            // Two requests per symbol; the first three answers are 503, so both succeed within 4 attempts.
            #expect(try await source.reference(for: "AAPL").get().lastTrade != nil)
            #expect(feed.restRequests == 5)
            let wrongKey = ReferencePrices(rest: PolygonREST(baseURL: base, apiKey: "wrong", attempts: 4, initialBackoff: .milliseconds(20), client: vendorTestClient))
            guard case .failure(.status(401, _)) = await wrongKey.reference(for: "AAPL") else {
                Issue.record("expected 401")
                return
            }
            #expect(feed.restRequests == 7, "a 401 is not retried")
        }
    }

    @Test func theFeedStopsWithinItsGraceThoughAnAnswerIsStillOnItsWay() async throws {
        // An answer held back for a minute, its client's connection open: a graceful stop waits for it
        // at most the feed's grace (5 s), then cuts it. `withServices` fails the test when the services
        // have not stopped 15 s after it asked (the hang this guards against held a run for 10 minutes).
        var configuration = DemoFeedConfiguration(port: 0, apiKey: "rest-key", eventsPerSecond: 100, seed: 4)
        configuration.restDelay = .seconds(60)
        let feed = DemoFeed(configuration: configuration, logger: testLogger)
        var socket: RawSocket?
        try await withServices([feed]) {
            let connection = try RawSocket(port: try await feed.listeningPort())
            _ = connection.send("GET /v2/last/trade/AAPL?apiKey=rest-key HTTP/1.1\r\nHost: feed\r\n\r\n")
            socket = connection
            try await eventually("the feed to take the request") { feed.restCount("trade", "AAPL").started == 1 }
        }
        #expect(feed.restCount("trade", "AAPL").completed == 0, "the held-back answer was cut, not waited for")
        _ = socket
    }

    @Test func theFeedStopsWithinItsGraceThoughAConnectionNeverSentARequest() async throws {
        // A client's pool may open a connection and park it unused: Hummingbird's server waits for its
        // first request past any cancellation, which once held a test for ten minutes. The feed's stop
        // cuts it at its grace; `withServices` fails the test if the feed has not stopped in 15 s.
        let feed = DemoFeed(configuration: DemoFeedConfiguration(port: 0, apiKey: "rest-key", eventsPerSecond: 100, seed: 4), logger: testLogger)
        var socket: RawSocket?
        try await withServices([feed]) {
            let connection = try RawSocket(port: try await feed.listeningPort())
            socket = connection
            // The feed answers another connection: the server runs, and took the silent one before it.
            let answered = try RawSocket(port: try await feed.listeningPort())
            _ = answered.send("GET /healthz HTTP/1.1\r\nHost: feed\r\nConnection: close\r\n\r\n")
            let answer = answered.receive().map { String(decoding: $0, as: UTF8.self) } ?? ""
            #expect(answer.hasPrefix("HTTP/1.1 200"), "\(answer)")
        }
        _ = socket
    }

    @Test func aSlowFeedsAnswersOnOneKeptAliveClientAllArrive() async throws {
        // The slow feed watches each connection for the client going away and then closes it after
        // answering; a client that reused such a connection sent its next request into a closing
        // socket (remote connection closed, I/O on closed channel). No retries here: each must succeed.
        var configuration = DemoFeedConfiguration(port: 0, apiKey: "rest-key", eventsPerSecond: 100, seed: 4)
        configuration.restDelay = .milliseconds(2)
        let feed = DemoFeed(configuration: configuration, logger: testLogger)
        try await withServices([feed]) {
            let client = HTTPClient(eventLoopGroupProvider: .singleton)
            let rest = PolygonREST(
                baseURL: "http://127.0.0.1:\(try await feed.listeningPort())", apiKey: "rest-key", attempts: 1, client: client)
            var failures: [String] = []
            for _ in 0..<40 {
                if case .failure(let error) = await rest.lastTrade("AAPL") { failures.append("\(error)") }
            }
            try await client.shutdown()
            #expect(failures.isEmpty, "\(failures.count) of 40 requests failed: \(Set(failures))")
            #expect(feed.restCount("trade", "AAPL").completed == 40)
        }
    }
}

@Suite("Portfolio valued from REST when no tick has arrived")
struct ClosedMarketValuationTests {
    @Test func referencePricesValueHoldingsAndGiveTheDayChange() async throws {
        // A market that sends (almost) nothing: only REST can price the book.
        let feed = DemoFeed(configuration: DemoFeedConfiguration(port: 0, apiKey: "k", eventsPerSecond: 0.001, seed: 8), logger: testLogger)
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("relay-closed-\(UUID().uuidString)").path
        defer { try? FileManager.default.removeItem(atPath: directory) }
        try await withServices([feed]) {
            let store = try PortfolioStore(directory: directory)
            let account = try await store.createAccount(
                name: "A", kind: .brokerage, currency: "USD", createdAt: Date(timeIntervalSince1970: 1_700_000_000))
            _ = try await store.addTransaction(
                accountID: account.id, date: Day(year: 2024, month: 1, day: 2), kind: .buy, symbol: "MSFT", quantity: 2, price: 400, fees: 0
            )
            let service = PortfolioService(
                store: store, hub: MarketDataHub(wire: .polygon),
                referencePrices: ReferencePrices(rest: PolygonREST(baseURL: "http://127.0.0.1:\(try await feed.listeningPort())", apiKey: "k", client: vendorTestClient)))
            try await withServices([service]) {
                let updates = await service.valuationUpdates()
                let valuation = try await waitFor(updates, "MSFT priced from REST") { $0.positions.first?.status == .priced }
                let row = try #require(valuation.positions.first)
                #expect(row.priceSource == .restLastTrade)
                #expect(row.dayChange != nil)
                #expect(valuation.positionsValue == row.marketValue)
            }
        }
    }
}

/// The portfolio's REST source against a host that answers what no real one should: every answer is
/// bounded by what was asked, an error's body is read only as far as its text is used, and no redirect
/// is followed.
@Suite("Reference prices from a hostile REST host", .serialized, .timeLimit(.minutes(2)))
struct HostileReferenceTests {
    let key = "hostile-reference-key"

    func rest(_ host: HostileREST) -> PolygonREST {
        PolygonREST(baseURL: "http://127.0.0.1:\(host.port)", apiKey: key, attempts: 3, initialBackoff: .milliseconds(10), timeout: .seconds(5), client: vendorTestClient)
    }

    static func row(_ day: String, close: String) -> String {
        let date = ISO8601DateFormatter().date(from: day + "T00:00:00Z") ?? Date(timeIntervalSince1970: 0)
        return #"{"t":\#(Int64(date.timeIntervalSince1970 * 1000)),"o":1,"h":2,"l":0.5,"c":\#(close),"v":10}"#
    }

    /// A symbol bought and sold again and again asks for its reference prices once at a time, and only
    /// while it is held: each buy started a request of its own before, queued without bound behind a
    /// rate-limited plan, for symbols gone by the time they were asked.
    @Test func holdingsBoughtAndSoldInARowAskOnlyForWhatIsStillHeld() async throws {
        // The host answers once the buying and selling is over: what was asked meanwhile waits.
        let over = Gate()
        let host = try HostileREST { _, _ in
            while !over.isOpen { Thread.sleep(forTimeInterval: 0.01) }
            return .status(404, #"{"status":"NOT_FOUND","message":"none"}"#)
        }
        defer { host.close() }
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("relay-churn-\(UUID().uuidString)").path
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let store = try PortfolioStore(directory: directory)
        let account = try await store.createAccount(name: "A", kind: .brokerage, currency: "USD", createdAt: Date(timeIntervalSince1970: 1_700_000_000))
        // A request waits for the gate however long the churn takes.
        let rest = PolygonREST(baseURL: "http://127.0.0.1:\(host.port)", apiKey: key, attempts: 1, timeout: .seconds(120), client: vendorTestClient)
        let service = PortfolioService(store: store, hub: MarketDataHub(wire: .polygon), referencePrices: ReferencePrices(rest: rest))
        defer { over.open() }
        try await withServices([service]) {
            for _ in 0..<20 {
                for kind in [TransactionKind.buy, .sell] {
                    _ = try await store.addTransaction(
                        accountID: account.id, date: Day(year: 2024, month: 1, day: 2), kind: kind, symbol: "CHURN", quantity: 1, price: 10, fees: 0)
                    try await service.holdingsChanged()
                }
            }
            over.open()
            try await eventually("the reference loader to finish") { await !service.isLoadingReferences }
        }
        // Two requests a load (the last trade, the previous close): the first buy's; one load a buy was 40.
        let targets = host.requests.withLock { $0.map(\.target).filter { $0.contains("/last/trade/CHURN") || $0.contains("/CHURN/prev") } }
        #expect(targets.count <= 2, "\(targets.count) requests for a symbol bought and sold 20 times: \(targets)")
    }

    /// Opens once, from any thread.
    final class Gate: Sendable {
        private let state = Atomic<Bool>(false)
        var isOpen: Bool { state.load(ordering: .acquiring) }
        func open() { state.store(true, ordering: .releasing) }
    }

    @Test func dailyBarsAreOnlyTheAskedDaysOneADayAndNeverChangeStoredClosesOfOthers() async throws {
        let rows = [
            Self.row("2020-01-02", close: "999"), Self.row("2024-03-04", close: "10"), Self.row("2024-03-05", close: "11"),
            Self.row("2024-03-05", close: "12"), Self.row("2024-03-06", close: "0"), Self.row("2024-03-07", close: "13"),
            Self.row("2024-03-08", close: "14"), Self.row("2031-01-02", close: "15"),
        ]
        let host = try HostileREST { _, _ in .json(#"{"status":"OK","results":[\#(rows.joined(separator: ","))]}"#) }
        defer { host.close() }
        let from = Day(year: 2024, month: 3, day: 4)
        let to = Day(year: 2024, month: 3, day: 8)
        let bars = try await rest(host).dailyBars("AAPL", from: from, to: to).get()
        let days = bars.map { DayCalendar.utc.day(of: Date(timeIntervalSince1970: Double($0.start) / 1000)) }
        #expect(days.map(\.description) == ["2024-03-04", "2024-03-05", "2024-03-07", "2024-03-08"])
        #expect(bars.map(\.close) == [10, 12, 13, 14], "a day sent twice is its last; a close of 0 is none")

        // The store keeps a source's closes to the days it was asked for, whoever calls it.
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("relay-closes-\(UUID().uuidString)").path
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let store = try PortfolioStore(directory: directory)
        let old = Day(year: 2020, month: 1, day: 2)
        try await store.saveCloses("AAPL", [(old, 75)], covering: old...old)
        try await store.saveCloses("AAPL", [(old, 999), (from, 10)], covering: from...to)
        let kept = try await store.closes(of: ["AAPL"], from: old, through: to)["AAPL"] ?? []
        #expect(kept.map(\.close) == [75, 10])
    }

    @Test func aMarketStatusIsKeptBoundedAndAnAnswerPastItsBoundIsNotAskedForAgain() async throws {
        let exchanges = (0..<2_000).map { #""x\#($0)":"open""# } + [#""\#(String(repeating: "n", count: 100))":"open""#]
        let long = String(repeating: "t", count: 100)
        let big = String(repeating: " ", count: 5 << 20)
        let host = try HostileREST { request, _ in
            request.target.contains("big") ? .json(#"{"market":"open"\#(big)}"#)
                : .json(#"{"market":"open","serverTime":"\#(long)","exchanges":{\#(exchanges.joined(separator: ","))}}"#)
        }
        defer { host.close() }
        let status = try await rest(host).marketStatus().get()
        #expect(status.exchanges?.count == MarketStatus.maxExchanges)
        #expect(status.exchanges?.keys.allSatisfy { $0.utf8.count <= MarketStatus.maxText } == true)
        #expect(status.serverTime == nil)
        host.requests.withLock { $0.removeAll() }
        guard case .failure(.malformed) = await rest(host).get("/big", maxBytes: 64 << 10) else {
            Issue.record("a body past its bound was taken")
            return
        }
        #expect(host.requests.withLock { $0.count } == 1, "an answer past its bound was asked for again")
    }

    @Test func anErrorsBodyIsReadOnlyAsFarAsItsTextIsUsed() async throws {
        // A 403 that claims 10 MB, sends 100 KB and holds the rest: its status comes at once.
        let host = try HostileREST { _, _ in .held(sent: 100_000, length: 10_000_000, status: 403) }
        defer { host.close() }
        // Read whole, it would end at the request's timeout, as a transport failure.
        guard case .failure(.status(403, let text)) = await rest(host).lastTrade("AAPL") else {
            Issue.record("the error's status was not told")
            return
        }
        #expect(text.utf8.count <= 4096)
        #expect(host.requests.withLock { $0.count } == 1)
    }

    @Test func aRedirectIsNotFollowed() async throws {
        let elsewhere = try HostileREST { _, _ in .json(#"{"results":{"p":1,"s":1,"t":1}}"#) }
        defer { elsewhere.close() }
        let host = try HostileREST { _, _ in .redirect(to: "http://127.0.0.1:\(elsewhere.port)/v2/last/trade/AAPL") }
        defer { host.close() }
        guard case .failure(.status(302, _)) = await rest(host).lastTrade("AAPL") else {
            Issue.record("a redirect was followed or not told")
            return
        }
        #expect(elsewhere.requests.withLock { $0.count } == 0, "the key went where a redirect pointed")
    }
}
