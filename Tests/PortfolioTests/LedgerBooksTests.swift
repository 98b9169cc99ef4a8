import Foundation
import GRDB
import MarketDataHub
import PolygonWire
import RelayTestSupport
import Testing

@testable import Portfolio
@testable import PortfolioData
@testable import PortfolioDomain

/// The live valuation's books, kept while the store's ledger revision stays the same, against real SQLite files.
@Suite("Ledger books")
struct LedgerBooksTests {
    @Test func theLedgerRevisionChangesWithEveryChangeAValuationReadsByAnyConnection() async throws {
        let dir = scratchDirectory("ledger")
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let store = try PortfolioStore(directory: dir)
        // Another connection to the same file: what `relay portfolio import` in another process is to the server.
        let other = try PortfolioStore(directory: dir)
        var seen: [Int64] = [try await store.ledgerRevision()]
        func changed(_ what: String) async throws {
            let revision = try await store.ledgerRevision()
            #expect(!seen.contains(revision), "\(what) left the ledger's revision at \(revision)")
            seen.append(revision)
        }
        let brokerage = try await store.createAccount(name: "B", kind: .brokerage, currency: "USD", createdAt: instant("2024-01-01T00:00:00Z"))
        try await changed("an account created")
        _ = try await other.addTransaction(accountID: brokerage.id, date: day("2024-01-02"), kind: .deposit, amount: 100)
        try await changed("another connection's transaction")
        let savings = try await other.createAccount(name: "S", kind: .savings, currency: "USD", createdAt: instant("2024-01-01T00:00:00Z"))
        try await changed("another connection's account")
        _ = try await store.addUpdate(accountID: savings.id, at: instant("2024-02-01T00:00:00Z"), value: 50)
        try await changed("a value update")
        _ = try await other.closeAccount(savings.id, at: instant("2024-03-01T00:00:00Z"))
        try await changed("an account closed")
        _ = try await store.deleteAccount(brokerage.id)
        try await changed("an account deleted")
        // What is read with a revision is the state at it.
        let ledger = try await store.ledger()
        #expect(ledger.revision == seen.last)
        #expect(ledger.accounts.map(\.id) == [savings.id])
        #expect(ledger.updates[savings.id]?.map(\.value) == [50])
        // Snapshots are not the ledger.
        try await store.saveSnapshots([AccountSnapshot(accountID: savings.id, day: day("2024-02-01"), value: 50, cash: nil, partial: false, source: .update)], portfolio: [])
        #expect(try await store.ledgerRevision() == seen.last)
    }

    @Test func aValuationReadsTheLedgerOnlyWhenItChangedAndSeesEveryConnectionsWrites() async throws {
        let dir = scratchDirectory("ledger")
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let store = try PortfolioStore(directory: dir)
        let other = try PortfolioStore(directory: dir)
        let account = try await store.createAccount(name: "A", kind: .brokerage, currency: "USD", createdAt: instant("2024-01-01T00:00:00Z"))
        _ = try await store.addTransaction(accountID: account.id, date: day("2024-01-02"), kind: .buy, symbol: "ZZ", quantity: 2, price: 10)
        let service = PortfolioService(store: store, hub: MarketDataHub(wire: .polygon))
        await service.setReference(PriceObservation(value: 30, at: .now, source: .restLastTrade), previousClose: nil, for: "ZZ")

        #expect(try await service.valuation().positionsValue == 60)
        let reads = await service.ledgerReads
        for _ in 0..<5 { _ = try await service.valuation() }
        _ = try await service.holdings()
        #expect(await service.ledgerReads == reads, "an unchanged ledger was read again")

        // Another connection's write is seen by the next valuation (read-your-writes across processes).
        _ = try await other.addTransaction(accountID: account.id, date: day("2024-01-03"), kind: .buy, symbol: "ZZ", quantity: 1, price: 10)
        #expect(try await service.valuation().positionsValue == 90)
        #expect(await service.ledgerReads == reads + 1)

        // Many valuations asked together after a change share one read.
        _ = try await store.addTransaction(accountID: account.id, date: day("2024-01-04"), kind: .sell, symbol: "ZZ", quantity: 3, price: 30)
        let values = try await withThrowingTaskGroup(of: Decimal.self) { group in
            for _ in 0..<20 { group.addTask { try await service.valuation().positionsValue } }
            return try await group.reduce(into: []) { $0.append($1) }
        }
        #expect(values == Array(repeating: 0, count: 20))
        #expect(await service.ledgerReads == reads + 2)
        #expect(try await service.holdings().isEmpty)
    }

