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

        public var quantity: Decimal { lots.reduce(0) { $0 + $1.quantity } }
        public var costBasis: Decimal { lots.reduce(0) { $0 + $1.cost } }
    }

    /// Why transactions cannot be applied.
    public enum BookError: Error, Sendable, Equatable, CustomStringConvertible {
        case oversold(symbol: String, date: Day, selling: Decimal, held: Decimal)

        public var description: String {
            switch self {
            case .oversold(let symbol, let date, let selling, let held):
                "selling \(DecimalText.format(selling)) \(symbol) on \(date) but only \(DecimalText.format(held)) are held"
            }
        }
    }

    public private(set) var positions: [String: Position] = [:]
    /// Fees charged on their own (`fee` transactions).
    public private(set) var fees: Decimal = 0

    public init() {}

    /// Applies transactions in date order (same-day ones in the order given).
    public init(transactions: [Transaction]) throws(BookError) {
        let ordered = transactions.enumerated().sorted { ($0.element.date, $0.offset) < ($1.element.date, $1.offset) }
        for (_, transaction) in ordered { try apply(transaction) }
    }

    public mutating func apply(_ transaction: Transaction) throws(BookError) {
        let symbol = transaction.symbol
        switch transaction.kind {
        case .buy:
            var position = positions[symbol] ?? Position(symbol: symbol)
            position.lots.append(
                Lot(
                    acquired: transaction.date, quantity: transaction.quantity,
                    cost: transaction.quantity * transaction.price + transaction.fees))
            positions[symbol] = position
        case .sell:
            var position = positions[symbol] ?? Position(symbol: symbol)
            let held = position.quantity
            guard transaction.quantity <= held else {
                throw .oversold(symbol: symbol, date: transaction.date, selling: transaction.quantity, held: held)
            }
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
            var position = positions[symbol] ?? Position(symbol: symbol)
            position.dividends += transaction.quantity * transaction.price - transaction.fees
            positions[symbol] = position
        case .fee:
            fees += transaction.fees
        }
    }

    /// Positions with shares held, by symbol.
    public var open: [Position] {
        positions.values.filter { $0.quantity > 0 }.sorted { $0.symbol < $1.symbol }
    }
}
