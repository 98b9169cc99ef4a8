import PortfolioDomain
import PortfolioData
import Foundation

/// What the live valuation needs of the store, built once from a ``PortfolioStore/Ledger`` and kept while
/// the ledger's revision stays the same: the accounts, each brokerage account's book (its open positions
/// and cash) and each savings account's recent value updates. A valuation then costs a one-row read and
/// the pricing of the open positions, not a read of every transaction and a rebuild of every book.
struct LedgerBooks: Sendable {
    let revision: Int64
    let accounts: [Account]
    /// Each brokerage account's book, or why its transactions make none (a database written by hand): only
    /// a valuation that needs that account fails, as when each read its own.
    private let books: [Int64: Result<OpenBook, PositionBook.BookError>]

    /// What a valuation reads of a brokerage account's book: its open positions, each one lot of its
    /// whole quantity and cost (``PositionBook/Position/collapsed``: an account of 100,000 buys is
    /// summed once per ledger revision, not at every valuation and push), and its cash.
    struct OpenBook: Sendable {
        let open: [PositionBook.Position]
        let cash: Decimal
    }
    /// A savings account's value updates from the last one a day or more before the books were built on
    /// (later ones are dated up to tomorrow): what a valuation from then on may pick from (a wall clock
    /// set back by less than a day included), and not every update the account ever had.
    private let updates: [Int64: [AccountUpdate]]
    /// The symbols each brokerage account's transactions name, held now or not (its history values them).
    private let named: [Int64: Set<String>]

    init(_ ledger: PortfolioStore.Ledger, now: Date) {
        revision = ledger.revision
        accounts = ledger.accounts
        named = ledger.transactions.mapValues { Set($0.lazy.map(\.symbol).filter { !$0.isEmpty }) }
        books = ledger.transactions.mapValues { transactions in
            Result { () throws(PositionBook.BookError) in
                let book = try PositionBook(transactions: transactions)
                return OpenBook(open: book.open.map(\.collapsed), cash: book.cash)
            }
        }
        let dayBefore = now.addingTimeInterval(-86_400)
        updates = ledger.updates.mapValues { updates in
            let current = updates.lastIndex { $0.at <= dayBefore } ?? updates.startIndex
            return Array(updates[current...])
        }
    }

    /// A brokerage account's book (an empty one for an account without transactions).
    func book(of account: Int64) throws(PositionBook.BookError) -> OpenBook {
        try books[account]?.get() ?? OpenBook(open: [], cash: 0)
    }

    /// The value update a savings account stands at, at `now`.
    func lastUpdate(of account: Int64, at now: Date) -> AccountUpdate? {
        updates[account]?.last { $0.at <= now }
    }

    /// The symbols the transactions of `account` (of every account when `nil`) name.
    func symbolsNamed(by account: Int64?) -> Set<String> {
        guard let account else { return named.values.reduce(into: []) { $0.formUnion($1) } }
        return named[account] ?? []
    }

    /// The active brokerage accounts in `wanted` (all when empty).
    private func activeBrokerage(_ wanted: Set<Int64> = []) -> [Account] {
        accounts.filter { $0.kind == .brokerage && $0.isActive && (wanted.isEmpty || wanted.contains($0.id)) }
    }

    /// The symbols the active brokerage accounts hold, and the accounts whose transactions make no book
    /// (what they hold is not known: the others' symbols are followed all the same).
    func heldSymbols() -> (symbols: Set<String>, broken: [Int64]) {
        var symbols: Set<String> = []
        var broken: [Int64] = []
        for account in activeBrokerage() {
            guard let book = try? book(of: account.id) else {
                broken.append(account.id)
                continue
            }
            for position in book.open { symbols.insert(position.symbol) }
        }
        return (symbols, broken)
    }

    /// Every open position of the active brokerage accounts in `wanted` (all when empty), merged by
    /// symbol, with the accounts holding each.
    func openPositions(accounts wanted: Set<Int64> = []) throws -> (positions: [String: PositionBook.Position], holders: [String: [Int64]]) {
        var positions: [String: PositionBook.Position] = [:]
        var holders: [String: [Int64]] = [:]
        for account in activeBrokerage(wanted) {
            let open = try book(of: account.id).open
            PositionBook.merge(open, into: &positions)
            for position in open { holders[position.symbol, default: []].append(account.id) }
        }
        return (positions, holders)
    }
}
