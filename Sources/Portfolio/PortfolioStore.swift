import Foundation
import GRDB

/// The portfolio's SQLite file, through GRDB: versioned migrations, WAL (`DatabasePool`), foreign keys
/// with cascading deletes. Money and quantities are stored as exact decimal text (``DecimalText``),
/// days as `YYYY-MM-DD`, instants as ISO 8601 UTC text.
///
/// `Sendable`: GRDB's pool serialises writes and runs reads concurrently.
public final class PortfolioStore: Sendable {
    public let path: String
    private let pool: DatabasePool

    /// A value that is well-formed but contradicts the account's life (dated before it was created, or
    /// on or after it closed): answered 409 with the reason.
    public struct ConflictError: Error, Sendable, Equatable, CustomStringConvertible {
        public var field: String
        public var message: String
        public var description: String { "\(field): \(message)" }
    }

    /// A value the store refuses, named so the caller can say which field is wrong.
    public struct ValidationError: Error, Sendable, Equatable, CustomStringConvertible {
        public var field: String
        public var message: String
        public var description: String { "\(field): \(message)" }
    }

    public enum StoreError: Error, Sendable, Equatable, CustomStringConvertible {
        case notFound(String)
        case corrupt(String)
        public var description: String {
            switch self {
            case .notFound(let what): "\(what) not found"
            case .corrupt(let what): "unreadable value in the database: \(what)"
            }
        }
    }

    /// Opens (creating if needed) `portfolio.sqlite` in `directory` and migrates it.
    public init(directory: String) throws {
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        path = (directory as NSString).appendingPathComponent("portfolio.sqlite")
        var configuration = Configuration()
        configuration.foreignKeysEnabled = true
        // Another process (`relay portfolio import` while `relay serve` runs) waits for the lock
        // instead of failing at once with SQLITE_BUSY.
        configuration.busyMode = .timeout(10)
        pool = try DatabasePool(path: path, configuration: configuration)
        try Self.migrator.migrate(pool)
    }

    static var migrator: DatabaseMigrator {
        var migrator = DatabaseMigrator()
        migrator.registerMigration("v1: accounts, transactions, updates, snapshots") { db in
            try db.execute(
                sql: """
                    CREATE TABLE account (
                        id INTEGER PRIMARY KEY AUTOINCREMENT,
                        name TEXT NOT NULL,
                        kind TEXT NOT NULL CHECK (kind IN ('brokerage', 'savings')),
                        currency TEXT NOT NULL,
                        createdAt TEXT NOT NULL,
                        isActive INTEGER NOT NULL DEFAULT 1,
                        closedAt TEXT
                    );
                    CREATE TABLE "transaction" (
                        id INTEGER PRIMARY KEY AUTOINCREMENT,
                        accountID INTEGER NOT NULL REFERENCES account(id) ON DELETE CASCADE,
                        date TEXT NOT NULL,
                        kind TEXT NOT NULL CHECK (kind IN ('buy', 'sell', 'dividend', 'fee')),
                        symbol TEXT NOT NULL,
                        quantity TEXT NOT NULL,
                        price TEXT NOT NULL,
                        fees TEXT NOT NULL
                    );
                    CREATE INDEX transaction_account ON "transaction"(accountID, date);
                    CREATE TABLE accountUpdate (
                        id INTEGER PRIMARY KEY AUTOINCREMENT,
                        accountID INTEGER NOT NULL REFERENCES account(id) ON DELETE CASCADE,
                        at TEXT NOT NULL,
                        value TEXT NOT NULL
                    );
                    CREATE INDEX accountUpdate_account ON accountUpdate(accountID, at);
                    CREATE TABLE accountSnapshot (
                        accountID INTEGER NOT NULL REFERENCES account(id) ON DELETE CASCADE,
                        day TEXT NOT NULL,
                        value TEXT NOT NULL,
                        partial INTEGER NOT NULL,
                        source TEXT NOT NULL,
                        PRIMARY KEY (accountID, day)
                    );
                    CREATE TABLE portfolioSnapshot (
                        day TEXT PRIMARY KEY,
                        total TEXT NOT NULL,
                        partial INTEGER NOT NULL
                    );
                    """)
        }
        return migrator
    }

