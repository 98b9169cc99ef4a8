import Foundation
import Hummingbird
import Logging
import MarketDataHub
import MarketREST
import NIOCore
@testable import Portfolio
import PolygonRESTClient
import PortfolioData
import PortfolioDomain
@testable import RESTGateway
import Synchronization
import Testing

/// A REST host on loopback that answers each path with the body it was given (503 for any other, each
/// counted): what a broken or hostile vendor host sends, through the relay's real HTTP client.
final class ScriptedRESTHost: Sendable {
    let answers: [String: String]
    /// Requests for paths it has no answer for, by path.
    let unanswered = Mutex<[String: Int]>([:])
    /// Every request's path and query, as received.
    let asked = Mutex<[String]>([])

    init(answers: [String: String]) { self.answers = answers }

    /// Runs the host for `body`, which is given its base URL.
    func serve<T: Sendable>(_ body: (String) async throws -> T) async throws -> T {
        let router = Router()
        for (path, answer) in answers {
            router.get(RouterPath(path)) { [self] request, _ in
                self.asked.withLock { $0.append(request.uri.path + "?" + (request.uri.query ?? "")) }
                return Response(status: .ok, headers: [.contentType: "application/json"], body: .init(byteBuffer: ByteBuffer(string: answer)))
            }
        }
        router.get("**") { [self] request, _ in
            self.unanswered.withLock { $0[request.uri.path, default: 0] += 1 }
            return Response(status: .serviceUnavailable, body: .init(byteBuffer: ByteBuffer(string: #"{"status":"ERROR"}"#)))
        }
        let (ports, listening) = AsyncStream.makeStream(of: Int.self)
        let app = Application(
            router: router, configuration: .init(address: .hostname("127.0.0.1", port: 0)),
            onServerRunning: { channel in listening.yield(channel.localAddress?.port ?? 0) }, logger: testLogger)
        return try await withServices([app]) {
            let port = try await within(.seconds(10), "the scripted REST host to listen") {
                for await port in ports { return port }
                throw TimeoutError(description: "the scripted REST host never listened")
            }
            return try await body("http://127.0.0.1:\(port)")
        }
    }
}

@Suite("A REST host's answers are bounded before they are kept")
struct HostileRESTHostTests {
    /// A book holding ZZ, bought `daysAgo` days ago, valued through a REST host whose every daily-bars
    /// answer for ZZ holds no bar, after `prepare` (more in the store): `body` gets the store and the day
    /// bought once the first close fetch ended, and how many daily-bars requests the host had.
    func withoutBars(
        boughtDaysAgo daysAgo: Double, prepare: (PortfolioStore) async throws -> Void,
        _ body: (PortfolioStore, Day, Int) async throws -> Void
    ) async throws {
        let host = ScriptedRESTHost(answers: ["/v2/aggs/ticker/ZZ/range/1/day/*/*": #"{"status":"OK","results":[]}"#])
        try await host.serve { base in
            let directory = FileManager.default.temporaryDirectory.appendingPathComponent("relay-no-bars-\(UUID().uuidString)").path
            defer { try? FileManager.default.removeItem(atPath: directory) }
            let store = try PortfolioStore(directory: directory)
            let bought = Date.now.addingTimeInterval(-daysAgo * 86_400)
            let account = try await store.createAccount(name: "A", kind: .brokerage, currency: "USD", createdAt: bought)
            _ = try await store.addTransaction(
                accountID: account.id, date: DayCalendar.utc.day(of: bought), kind: .buy, symbol: "ZZ", quantity: 1, price: 10, fees: 0)
            try await prepare(store)
            let service = PortfolioService(
                store: store, hub: MarketDataHub(wire: .polygon),
                referencePrices: ReferencePrices(rest: PolygonREST(baseURL: base, apiKey: "k", attempts: 1, client: vendorTestClient)))
            try await withServices([service]) {
                try await eventually("the close fetch to end") { await service.closeFetchesEnded >= 1 }
            }
            try await body(store, DayCalendar.utc.day(of: bought), host.asked.withLock { $0 }.filter { $0.hasPrefix("/v2/aggs/ticker/ZZ/") }.count)
        }
    }

    /// An answer without a single daily bar (the vendor does not have them yet, or not for this symbol)
    /// covers no day: covered, the days would never be asked for again.
    @Test func anAnswerWithoutADailyBarCoversNoDay() async throws {
        try await withoutBars(boughtDaysAgo: 30, prepare: { _ in }) { store, _, asked in
            #expect(asked == 1)
            let coverage = try await store.closeCoverage()
            #expect(coverage["ZZ"] == nil, "no day is covered by an answer without a bar")
        }
    }

    /// Days before those the vendor has bars of, where it has none (its history does not reach them): an
    /// answer without a bar covers them, or they would be asked for again and again; the days after the
    /// coverage, still without a bar, are not covered.
    @Test func anAnswerWithoutADailyBarBeforeTheDaysCoveredCoversThem() async throws {
        let utc = DayCalendar.utc
        let covered = utc.day(of: Date.now.addingTimeInterval(-30 * 86_400))...utc.day(of: Date.now.addingTimeInterval(-10 * 86_400))
        try await withoutBars(
            boughtDaysAgo: 90, prepare: { try await $0.saveCloses("ZZ", [(covered.lowerBound, 11)], covering: covered, settledThrough: covered.upperBound) }
        ) { store, bought, asked in
            #expect(asked == 2, "the days before and after")
            let coverage = try #require(try await store.closeCoverage()["ZZ"])
            #expect(coverage.days.lowerBound <= bought, "the days before are covered: \(coverage.days)")
            #expect(coverage.days.upperBound == covered.upperBound, "the days after are not: \(coverage.days)")
        }
    }

    @Test func aLastTradeDatedInTheFutureIsTakenAsOfNowNotFreshForEver() async throws {
        let tomorrow = Int64(Date.now.addingTimeInterval(86_400).timeIntervalSince1970) * 1_000_000_000
        let host = ScriptedRESTHost(answers: [
            "/v2/last/trade/AAPL": #"{"status":"OK","results":{"p":12.5,"s":1,"t":\#(tomorrow)}}"#,
            "/v2/aggs/ticker/AAPL/prev": #"{"status":"OK","results":[{"c":12}]}"#,
        ])
        try await host.serve { base in
            let source = ReferencePrices(rest: PolygonREST(baseURL: base, apiKey: "k", attempts: 1, client: vendorTestClient))
            let trade = try #require(try await source.reference(for: "AAPL").get().lastTrade)
            #expect(trade.value == 12.5)
            #expect(trade.at <= .now, "a time in the future would keep the price fresh for ever")
        }
    }

    /// The fills' and the portfolio's REST reads count against the bound the gateway's reads count
    /// against: while other reads hold the bound, a large answer is not read whole beside them (and
    /// the bytes a read counted go back when it ends).
    @Test func aReadCountsAgainstTheBoundTheGatewaysReadsShare() async throws {
        let large = #"{"status":"OK","results":["# + String(repeating: #""x","#, count: 100_000) + #""x"]}"#
        let host = ScriptedRESTHost(answers: ["/v3/large": large])
        try await host.serve { base in
            let reading = ReadingBytes(limit: 64 << 10)
            var rest = PolygonREST(baseURL: base, apiKey: "k", attempts: 3, client: vendorTestClient)
            rest.reading = reading
            // Another read holds 32 KB of the 64.
            #expect(reading.take(32 << 10, holding: 0))
            guard case .failure(.transport(let why)) = await rest.get("/v3/large") else {
                Issue.record("read whole beside another read past the bound")
                return
            }
            #expect(why.contains("reading") && why.contains("rest.answersInFlightMB"), "\(why)")
            #expect(host.asked.withLock { $0.count } == 1, "asked once, not again while the bound is held")
            #expect(reading.bytes == 32 << 10, "the refused read gave its bytes back")
            reading.give(32 << 10)
            // Alone, a read goes on whatever its size.
            let whole = try await rest.get("/v3/large").get()
            #expect(whole.readableBytes == large.utf8.count && reading.bytes == 0)
        }
    }

    @Test func aNextURLIsAskedOfTheRelaysOwnRESTAddressWhateverHostItNames() async throws {
        let host = ScriptedRESTHost(answers: ["/v3/next": #"{"results":[]}"#, "/proxy/v3/next": #"{"results":[1]}"#])
        try await host.serve { base in
            let rest = PolygonREST(baseURL: base, apiKey: "k", attempts: 1, client: vendorTestClient)
            // The vendor's other name and port: followed, on the relay's address, without a key in the query.
            let page = try await rest.get(nextURL: "https://api.massive.com:443/v3/next?cursor=YWJj&apiKey=leaked").get()
            #expect(String(buffer: page) == #"{"results":[]}"#)
            #expect(host.asked.withLock { $0 } == ["/v3/next?cursor=YWJj"])
            // A `+` in a cursor goes back encoded (sent as itself, it is a space to the vendor).
            _ = try await rest.get(nextURL: "https://api.polygon.io/v3/next?cursor=a%2Bb").get()
            #expect(host.asked.withLock { $0.last } == "/v3/next?cursor=a%2Bb")
            // Behind a proxy with a path: that path once.
            let proxied = PolygonREST(baseURL: base + "/proxy", apiKey: "k", attempts: 1, client: vendorTestClient)
            #expect(String(buffer: try await proxied.get(nextURL: "https://proxy.example/proxy/v3/next?cursor=YWJj").get()) == #"{"results":[1]}"#)
            // No path, or one that climbs: nothing asked.
            for link in ["cursor=YWJj", "https://api.polygon.io/v3/../admin?cursor=a", "https://api.polygon.io/v3/%2e%2e/admin"] {
                guard case .failure(.malformed) = await rest.get(nextURL: link) else {
                    Issue.record("\(link) was followed")
                    continue
                }
            }
            // An encoded `?` or `#` stays in the path: it adds no query and cuts no cursor off.
            // (Decoded, it would have asked `/v3/next?x=1`, its cursor cut off by the `#`.)
            let encoded = await rest.get(nextURL: "https://api.polygon.io/v3/next%3Fx=1%23?cursor=YWJj")
            guard case .failure(.status(404, _)) = encoded else {
                Issue.record("a path no route of the host's: \(encoded)")
                return
            }
            #expect(host.asked.withLock { $0.count } == 3, "\(host.asked.withLock { $0 })")
        }
    }

    @Test func aFailingMarketStatusIsAskedOnceForManyDetails() async throws {
        let host = ScriptedRESTHost(answers: [:])
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("relay-status-\(UUID().uuidString)").path
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let store = try PortfolioStore(directory: dir)
        try await host.serve { base in
            let rest = PolygonREST(baseURL: base, apiKey: "k", attempts: 1, client: vendorTestClient)
            let loader = SecurityDetailLoader(store: store, hub: nil, rest: rest)
            for symbol in ["AAPL", "MSFT", "NVDA"] { _ = await loader.load(symbol) }
            #expect(host.unanswered.withLock { $0["/v1/marketstatus/now"] } == 1, "\(host.unanswered.withLock { $0 })")
            #expect(host.unanswered.withLock { $0["/v2/last/trade/MSFT"] } == 1, "the details themselves are asked each")
        }
    }
}
