import Foundation
import PolygonWire
import RelayBench
import Testing

@testable import DemoFeed

/// The demo feed runs inside the relay when no upstream is configured, for as long as the relay does:
/// what its clients (the relay, and through the REST gateway anyone with a key) choose stays bounded.
@Suite("Demo feed: bounded by what its clients send")
struct DemoFeedBoundsTests {
    /// The log of what the relay sent upstream keeps its newest actions, within its bound.
    @Test func theActionLogLetsGoOfItsOldestPastItsBound() {
        var snapshot = DemoFeedMonitor.Snapshot()
        let params = String(repeating: "T.ABCDEFGH,", count: 10_000)
        let count = DemoFeedMonitor.Snapshot.maxActionBytes / params.utf8.count * 3
        for index in 0..<count {
            snapshot.record(.init(connection: index, kind: index.isMultiple(of: 2) ? .subscribe : .unsubscribe, params: params))
        }
        let kept = snapshot.actions.reduce(0) { $0 + $1.params.utf8.count }
        #expect(kept <= DemoFeedMonitor.Snapshot.maxActionBytes, "\(kept) bytes kept")
        #expect(snapshot.actionsLetGo > 0 && snapshot.actionsLetGo + snapshot.actions.count == count)
        #expect(snapshot.actions.last?.connection == count - 1, "the newest is kept")
    }

    /// REST counts are kept per endpoint and ticker for a bounded number of keys (a client chooses the
    /// ticker); every request is still counted, and a known key on its own.
    @Test func restCountsKeepABoundedNumberOfKeysAndCountEveryRequest() {
        var tally = RestTally()
        _ = tally.start("aggs AAPL")
        for index in 0..<(RestTally.maxKeys * 2) { _ = tally.start("aggs RAND\(index)") }
        #expect(tally.start("aggs AAPL") == RestTally.maxKeys * 2 + 2, "every request numbered")
        #expect(tally["aggs AAPL"].started == 2)
        #expect(tally.byKey.count <= RestTally.maxKeys + 1, "\(tally.byKey.count) keys")
        #expect(tally["other"].started > 0)
    }

    /// A coin walked down to a few units keeps no bid at a price of nothing or less (its books sent
    /// `"p":-0.03`).
    @Test func aBookNearZeroHasNoBidAtNothingOrLess() throws {
        var books = DemoBooks(prices: ["DOGE/USD": 3], seed: 1)
        for index in 0..<200 { _ = books.tick(prices: ["DOGE/USD": Int64(1 + index % 3)], nanoseconds: Int64(index)) }
        let bids = try #require(books.books["DOGE/USD"]).bids.keys
        #expect(!bids.isEmpty && bids.allSatisfy { $0 > 0 }, "\(bids.sorted())")
    }

    /// Every generated ticker the feed takes (up to 60,000) has its own name: past 26³ they went round
    /// to `ZAAA` again, and two price walks shared one ticker.
    @Test func everyGeneratedTickerHasItsOwnName() {
        let names = (0..<60_000).map(DemoMarket.generatedTicker)
        #expect(Set(names).count == names.count)
        #expect(names[0] == "ZAAA" && names[17_575] == "ZZZZ" && names[17_576] == "ZAAAA")
    }

    /// The standalone feed refuses what its arithmetic cannot hold, with a message, before it starts.
    @Test(arguments: [["--tickers", "70000"], ["--rate", "1e300"], ["--rate", "inf"], ["--aggregate-seconds", "9223372036854775807"]])
    func theStandaloneFeedRefusesValuesPastWhatItHolds(arguments: [String]) throws {
        let ended = try runRelayCommand(["demo-feed", "--listen", "127.0.0.1:0"] + arguments)
        #expect(ended.reason == .exit && ended.status != 0, "\(arguments): \(ended.output)")
        #expect(ended.output.contains(arguments[0]), "\(arguments): \(ended.output)")
    }
}
