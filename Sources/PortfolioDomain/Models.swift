import Foundation

/// What an account holds: securities bought and sold (`brokerage`), or a value entered now and then
/// (`savings`).
public enum AccountKind: String, Codable, Sendable, CaseIterable {
    case brokerage, savings

    public init(from decoder: any Decoder) throws { self = try Self.decodeListingValues(from: decoder) }
}

/// An account. Closing keeps its history; deleting removes it and all its rows.
public struct Account: Codable, Sendable, Equatable {
    public var id: Int64
    public var name: String
    public var kind: AccountKind
    /// ISO 4217, e.g. `USD`.
    public var currency: String
    public var createdAt: Date
    public var isActive: Bool
    public var closedAt: Date?
    /// Whether a withdrawal may take the account's cash below zero (a margin account). Buys may always.
    public var allowNegativeCash: Bool

    public init(
        id: Int64, name: String, kind: AccountKind, currency: String, createdAt: Date, isActive: Bool = true, closedAt: Date? = nil,
        allowNegativeCash: Bool = false
    ) {
        self.id = id
        self.name = name
        self.kind = kind
        self.currency = currency
        self.createdAt = createdAt
        self.isActive = isActive
        self.closedAt = closedAt
        self.allowNegativeCash = allowNegativeCash
    }
}

public enum TransactionKind: String, Codable, Sendable, CaseIterable {
    case buy, sell, dividend, fee, deposit, withdrawal

    /// Moves only cash (`amount`), no security.
    public var isCashOnly: Bool { self == .deposit || self == .withdrawal }

    public init(from decoder: any Decoder) throws { self = try Self.decodeListingValues(from: decoder) }
}

extension RawRepresentable where Self: CaseIterable, RawValue == String {
    /// Decodes the raw value; an unknown one is an error that lists the valid values.
    static func decodeListingValues(from decoder: any Decoder) throws -> Self {
        let container = try decoder.singleValueContainer()
        let text = try container.decode(String.self)
        guard let value = Self(rawValue: text) else {
            throw DecodingError.dataCorruptedError(
                in: container, debugDescription: "\"\(text)\" is not one of \(allCases.map(\.rawValue).joined(separator: ", "))")
        }
        return value
    }
}

/// A brokerage transaction. Quantities, prices, fees and amounts are exact decimals.
/// `dividend`: `quantity` shares paid `price` each. `fee`: `fees` charged (quantity and price 0).
/// `deposit`, `withdrawal`: `amount` of cash in or out (no symbol, quantity or price).
/// Every kind moves the account's cash: a buy takes `quantity × price + fees`, a sell and a dividend
/// bring `quantity × price − fees`, a fee takes `fees`.
public struct Transaction: Encodable, Sendable, Equatable {
    public var id: Int64
    public var accountID: Int64
    public var date: Day
    public var kind: TransactionKind
    public var symbol: String
    public var quantity: Decimal
    public var price: Decimal
    public var fees: Decimal
    public var amount: Decimal

    public init(
        id: Int64, accountID: Int64, date: Day, kind: TransactionKind, symbol: String, quantity: Decimal, price: Decimal,
        fees: Decimal, amount: Decimal = 0
    ) {
        self.id = id
        self.accountID = accountID
        self.date = date
        self.kind = kind
        self.symbol = symbol
        self.quantity = quantity
        self.price = price
        self.fees = fees
        self.amount = amount
    }

    /// What the transaction does to the account's cash.
    public var cashChange: Decimal {
        switch kind {
        case .buy: -(quantity * price + fees)
        case .sell, .dividend: quantity * price - fees
        case .fee: -fees
        case .deposit: amount - fees
        case .withdrawal: -(amount + fees)
        }
    }

    enum CodingKeys: String, CodingKey {
        case id, accountID, date, kind, symbol, quantity, price, fees, amount, cashChange
    }

    /// The stored fields and `cashChange`.
    public func encode(to encoder: any Encoder) throws {
        var c = encoder.container(keyedBy: CodingKeys.self)
        try c.encode(id, forKey: .id)
        try c.encode(accountID, forKey: .accountID)
        try c.encode(date, forKey: .date)
        try c.encode(kind, forKey: .kind)
        try c.encode(symbol, forKey: .symbol)
        try c.encode(quantity, forKey: .quantity)
        try c.encode(price, forKey: .price)
        try c.encode(fees, forKey: .fees)
        try c.encode(amount, forKey: .amount)
        try c.encode(cashChange, forKey: .cashChange)
    }
}

/// A savings-type account's value, entered at a moment.
public struct AccountUpdate: Codable, Sendable, Equatable {
    public var id: Int64
    public var accountID: Int64
    public var at: Date
    public var value: Decimal

    public init(id: Int64, accountID: Int64, at: Date, value: Decimal) {
        self.id = id
        self.accountID = accountID
        self.at = at
        self.value = value
    }
}

/// Where a day's value came from.
public enum SnapshotSource: String, Codable, Sendable {
    /// A value entered that day (savings accounts).
    case update
    /// The live valuation that day (brokerage accounts).
    case valuation
    /// No new value that day: the previous day's value carried forward.
    case carried
    /// No value known yet for this account.
    case none
    /// Valued from that day's closes (the upstream's daily aggregates) and the book as of that day.
    case close
}

/// One account's value on one day.
public struct AccountSnapshot: Encodable, Sendable, Equatable {
    public var accountID: Int64
    public var day: Day
    /// Everything: positions and cash.
    public var value: Decimal
    /// The cash part of `value` (brokerage accounts; `nil` for savings).
    public var cash: Decimal?
    /// Some of the value could not be determined (unpriced positions, or no value yet).
    public var partial: Bool
    public var source: SnapshotSource
    /// Held symbols that had no price for the day (a `close` day: no close could be had).
    public var unpriced: [String]

    public init(
        accountID: Int64, day: Day, value: Decimal, cash: Decimal? = nil, partial: Bool, source: SnapshotSource, unpriced: [String] = []
    ) {
        self.accountID = accountID
        self.day = day
        self.value = value
        self.cash = cash
        self.partial = partial
        self.source = source
        self.unpriced = unpriced
    }

    enum CodingKeys: String, CodingKey { case accountID, day, value, cash, partial, source, unpriced }

    /// `unpriced` only when some symbol was.
    public func encode(to encoder: any Encoder) throws {
        var c = encoder.container(keyedBy: CodingKeys.self)
        try c.encode(accountID, forKey: .accountID)
        try c.encode(day, forKey: .day)
        try c.encode(value, forKey: .value)
        try c.encodeIfPresent(cash, forKey: .cash)
        try c.encode(partial, forKey: .partial)
        try c.encode(source, forKey: .source)
        if !unpriced.isEmpty { try c.encode(unpriced, forKey: .unpriced) }
    }
}

/// The portfolio's total on one day: the accounts active that day.
public struct PortfolioSnapshot: Codable, Sendable, Equatable {
    public var day: Day
    public var total: Decimal
    /// The brokerage accounts' cash in `total`.
    public var cash: Decimal
    public var partial: Bool

    /// On the wire the total is `value`, as an account's day is.
    enum CodingKeys: String, CodingKey {
        case day, total = "value", cash, partial
    }

    public init(day: Day, total: Decimal, cash: Decimal = 0, partial: Bool) {
        self.day = day
        self.total = total
        self.cash = cash
        self.partial = partial
    }
}