    // MARK: encoding

    private static func text(_ date: Date) -> String {
        date.formatted(Date.ISO8601FormatStyle(includingFractionalSeconds: true))
    }

    private static func date(_ text: String) throws -> Date {
        if let date = try? Date.ISO8601FormatStyle(includingFractionalSeconds: true).parse(text) { return date }
        if let date = try? Date.ISO8601FormatStyle().parse(text) { return date }
        throw StoreError.corrupt("instant \(text)")
    }

    private static func decimal(_ text: String) throws -> Decimal {
        guard let value = DecimalText.parse(text) else { throw StoreError.corrupt("decimal \(text)") }
        return value
    }

    private static func day(_ text: String) throws -> Day {
        guard let day = Day(text) else { throw StoreError.corrupt("day \(text)") }
        return day
    }

    private static func account(_ row: Row) throws -> Account {
        guard let kind = AccountKind(rawValue: row["kind"]) else { throw StoreError.corrupt("account kind") }
        return Account(
            id: row["id"], name: row["name"], kind: kind, currency: row["currency"], createdAt: try date(row["createdAt"]),
            isActive: row["isActive"], closedAt: try (row["closedAt"] as String?).map(date))
    }

    // MARK: accounts

    public func createAccount(name: String, kind: AccountKind, currency: String, createdAt: Date) throws -> Account {
        let name = name.trimmingCharacters(in: .whitespaces)
        guard !name.isEmpty, name.count <= 200 else { throw ValidationError(field: "name", message: "must be 1 to 200 characters") }
        guard currency.range(of: "^[A-Z]{3}$", options: .regularExpression) != nil else {
            throw ValidationError(field: "currency", message: "must be an ISO 4217 code such as USD")
        }
        return try pool.write { db in
            try db.execute(
                sql: "INSERT INTO account (name, kind, currency, createdAt, isActive) VALUES (?, ?, ?, ?, 1)",
                arguments: [name, kind.rawValue, currency, Self.text(createdAt)])
            return Account(id: db.lastInsertedRowID, name: name, kind: kind, currency: currency, createdAt: createdAt)
        }
    }

    public func accounts() throws -> [Account] {
        try pool.read { db in try Row.fetchAll(db, sql: "SELECT * FROM account ORDER BY id").map(Self.account) }
    }

    public func account(_ id: Int64) throws -> Account {
        try pool.read { db in
            guard let row = try Row.fetchOne(db, sql: "SELECT * FROM account WHERE id = ?", arguments: [id]) else {
                throw StoreError.notFound("account \(id)")
            }
            return try Self.account(row)
        }
    }

    /// Closes an account: it keeps its history and leaves totals from its closing day on.
    public func closeAccount(_ id: Int64, at: Date) throws -> Account {
        var account = try account(id)
        guard account.closedAt == nil else { throw ValidationError(field: "closedAt", message: "the account is already closed") }
        guard at >= account.createdAt else {
            throw ValidationError(field: "closedAt", message: "must not be before the account was created")
        }
        try pool.write { db in
            try db.execute(sql: "UPDATE account SET isActive = 0, closedAt = ? WHERE id = ?", arguments: [Self.text(at), id])
        }
        account.isActive = false
        account.closedAt = at
        return account
    }

    /// Deletes an account and, by cascade, its transactions, updates and snapshots.
    public func deleteAccount(_ id: Int64) throws {
        try pool.write { db in
            try db.execute(sql: "DELETE FROM account WHERE id = ?", arguments: [id])
            guard db.changesCount > 0 else { throw StoreError.notFound("account \(id)") }
        }
    }

    // MARK: transactions

