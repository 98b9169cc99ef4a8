import PortfolioDomain
import Foundation
import GRDB
import MarketCore

/// The portfolio's SQLite file, through GRDB: versioned migrations, WAL (`DatabasePool`), foreign keys
/// with cascading deletes. Money and quantities are stored as exact decimal text (``DecimalText``),
/// days as `YYYY-MM-DD`, instants as ISO 8601 UTC text.
///
/// `Sendable`: GRDB's pool serialises writes and runs reads concurrently. Every call for the server is
/// `async` through GRDB's async API: SQLite works on GRDB's own dispatch queues while the caller is
/// suspended, so a writer waiting for another process's lock never blocks a thread of Swift's
/// cooperative pool (which the market feed and `/healthz` share). A write that cannot get the lock
/// within the busy timeout throws ``StoreError/busy`` (answered 503).
public final class PortfolioStore: Sendable {
    public let path: String
    private let pool: DatabasePool

    /// The domain's refusals, by the names callers know them by.
    public typealias ConflictError = PortfolioDomain.ConflictError
    public typealias ValidationError = PortfolioDomain.ValidationError

    public enum StoreError: Error, Sendable, Equatable, CustomStringConvertible {
        case notFound(String)
        case corrupt(String)
        /// Another connection (another process, such as `relay portfolio import`) held the database's
        /// write lock for longer than the busy timeout: nothing was written, try again.
        case busy
        public var description: String {
            switch self {
            case .notFound(let what): "\(what) not found"
            case .corrupt(let what): "unreadable value in the database: \(what)"
            case .busy: "the portfolio database is busy (another writer holds its lock); nothing was written, try again shortly"
            }
        }
    }

    /// How long a write waits for another connection's lock before failing with ``StoreError/busy``.
    public let busyTimeout: TimeInterval
    /// What the store holds at most; a write past it is refused (409) and writes nothing.
    public let limits: PortfolioLimits

