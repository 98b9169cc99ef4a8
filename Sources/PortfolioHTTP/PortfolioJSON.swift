import Portfolio
import PortfolioDomain
import Foundation

/// What the API reads, and its one encoder for what it answers (the models themselves, through
/// ``APIJSONEncoder``: money and quantities as strings of exact decimal text, days `YYYY-MM-DD`,
/// instants ISO 8601).
enum PortfolioJSON {
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

    static let encoder = APIJSONEncoder()

    static let decoder: JSONDecoder = {
        let decoder = JSONDecoder()
        decoder.dateDecodingStrategy = .iso8601
        return decoder
    }()
}