    /// Records a transaction after checking it, and that it does not sell shares that are not held.
    public func addTransaction(
        accountID: Int64, date: Day, kind: TransactionKind, symbol: String, quantity: Decimal, price: Decimal, fees: Decimal,
        calendar: DayCalendar = .utc
    ) throws -> Transaction {
        let account = try account(accountID)
        guard account.kind == .brokerage else {
            throw ValidationError(field: "accountID", message: "transactions belong to brokerage accounts")
        }
        let created = calendar.day(of: account.createdAt)
        guard date >= created else {
            throw ConflictError(field: "date", message: "\(date) is before the account was created (\(created))")
        }
        if let closedAt = account.closedAt, date >= calendar.day(of: closedAt) {
            throw ConflictError(field: "date", message: "the account closed on \(calendar.day(of: closedAt)); \(date) is not before that")
        }
        let symbol = symbol.trimmingCharacters(in: .whitespaces).uppercased()
        if kind != .fee {
            guard !symbol.isEmpty, symbol.count <= 32 else {
                throw ValidationError(field: "symbol", message: "required, up to 32 characters")
            }
            guard quantity > 0 else { throw ValidationError(field: "quantity", message: "must be above 0") }
            guard price >= 0 else { throw ValidationError(field: "price", message: "must not be negative") }
        }
        guard fees >= 0 else { throw ValidationError(field: "fees", message: "must not be negative") }
        var candidate = Transaction(
            id: 0, accountID: accountID, date: date, kind: kind, symbol: symbol, quantity: quantity, price: price, fees: fees)
        // Read, check and insert in one write transaction: two sells arriving together are checked one
        // after the other, so together they can never sell more than is held.
        try pool.write { db in
            let existing = try Self.transactions(db, accountID: accountID)
            do {
                _ = try PositionBook(transactions: existing + [candidate])
            } catch {
                throw ValidationError(field: "quantity", message: "\(error)")
            }
            try db.execute(
                sql: #"INSERT INTO "transaction" (accountID, date, kind, symbol, quantity, price, fees) VALUES (?, ?, ?, ?, ?, ?, ?)"#,
                arguments: [
                    accountID, date.description, kind.rawValue, symbol, DecimalText.format(quantity), DecimalText.format(price),
                    DecimalText.format(fees),
                ])
            candidate.id = db.lastInsertedRowID
        }
        return candidate
    }

    public func transactions(accountID: Int64) throws -> [Transaction] {
        try pool.read { db in try Self.transactions(db, accountID: accountID) }
    }

    private static func transactions(_ db: Database, accountID: Int64) throws -> [Transaction] {
        try Row.fetchAll(db, sql: #"SELECT * FROM "transaction" WHERE accountID = ? ORDER BY date, id"#, arguments: [accountID]).map { row in
            guard let kind = TransactionKind(rawValue: row["kind"]) else { throw StoreError.corrupt("transaction kind") }
            return Transaction(
                id: row["id"], accountID: row["accountID"], date: try day(row["date"]), kind: kind, symbol: row["symbol"],
                quantity: try decimal(row["quantity"]), price: try decimal(row["price"]), fees: try decimal(row["fees"]))
        }
    }

    // MARK: value updates

    public func addUpdate(accountID: Int64, at: Date, value: Decimal) throws -> AccountUpdate {
        let account = try account(accountID)
        guard account.kind == .savings else {
            throw ValidationError(field: "accountID", message: "value updates belong to savings accounts")
        }
        guard value >= 0 else { throw ValidationError(field: "value", message: "must not be negative") }
        if let closedAt = account.closedAt, at >= closedAt {
            throw ConflictError(field: "at", message: "the account closed at \(Self.text(closedAt)); an update then or later counts nowhere")
        }
        return try pool.write { db in
            try db.execute(
                sql: "INSERT INTO accountUpdate (accountID, at, value) VALUES (?, ?, ?)",
                arguments: [accountID, Self.text(at), DecimalText.format(value)])
            return AccountUpdate(id: db.lastInsertedRowID, accountID: accountID, at: at, value: value)
        }
    }

