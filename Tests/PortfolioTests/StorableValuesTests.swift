import Foundation
import GRDB
import RelayTestSupport
import Testing

@testable import PortfolioData
@testable import PortfolioDomain

/// Everything the store writes it can read back: what a REST host's prices, or a quantity times a
/// price, may make is kept to the places the store reads, and a row an older version stored unreadable
/// neither stops the history nor stays.
@Suite("Storable values")
struct StorableValuesTests {
    @Test func aValueIsRoundedToItsPlacesAndOneWithTooManyDigitsIsNotStorable() throws {
        let long = try #require(Decimal(string: "0.123456789012345678901234"))
        #expect(DecimalText.storable(long, scale: 8) == Decimal(string: "0.12345679"))
        #expect(DecimalText.storable(long, scale: 40) == Decimal(string: "0.123456789012345679"), "at most 18 places")
        #expect(DecimalText.storable(Decimal(string: "1e40") ?? 0, scale: 8) == nil)
        #expect(DecimalText.storable(.nan, scale: 8) == nil)
        #expect(DecimalText.storable(-12.5, scale: 8) == -12.5)
    }

    /// An account's name is bounded in bytes (one character can carry a megabyte of combining marks,
    /// and the name is in every valuation and push frame) and is visible text (no direction overrides).
    @Test func anAccountNameIsBoundedInBytesAndVisible() async throws {
        let dir = scratchDirectory("names")
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let store = try PortfolioStore(directory: dir)
        let created = instant("2024-01-01T00:00:00Z")
        for name in [String(repeating: "a", count: 200), String(repeating: "é", count: 100), "Roth IRA — 2024 (€)", "سرمایه\u{200C}گذاری", "Dev 👨\u{200D}💻\u{00A0}fund"] {
            let account = try await store.createAccount(name: name, kind: .brokerage, currency: "USD", createdAt: created)
            #expect(account.name == name)
        }
        let oneCharacter = "a" + String(repeating: "\u{301}", count: 500_000)
        #expect(oneCharacter.count == 1)
        for refused in [oneCharacter, String(repeating: "é", count: 101), "Savings \u{202E}gnp.exe", "tab\there", "line\nbreak"] {
            await #expect(throws: ValidationError.self, "\(refused.prefix(20).debugDescription)") {
                _ = try await store.createAccount(name: refused, kind: .brokerage, currency: "USD", createdAt: created)
            }
        }
        #expect(try await store.accounts().count == 5)
    }

    @Test func snapshotsAndClosesAreStoredReadablyAndUnreadableRowsAreSkippedThenReplaced() async throws {
        let dir = scratchDirectory("storable")
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let store = try PortfolioStore(directory: dir)
        let account = try await store.createAccount(name: "A", kind: .brokerage, currency: "USD", createdAt: instant("2024-01-01T00:00:00Z"))
        let long = try #require(Decimal(string: "1234.123456789012345678901234"))
        let huge = try #require(Decimal(string: "1e40"))

        // A quantity times a price with more places than the store keeps, and a value no market has.
        try await store.saveSnapshots(
            [
                AccountSnapshot(accountID: account.id, day: day("2024-01-02"), value: long, cash: long, partial: false, source: .valuation),
                AccountSnapshot(accountID: account.id, day: day("2024-01-03"), value: huge, cash: 1, partial: false, source: .valuation),
            ],
            portfolio: [PortfolioSnapshot(day: day("2024-01-02"), total: huge, cash: 0, partial: false)])
        let rows = try await store.accountSnapshots(accountID: account.id, from: day("2024-01-02"), through: day("2024-01-03"))
        #expect(rows.map(\.value) == [try #require(Decimal(string: "1234.12345679")), 0])
        #expect(rows.map(\.partial) == [false, true], "a value that cannot be stored is told as partial")
        #expect(try await store.portfolioSnapshots(from: day("2024-01-02"), through: day("2024-01-02")).first?.partial == true)

        // A REST host's closes: one with too many places is rounded, one with too many digits is not kept.
        try await store.saveCloses("ZZ", [(day("2024-01-02"), long), (day("2024-01-03"), huge)], covering: day("2024-01-02")...day("2024-01-03"))
        let closes = try await store.closes(of: ["ZZ"], from: day("2024-01-01"), through: day("2024-01-05"))
        #expect(closes["ZZ"]?.map(\.close) == [try #require(Decimal(string: "1234.1234567890"))])

        // What an older version stored unreadable (an overflow's NaN): skipped by reads, replaced by the next history.
        try await sideConnection(to: store.path).write { db in
            try db.execute(sql: "INSERT INTO dailyClose (symbol, day, close) VALUES ('ZZ', '2024-01-04', 'NaN')")
            try db.execute(sql: "UPDATE accountSnapshot SET value = 'NaN' WHERE day = '2024-01-02'")
            try db.execute(sql: "UPDATE portfolioSnapshot SET total = 'NaN' WHERE day = '2024-01-02'")
        }
        #expect(try await store.closes(of: ["ZZ"], from: day("2024-01-01"), through: day("2024-01-05"))["ZZ"]?.count == 1)
        let written = try await store.replaceHistory(
            [AccountSnapshot(accountID: account.id, day: day("2024-01-02"), value: 7, cash: 7, partial: false, source: .valuation)],
            accountDays: [account.id: (day("2024-01-02"), day("2024-01-02"))],
            portfolio: [PortfolioSnapshot(day: day("2024-01-02"), total: 7, cash: 7, partial: false)], portfolioDays: (day("2024-01-02"), day("2024-01-02")))
        #expect(written.written == 2)
        #expect(try await store.accountSnapshots(accountID: account.id, from: day("2024-01-02"), through: day("2024-01-02")).map(\.value) == [7])
        #expect(try await store.portfolioSnapshots(from: day("2024-01-02"), through: day("2024-01-02")).map(\.total) == [7])
    }

    @Test func aHistoryWithARowAnOlderVersionStoredUnreadableIsRecomputedAndTheRowReplaced() async throws {
        let dir = scratchDirectory("storable")
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let (store, service, account, start, today) = try await SnapshotServiceTests.yearOfCash(in: dir)
        try await service.backfill()
        let day = DayCalendar.utc.day(start, addingDays: 3)
        try await sideConnection(to: store.path).write { db in
            try db.execute(sql: "UPDATE accountSnapshot SET value = 'NaN' WHERE day = ?", arguments: [day.description])
            try db.execute(sql: "UPDATE portfolioSnapshot SET total = 'NaN' WHERE day = ?", arguments: [day.description])
        }
        // Left out when read, not a failure of the whole history.
        #expect(try await store.accountSnapshots(accountID: account.id, from: day, through: day).isEmpty)
        try await service.backfill()
        #expect(try await store.accountSnapshots(accountID: account.id, from: day, through: day).map(\.value) == [100])
        #expect(try await store.portfolioSnapshots(from: day, through: day).map(\.total) == [100])
        #expect(try await store.accountSnapshots(accountID: account.id, from: start, through: today).count > 300)
    }
}
