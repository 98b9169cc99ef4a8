import PortfolioDomain
import Foundation

/// Imports brokerage transactions from CSV: a header line, then
/// `account,date,kind,symbol,quantity,price,fees,amount` (`fees` and `amount` optional; `amount` is the
/// cash of a `deposit` or `withdrawal`, which leave symbol, quantity and price empty). Accounts that do
/// not exist yet are created as brokerage accounts in `currency`, dated from their first transaction.
/// Fields are plain (no quoted commas); blank lines and lines starting with `#` are skipped. All or
/// nothing: the rows are written in one database transaction.
public enum TransactionImport {
    /// One line: the account it names and the transaction it asks for.
    public struct Row: Sendable, Equatable {
        public var line: Int
        public var account: String
        public var transaction: PortfolioStore.NewTransaction
    }

    /// A line that cannot be imported: its number, the field, and why.
    public struct LineError: Error, Sendable, Equatable, CustomStringConvertible {
        public var line: Int
        public var field: String
        public var message: String
        public var description: String { "line \(line): \(field): \(message)" }
    }

    static let columns = ["account", "date", "kind", "symbol", "quantity", "price", "fees", "amount"]
    static let requiredColumns = ["account", "date", "kind", "symbol", "quantity", "price"]

    /// Reads and checks every line before anything is written.
    public static func parse(_ text: String) throws(LineError) -> [Row] {
        var rows: [Row] = []
        var header: [String: Int]?
        // Lines end in LF or CRLF (a spreadsheet's export; "\r\n" is one Character, never equal to "\n").
        for (offset, raw) in text.split(omittingEmptySubsequences: false, whereSeparator: \.isNewline).enumerated() {
            let number = offset + 1
            let line = raw.trimmingCharacters(in: .whitespacesAndNewlines)
            if line.isEmpty || line.hasPrefix("#") { continue }
            if line.contains("\"") { throw LineError(line: number, field: "line", message: "quoted fields are not supported") }
            let fields = line.split(separator: ",", omittingEmptySubsequences: false).map { $0.trimmingCharacters(in: .whitespaces) }
            guard let columns = header else {
                var index: [String: Int] = [:]
                for (position, name) in fields.enumerated() { index[name.lowercased()] = position }
                for required in Self.requiredColumns where index[required] == nil {
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
                throw LineError(
                    line: number, field: "kind", message: "one of \(TransactionKind.allCases.map(\.rawValue).joined(separator: ", "))")
            }
            rows.append(
                Row(
                    line: number, account: account,
                    transaction: .init(
                        date: date, kind: kind, symbol: field("symbol").uppercased(), quantity: try amount("quantity", default: 0),
                        price: try amount("price", default: 0), fees: try amount("fees", default: 0),
                        amount: try amount("amount", default: 0))))
        }
        return rows
    }

    /// Writes parsed rows, creating accounts as needed, all in one database transaction: a refused row
    /// (reported with its line) or a process killed midway leaves nothing written. Returns how many
    /// transactions were added.
    @discardableResult
    public static func apply(
        _ rows: [Row], to store: PortfolioStore, currency: String = "USD", calendar: DayCalendar = .utc,
        progress: (@Sendable (_ written: Int, _ of: Int) -> Void)? = nil
    ) throws -> Int {
        let input = rows.map { (account: $0.account, transaction: $0.transaction) }
        do {
            return try store.importTransactions(input, newAccounts: currency, calendar: calendar, progress: progress)
        } catch {
            guard let index = error.index else { throw error.error }
            guard let refused = error.error as? any FieldRefusal else {
                throw LineError(line: rows[index].line, field: "line", message: "\(error.error)")
            }
            throw LineError(line: rows[index].line, field: refused.field, message: refused.message)
        }
    }
}
