import Foundation
import MarketDataHub
import RelayTestSupport
import Testing
import PolygonWire

@testable import Portfolio
@testable import PortfolioData
@testable import PortfolioDomain

/// The sidecar's snapshot writing against a real SQLite file.
@Suite("Snapshot service")
struct SnapshotServiceTests {
    /// A store in `dir` with one account opened a year ago with a deposit of 100 that day, and a service on it.
    static func yearOfCash(in dir: String) async throws -> (PortfolioStore, PortfolioService, Account, Day, Day) {
        let store = try PortfolioStore(directory: dir)
        let calendar = DayCalendar.utc
        let today = calendar.day(of: .now)
        let start = calendar.day(today, addingYears: -1)
        let account = try await store.createAccount(name: "A", kind: .brokerage, currency: "USD", createdAt: calendar.startOfDay(start))
        _ = try await store.addTransaction(accountID: account.id, date: start, kind: .deposit, amount: 100)
        return (store, PortfolioService(store: store, hub: MarketDataHub(wire: .polygon)), account, start, today)
    }

    @Test func aPartialLiveValueDoesNotReplaceTodaysCompleteRowUntilAllIsPricedAgain() async throws {
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("relay-snapshots-\(UUID().uuidString)").path
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let store = try PortfolioStore(directory: dir)
        let account = try await store.createAccount(name: "A", kind: .brokerage, currency: "USD", createdAt: instant("2024-01-01T00:00:00Z"))
        _ = try await store.addTransaction(accountID: account.id, date: day("2024-01-02"), kind: .buy, symbol: "ZZ", quantity: 1, price: 10)
        let today = DayCalendar.utc.day(of: .now)
        // What the relay wrote before it was restarted: today complete, ZZ at 25 (cash -10).
        try await store.saveSnapshots(
            [AccountSnapshot(accountID: account.id, day: today, value: 15, cash: -10, partial: false, source: .valuation)], portfolio: [])

        // Restarted, no price yet: today's row is kept, not replaced by "partial".
        let service = PortfolioService(store: store, hub: MarketDataHub(wire: .polygon))
        try await service.backfill()
        var row = try #require(try await store.accountSnapshots(accountID: account.id, from: today, through: today).first)
        #expect(row.partial == false)
        #expect(row.value == 15)

        // Priced again: the live value takes over.
        await service.setReference(PriceObservation(value: 30, at: .now, source: .restLastTrade), previousClose: nil, for: "ZZ")
        try await service.backfill()
        row = try #require(try await store.accountSnapshots(accountID: account.id, from: today, through: today).first)
        #expect(row.partial == false)
        #expect(row.value == 20)
        #expect(row.cash == -10)
        // The portfolio's total follows, cash included.
        let total = try #require(try await store.portfolioSnapshots(from: today, through: today).first)
        #expect(total.total == 20)
        #expect(total.cash == -10)
    }

    @Test func aBurstOfWritesSharesTheRecomputationsWaitingFromTheEarliestDayAsked() async throws {
        let dir = scratchDirectory("snapshots")
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let (store, service, account, start, today) = try await Self.yearOfCash(in: dir)
        let calendar = DayCalendar.utc
        try await service.backfill()
        let before = await service.recomputations
        // Fifty deposits at once, each on its own day: the first recomputation runs, the rest join the
        // one waiting behind it, from the earliest day any of them asked.
        let days = Array(calendar.days(from: start, through: today).suffix(60).prefix(50))
        try await withThrowingTaskGroup(of: Void.self) { group in
            for day in days {
                group.addTask {
                    _ = try await store.addTransaction(accountID: account.id, date: day, kind: .deposit, amount: 1)
                    await service.historyChanged(from: day)
                }
            }
            try await group.waitForAll()
        }
        let ran = await service.recomputations - before
        #expect(ran >= 1 && ran <= 3, "\(ran) recomputations for 50 writes")
        // Whatever joined, every deposit is in the history: the last day holds all fifty.
        let history = try await store.accountSnapshots(accountID: account.id, from: start, through: today)
        #expect(history.last?.cash == 150)
        #expect(history.first(where: { $0.day == days[0] })?.cash == 101, "the earliest day asked was recomputed")
    }

