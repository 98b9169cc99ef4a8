import Foundation
import PortfolioDomain
import Testing

@testable import PortfolioHTTP

@Suite("The API's JSON encoding")
struct APIJSONEncoderTests {
    let encoder = APIJSONEncoder()

    func text(_ value: some Encodable) throws -> String { String(decoding: try encoder.encode(value), as: UTF8.self) }

    @Test func decimalsAreExactStringsDatesISO8601AndKeysSorted() throws {
        let sum = (DecimalText.parse("0.1") ?? 0) + (DecimalText.parse("0.2") ?? 0)
        let big = DecimalText.parse("12345678901234567890.123456789") ?? 0
        let update = AccountUpdate(id: 7, accountID: 3, at: Date(timeIntervalSince1970: 1_735_833_600), value: sum)
        #expect(try text(update) == #"{"accountID":3,"at":"2025-01-02T16:00:00Z","id":7,"value":"0.3"}"#)
        #expect(try text([big, -big]) == #"["12345678901234567890.123456789","-12345678901234567890.123456789"]"#)
    }

    @Test func absentOptionalsAreOmittedAndStringsEscaped() throws {
        let account = Account(id: 1, name: "Tab\t\"quoted\" \\ \u{1}", kind: .brokerage, currency: "USD", createdAt: Date(timeIntervalSince1970: 0))
        let json = try text(account)
        #expect(!json.contains("closedAt"), "nil is omitted, not null")
        #expect(json.contains(#""name":"Tab\t\"quoted\" \\ \u0001""#))
        let decoded = try JSONSerialization.jsonObject(with: Data(json.utf8)) as? [String: Any]
        #expect(decoded?["name"] as? String == account.name, "what it writes is valid JSON that reads back")
    }

    @Test func modelsAddTheirDerivedFieldsBesideTheStoredOnes() throws {
        let day = try #require(Day("2025-03-04"))
        let sell = Transaction(
            id: 1, accountID: 2, date: day, kind: .sell, symbol: "AAPL", quantity: 10, price: DecimalText.parse("189.05") ?? 0, fees: 1)
        let object = try #require(try JSONSerialization.jsonObject(with: encoder.encode(sell)) as? [String: Any])
        #expect(object["cashChange"] as? String == "1889.5")
        #expect(object["price"] as? String == "189.05")
        #expect(object["date"] as? String == "2025-03-04")
        let snapshot = PortfolioSnapshot(day: day, total: 100, cash: 5, partial: false)
        #expect(try text(snapshot) == #"{"cash":"5","day":"2025-03-04","partial":false,"value":"100"}"#)
        let account = AccountSnapshot(accountID: 1, day: day, value: 3, partial: true, source: .close)
        #expect(!(try text(account)).contains("unpriced"), "an empty list of unpriced symbols is left out")
    }
}