    @Test func aSavingsAccountStandsAtItsLatestUpdateAsTimeGoesOn() throws {
        let now = instant("2024-06-01T12:00:00Z")
        let savings = Account(id: 1, name: "S", kind: .savings, currency: "USD", createdAt: instant("2024-01-01T00:00:00Z"))
        let updates = [
            AccountUpdate(id: 1, accountID: 1, at: instant("2024-05-01T00:00:00Z"), value: 10),
            AccountUpdate(id: 2, accountID: 1, at: instant("2024-05-31T00:00:00Z"), value: 20),
            AccountUpdate(id: 4, accountID: 1, at: instant("2024-06-01T06:00:00Z"), value: 25),
            AccountUpdate(id: 3, accountID: 1, at: instant("2024-06-02T00:00:00Z"), value: 30),
        ]
        let books = LedgerBooks(.init(revision: 1, accounts: [savings], transactions: [:], updates: [1: updates]), now: now)
        #expect(books.lastUpdate(of: 1, at: now)?.value == 25)
        // Tomorrow's update counts once its time has come, from the same books.
        #expect(books.lastUpdate(of: 1, at: instant("2024-06-02T00:00:01Z"))?.value == 30)
        // A wall clock set back by a few hours still finds the update then.
        #expect(books.lastUpdate(of: 1, at: instant("2024-06-01T03:00:00Z"))?.value == 20)
        #expect(books.lastUpdate(of: 2, at: now) == nil)
        // Only updates still to come: none yet, then the first.
        let early = LedgerBooks(.init(revision: 1, accounts: [savings], transactions: [:], updates: [1: updates]), now: instant("2024-04-01T00:00:00Z"))
        #expect(early.lastUpdate(of: 1, at: instant("2024-04-01T00:00:00Z")) == nil)
        #expect(early.lastUpdate(of: 1, at: instant("2024-05-01T00:00:00Z"))?.value == 10)
    }

    /// A book of many buys is summed once when the books are built: each open position is one lot of its
    /// whole quantity and cost, and values as the lots did.
    @Test func eachOpenPositionIsKeptAsOneLotOfItsWholeQuantityAndCost() throws {
        let created = instant("2024-01-01T00:00:00Z")
        let account = Account(id: 1, name: "G", kind: .brokerage, currency: "USD", createdAt: created)
        let buys = (1...500).map { index in
            Transaction(
                id: Int64(index), accountID: 1, date: day("2024-01-02"), kind: .buy, symbol: index % 2 == 0 ? "AA" : "BB", quantity: 2,
                price: Decimal(index), fees: 1, amount: 0)
        }
        let sold = Transaction(id: 501, accountID: 1, date: day("2024-01-03"), kind: .sell, symbol: "AA", quantity: 3, price: 1, fees: 0, amount: 0)
        let whole = try PositionBook(transactions: buys + [sold])
        let books = LedgerBooks(.init(revision: 1, accounts: [account], transactions: [1: buys + [sold]], updates: [:]), now: .now)
        let open = try books.book(of: 1).open
        #expect(open.map(\.symbol) == ["AA", "BB"] && open.allSatisfy { $0.lots.count == 1 })
        for position in open {
            let lots = try #require(whole.open.first { $0.symbol == position.symbol })
            #expect(lots.lots.count > 1 && position.quantity == lots.quantity && position.costBasis == lots.costBasis, "\(position.symbol)")
        }
        #expect(try books.book(of: 1).cash == whole.cash)
    }

