import Foundation

/// Positions and FIFO tax lots derived from a brokerage account's transactions. Pure, `Sendable`.
public struct PositionBook: Sendable, Equatable {
    /// Shares bought together, what is left of them, and what that remainder cost (fees included).
    public struct Lot: Sendable, Equatable, Codable {
        public var acquired: Day
        public var quantity: Decimal
        public var cost: Decimal

        /// Cost per share (rounded for display; sums use `cost`).
        public var unitCost: Decimal { quantity == 0 ? 0 : DecimalText.rounded(cost / quantity, scale: 6) }
    }

    public struct Position: Sendable, Equatable, Codable {
        public var symbol: String
        /// Open lots, oldest first.
        public var lots: [Lot] = []
        public var realizedPnL: Decimal = 0
        public var dividends: Decimal = 0

        public init(symbol: String, lots: [Lot] = [], realizedPnL: Decimal = 0, dividends: Decimal = 0) {
            self.symbol = symbol
            self.lots = lots
            self.realizedPnL = realizedPnL
            self.dividends = dividends
        }

        public var quantity: Decimal { lots.reduce(0) { $0 + $1.quantity } }
        public var costBasis: Decimal { lots.reduce(0) { $0 + $1.cost } }

        /// The position as one lot of its whole quantity and cost (dated by its oldest): what a valuation
        /// reads of it, summed once rather than lot by lot at every valuation.
        public var collapsed: Position {
            guard lots.count > 1, let first = lots.first else { return self }
            return Position(
                symbol: symbol, lots: [Lot(acquired: first.acquired, quantity: quantity, cost: costBasis)], realizedPnL: realizedPnL, dividends: dividends)
        }
    }

    /// Why transactions cannot be applied.
    public enum BookError: Error, Sendable, Equatable, CustomStringConvertible {
        case oversold(symbol: String, date: Day, selling: Decimal, held: Decimal)
        case overdrawn(date: Day, withdrawing: Decimal, cash: Decimal)

        public var description: String {
            switch self {
            case .oversold(let symbol, let date, let selling, let held):
                "selling \(DecimalText.format(selling)) \(symbol) on \(date) but only \(DecimalText.format(held)) are held"
            case .overdrawn(let date, let withdrawing, let cash):
                "withdrawing \(DecimalText.format(withdrawing)) on \(date) but the cash then is \(DecimalText.format(cash)) (the account does not allow negative cash)"
            }
        }

        /// The request field the error is about.
        public var field: String {
            switch self {
            case .oversold: "quantity"
            case .overdrawn: "amount"
            }
        }
    }

    public private(set) var positions: [String: Position] = [:]
    /// Fees charged on their own (`fee` transactions).
    public private(set) var fees: Decimal = 0
    /// The account's cash: deposits less withdrawals, plus what sells and dividends brought, less what
    /// buys and fees took. Buys may take it below zero; withdrawals only when negative cash is allowed.
    public private(set) var cash: Decimal = 0
    /// Whether a withdrawal may take the cash below zero.
    public let allowNegativeCash: Bool

    public init(allowNegativeCash: Bool = true) {
        self.allowNegativeCash = allowNegativeCash
    }

    /// Applies transactions in date order (same-day ones in the order given).
    /// - Parameter allowNegativeCash: when false, a withdrawal beyond the cash of its day is an error.
    public init(transactions: [Transaction], allowNegativeCash: Bool = true) throws(BookError) {
        self.allowNegativeCash = allowNegativeCash
        let ordered = transactions.enumerated().sorted { ($0.element.date, $0.offset) < ($1.element.date, $1.offset) }
        for (_, transaction) in ordered { try apply(transaction) }
    }

    /// The cash at the end of each day that has transactions, in day order.
    public static func cashByDay(_ transactions: [Transaction]) -> [(day: Day, cash: Decimal)] {
        var result: [(day: Day, cash: Decimal)] = []
        var cash: Decimal = 0
        for transaction in transactions.sorted(by: { $0.date < $1.date }) {
            cash += transaction.cashChange
            if result.last?.day == transaction.date { result[result.count - 1].cash = cash } else { result.append((transaction.date, cash)) }
        }
        return result
    }

    public mutating func apply(_ transaction: Transaction) throws(BookError) {
        let symbol = transaction.symbol
        if transaction.kind == .withdrawal, !allowNegativeCash, cash + transaction.cashChange < 0 {
            throw .overdrawn(date: transaction.date, withdrawing: transaction.amount, cash: cash)
        }
        cash += transaction.cashChange
        switch transaction.kind {
        case .deposit, .withdrawal:
            break
        case .buy:
            // In place (the dictionary's modify accessor): a copy of the position would copy all its lots.
            positions[symbol, default: Position(symbol: symbol)].lots.append(
                Lot(
                    acquired: transaction.date, quantity: transaction.quantity,
                    cost: transaction.quantity * transaction.price + transaction.fees))
        case .sell:
            let held = positions[symbol]?.quantity ?? 0
            guard transaction.quantity <= held else {
                throw .oversold(symbol: symbol, date: transaction.date, selling: transaction.quantity, held: held)
            }
            // Taken out, so the only reference to its lots is this one and they change in place.
            var position = positions.removeValue(forKey: symbol) ?? Position(symbol: symbol)
            var remaining = transaction.quantity
            var consumedCost: Decimal = 0
            while remaining > 0, !position.lots.isEmpty {
                var lot = position.lots[0]
                if lot.quantity <= remaining {
                    remaining -= lot.quantity
                    consumedCost += lot.cost
                    position.lots.removeFirst()
                } else {
                    // The part sold carries its share of the lot's cost; what stays keeps the rest exactly.
                    let part = DecimalText.rounded(lot.cost * remaining / lot.quantity, scale: 10)
                    lot.quantity -= remaining
                    lot.cost -= part
                    consumedCost += part
                    remaining = 0
                    position.lots[0] = lot
                }
            }
            position.realizedPnL += transaction.quantity * transaction.price - transaction.fees - consumedCost
            positions[symbol] = position.lots.isEmpty && position.realizedPnL == 0 && position.dividends == 0 ? nil : position
        case .dividend:
            positions[symbol, default: Position(symbol: symbol)].dividends += transaction.quantity * transaction.price - transaction.fees
        case .fee:
            fees += transaction.fees
        }
    }

    /// Adds positions of several accounts together by symbol: their lots side by side (all a valuation
    /// across accounts uses).
    public static func merge(_ positions: [Position], into merged: inout [String: Position]) {
        for position in positions {
            merged[position.symbol, default: Position(symbol: position.symbol)].lots += position.lots
        }
    }

    /// Positions with shares held, by symbol.
    public var open: [Position] {
        positions.values.filter { $0.quantity > 0 }.sorted { $0.symbol < $1.symbol }
    }
}
