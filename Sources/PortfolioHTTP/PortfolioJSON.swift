import Portfolio
import PortfolioDomain
import Foundation

/// The API's JSON shapes. Money and quantities are strings of exact decimal text (`"189.05"`), days
/// `YYYY-MM-DD`, instants ISO 8601.
enum PortfolioJSON {
    static func text(_ value: Decimal) -> String { DecimalText.format(value) }
    static func text(_ value: Decimal?) -> String? { value.map(DecimalText.format) }

    struct AccountOut: Encodable {
        var id: Int64
        var name: String
        var kind: AccountKind
        var currency: String
        var createdAt: Date
        var isActive: Bool
        var closedAt: Date?
        var allowNegativeCash: Bool
        init(_ a: Account) {
            (id, name, kind, currency, createdAt, isActive, closedAt, allowNegativeCash) = (
                a.id, a.name, a.kind, a.currency, a.createdAt, a.isActive, a.closedAt, a.allowNegativeCash
            )
        }
    }

    struct TransactionOut: Encodable {
        var id: Int64
        var accountID: Int64
        var date: Day
        var kind: TransactionKind
        var symbol: String
        var quantity: String
        var price: String
        var fees: String
        var amount: String
        /// What it did to the account's cash.
        var cashChange: String
        /// In a security's detail, which spans accounts.
        var accountName: String?
        init(_ t: Transaction, accountName: String? = nil) {
            (id, accountID, date, kind, symbol, self.accountName) = (t.id, t.accountID, t.date, t.kind, t.symbol, accountName)
            (quantity, price, fees, amount, cashChange) = (text(t.quantity), text(t.price), text(t.fees), text(t.amount), text(t.cashChange))
        }
    }

    struct UpdateOut: Encodable {
        var id: Int64
        var accountID: Int64
        var at: Date
        var value: String
        init(_ u: AccountUpdate) { (id, accountID, at, value) = (u.id, u.accountID, u.at, text(u.value)) }
    }

    struct PositionOut: Encodable {
        var symbol: String
        var quantity: String
        var costBasis: String
        var price: String?
        var priceTime: Date?
        var priceSource: PriceObservation.Source?
        var marketValue: String?
        var unrealizedPnL: String?
        var unrealizedPnLPercent: String?
        var dayChange: String?
        var status: PriceRule.Status
        init(_ p: PositionValuation) {
            (symbol, quantity, costBasis, price, priceTime, priceSource) = (
                p.symbol, text(p.quantity), text(p.costBasis), text(p.price), p.priceTime, p.priceSource
            )
            (marketValue, unrealizedPnL, unrealizedPnLPercent, dayChange, status) = (
                text(p.marketValue), text(p.unrealizedPnL), text(p.unrealizedPnLPercent), text(p.dayChange), p.status
            )
        }
    }

    struct ValuationOut: Encodable {
        var asOf: Date
        var positions: [PositionOut]
        var total: String
        var positionsValue: String
        var cash: String
        var costBasis: String
        var unrealizedPnL: String
        var dayChange: String
        var hasPartialFailures: Bool
        var unpricedSymbols: [String]
        var staleSymbols: [String]
        var accounts: [AccountValueOut]
        init(_ v: Valuation) {
            accounts = v.accounts.map(AccountValueOut.init)
            (asOf, positions, total, costBasis) = (v.asOf, v.positions.map(PositionOut.init), text(v.total), text(v.costBasis))
            (positionsValue, cash) = (text(v.positionsValue), text(v.cash))
            (unrealizedPnL, dayChange, hasPartialFailures, unpricedSymbols, staleSymbols) = (
                text(v.unrealizedPnL), text(v.dayChange), v.hasPartialFailures, v.unpricedSymbols, v.staleSymbols
            )
        }
    }

    struct AccountValueOut: Encodable {
        var id: Int64
        var name: String
        var kind: AccountKind
        var value: String?
        var cash: String?
        var asOf: Date?
        var basis: AccountValue.Basis
        var partial: Bool
        init(_ a: AccountValue) {
            (id, name, kind, value, cash, asOf, basis, partial) = (a.id, a.name, a.kind, text(a.value), text(a.cash), a.asOf, a.basis, a.partial)
        }
    }

    struct SnapshotOut: Encodable {
        var day: Day
        var value: String
        var cash: String?
        var partial: Bool
        var source: SnapshotSource?
        /// Held symbols without a price that day (omitted when none).
        var unpriced: [String]?
        init(_ s: AccountSnapshot) {
            (day, value, cash, partial, source) = (s.day, text(s.value), text(s.cash), s.partial, s.source)
            unpriced = s.unpriced.isEmpty ? nil : s.unpriced
        }
        init(_ s: PortfolioSnapshot) { (day, value, cash, partial, source) = (s.day, text(s.total), text(s.cash), s.partial, nil) }
    }

    /// A decimal given as a string (preferred) or a JSON number.
    struct Amount: Decodable {
        var value: Decimal
        init(from decoder: any Decoder) throws {
            let container = try decoder.singleValueContainer()
            if let text = try? container.decode(String.self), let value = DecimalText.parse(text) {
                self.value = value
            } else if let number = try? container.decode(Decimal.self), let value = DecimalText.parse(DecimalText.format(number)) {
                self.value = value
            } else {
                throw DecodingError.dataCorruptedError(in: container, debugDescription: "expected a decimal such as \"12.50\"")
            }
        }
    }

    struct NewAccount: Decodable {
        var name: String
        var kind: AccountKind
        var currency: String?
        var createdAt: Date?
        var allowNegativeCash: Bool?
    }

    struct Close: Decodable { var closedAt: Date? }

    struct NewTransaction: Decodable {
        var date: Day
        var kind: TransactionKind
        var symbol: String?
        var quantity: Amount?
        var price: Amount?
        var fees: Amount?
        var amount: Amount?
    }

    struct NewUpdate: Decodable {
        var at: Date?
        var value: Amount
    }

    static let encoder: JSONEncoder = {
        let encoder = JSONEncoder()
        encoder.dateEncodingStrategy = .iso8601
        encoder.outputFormatting = [.sortedKeys]
        return encoder
    }()

    static let decoder: JSONDecoder = {
        let decoder = JSONDecoder()
        decoder.dateDecodingStrategy = .iso8601
        return decoder
    }()
}
