import Foundation
import GRDB
import RelayTestSupport
import Testing

@testable import Portfolio
@testable import PortfolioData
@testable import PortfolioDomain

/// A day's close fetched before it was final (yesterday's, or one that had not come yet) is fetched again
/// with the next new day, not kept for ever.
@Suite("Settled closes")
struct SettledClosesTests {
    @Test func theDaysFetchedBeforeTheyWereFinalAreAskedAgainWithTheNextNewDay() {
        let calendar = DayCalendar.utc
        // Final now through the 8th, unless said.
        func fetch(need: ClosedRange<Day>, have: PortfolioStore.CloseCoverage?, settled: Day = day("2024-03-08")) -> [ClosedRange<Day>] {
            PortfolioService.closesToFetch(need: need, have: have, settled: settled, calendar: calendar)
        }
        // Nothing yet: everything needed.
        #expect(fetch(need: day("2024-03-01")...day("2024-03-10"), have: nil) == [day("2024-03-01")...day("2024-03-10")])
        // Covered through the 10th, settled through the 8th: nothing until a new day is needed, then from the 9th.
        let have = PortfolioStore.CloseCoverage(days: day("2024-02-20")...day("2024-03-10"), settledThrough: day("2024-03-08"))
        #expect(fetch(need: day("2024-03-01")...day("2024-03-10"), have: have).isEmpty)
        #expect(fetch(need: day("2024-03-01")...day("2024-03-11"), have: have) == [day("2024-03-09")...day("2024-03-11")])
        // All settled: from the first day not covered; and before the coverage, what is needed there.
        let settled = PortfolioStore.CloseCoverage(days: day("2024-02-20")...day("2024-03-10"), settledThrough: day("2024-03-10"))
        #expect(fetch(need: day("2024-02-10")...day("2024-03-11"), have: settled) == [day("2024-02-10")...day("2024-02-19"), day("2024-03-11")...day("2024-03-11")])
        // A symbol no longer held (the need ends where the coverage does): its unsettled days once they are
        // final, then nothing.
        #expect(fetch(need: day("2024-03-01")...day("2024-03-10"), have: have, settled: day("2024-03-10")) == [day("2024-03-09")...day("2024-03-10")])
        #expect(fetch(need: day("2024-03-01")...day("2024-03-10"), have: settled, settled: day("2024-03-20")).isEmpty)
        // None settled: the whole coverage again.
        let unsettled = PortfolioStore.CloseCoverage(days: day("2024-03-09")...day("2024-03-10"), settledThrough: day("2024-03-08"))
        #expect(fetch(need: day("2024-03-09")...day("2024-03-11"), have: unsettled) == [day("2024-03-09")...day("2024-03-11")])
    }

    @Test func theStoreKeepsWhereTheSettledDaysEndAndExtendsThemOnlyWhereTheyJoin() async throws {
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("relay-settled-\(UUID().uuidString)").path
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let store = try PortfolioStore(directory: dir)
        // Fetched on the 12th: through the 11th, final through the 10th.
        try await store.saveCloses("ZZ", [(day("2024-03-11"), 5)], covering: day("2024-03-01")...day("2024-03-11"), settledThrough: day("2024-03-10"))
        #expect(try await store.closeCoverage()["ZZ"] == .init(days: day("2024-03-01")...day("2024-03-11"), settledThrough: day("2024-03-10")))
        // The next day's fetch, from the first day not settled: the 11th's close replaced, settled through the 11th.
        try await store.saveCloses("ZZ", [(day("2024-03-11"), 6), (day("2024-03-12"), 7)], covering: day("2024-03-11")...day("2024-03-12"), settledThrough: day("2024-03-11"))
        #expect(try await store.closeCoverage()["ZZ"] == .init(days: day("2024-03-01")...day("2024-03-12"), settledThrough: day("2024-03-11")))
        #expect(try await store.closes(of: ["ZZ"], from: day("2024-03-11"), through: day("2024-03-12"))["ZZ"]?.map(\.close) == [6, 7])
        // An earlier range (a transaction back-dated) leaves where the settled days end.
        try await store.saveCloses("ZZ", [], covering: day("2024-02-01")...day("2024-02-29"), settledThrough: day("2024-03-11"))
        #expect(try await store.closeCoverage()["ZZ"] == .init(days: day("2024-02-01")...day("2024-03-12"), settledThrough: day("2024-03-11")))
        // Without a settled day (an older caller's): all of it is.
        try await store.saveCloses("YY", [], covering: day("2024-03-01")...day("2024-03-05"))
        #expect(try await store.closeCoverage()["YY"]?.settledThrough == day("2024-03-05"))
        // Fetched so early nothing was final: none settled.
        try await store.saveCloses("XX", [], covering: day("2024-03-10")...day("2024-03-11"), settledThrough: day("2024-03-01"))
        #expect(try await store.closeCoverage()["XX"]?.settledThrough == day("2024-03-09"))
    }

