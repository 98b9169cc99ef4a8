import DemoFeed
import Foundation
import MarketDataHub
import Portfolio
import Testing

/// The REST client against the demo feed's Polygon-style endpoints, over loopback.
@Suite("Reference prices over REST")
struct ReferencePricesTests {
    func feed(failures: Int = 0) -> DemoFeed {
        var configuration = DemoFeedConfiguration(port: 0, apiKey: "rest-key", eventsPerSecond: 100, seed: 4)
        configuration.restFailures = failures
        return DemoFeed(configuration: configuration, logger: testLogger)
    }

    @Test func eachSymbolGetsItsOwnResult() async throws {
        let feed = feed()
        try await withServices([feed]) {
            let source = ReferencePrices(baseURL: "http://127.0.0.1:\(try await feed.listeningPort())", apiKey: "rest-key")
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

    @Test func serverErrorsAreRetriedWithBackoffAndClientErrorsAreNot() async throws {
        let feed = feed(failures: 3)
        try await withServices([feed]) {
            let base = "http://127.0.0.1:\(try await feed.listeningPort())"
            let source = ReferencePrices(baseURL: base, apiKey: "rest-key", attempts: 4, initialBackoff: .milliseconds(20))
            // Two requests per symbol; the first three answers are 503, so both succeed within 4 attempts.
            #expect(try await source.reference(for: "AAPL").get().lastTrade != nil)
            #expect(feed.restRequests == 5)
            let wrongKey = ReferencePrices(baseURL: base, apiKey: "wrong", attempts: 4, initialBackoff: .milliseconds(20))
            guard case .failure(.status(401, _)) = await wrongKey.reference(for: "AAPL") else {
                Issue.record("expected 401")
                return
            }
            #expect(feed.restRequests == 7, "a 401 is not retried")
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
            let account = try store.createAccount(
                name: "A", kind: .brokerage, currency: "USD", createdAt: Date(timeIntervalSince1970: 1_700_000_000))
            _ = try store.addTransaction(
                accountID: account.id, date: Day(year: 2024, month: 1, day: 2), kind: .buy, symbol: "MSFT", quantity: 2, price: 400, fees: 0
            )
            let service = PortfolioService(
                store: store, hub: MarketDataHub(),
                referencePrices: ReferencePrices(baseURL: "http://127.0.0.1:\(try await feed.listeningPort())", apiKey: "k"))
            try await withServices([service]) {
                let updates = await service.valuationUpdates()
                let valuation = try await waitFor(updates, "MSFT priced from REST") { $0.positions.first?.status == .priced }
                let row = try #require(valuation.positions.first)
                #expect(row.priceSource == .restLastTrade)
                #expect(row.dayChange != nil)
                #expect(valuation.total == row.marketValue)
            }
        }
    }
}
