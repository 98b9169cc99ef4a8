import Foundation
import Testing

@testable import Portfolio
@testable import PortfolioData
@testable import PortfolioDomain

@Suite("CSV import")
struct ImportTests {
    @Test func theSampleFileImportsAndValuesItsLots() async throws {
        let url = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
            .appendingPathComponent("config/sample-portfolio.csv")
        let rows = try TransactionImport.parse(try String(contentsOf: url, encoding: .utf8))
        #expect(rows.count == 11)
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("relay-import-\(UUID().uuidString)").path
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let store = try PortfolioStore(directory: dir)
        try TransactionImport.apply(rows, to: store)
        let accounts = try await store.accounts()
        #expect(accounts.map(\.name) == ["Core", "Growth"])
        let core = try PositionBook(transactions: try await store.transactions(accountID: accounts[0].id))
        #expect(core.positions["AAPL"]?.quantity == dec("30"))
        #expect(core.positions["AAPL"]?.dividends == dec("7.5"))
        // 20000 deposited, three buys, a sell and a dividend.
        #expect(core.cash == dec("20000") - dec("7426.6") - dec("5564.05") - dec("2179.3") + dec("1939.3") + dec("7.5"))
    }

    @Test(arguments: [
        ("account,date,kind,symbol,quantity,price\nA,2024-13-01,buy,X,1,1", "line 2: date"),
        ("account,date,kind,symbol,quantity,price\nA,2024-01-01,hold,X,1,1", "line 2: kind"),
        ("account,date,kind,symbol,quantity,price\nA,2024-01-01,buy,X,1e3,1", "line 2: quantity"),
        ("account,date,symbol,quantity,price\n", "line 1: kind"),
    ])
    func badLinesAreNamedByNumberAndField(text: String, expected: String) {
        do {
            _ = try TransactionImport.parse(text)
            Issue.record("expected \(expected)")
        } catch {
            #expect(error.description.hasPrefix(expected))
        }
    }

    /// A spreadsheet's export ends its lines in CRLF ("\r\n" is one Character in Swift, never "\n"):
    /// read as LF, the whole file was one line, and an import of nothing said it imported 0.
    @Test func linesEndingInCRLFAreRead() throws {
        let url = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
            .appendingPathComponent("config/sample-portfolio.csv")
        let text = try String(contentsOf: url, encoding: .utf8).replacingOccurrences(of: "\n", with: "\r\n")
        #expect(try TransactionImport.parse(text).count == 11)
        let short = try TransactionImport.parse("account,date,kind,symbol,quantity,price,fees,amount\r\nA,2024-01-01,deposit,,,,,100\r\n")
        #expect(short.count == 1 && short.first?.transaction.amount == dec("100"))
    }

    /// A value past what a `Decimal` holds exactly (38 digits) is refused, not read as another.
    @Test func aValueOfMoreDigitsThanADecimalHoldsIsRefused() {
        #expect(DecimalText.parse("100000000000000000000000000000.000000000000000001") == nil)
        #expect(DecimalText.parse("12345678901234567890.123456789012345678") == dec("12345678901234567890.123456789012345678"))
        #expect(DecimalText.parse("123456789012345678901234567890.12345678") != nil)
        #expect(DecimalText.parse("123456789012345678901234567890.123456789") == nil)
    }

    /// A fee's amount is its `fees`: one of nothing (the amount put in `amount`, as a deposit's) is refused.
    @Test func aFeeOfNothingIsRefused() async throws {
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("relay-import-\(UUID().uuidString)").path
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let store = try PortfolioStore(directory: dir)
        let rows = try TransactionImport.parse("account,date,kind,symbol,quantity,price,fees,amount\nA,2024-01-01,deposit,,,,,100\nA,2024-01-02,fee,,,,,25")
        let error = try #require(throws: TransactionImport.LineError.self) { try TransactionImport.apply(rows, to: store) }
        #expect(error.line == 3 && error.field == "fees")
    }