    public func updates(accountID: Int64) throws -> [AccountUpdate] {
        try pool.read { db in
            try Row.fetchAll(db, sql: "SELECT * FROM accountUpdate WHERE accountID = ? ORDER BY at, id", arguments: [accountID]).map {
                row in
                AccountUpdate(
                    id: row["id"], accountID: row["accountID"], at: try Self.date(row["at"]), value: try Self.decimal(row["value"]))
            }
        }
    }

    // MARK: snapshots

    /// Writes snapshots, replacing those of the same account and day, in one transaction.
    public func saveSnapshots(_ snapshots: [AccountSnapshot], portfolio: [PortfolioSnapshot]) throws {
        try pool.write { db in try Self.save(snapshots, portfolio: portfolio, in: db) }
    }

    private static func save(_ snapshots: [AccountSnapshot], portfolio: [PortfolioSnapshot], in db: Database) throws {
        for snapshot in snapshots {
            try db.execute(
                sql: "INSERT OR REPLACE INTO accountSnapshot (accountID, day, value, partial, source) VALUES (?, ?, ?, ?, ?)",
                arguments: [
                    snapshot.accountID, snapshot.day.description, DecimalText.format(snapshot.value), snapshot.partial,
                    snapshot.source.rawValue,
                ])
        }
        for snapshot in portfolio {
            try db.execute(
                sql: "INSERT OR REPLACE INTO portfolioSnapshot (day, total, partial) VALUES (?, ?, ?)",
                arguments: [snapshot.day.description, DecimalText.format(snapshot.total), snapshot.partial])
        }
    }

    /// Replaces the whole recomputed history in one transaction: each account's rows outside its days (after it closed,
    /// say) are removed, the portfolio's rows outside `portfolioDays` (days
    /// before any account that still exists) are removed, and the rest written. A closed or deleted
    /// account so leaves the totals of every day it no longer counts on.
    public func replaceHistory(
        _ snapshots: [AccountSnapshot], accountDays: [Int64: (from: Day, through: Day)], portfolio: [PortfolioSnapshot],
        portfolioDays: (from: Day, through: Day)?
    ) throws {
        try pool.write { db in
            for (accountID, days) in accountDays {
                try db.execute(
                    sql: "DELETE FROM accountSnapshot WHERE accountID = ? AND (day < ? OR day > ?)",
                    arguments: [accountID, days.from.description, days.through.description])
            }
            if let portfolioDays {
                try db.execute(
                    sql: "DELETE FROM portfolioSnapshot WHERE day < ? OR day > ?",
                    arguments: [portfolioDays.from.description, portfolioDays.through.description])
            } else {
                try db.execute(sql: "DELETE FROM portfolioSnapshot")
            }
            try Self.save(snapshots, portfolio: portfolio, in: db)
        }
    }

    public func accountSnapshots(accountID: Int64, from: Day, through: Day) throws -> [AccountSnapshot] {
        try pool.read { db in
            try Row.fetchAll(
                db, sql: "SELECT * FROM accountSnapshot WHERE accountID = ? AND day >= ? AND day <= ? ORDER BY day",
                arguments: [accountID, from.description, through.description]
            ).map { row in
                AccountSnapshot(
                    accountID: row["accountID"], day: try Self.day(row["day"]), value: try Self.decimal(row["value"]),
                    partial: row["partial"], source: SnapshotSource(rawValue: row["source"]) ?? .none)
            }
        }
    }

    public func portfolioSnapshots(from: Day, through: Day) throws -> [PortfolioSnapshot] {
        try pool.read { db in
            try Row.fetchAll(
                db, sql: "SELECT * FROM portfolioSnapshot WHERE day >= ? AND day <= ? ORDER BY day",
                arguments: [from.description, through.description]
            ).map { row in
                PortfolioSnapshot(day: try Self.day(row["day"]), total: try Self.decimal(row["total"]), partial: row["partial"])
            }
        }
    }
}