    @Test func aCoverageWrittenBeforeSettledDaysWereKeptHasItsLastTwoDaysAskedOnceMore() async throws {
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("relay-settled-\(UUID().uuidString)").path
        defer { try? FileManager.default.removeItem(atPath: dir) }
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        // A file as the version before left it.
        let old = try sideConnection(to: dir + "/portfolio.sqlite")
        try PortfolioStore.migrator.migrate(old, upTo: "v7: the ledger's revision")
        try await old.write { db in
            try db.execute(sql: "INSERT INTO closeCoverage (symbol, fromDay, throughDay) VALUES ('ZZ', '2024-03-01', '2024-03-10')")
        }
        try old.close()
        let store = try PortfolioStore(directory: dir)
        #expect(try await store.closeCoverage()["ZZ"] == .init(days: day("2024-03-01")...day("2024-03-10"), settledThrough: day("2024-03-08")))
    }

    @Test func closesThatDidNotComeAreAskedAgainAfterTenMinutesThenTwiceAsLongADayAtMost() {
        #expect(PortfolioService.closeRetryWait(after: nil) == .seconds(600))
        #expect(PortfolioService.closeRetryWait(after: .seconds(600)) == .seconds(1_200))
        #expect(PortfolioService.closeRetryWait(after: .seconds(60_000)) == .seconds(86_400))
        #expect(PortfolioService.closeRetryWait(after: .seconds(86_400)) == .seconds(86_400))
    }

    @Test func aPricesTimeIsNeverLaterThanWhenItWasSeen() {
        let now = Date(timeIntervalSince1970: 1_700_000_000)
        #expect(EventPrices.seen(1_700_000_100_000_000_000, now: now) == now, "a time in the future counts as now")
        #expect(EventPrices.seen(1_699_999_000_000_000_000, now: now) == Date(timeIntervalSince1970: 1_699_999_000))
        #expect(EventPrices.seen(nil, now: now) == now)
    }

    /// A deleted account takes the closes of the symbols no other transaction names along: an account
    /// bought into thousands of symbols and deleted, again and again, left their closes for good.
    @Test func deletingAnAccountLetsGoOfTheClosesNoTransactionNeeds() async throws {
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("relay-closes-\(UUID().uuidString)").path
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let store = try PortfolioStore(directory: dir)
        let created = Date(timeIntervalSince1970: 1_704_067_200)  // 2024-01-01
        let gone = try await store.createAccount(name: "gone", kind: .brokerage, currency: "USD", createdAt: created, allowNegativeCash: true)
        let kept = try await store.createAccount(name: "kept", kind: .brokerage, currency: "USD", createdAt: created, allowNegativeCash: true)
        _ = try await store.addTransaction(accountID: gone.id, date: day("2024-01-02"), kind: .buy, symbol: "AAA", quantity: 1, price: 1)
        _ = try await store.addTransaction(accountID: gone.id, date: day("2024-01-02"), kind: .buy, symbol: "BBB", quantity: 1, price: 1)
        _ = try await store.addTransaction(accountID: kept.id, date: day("2024-01-02"), kind: .buy, symbol: "BBB", quantity: 1, price: 1)
        for symbol in ["AAA", "BBB"] {
            try await store.saveCloses(symbol, [(day("2024-01-02"), 5)], covering: day("2024-01-02")...day("2024-01-02"))
        }
        try await store.deleteAccount(gone.id)
        let closes = try await store.closes(of: ["AAA", "BBB"], from: day("2024-01-01"), through: day("2024-01-31"))
        #expect(closes["AAA"] == nil && closes["BBB"]?.count == 1)
        #expect(Set(try await store.closeCoverage().keys) == ["BBB"])
    }
}