    /// Rows dated before an account's latest transaction (older statements imported later) are checked
    /// together once, not each by a replay of the whole account; an impossible one is still named by line.
    @Test func olderRowsImportedIntoAnAccountWithLaterOnesAreCheckedAndNamed() async throws {
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("relay-import-\(UUID().uuidString)").path
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let store = try PortfolioStore(directory: dir)
        let header = "account,date,kind,symbol,quantity,price,fees,amount\n"
        _ = try TransactionImport.apply(try TransactionImport.parse(header + "A,2020-01-01,deposit,,,,,100000\nA,2025-06-02,deposit,,,,,1"), to: store)
        // 2,000 buys and sells between the two deposits.
        var lines: [String] = []
        for index in 0..<1_000 {
            let day = String(format: "2021-%02d-%02d", index % 12 + 1, index % 28 + 1)
            lines.append("A,\(day),buy,X,2,10")
            lines.append("A,\(day),sell,X,1,10")
        }
        #expect(try TransactionImport.apply(try TransactionImport.parse(header + lines.joined(separator: "\n")), to: store) == 2_000)
        let account = try #require(try await store.accounts().first)
        let book = try PositionBook(transactions: try await store.transactions(accountID: account.id))
        #expect(book.positions["X"]?.quantity == dec("1000"))
        // An oversell among them: named by its line, and nothing of the import kept.
        let bad = header + "A,2022-01-01,buy,Y,1,10\nA,2022-01-02,sell,Y,2,10\nA,2022-01-03,buy,Y,5,10"
        let error = try #require(throws: TransactionImport.LineError.self) { try TransactionImport.apply(try TransactionImport.parse(bad), to: store) }
        #expect(error.line == 3 && error.field == "quantity", "\(error)")
        #expect(try await store.transactions(accountID: account.id).count == 2_002)
    }

    @Test func anOversellIsRefusedWithItsLine() async throws {
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("relay-import-\(UUID().uuidString)").path
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let store = try PortfolioStore(directory: dir)
        let rows = try TransactionImport.parse(
            "account,date,kind,symbol,quantity,price,fees,amount\nA,2024-01-01,deposit,,,,,100\nB,2024-01-02,buy,Y,1,10\nA,2024-01-02,buy,X,1,10\nA,2024-01-03,sell,X,2,10")
        let error = try #require(throws: TransactionImport.LineError.self) { try TransactionImport.apply(rows, to: store) }
        #expect(error.line == 5)
        #expect(error.field == "quantity")
        // All or nothing: the rows before it, and the accounts it created, are not there either.
        #expect(try await store.accounts().isEmpty)
    }

    @Test func depositsAndWithdrawalsImportWithTheirAmount() async throws {
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("relay-import-\(UUID().uuidString)").path
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let store = try PortfolioStore(directory: dir)
        let rows = try TransactionImport.parse(
            "account,date,kind,symbol,quantity,price,fees,amount\nA,2024-01-01,deposit,,,,,100\nA,2024-01-02,buy,X,1,10,1\nA,2024-01-03,withdrawal,,,,,89")
        #expect(try TransactionImport.apply(rows, to: store) == 3)
        let account = try #require(try await store.accounts().first)
        #expect(try PositionBook(transactions: try await store.transactions(accountID: account.id)).cash == 0)
        let overdraw = try TransactionImport.parse("account,date,kind,symbol,quantity,price,amount\nA,2024-01-04,withdrawal,,,,1")
        let error = try #require(throws: TransactionImport.LineError.self) { try TransactionImport.apply(overdraw, to: store) }
        #expect(error.field == "amount")
    }

    /// Issue 22 item 7: an imported symbol is held to the ticker rules of a subscription, named by line.
    @Test(arguments: ["*", "AM.*", "ZZZQ;Q.AAPL", "A B", String(repeating: "A", count: 41)])
    func aSymbolThatIsNoTickerIsRefusedWithItsLine(symbol: String) async throws {
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("relay-import-\(UUID().uuidString)").path
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let store = try PortfolioStore(directory: dir)
        let rows = try TransactionImport.parse("account,date,kind,symbol,quantity,price\nA,2024-01-02,buy,AAPL,1,10\nA,2024-01-03,buy,\(symbol),1,10")
        let error = try #require(throws: TransactionImport.LineError.self) { try TransactionImport.apply(rows, to: store) }
        #expect(error.line == 3)
        #expect(error.field == "symbol")
        #expect(try await store.accounts().isEmpty)
    }

    /// Issue 22 item 11: an imported date is bounded like any other, named by line.
    @Test(arguments: ["0001-01-01", "1969-12-31", "2999-01-01"])
    func aDateOutsideTheHistoryIsRefusedWithItsLine(date: String) async throws {
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("relay-import-\(UUID().uuidString)").path
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let store = try PortfolioStore(directory: dir)
        let rows = try TransactionImport.parse(
            "account,date,kind,symbol,quantity,price,fees,amount\nA,2024-01-02,deposit,,,,,100\nB,\(date),deposit,,,,,1")
        let error = try #require(throws: TransactionImport.LineError.self) { try TransactionImport.apply(rows, to: store) }
        #expect(error.line == 3)
        #expect(error.field == "date")
        #expect(try await store.accounts().isEmpty)
    }
}
