import PortfolioDomain
import PortfolioData
import Foundation

/// What the live valuation needs of the store, built once from a ``PortfolioStore/Ledger`` and kept while
/// the ledger's revision stays the same: the accounts, each brokerage account's book (its open positions
/// and cash) and each savings account's current value update. A valuation then costs a one-row read and
/// the pricing of the open positions, not a read of every transaction and a rebuild of every book.
struct LedgerBooks: Sendable {
    let revision: Int64
    let accounts: [Account]
    let books: [Int64: PositionBook]
    /// A savings account's value updates from the last one at or before ``builtAt`` on (later ones are
    /// dated up to tomorrow): what a valuation at ``builtAt`` or later may pick from, and no more.
    private let updates: [Int64: [AccountUpdate]]
    let builtAt: Date

    init(_ ledger: PortfolioStore.Ledger, now: Date) throws {
        revision = ledger.revision
        accounts = ledger.accounts
        builtAt = now
        var books: [Int64: PositionBook] = [:]
        for (account, transactions) in ledger.transactions { books[account] = try PositionBook(transactions: transactions) }
        self.books = books
        updates = ledger.updates.mapValues { updates in
            let current = updates.lastIndex { $0.at <= now } ?? updates.startIndex
            return Array(updates[current...])
        }
    }

    /// The value update a savings account stands at, at `now` (at or after ``builtAt``).
    func lastUpdate(of account: Int64, at now: Date) -> AccountUpdate? {
        updates[account]?.last { $0.at <= now }
    }

    /// Every open position of the active brokerage accounts in `wanted` (all when empty), merged by
    /// symbol, with the accounts holding each.
    func openPositions(accounts wanted: Set<Int64> = []) -> (positions: [String: PositionBook.Position], holders: [String: [Int64]]) {
        var positions: [String: PositionBook.Position] = [:]
        var holders: [String: [Int64]] = [:]
        for account in accounts where account.kind == .brokerage && account.isActive && (wanted.isEmpty || wanted.contains(account.id)) {
            let open = books[account.id]?.open ?? []
            PositionBook.merge(open, into: &positions)
            for position in open { holders[position.symbol, default: []].append(account.id) }
        }
        return (positions, holders)
    }
}