    /// Opens (creating if needed) `portfolio.sqlite` in `directory` and migrates it.
    /// - Parameter busyTimeout: how long a write waits for another connection's lock: short for the
    ///   server (an HTTP write answers 503 rather than hang), longer for the import command.
    public init(directory: String, busyTimeout: TimeInterval = 2, limits: PortfolioLimits = PortfolioLimits()) throws {
        self.busyTimeout = busyTimeout
        self.limits = limits
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        path = (directory as NSString).appendingPathComponent("portfolio.sqlite")
        var configuration = Configuration()
        configuration.foreignKeysEnabled = true
        // Another process (`relay portfolio import` while `relay serve` runs) holds the lock: wait a
        // little for it instead of failing at once, then fail with `busy`.
        configuration.busyMode = .timeout(busyTimeout)
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
        migrator.registerMigration("v2: cash (deposit, withdrawal, amount, allowNegativeCash), snapshot cash") { db in
            // SQLite cannot change a CHECK constraint: the transaction table is rebuilt with the new kinds.
            try db.execute(
                sql: """
                    ALTER TABLE account ADD COLUMN allowNegativeCash INTEGER NOT NULL DEFAULT 0;
                    CREATE TABLE transaction_v2 (
                        id INTEGER PRIMARY KEY AUTOINCREMENT,
                        accountID INTEGER NOT NULL REFERENCES account(id) ON DELETE CASCADE,
                        date TEXT NOT NULL,
                        kind TEXT NOT NULL CHECK (kind IN ('buy', 'sell', 'dividend', 'fee', 'deposit', 'withdrawal')),
                        symbol TEXT NOT NULL,
                        quantity TEXT NOT NULL,
                        price TEXT NOT NULL,
                        fees TEXT NOT NULL,
                        amount TEXT NOT NULL DEFAULT '0'
                    );
                    INSERT INTO transaction_v2 (id, accountID, date, kind, symbol, quantity, price, fees)
                        SELECT id, accountID, date, kind, symbol, quantity, price, fees FROM "transaction";
                    DROP TABLE "transaction";
                    ALTER TABLE transaction_v2 RENAME TO "transaction";
                    CREATE INDEX transaction_account ON "transaction"(accountID, date);
                    ALTER TABLE accountSnapshot ADD COLUMN cash TEXT;
                    ALTER TABLE portfolioSnapshot ADD COLUMN cash TEXT NOT NULL DEFAULT '0';
                    """)
        }
        migrator.registerMigration("v3: daily closes, snapshot unpriced symbols") { db in
            try db.execute(
                sql: """
                    CREATE TABLE dailyClose (
                        symbol TEXT NOT NULL,
                        day TEXT NOT NULL,
                        close TEXT NOT NULL,
                        PRIMARY KEY (symbol, day)
                    );
                    CREATE TABLE closeCoverage (
                        symbol TEXT PRIMARY KEY,
                        fromDay TEXT NOT NULL,
                        throughDay TEXT NOT NULL
                    );
                    ALTER TABLE accountSnapshot ADD COLUMN unpriced TEXT;
                    """)
        }
        migrator.registerMigration("v4: snapshots by day") { db in
            // The history is recomputed from a day on (today, each minute): its rows are found by day.
            try db.execute(sql: "CREATE INDEX accountSnapshot_day ON accountSnapshot(day)")
        }
        migrator.registerMigration("v5: transactions by symbol") { db in
            // Whether a symbol is new to the store (``PortfolioLimits/symbols``) is found by symbol.
            try db.execute(sql: #"CREATE INDEX transaction_symbol ON "transaction"(symbol)"#)
        }
        migrator.registerMigration("v6: a fee names no symbol") { db in
            // The account's (the book never read it): only what is held names a symbol, so the symbol
            // index alone says what the store names.
            try db.execute(sql: #"UPDATE "transaction" SET symbol = '' WHERE kind = 'fee'"#)
        }
        migrator.registerMigration("v7: the ledger's revision", migrate: addLedgerRevision)
        migrator.registerMigration("v8: settled closes") { db in
            // The last day of a symbol's coverage whose close was final when fetched (NULL: all of them).
            // A coverage written before knew nothing of it: its last two days are taken as fetched before
            // they were final, and asked once more.
            try db.execute(
                sql: "ALTER TABLE closeCoverage ADD COLUMN settledThrough TEXT; UPDATE closeCoverage SET settledThrough = date(throughDay, '-2 days')")
        }
        return migrator
    }

    /// v7: one number that every change to what a live valuation reads (accounts, transactions, value
    /// updates) adds one to, made by whichever connection or process: triggers, so a writer that knows
    /// nothing of it (an older `relay portfolio import`) counts too. A later migration that rebuilds one of
    /// these tables (DROP, then RENAME, as v2 did) drops its triggers and must create them again
    /// (`everyTableAValuationReadsCountsItsChangesAfterTheMigrations` in the tests checks).
    private static func addLedgerRevision(_ db: Database) throws {
        try db.execute(sql: "CREATE TABLE ledgerRevision (value INTEGER NOT NULL); INSERT INTO ledgerRevision (value) VALUES (0);")
        for table in ["account", "transaction", "accountUpdate"] {
            for change in ["INSERT", "UPDATE", "DELETE"] {
                try db.execute(
                    sql: """
                        CREATE TRIGGER "ledgerRevision_\(table)_\(change.lowercased())" AFTER \(change) ON "\(table)"
                        BEGIN UPDATE ledgerRevision SET value = value + 1; END
                        """)
            }
        }
    }

    // MARK: dates

    /// The first day a date may name.
    public static let earliestDay = Day(year: 1970, month: 1, day: 1)
    /// The longest account name, in UTF-8 bytes.
    public static let nameBytes = 200

    /// What a name may hold: visible text (``VisibleText/isVisible(_:)``), any space, and the joiners
    /// words and emoji are written with (U+200C, U+200D); no control, bidirectional or other format character.
    static func isNameScalar(_ scalar: Unicode.Scalar) -> Bool {
        VisibleText.isVisible(scalar) || scalar.value == 0x200C || scalar.value == 0x200D
            || scalar.properties.generalCategory == .spaceSeparator
    }

    /// Refuses a day before 1970-01-01 or after tomorrow (in `calendar`): every change recomputes the
    /// history from its day on, so a date is bounded the way the history is.
    static func check(_ day: Day, field: String, calendar: DayCalendar) throws {
        let latest = calendar.next(calendar.day(of: .now))
        guard day >= earliestDay, day <= latest else {
            throw ValidationError(field: field, message: "must be from \(earliestDay) through tomorrow (\(latest)), got \(day)")
        }
    }

    /// ``check(_:field:calendar:)`` for an instant (its day in `calendar`).
    static func check(_ instant: Date, field: String, calendar: DayCalendar) throws {
        // Far outside first (a calendar is not asked about the year 1 or 100000): a day and a half of
        // margin either side covers every time zone.
        let now = Date.now.timeIntervalSince1970
        guard instant.timeIntervalSince1970 > -129_600, instant.timeIntervalSince1970 < now + 3 * 86_400 else {
            throw ValidationError(
                field: field, message: "must be from \(earliestDay) through tomorrow (\(calendar.next(calendar.day(of: .now))))")
        }
        try check(calendar.day(of: instant), field: field, calendar: calendar)
    }

    // MARK: access

    /// GRDB's async read, on its reader queues.
    private func read<T: Sendable>(_ body: @escaping @Sendable (Database) throws -> T) async throws -> T {
        do { return try await pool.read(body) } catch let error as DatabaseError where Self.isBusy(error) { throw StoreError.busy }
    }

    /// GRDB's async write, on its writer queue, in one `IMMEDIATE` transaction that waits for another
    /// connection's lock at most ``busyTimeout`` from the call, not from its turn: writes queued behind
    /// one that waits for the lock do not each wait the whole timeout again, one after the other.
    private func write<T: Sendable>(_ body: @escaping @Sendable (Database) throws -> T) async throws -> T {
        let deadline = ContinuousClock.now + .milliseconds(Int(busyTimeout * 1000))
        do {
            return try await pool.writeWithoutTransaction { db in
                let left = (deadline - .now).components
                let milliseconds = left.seconds * 1000 + left.attoseconds / 1_000_000_000_000_000
                guard milliseconds > 0 else { throw StoreError.busy }
                try db.execute(sql: "PRAGMA busy_timeout = \(milliseconds)")
                var value: T?
                try db.inTransaction(.immediate) {
                    value = try body(db)
                    return .commit
                }
                guard let value else { throw StoreError.corrupt("a write without a result") }
                return value
            }
        } catch let error as DatabaseError where Self.isBusy(error) {
            throw StoreError.busy
        }
    }

    private static func isBusy(_ error: DatabaseError) -> Bool {
        error.resultCode == .SQLITE_BUSY || error.resultCode == .SQLITE_LOCKED
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
            isActive: row["isActive"], closedAt: try (row["closedAt"] as String?).map(date), allowNegativeCash: row["allowNegativeCash"])
    }

    // MARK: accounts

    public func createAccount(
        name: String, kind: AccountKind, currency: String, createdAt: Date, allowNegativeCash: Bool = false, calendar: DayCalendar = .utc
    ) async throws -> Account {
        try Self.check(createdAt, field: "createdAt", calendar: calendar)
        let limits = self.limits
        return try await write { db in
            try Self.insertAccount(
                db, name: name, kind: kind, currency: currency, createdAt: createdAt, allowNegativeCash: allowNegativeCash, limits: limits)
        }
    }

    private static func insertAccount(
        _ db: Database, name: String, kind: AccountKind, currency: String, createdAt: Date, allowNegativeCash: Bool, limits: PortfolioLimits
    ) throws -> Account {
        // Closed accounts count: they stay, with their history.
        let held = try Int.fetchOne(db, sql: "SELECT COUNT(*) FROM account") ?? 0
        guard held < limits.accounts else {
            throw ConflictError(field: "name", message: "the portfolio holds at most \(limits.accounts) accounts (portfolio.maxAccounts)")
        }
        let name = name.trimmingCharacters(in: .whitespaces)
        // Bytes, not characters as shown: one character may carry a megabyte of combining marks, and a
        // name goes into every valuation, push frame and transaction row of a security's detail.
        guard !name.isEmpty, name.utf8.count <= Self.nameBytes else {
            throw ValidationError(field: "name", message: "must be 1 to \(Self.nameBytes) bytes of UTF-8 (a letter of another script takes 2 to 4)")
        }
        guard name.unicodeScalars.allSatisfy(Self.isNameScalar) else {
            throw ValidationError(field: "name", message: "letters, marks, digits, punctuation, symbols and spaces only (no control, format or direction characters)")
        }
        guard currency.range(of: "^[A-Z]{3}$", options: .regularExpression) != nil else {
            throw ValidationError(field: "currency", message: "must be an ISO 4217 code such as USD")
        }
        if allowNegativeCash, kind != .brokerage {
            throw ValidationError(field: "allowNegativeCash", message: "only brokerage accounts hold cash")
        }
        try db.execute(
            sql: "INSERT INTO account (name, kind, currency, createdAt, isActive, allowNegativeCash) VALUES (?, ?, ?, ?, 1, ?)",
            arguments: [name, kind.rawValue, currency, text(createdAt), allowNegativeCash])
        return Account(
            id: db.lastInsertedRowID, name: name, kind: kind, currency: currency, createdAt: createdAt, allowNegativeCash: allowNegativeCash)
    }

    public func accounts() async throws -> [Account] {
        try await read { db in try Self.accounts(db) }
    }

    private static func accounts(_ db: Database) throws -> [Account] {
        try Row.fetchAll(db, sql: "SELECT * FROM account ORDER BY id").map(account)
    }

    public func account(_ id: Int64) async throws -> Account {
        try await read { db in try Self.account(db, id) }
    }

    private static func account(_ db: Database, _ id: Int64) throws -> Account {
        guard let row = try Row.fetchOne(db, sql: "SELECT * FROM account WHERE id = ?", arguments: [id]) else {
            throw StoreError.notFound("account \(id)")
        }
        return try account(row)
    }

    /// Closes an account: it keeps its history and leaves totals from its closing day on. Refused (409)
    /// while it has transactions on or after the closing day or updates at or after the close.
    public func closeAccount(_ id: Int64, at: Date, calendar: DayCalendar = .utc) async throws -> Account {
        try Self.check(at, field: "closedAt", calendar: calendar)
        return try await write { db in
            var account = try Self.account(db, id)
            guard account.closedAt == nil else { throw ValidationError(field: "closedAt", message: "the account is already closed") }
            guard at >= account.createdAt else {
                throw ValidationError(field: "closedAt", message: "must not be before the account was created")
            }
            // Nothing may be left dated where a new row could not be (a transaction on or after the
            // closing day, an update at or after the close): checked in this transaction, so a row
            // written meanwhile is seen.
            let closeDay = calendar.day(of: at)
            if let later = try String.fetchOne(
                db, sql: #"SELECT MIN(date) FROM "transaction" WHERE accountID = ? AND date >= ?"#, arguments: [id, closeDay.description])
            {
                throw ConflictError(
                    field: "closedAt",
                    message: "the account has transactions on or after \(closeDay) (the first on \(later)); close it after its last transaction")
            }
            if let later = try String.fetchOne(
                db, sql: "SELECT at FROM accountUpdate WHERE accountID = ? AND at >= ? ORDER BY at LIMIT 1", arguments: [id, Self.text(at)])
            {
                throw ConflictError(
                    field: "closedAt", message: "the account has a value update at \(later), at or after the close; close it after its last update")
            }
            try db.execute(sql: "UPDATE account SET isActive = 0, closedAt = ? WHERE id = ?", arguments: [Self.text(at), id])
            account.isActive = false
            account.closedAt = at
            return account
        }
    }

    /// Deletes an account and, by cascade, its transactions, updates and snapshots, and the daily closes
    /// of symbols no transaction names any more (an account bought into thousands of symbols from 1970
    /// and deleted, again and again, would otherwise leave their closes for good).
    /// - Returns: the account as it was.
    @discardableResult
    public func deleteAccount(_ id: Int64) async throws -> Account {
        try await write { db in
            let account = try Self.account(db, id)
            try db.execute(sql: "DELETE FROM account WHERE id = ?", arguments: [id])
            for table in ["dailyClose", "closeCoverage"] {
                try db.execute(sql: #"DELETE FROM \#(table) WHERE symbol NOT IN (SELECT symbol FROM "transaction" WHERE symbol != '')"#)
            }
            return account
        }
    }

    // MARK: transactions

    /// A transaction to record, as given (before the checks).
    public struct NewTransaction: Sendable, Equatable {
        public var date: Day
        public var kind: TransactionKind
        public var symbol: String
        public var quantity: Decimal
        public var price: Decimal
        public var fees: Decimal
        public var amount: Decimal

        public init(
            date: Day, kind: TransactionKind, symbol: String = "", quantity: Decimal = 0, price: Decimal = 0, fees: Decimal = 0,
            amount: Decimal = 0
        ) {
            (self.date, self.kind, self.symbol, self.quantity, self.price, self.fees, self.amount) = (
                date, kind, symbol, quantity, price, fees, amount
            )
        }
    }

    /// Records a transaction after checking it: its fields, its date against the account's life, and
    /// that the account's book stays possible (no selling shares not held, no withdrawal beyond the
    /// cash unless the account allows negative cash).
    public func addTransaction(accountID: Int64, _ new: NewTransaction, calendar: DayCalendar = .utc) async throws -> Transaction {
        // Read, check and insert in one write transaction: two sells arriving together are checked one
        // after the other, so together they can never sell more than is held.
        let limits = self.limits
        return try await write { db in
            let account = try Self.account(db, accountID)
            var book = BookCheck(account: account, existing: try Self.transactions(db, accountID: accountID))
            var room = SymbolRoom(limit: limits.symbols)
            return try Self.insert(new, into: account, checking: &book, room: &room, db: db, calendar: calendar, limits: limits)
        }
    }

    /// ``addTransaction(accountID:_:calendar:)`` with the fields spelled out.
    public func addTransaction(
        accountID: Int64, date: Day, kind: TransactionKind, symbol: String = "", quantity: Decimal = 0, price: Decimal = 0,
        fees: Decimal = 0, amount: Decimal = 0, calendar: DayCalendar = .utc
    ) async throws -> Transaction {
        try await addTransaction(
            accountID: accountID,
            NewTransaction(date: date, kind: kind, symbol: symbol, quantity: quantity, price: price, fees: fees, amount: amount),
            calendar: calendar)
    }

    /// An account's transactions and its book, kept up to date while several are added in one write.
    private struct BookCheck {
        let account: Account
        var transactions: [Transaction]
        var book: PositionBook?
        /// An import's candidates dated before a transaction the account had (its import row with
        /// each), in the order added: checked all at once by
        /// ``checkDeferred()``. Each checked as it came would replay the whole account (an import of
        /// older statements into an account with a later transaction: rows × transactions, holding the
        /// store's writer all along).
        var deferred: [(row: Int, transaction: Transaction)] = []

        init(account: Account, existing: [Transaction]) {
            self.account = account
            self.transactions = existing
        }

        /// Where a transaction dated `date` goes: after the same day's earlier transactions, as the store
        /// orders them (date, then id); the common case (an import in date order) is the end.
        private func index(for date: Day) -> Int {
            if transactions.last.map({ $0.date <= date }) ?? true { return transactions.endIndex }
            var (low, high) = (0, transactions.endIndex)
            while low < high {
                let middle = (low + high) / 2
                if transactions[middle].date <= date { low = middle + 1 } else { high = middle }
            }
            return low
        }

        /// Adds a candidate if the book stays possible; the book grows step by step while candidates come
        /// in date order at the end. One of an import (`row`) dated before the end is checked later with
        /// the rest (``checkDeferred()``); a single write's is checked at once.
        mutating func add(_ candidate: Transaction, row: Int? = nil) throws {
            let index = index(for: candidate.date)
            let atEnd = index == transactions.endIndex
            if let row, !atEnd || !deferred.isEmpty {
                deferred.append((row, candidate))
                book = nil
                transactions.insert(candidate, at: index)
                return
            }
            do throws(PositionBook.BookError) {
                if atEnd, var current = book {
                    // Taken out first so the book is mutated in place, not copied; left out if it fails.
                    book = nil
                    try current.apply(candidate)
                    book = current
                } else {
                    var all = transactions
                    all.insert(candidate, at: index)
                    book = try PositionBook(transactions: all, allowNegativeCash: account.allowNegativeCash)
                }
            } catch {
                throw ValidationError(error)
            }
            transactions.insert(candidate, at: index)
        }

        /// Whether the book of every transaction, deferred ones included, is possible (one pass, in the
        /// store's order); if not, the row to blame and why: the transaction that made it impossible when
        /// it is a deferred one, else (one the account had) the latest deferred row dated at or before it.
        func checkDeferred() -> (row: Int, error: ValidationError)? {
            guard !deferred.isEmpty else { return nil }
            var book = PositionBook(allowNegativeCash: account.allowNegativeCash)
            for transaction in transactions {
                do throws(PositionBook.BookError) {
                    try book.apply(transaction)
                } catch {
                    let blamed =
                        deferred.first { $0.transaction == transaction }
                        ?? deferred.last { $0.transaction.date <= transaction.date } ?? deferred[0]
                    return (blamed.row, ValidationError(error))
                }
            }
            return nil
        }
    }

    private static func insert(
        _ new: NewTransaction, into account: Account, checking book: inout BookCheck, room: inout SymbolRoom, db: Database, calendar: DayCalendar,
        limits: PortfolioLimits, row: Int? = nil
    ) throws -> Transaction {
        guard account.kind == .brokerage else {
            throw ValidationError(field: "accountID", message: "transactions belong to brokerage accounts")
        }
        guard book.transactions.count < limits.transactionsPerAccount else {
            throw ConflictError(
                field: "accountID", message: "an account holds at most \(limits.transactionsPerAccount) transactions (portfolio.maxTransactionsPerAccount)")
        }
        let date = new.date
        try check(date, field: "date", calendar: calendar)
        let created = calendar.day(of: account.createdAt)
        guard date >= created else {
            throw ConflictError(field: "date", message: "\(date) is before the account was created (\(created))")
        }
        if let closedAt = account.closedAt, date >= calendar.day(of: closedAt) {
            throw ConflictError(field: "date", message: "the account closed on \(calendar.day(of: closedAt)); \(date) is not before that")
        }
        var symbol = HeldSymbol.normalized(new.symbol)
        var (quantity, price, amount) = (new.quantity, new.price, new.amount)
        switch new.kind {
        case .buy, .sell, .dividend:
            // The sidecar subscribes upstream to the `T.`/`Q.` topics of what is held: the same rules as a
            // market-feed subscription, so no symbol can name other topics (`*`, `X,AM.*`).
            if let problem = HeldSymbol.problem(with: symbol) {
                throw ValidationError(field: "symbol", message: "\(problem): expected a ticker such as AAPL or X:BTCUSD")
            }
            guard quantity > 0 else { throw ValidationError(field: "quantity", message: "must be above 0") }
            guard price >= 0 else { throw ValidationError(field: "price", message: "must not be negative") }
            amount = 0
        case .fee:
            // The account's, not a symbol's (a symbol kept here would name no holding, bounded by nothing).
            // Its amount is `fees`: a fee of nothing is a row in the wrong column (`amount`, as a deposit's).
            guard new.fees > 0 else { throw ValidationError(field: "fees", message: "a fee's amount goes in fees, above 0") }
            (symbol, quantity, price, amount) = ("", 0, 0, 0)
        case .deposit, .withdrawal:
            guard amount > 0 else { throw ValidationError(field: "amount", message: "required, above 0") }
            (symbol, quantity, price) = ("", 0, 0)
        }
        guard new.fees >= 0 else { throw ValidationError(field: "fees", message: "must not be negative") }
        var candidate = Transaction(
            id: 0, accountID: account.id, date: date, kind: new.kind, symbol: symbol, quantity: quantity, price: price, fees: new.fees,
            amount: amount)
        try book.add(candidate, row: row)
        // After the book's checks: a sell of what is not held is that, whatever the symbol bound says.
        // (A throw here writes nothing: the write, or the whole import, is rolled back.) Only buys, sells
        // and dividends name a symbol; fees and cash were given none above.
        if !symbol.isEmpty { try room.take(symbol, db: db) }
        try db.execute(
            sql: #"INSERT INTO "transaction" (accountID, date, kind, symbol, quantity, price, fees, amount) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"#,
            arguments: [
                account.id, date.description, new.kind.rawValue, symbol, DecimalText.format(quantity), DecimalText.format(price),
                DecimalText.format(new.fees), DecimalText.format(amount),
            ])
        candidate.id = db.lastInsertedRowID
        return candidate
    }

    /// The symbols a write's transactions name (buys, sells, dividends), each new one taking a place of
    /// ``PortfolioLimits/symbols``: each one held is followed live (its trades and quotes asked of the
    /// upstream) and priced over REST. Those the store has are looked up by the symbol index, and counted
    /// by walking it one symbol at a time (a seek each, at most the limit's), once per write.
    struct SymbolRoom {
        let limit: Int
        private var known: Set<String>?

        init(limit: Int) {
            self.limit = limit
        }

        /// Takes `symbol`, or throws a conflict when it is new and the store names `limit` already.
        /// (Only buys, sells and dividends name symbols: a fee's and cash's are empty, v6.)
        mutating func take(_ symbol: String, db: Database) throws {
            if known?.contains(symbol) == true { return }
            let stored = try Bool.fetchOne(db, sql: #"SELECT EXISTS (SELECT 1 FROM "transaction" WHERE symbol = ?)"#, arguments: [symbol]) ?? false
            guard !stored else {
                known?.insert(symbol)
                return
            }
            // Listed only for a new one: with `limit` or fewer stored, every one is in the list.
            var names = try known ?? Set(String.fetchAll(db, sql: Self.firstSymbols, arguments: [limit + 1]))
            defer { known = names }
            guard names.count < limit else {
                throw ConflictError(field: "symbol", message: "the portfolio holds at most \(limit) symbols (portfolio.maxSymbols)")
            }
            names.insert(symbol)
        }

        /// The store's first symbols in order, at most `?`: one index seek each.
        static let firstSymbols = """
            WITH RECURSIVE named(symbol) AS (
                SELECT MIN(symbol) FROM "transaction" WHERE symbol > ''
                UNION ALL
                SELECT (SELECT MIN(symbol) FROM "transaction" WHERE symbol > named.symbol) FROM named WHERE named.symbol IS NOT NULL
                LIMIT ?
            )
            SELECT symbol FROM named WHERE symbol IS NOT NULL
            """
    }

    /// An import's rows, all or nothing: in one write transaction (synchronous: for the import command,
    /// which has no cooperative pool to keep free), creating the accounts named that do
    /// not exist yet (as `kind` accounts dated from their first row). The first refused row throws
    /// (with its index in `rows`) and nothing is written.
    public func importTransactions(
        _ rows: [(account: String, transaction: NewTransaction)], newAccounts currency: String, calendar: DayCalendar = .utc,
        progress: (@Sendable (_ written: Int, _ of: Int) -> Void)? = nil
    ) throws(ImportError) -> Int {
        do {
            return try pool.write { db in
                var accounts: [String: Account] = [:]
                for account in try Self.accounts(db) where accounts[account.name] == nil {
                    accounts[account.name] = account
                }
                var books: [Int64: BookCheck] = [:]
                // One for the whole import: the symbols it names are looked up once each.
                var room = SymbolRoom(limit: limits.symbols)
                var written = 0
                for (index, row) in rows.enumerated().sorted(by: { ($0.element.transaction.date, $0.offset) < ($1.element.transaction.date, $1.offset) }) {
                    do {
                        let account: Account
                        if let existing = accounts[row.account] {
                            account = existing
                        } else {
                            // Rows are taken in date order: an account's first row is its earliest.
                            account = try Self.insertAccount(
                                db, name: row.account, kind: .brokerage, currency: currency,
                                createdAt: calendar.startOfDay(row.transaction.date), allowNegativeCash: false, limits: limits)
                            accounts[row.account] = account
                        }
                        // Taken out of the table while it grows: a copy left in it would make every insert copy the list.
                        var book =
                            try books.removeValue(forKey: account.id)
                            ?? BookCheck(account: account, existing: try Self.transactions(db, accountID: account.id))
                        _ = try Self.insert(
                            row.transaction, into: account, checking: &book, room: &room, db: db, calendar: calendar, limits: limits, row: index)
                        books[account.id] = book
                        written += 1
                        if written % Self.importProgressEvery == 0 { progress?(written, rows.count) }
                    } catch {
                        throw ImportError(index: index, error: error)
                    }
                }
                // Rows dated before an account's later transactions, checked once per account (the earliest
                // failing row named; the whole import is rolled back).
                let failures = books.values.compactMap { $0.checkDeferred() }
                if let first = failures.min(by: { $0.row < $1.row }) { throw ImportError(index: first.row, error: first.error) }
                return rows.count
            }
        } catch let error as ImportError {
            throw error
        } catch {
            throw ImportError(index: nil, error: error)
        }
    }

    /// How many rows an import writes between two progress reports.
    public static let importProgressEvery = 5_000

    /// Why an import wrote nothing: the row (index into the rows given) and the store's error.
    public struct ImportError: Error, CustomStringConvertible {
        public var index: Int?
        public var error: any Error
        public var description: String { "\(error)" }
    }

    public func transactions(accountID: Int64) async throws -> [Transaction] {
        try await read { db in try Self.transactions(db, accountID: accountID) }
    }

    /// Some rows of a list in its order, and whether more follow.
    public struct Page<Element: Sendable>: Sendable {
        public var rows: [Element]
        public var more: Bool
    }

    /// The most rows one page of a list holds.
    public static let maxPageRows = 10_000

    /// At most `limit` of an account's transactions (by date, then id) after the one numbered `after`
    /// (from the first when `nil`). An unknown account is ``StoreError/notFound(_:)``; an `after` that
    /// is no transaction of the account, a ``ValidationError`` on `after`.
    public func transactions(accountID: Int64, after: Int64?, limit: Int) async throws -> Page<Transaction> {
        try await page(accountID: accountID, after: after, limit: limit, table: #""transaction""#, by: "date", naming: "transaction") {
            try Self.transactions($0, where: $1, $2, limit: $3)
        }
    }

    /// A page of one of an account's lists, `table`'s rows ordered by `by`, then id (what both lists share).
    private func page<Element: Sendable>(
        accountID: Int64, after: Int64?, limit: Int, table: String, by order: String, naming what: String,
        rows: @escaping @Sendable (Database, String, StatementArguments, Int) throws -> [Element]
    ) async throws -> Page<Element> {
        let limit = min(max(limit, 1), Self.maxPageRows)
        return try await read { db in
            _ = try Self.account(db, accountID)
            var clause = "accountID = ?"
            var arguments: StatementArguments = [accountID]
            if let after {
                let sql = "SELECT \(order) FROM \(table) WHERE id = ? AND accountID = ?"
                guard let key = try String.fetchOne(db, sql: sql, arguments: [after, accountID]) else {
                    throw ValidationError(field: "after", message: "names no \(what) of account \(accountID)")
                }
                clause += " AND (\(order), id) > (?, ?)"
                arguments += [key, after]
            }
            let found = try rows(db, clause, arguments, limit + 1)
            return Page(rows: Array(found.prefix(limit)), more: found.count > limit)
        }
    }

    /// Every brokerage account with its transactions of `symbol` (by the symbol's index: what one security
    /// is read from, whatever else the accounts hold), from one read (one consistent state).
    public func brokerageTransactions(of symbol: String) async throws -> [(account: Account, transactions: [Transaction])] {
        try await read { db in
            // One query on the symbol's index (with the account's too, SQLite would take the account's).
            let held = Dictionary(grouping: try Self.transactions(db, where: "symbol = ?", [symbol]), by: \.accountID)
            return try Self.accounts(db).filter { $0.kind == .brokerage }.map { ($0, held[$0.id] ?? []) }
        }
    }

    private static func transactions(_ db: Database, accountID: Int64) throws -> [Transaction] {
        try transactions(db, where: "accountID = ?", [accountID])
    }

    /// The transactions `clause` picks, by date, then id; at most `limit`.
    private static func transactions(_ db: Database, where clause: String, _ arguments: StatementArguments, limit: Int? = nil) throws
        -> [Transaction]
    {
        let sql = #"SELECT * FROM "transaction" WHERE "# + clause + " ORDER BY date, id" + (limit.map { " LIMIT \($0)" } ?? "")
        return try Row.fetchAll(db, sql: sql, arguments: arguments).map { row in
            guard let kind = TransactionKind(rawValue: row["kind"]) else { throw StoreError.corrupt("transaction kind") }
            return Transaction(
                id: row["id"], accountID: row["accountID"], date: try day(row["date"]), kind: kind, symbol: row["symbol"],
                quantity: try decimal(row["quantity"]), price: try decimal(row["price"]), fees: try decimal(row["fees"]),
                amount: try decimal(row["amount"]))
        }
    }

    // MARK: the ledger

    /// What a live valuation reads, from one read (one consistent state).
    public struct Ledger: Sendable {
        /// The ledger's revision when read: any later change to an account, a transaction or a value update,
        /// by any connection or process, makes ``PortfolioStore/ledgerRevision()`` differ from it.
        public var revision: Int64
        /// Every account, by id.
        public var accounts: [Account]
        /// The brokerage accounts' transactions, by account, by date.
        public var transactions: [Int64: [Transaction]]
        /// The savings accounts' value updates, by account, by time.
        public var updates: [Int64: [AccountUpdate]]
    }

    /// The ledger's revision now: one row, so a reader that kept what it built from a ``Ledger`` of the
    /// same revision knows it is still current (read-your-writes included: a write has committed before
    /// its call returns).
    public func ledgerRevision() async throws -> Int64 {
        try await read { db in try Self.ledgerRevision(db) }
    }

    private static func ledgerRevision(_ db: Database) throws -> Int64 {
        guard let value = try Int64.fetchOne(db, sql: "SELECT value FROM ledgerRevision") else { throw StoreError.corrupt("ledger revision") }
        return value
    }

    public func ledger() async throws -> Ledger {
        try await read { db in
            var ledger = Ledger(revision: try Self.ledgerRevision(db), accounts: try Self.accounts(db), transactions: [:], updates: [:])
            for account in ledger.accounts {
                switch account.kind {
                case .brokerage: ledger.transactions[account.id] = try Self.transactions(db, accountID: account.id)
                case .savings: ledger.updates[account.id] = try Self.updates(db, accountID: account.id)
                }
            }
            return ledger
        }
    }

    // MARK: changes

    /// The newest row ids of the tables a change adds to (ids only grow: `AUTOINCREMENT`).
    public struct ChangeMarks: Sendable, Equatable {
        public var account: Int64 = 0
        public var transaction: Int64 = 0
        public var update: Int64 = 0
        public init() {}
    }

    /// The rows added since `marks` (by this process or another, such as `relay portfolio import`):
    /// the earliest day they touch (an account's creation, a transaction's date, an update's day in
    /// `calendar`), `nil` when none was added, and the marks to ask from next time.
    public func changes(after marks: ChangeMarks, calendar: DayCalendar) async throws -> (marks: ChangeMarks, earliest: Day?) {
        try await read { db in
            var now = ChangeMarks()
            now.account = try Int64.fetchOne(db, sql: "SELECT COALESCE(MAX(id), 0) FROM account") ?? 0
            now.transaction = try Int64.fetchOne(db, sql: #"SELECT COALESCE(MAX(id), 0) FROM "transaction""#) ?? 0
            now.update = try Int64.fetchOne(db, sql: "SELECT COALESCE(MAX(id), 0) FROM accountUpdate") ?? 0
            var days: [Day] = []
            if let text = try String.fetchOne(db, sql: #"SELECT MIN(date) FROM "transaction" WHERE id > ?"#, arguments: [marks.transaction]) {
                days.append(try Self.day(text))
            }
            for text in try String.fetchAll(db, sql: "SELECT createdAt FROM account WHERE id > ?", arguments: [marks.account]) {
                days.append(calendar.day(of: try Self.date(text)))
            }
            for text in try String.fetchAll(db, sql: "SELECT at FROM accountUpdate WHERE id > ?", arguments: [marks.update]) {
                days.append(calendar.day(of: try Self.date(text)))
            }
            return (now, days.min())
        }
    }

    // MARK: value updates

    public func addUpdate(accountID: Int64, at: Date, value: Decimal, calendar: DayCalendar = .utc) async throws -> AccountUpdate {
        try Self.check(at, field: "at", calendar: calendar)
        let limits = self.limits
        return try await write { db in
            let account = try Self.account(db, accountID)
            guard account.kind == .savings else {
                throw ValidationError(field: "accountID", message: "value updates belong to savings accounts")
            }
            guard value >= 0 else { throw ValidationError(field: "value", message: "must not be negative") }
            let held = try Int.fetchOne(db, sql: "SELECT COUNT(*) FROM accountUpdate WHERE accountID = ?", arguments: [accountID]) ?? 0
            guard held < limits.updatesPerAccount else {
                throw ConflictError(
                    field: "accountID", message: "an account holds at most \(limits.updatesPerAccount) value updates (portfolio.maxUpdatesPerAccount)")
            }
            if let closedAt = account.closedAt, at >= closedAt {
                throw ConflictError(field: "at", message: "the account closed at \(Self.text(closedAt)); an update then or later counts nowhere")
            }
            try db.execute(
                sql: "INSERT INTO accountUpdate (accountID, at, value) VALUES (?, ?, ?)",
                arguments: [accountID, Self.text(at), DecimalText.format(value)])
            return AccountUpdate(id: db.lastInsertedRowID, accountID: accountID, at: at, value: value)
        }
    }

    public func updates(accountID: Int64) async throws -> [AccountUpdate] {
        try await read { db in try Self.updates(db, accountID: accountID) }
    }

    private static func updates(_ db: Database, accountID: Int64) throws -> [AccountUpdate] {
        try updates(db, where: "accountID = ?", [accountID])
    }

    /// At most `limit` of an account's value updates (by time, then id) after the one numbered `after`
    /// (from the first when `nil`); refused as ``transactions(accountID:after:limit:)`` is.
    public func updates(accountID: Int64, after: Int64?, limit: Int) async throws -> Page<AccountUpdate> {
        try await page(accountID: accountID, after: after, limit: limit, table: "accountUpdate", by: "at", naming: "value update") {
            try Self.updates($0, where: $1, $2, limit: $3)
        }
    }

    /// The value updates `clause` picks, by time, then id; at most `limit`.
    private static func updates(_ db: Database, where clause: String, _ arguments: StatementArguments, limit: Int? = nil) throws
        -> [AccountUpdate]
    {
        let sql = "SELECT * FROM accountUpdate WHERE " + clause + " ORDER BY at, id" + (limit.map { " LIMIT \($0)" } ?? "")
        return try Row.fetchAll(db, sql: sql, arguments: arguments).map { row in
            AccountUpdate(id: row["id"], accountID: row["accountID"], at: try date(row["at"]), value: try decimal(row["value"]))
        }
    }

    // MARK: snapshots

    /// Writes snapshots, replacing those of the same account and day, in one transaction.
    public func saveSnapshots(_ snapshots: [AccountSnapshot], portfolio: [PortfolioSnapshot]) async throws {
        let (snapshots, portfolio) = (snapshots.map(Self.storable), portfolio.map(Self.storable))
        try await write { db in try Self.save(snapshots, portfolio: portfolio, in: db) }
    }

    /// The places a snapshot's values are stored to.
    public static let snapshotScale = 8
    /// The places a daily close is stored to.
    public static let closeScale = 10

    /// A snapshot as it is stored: its values to ``snapshotScale`` places; one whose value cannot be stored
    /// (more than 30 digits: no market's price times a quantity, but a REST host's may be) as `0`, partial.
    static func storable(_ snapshot: AccountSnapshot) -> AccountSnapshot {
        var stored = snapshot
        let cash = snapshot.cash.map { DecimalText.storable($0, scale: snapshotScale) }
        guard let value = DecimalText.storable(snapshot.value, scale: snapshotScale), cash != .some(nil) else {
            (stored.value, stored.cash, stored.partial) = (0, nil, true)
            return stored
        }
        (stored.value, stored.cash) = (value, cash ?? nil)
        return stored
    }

    /// A portfolio total as it is stored (as ``storable(_:)-(AccountSnapshot)`` stores an account's).
    static func storable(_ snapshot: PortfolioSnapshot) -> PortfolioSnapshot {
        var stored = snapshot
        guard let total = DecimalText.storable(snapshot.total, scale: snapshotScale), let cash = DecimalText.storable(snapshot.cash, scale: snapshotScale)
        else {
            (stored.total, stored.cash, stored.partial) = (0, 0, true)
            return stored
        }
        (stored.total, stored.cash) = (total, cash)
        return stored
    }

    private static func save(_ snapshots: [AccountSnapshot], portfolio: [PortfolioSnapshot], in db: Database) throws {
        for snapshot in snapshots {
            try db.execute(
                sql: """
                    INSERT OR REPLACE INTO accountSnapshot (accountID, day, value, cash, partial, source, unpriced)
                    VALUES (?, ?, ?, ?, ?, ?, ?)
                    """,
                arguments: [
                    snapshot.accountID, snapshot.day.description, DecimalText.format(snapshot.value), snapshot.cash.map(DecimalText.format),
                    snapshot.partial, snapshot.source.rawValue, snapshot.unpriced.isEmpty ? nil : snapshot.unpriced.joined(separator: ","),
                ])
        }
        for snapshot in portfolio {
            try db.execute(
                sql: "INSERT OR REPLACE INTO portfolioSnapshot (day, total, cash, partial) VALUES (?, ?, ?, ?)",
                arguments: [snapshot.day.description, DecimalText.format(snapshot.total), DecimalText.format(snapshot.cash), snapshot.partial])
        }
    }

    /// How many snapshot rows a ``replaceHistory(_:accountDays:portfolio:portfolioDays:)`` changed.
    public struct HistoryWrite: Sendable, Equatable {
        /// Rows inserted or replaced (account and portfolio).
        public var written = 0
        /// Rows removed (days an account or the portfolio no longer counts).
        public var removed = 0

        public init(written: Int = 0, removed: Int = 0) {
            self.written = written
            self.removed = removed
        }
    }

    /// Replaces the recomputed history in one write transaction (of the days from `from` on: the snapshots
    /// given are those days', the rows before are not read), touching only the rows that changed: each
    /// account's rows outside its days (after it closed, say) are removed, the portfolio's rows outside
    /// `portfolioDays` (days before any account that still exists) are removed, and of the rest only
    /// those that differ from what is stored are written. A closed or deleted account so leaves the
    /// totals of every day it no longer counts on. Through GRDB's async API: the caller is suspended,
    /// not a thread of the cooperative pool blocked, while SQLite works.
    ///
    /// What is stored is read before the write, not in it: a recomputation from long ago reads every
    /// account's rows since (hundreds of thousands), and every other write would wait for that read.
    /// Nothing else writes these rows (recomputations run one at a time, one sidecar per file); only
    /// deleting an account removes its rows meanwhile, and writing one of them fails as before (its
    /// account is gone). So the rows read are those stored when the write runs, and the write holds the
    /// database only for the rows that changed. (The rows given all lie within their account's days,
    /// which the write's deletions leave alone.)
    @discardableResult
    public func replaceHistory(
        _ snapshots: [AccountSnapshot], accountDays: [Int64: (from: Day, through: Day)], portfolio: [PortfolioSnapshot],
        portfolioDays: (from: Day, through: Day)?, from: Day? = nil
    ) async throws -> HistoryWrite {
        let since = from?.description ?? ""  // every day is after 
        let ranges = accountDays.map { (id: $0.key, from: $0.value.from, through: $0.value.through) }
        let (snapshots, portfolio) = (snapshots.map(Self.storable), portfolio.map(Self.storable))
        let (changed, changedTotals) = try await read { db in
            var storedAccounts: [Int64: [Day: AccountSnapshot]] = [:]
            // A row that cannot be read (written by a version that stored what it could not read back) is
            // taken as differing: it is written again, readable.
            for row in try Row.fetchAll(db, sql: "SELECT * FROM accountSnapshot WHERE day >= ?", arguments: [since]) {
                guard let snapshot = try? Self.accountSnapshot(row) else { continue }
                storedAccounts[snapshot.accountID, default: [:]][snapshot.day] = snapshot
            }
            var storedTotals: [Day: PortfolioSnapshot] = [:]
            for row in try Row.fetchAll(db, sql: "SELECT * FROM portfolioSnapshot WHERE day >= ?", arguments: [since]) {
                guard let snapshot = try? Self.portfolioSnapshot(row) else { continue }
                storedTotals[snapshot.day] = snapshot
            }
            return (snapshots.filter { storedAccounts[$0.accountID]?[$0.day] != $0 }, portfolio.filter { storedTotals[$0.day] != $0 })
        }
        return try await write { db in
            var result = HistoryWrite()
            for range in ranges {
                try db.execute(
                    sql: "DELETE FROM accountSnapshot WHERE accountID = ? AND (day < ? OR day > ?)",
                    arguments: [range.id, range.from.description, range.through.description])
                result.removed += db.changesCount
            }
            if let portfolioDays {
                try db.execute(
                    sql: "DELETE FROM portfolioSnapshot WHERE day < ? OR day > ?",
                    arguments: [portfolioDays.from.description, portfolioDays.through.description])
            } else {
                try db.execute(sql: "DELETE FROM portfolioSnapshot")
            }
            result.removed += db.changesCount
            try Self.save(changed, portfolio: changedTotals, in: db)
            result.written = changed.count + changedTotals.count
            return result
        }
    }

    private static func accountSnapshot(_ row: Row) throws -> AccountSnapshot {
        AccountSnapshot(
            accountID: row["accountID"], day: try day(row["day"]), value: try decimal(row["value"]),
            cash: try (row["cash"] as String?).map(decimal), partial: row["partial"], source: SnapshotSource(rawValue: row["source"]) ?? .none,
            unpriced: (row["unpriced"] as String?).map { $0.split(separator: ",").map(String.init) } ?? [])
    }

    private static func portfolioSnapshot(_ row: Row) throws -> PortfolioSnapshot {
        PortfolioSnapshot(day: try day(row["day"]), total: try decimal(row["total"]), cash: try decimal(row["cash"]), partial: row["partial"])
    }

    // MARK: daily closes

    /// A symbol's days whose closes were fetched.
    public struct CloseCoverage: Sendable, Equatable {
        /// The days fetched (closes or not: a holiday has none).
        public var days: ClosedRange<Day>
        /// The last of them whose close was final when it was fetched (before it, `days` held none): the
        /// days after it are fetched again with the next new day (a day's bar may come late, or change
        /// until the next morning).
        public var settledThrough: Day

        public init(days: ClosedRange<Day>, settledThrough: Day) {
            self.days = days
            self.settledThrough = settledThrough
        }
    }

    /// Each symbol's coverage.
    public func closeCoverage() async throws -> [String: CloseCoverage] {
        try await read { db in
            var coverage: [String: CloseCoverage] = [:]
            for row in try Row.fetchAll(db, sql: "SELECT * FROM closeCoverage") {
                let from = try Self.day(row["fromDay"])
                let through = try Self.day(row["throughDay"])
                let settled = try (row["settledThrough"] as String?).map(Self.day) ?? through
                if from <= through { coverage[row["symbol"]] = CloseCoverage(days: from...through, settledThrough: min(settled, through)) }
            }
            return coverage
        }
    }

    /// Stored closes of `symbols` from `from` through `through`, oldest first per symbol.
    public func closes(of symbols: Set<String>, from: Day, through: Day) async throws -> [String: [(day: Day, close: Decimal)]] {
        guard !symbols.isEmpty else { return [:] }
        return try await read { db in
            var closes: [String: [(day: Day, close: Decimal)]] = [:]
            let marks = Array(repeating: "?", count: symbols.count).joined(separator: ",")
            let rows = try Row.fetchAll(
                db, sql: "SELECT * FROM dailyClose WHERE day >= ? AND day <= ? AND symbol IN (\(marks)) ORDER BY symbol, day",
                arguments: StatementArguments([from.description, through.description] + symbols.sorted()))
            for row in rows {
                // One a version that kept what it could not read back stored: that day has no close.
                guard let close = DecimalText.parse(row["close"]) else { continue }
                closes[row["symbol"], default: []].append((try Self.day(row["day"]), close))
            }
            return closes
        }
    }

    /// Stores a symbol's closes fetched for `covering` (adjacent to or overlapping what it had: the
    /// coverage becomes their union). A close of a day outside `covering` is not stored: a source's
    /// answer never changes days it was not asked for. The days of `covering` through `settledThrough`
    /// (all when `nil`) were final when fetched; they extend the settled days when they join them.
    public func saveCloses(
        _ symbol: String, _ closes: [(day: Day, close: Decimal)], covering: ClosedRange<Day>, settledThrough: Day? = nil
    ) async throws {
        let utc = DayCalendar.utc
        // The last settled day of this fetch (the day before it when none is).
        let settledNow = min(covering.upperBound, settledThrough.map { max($0, utc.previous(covering.lowerBound)) } ?? covering.upperBound)
        // A close the store could not read back (more places or digits than it keeps) is not kept: its day
        // is valued as one without a close.
        let rows = closes.filter { covering.contains($0.day) }.compactMap { day, close in
            DecimalText.storable(close, scale: Self.closeScale).map { (day: day.description, close: DecimalText.format($0)) }
        }
        try await write { db in
            for row in rows {
                try db.execute(sql: "INSERT OR REPLACE INTO dailyClose (symbol, day, close) VALUES (?, ?, ?)", arguments: [symbol, row.day, row.close])
            }
            var from = covering.lowerBound
            var through = covering.upperBound
            var settled = settledNow
            if let existing = try Row.fetchOne(db, sql: "SELECT * FROM closeCoverage WHERE symbol = ?", arguments: [symbol]) {
                let before = try Self.day(existing["fromDay"])...Self.day(existing["throughDay"])
                let settledBefore = try (existing["settledThrough"] as String?).map(Self.day) ?? before.upperBound
                from = min(from, before.lowerBound)
                through = max(through, before.upperBound)
                // Settled days extend the settled ones only where they join them (an earlier range
                // fetched before the coverage leaves them as they were).
                settled = covering.lowerBound <= utc.next(settledBefore) ? max(settledBefore, settledNow) : settledBefore
            }
            try db.execute(
                sql: "INSERT OR REPLACE INTO closeCoverage (symbol, fromDay, throughDay, settledThrough) VALUES (?, ?, ?, ?)",
                arguments: [symbol, from.description, through.description, settled.description])
        }
    }

    /// An account's snapshots of the days from `from` through `through`; a row an older version stored
    /// unreadable is left out (the next recomputation writes its day again).
    public func accountSnapshots(accountID: Int64, from: Day, through: Day) async throws -> [AccountSnapshot] {
        try await read { db in
            try Row.fetchAll(
                db, sql: "SELECT * FROM accountSnapshot WHERE accountID = ? AND day >= ? AND day <= ? ORDER BY day",
                arguments: [accountID, from.description, through.description]
            ).compactMap { try? Self.accountSnapshot($0) }
        }
    }

    /// The portfolio's totals of the days from `from` through `through`, unreadable rows left out as
    /// ``accountSnapshots(accountID:from:through:)`` leaves them.
    public func portfolioSnapshots(from: Day, through: Day) async throws -> [PortfolioSnapshot] {
        try await read { db in
            try Row.fetchAll(
                db, sql: "SELECT * FROM portfolioSnapshot WHERE day >= ? AND day <= ? ORDER BY day",
                arguments: [from.description, through.description]
            ).compactMap { try? Self.portfolioSnapshot($0) }
        }
    }
}

/// What a portfolio store holds at most (the sidecar follows every symbol held live and prices it over
/// REST, and values every account on each write): past a bound a write is refused with a conflict and
/// writes nothing. Value type, `Sendable`.
public struct PortfolioLimits: Sendable, Equatable {
    /// Accounts, closed ones included.
    public var accounts: Int
    /// Transactions of one account.
    public var transactionsPerAccount: Int
    /// Value updates of one (savings) account.
    public var updatesPerAccount: Int
    /// Distinct symbols with a transaction (at most ``maxSymbols``).
    public var symbols: Int

    /// The most ``symbols`` may be: a query names them all at once.
    public static let maxSymbols = 10_000

    public init(accounts: Int = 100, transactionsPerAccount: Int = 100_000, updatesPerAccount: Int = 100_000, symbols: Int = 2_000) {
        self.accounts = accounts
        self.transactionsPerAccount = transactionsPerAccount
        self.updatesPerAccount = updatesPerAccount
        self.symbols = min(symbols, Self.maxSymbols)
    }
}

extension ValidationError {
    /// A book's refusal (an oversell, an overdraft), on the field it names.
    fileprivate init(_ error: PositionBook.BookError) {
        self.init(field: error.field, message: "\(error)")
    }
}