    @Test func anAccountWhoseTransactionsMakeNoBookFailsOnlyTheValuationsThatNeedIt() throws {
        let created = instant("2024-01-01T00:00:00Z")
        let good = Account(id: 1, name: "G", kind: .brokerage, currency: "USD", createdAt: created)
        let broken = Account(id: 2, name: "B", kind: .brokerage, currency: "USD", createdAt: created, isActive: false)
        // What a hand-edited database may hold: a sale of more than was bought.
        let oversold = Transaction(id: 9, accountID: 2, date: day("2024-01-02"), kind: .sell, symbol: "ZZ", quantity: 1, price: 1, fees: 0, amount: 0)
        let bought = Transaction(id: 1, accountID: 1, date: day("2024-01-02"), kind: .buy, symbol: "ZZ", quantity: 1, price: 1, fees: 0, amount: 0)
        let books = LedgerBooks(.init(revision: 1, accounts: [good, broken], transactions: [1: [bought], 2: [oversold]], updates: [:]), now: .now)
        #expect(try books.book(of: 1).open.map(\.symbol) == ["ZZ"])
        #expect(throws: PositionBook.BookError.self) { try books.book(of: 2) }
        // The closed account is in no open position: the holdings are valued.
        #expect(try books.openPositions().positions.keys.sorted() == ["ZZ"])
    }

    @Test func everyTableAValuationReadsCountsItsChangesAfterTheMigrations() async throws {
        let dir = scratchDirectory("ledger")
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let store = try PortfolioStore(directory: dir)
        // A migration that rebuilt one of these tables would have dropped its triggers with it.
        let triggers = try await sideConnection(to: store.path).read { db in
            try String.fetchAll(db, sql: "SELECT name FROM sqlite_master WHERE type = 'trigger' ORDER BY name")
        }
        let expected = ["account", "accountUpdate", "transaction"].flatMap { table in
            ["delete", "insert", "update"].map { "ledgerRevision_\(table)_\($0)" }
        }
        #expect(triggers == expected.sorted())
    }

    @Test func anActiveAccountWhoseTransactionsMakeNoBookLeavesTheOthersValuedAndFollowed() async throws {
        let dir = scratchDirectory("ledger")
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let store = try PortfolioStore(directory: dir)
        let good = try await store.createAccount(name: "G", kind: .brokerage, currency: "USD", createdAt: instant("2024-01-01T00:00:00Z"))
        let broken = try await store.createAccount(name: "B", kind: .brokerage, currency: "USD", createdAt: instant("2024-01-01T00:00:00Z"))
        _ = try await store.addTransaction(accountID: good.id, date: day("2024-01-02"), kind: .buy, symbol: "ZZ", quantity: 2, price: 10)
        // What a database edited by hand may hold: a sale of what was never bought, in an active account.
        try await sideConnection(to: store.path).write { db in
            try db.execute(
                sql: #"INSERT INTO "transaction" (accountID, date, kind, symbol, quantity, price, fees, amount) VALUES (?, '2024-01-02', 'sell', 'YY', '1', '1', '0', '0')"#,
                arguments: [broken.id])
        }
        let service = PortfolioService(store: store, hub: MarketDataHub(wire: .polygon))
        await service.setReference(PriceObservation(value: 30, at: .now, source: .restLastTrade), previousClose: nil, for: "ZZ")
        try await service.holdingsChanged()
        #expect(try await service.valuation(accountID: good.id).positionsValue == 60)
        await #expect(throws: PositionBook.BookError.self) { _ = try await service.valuation(accountID: broken.id) }
        await #expect(throws: PositionBook.BookError.self) { _ = try await service.valuation() }
    }
}