    @Test func aBackfillWritesOnlyTheDaysThatChanged() async throws {
        let dir = scratchDirectory("snapshots")
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let (store, service, account, start, today) = try await Self.yearOfCash(in: dir)
        let calendar = DayCalendar.utc
        let days = calendar.days(from: start, through: today).count

        try await service.backfill()
        #expect(await service.lastHistoryWrite.written == 2 * days, "every day of the account and of the portfolio, once")
        try await service.backfill()
        #expect(await service.lastHistoryWrite == PortfolioStore.HistoryWrite(), "nothing changed, nothing written")

        // A deposit dated ten days ago changes those ten days and today, account and portfolio.
        let tenDaysAgo = calendar.days(from: start, through: today).suffix(11).first ?? today
        _ = try await store.addTransaction(accountID: account.id, date: tenDaysAgo, kind: .deposit, amount: 5)
        try await service.backfill()
        #expect(await service.lastHistoryWrite.written == 2 * 11)
        let history = try await store.accountSnapshots(accountID: account.id, from: start, through: today)
        #expect(history.count == days)
        #expect(history.last?.cash == 105)
        #expect(history.first?.cash == 100)
    }

    /// Issue 22 item 11: a change recomputes the days from its own on, the minute's tick today only, and
    /// rows another process added (`relay portfolio import`) from their day on.
    @Test func aRecomputationStartsAtTheDayAChangeTouches() async throws {
        let dir = scratchDirectory("snapshots")
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let (store, service, account, start, today) = try await Self.yearOfCash(in: dir)
        let calendar = DayCalendar.utc
        try await service.backfill()
        // A row long before any change below, marked: a recomputation reaching back to it would put it right.
        let marked = calendar.day(start, addingDays: 10)
        try await store.saveSnapshots(
            [AccountSnapshot(accountID: account.id, day: marked, value: 999, cash: 999, partial: false, source: .carried)], portfolio: [])
        @Sendable func row(_ day: Day) async throws -> AccountSnapshot? {
            try await store.accountSnapshots(accountID: account.id, from: day, through: day).first
        }

        // The minute's tick: today only (nothing changed there).
        try await service.backfill(from: today)
        #expect(await service.lastHistoryWrite == PortfolioStore.HistoryWrite())
        #expect(try await row(marked)?.value == 999)

        // A deposit ten days ago: those days and today, account and portfolio, nothing before.
        let tenDaysAgo = calendar.day(today, addingDays: -10)
        _ = try await store.addTransaction(accountID: account.id, date: tenDaysAgo, kind: .deposit, amount: 5)
        try await service.backfill(from: tenDaysAgo)
        #expect(await service.lastHistoryWrite.written == 2 * 11)
        #expect(try await row(tenDaysAgo)?.cash == 105)
        #expect(try await row(calendar.previous(tenDaysAgo))?.cash == 100)
        #expect(try await row(marked)?.value == 999)

        // Another process imports a deposit five days ago: the next recomputation, even the tick's,
        // finds the new row and starts at its day.
        let fiveDaysAgo = calendar.day(today, addingDays: -5)
        let imported = try PortfolioStore(directory: dir, busyTimeout: 10)
        _ = try imported.importTransactions(
            [(account: "A", transaction: .init(date: fiveDaysAgo, kind: .deposit, amount: 1))], newAccounts: "USD")
        try await service.backfill(from: today)
        #expect(await service.lastHistoryWrite.written == 2 * 6)
        #expect(try await row(fiveDaysAgo)?.cash == 106)
        #expect(try await row(calendar.previous(fiveDaysAgo))?.cash == 105)
        #expect(try await row(marked)?.value == 999)
    }
}
