import Foundation

/// Imports brokerage transactions from CSV: a header line, then
/// `account,date,kind,symbol,quantity,price,fees` (fees optional). Accounts that do not exist yet are
/// created as brokerage accounts in `currency`, dated from their first transaction. Fields are plain
/// (no quoted commas); blank lines and lines starting with `#` are skipped.
public enum TransactionImport {
    public struct Row: Sendable, Equatable {
        public var line: Int
        public var account: String
        public var date: Day
        public var kind: TransactionKind
        public var symbol: String
        public var quantity: Decimal
        public var price: Decimal
        public var fees: Decimal
    }

    /// A line that cannot be imported: its number, the field, and why.
    public struct LineError: Error, Sendable, Equatable, CustomStringConvertible {
        public var line: Int
        public var field: String
        public var message: String
        public var description: String { "line \(line): \(field): \(message)" }
    }

    static let columns = ["account", "date", "kind", "symbol", "quantity", "price", "fees"]

    /// Reads and checks every line before anything is written.
    public static func parse(_ text: String) throws(LineError) -> [Row] {
        var rows: [Row] = []
        var header: [String: Int]?
        for (offset, raw) in text.split(separator: "\n", omittingEmptySubsequences: false).enumerated() {
            let number = offset + 1
            let line = raw.trimmingCharacters(in: .whitespacesAndNewlines)
            if line.isEmpty || line.hasPrefix("#") { continue }
            if line.contains("\"") { throw LineError(line: number, field: "line", message: "quoted fields are not supported") }
            let fields = line.split(separator: ",", omittingEmptySubsequences: false).map { $0.trimmingCharacters(in: .whitespaces) }
            guard let columns = header else {
                var index: [String: Int] = [:]
                for (position, name) in fields.enumerated() { index[name.lowercased()] = position }
                for required in Self.columns.dropLast() where index[required] == nil {
                    throw LineError(
                        line: number, field: required, message: "missing column (header must name \(Self.columns.joined(separator: ",")))")
                }
                header = index
                continue
            }
            func field(_ name: String) -> String { columns[name].flatMap { $0 < fields.count ? fields[$0] : nil } ?? "" }
            func amount(_ name: String, default value: Decimal? = nil) throws(LineError) -> Decimal {
                let text = field(name)
                if text.isEmpty, let value { return value }
                guard let decimal = DecimalText.parse(text) else {
                    throw LineError(line: number, field: name, message: "expected a decimal such as 12.50")
                }
                return decimal
            }
            let account = field("account")
            guard !account.isEmpty else { throw LineError(line: number, field: "account", message: "required") }
            guard let date = Day(field("date")) else { throw LineError(line: number, field: "date", message: "expected YYYY-MM-DD") }
            guard let kind = TransactionKind(rawValue: field("kind").lowercased()) else {
                throw LineError(line: number, field: "kind", message: "one of buy, sell, dividend, fee")
            }
            rows.append(
                Row(
                    line: number, account: account, date: date, kind: kind, symbol: field("symbol").uppercased(),
                    quantity: try amount("quantity", default: 0), price: try amount("price", default: 0),
                    fees: try amount("fees", default: 0)))
        }
        return rows
    }

    /// Writes parsed rows, creating accounts as needed. Returns how many transactions were added.
    @discardableResult
    public static func apply(_ rows: [Row], to store: PortfolioStore, currency: String = "USD", calendar: DayCalendar = .utc) throws -> Int
    {
        var accounts = Dictionary(try store.accounts().map { ($0.name, $0) }, uniquingKeysWith: { first, _ in first })
        for row in rows.sorted(by: { ($0.date, $0.line) < ($1.date, $1.line) }) {
            if accounts[row.account] == nil {
                let first = rows.filter { $0.account == row.account }.map(\.date).min() ?? row.date
                accounts[row.account] = try store.createAccount(
                    name: row.account, kind: .brokerage, currency: currency, createdAt: calendar.startOfDay(first))
            }
            guard let account = accounts[row.account] else { continue }
            do {
                _ = try store.addTransaction(
                    accountID: account.id, date: row.date, kind: row.kind, symbol: row.symbol, quantity: row.quantity, price: row.price,
                    fees: row.fees, calendar: calendar)
            } catch let error as PortfolioStore.ValidationError {
                throw LineError(line: row.line, field: error.field, message: error.message)
            } catch let error as PortfolioStore.ConflictError {
                throw LineError(line: row.line, field: error.field, message: error.message)
            }
        }
        return rows.count
    }
}
