import Foundation
import Testing

@testable import Portfolio
@testable import PortfolioData
@testable import PortfolioDomain

@Suite("Holdings views")
struct HoldingsQueryTests {
    func holding(_ symbol: String, value: Decimal?, quantity: Decimal = 1) -> Holding {
        var row = PositionValuation(symbol: symbol, quantity: quantity, costBasis: 10, status: value == nil ? .unavailable : .priced)
        row.marketValue = value
        row.price = value
        return Holding(valuation: row, assetType: AssetType(ticker: symbol), accounts: [1], weight: nil)
    }

    var book: [Holding] {
        [
            holding("MSFT", value: 300), holding("AAPL", value: 300), holding("X:BTCUSD", value: 900), holding("ZZZ", value: nil),
            holding("AMD", value: 100), holding("C:EURUSD", value: nil),
        ]
    }

    @Test func sortsWithTiesBrokenBySymbolAndMissingValuesLastEitherWay() {
        let descending = HoldingsQuery(sort: .marketValue).apply(book).map(\.symbol)
        #expect(descending == ["X:BTCUSD", "AAPL", "MSFT", "AMD", "C:EURUSD", "ZZZ"])
        let ascending = HoldingsQuery(sort: .marketValue, order: .asc).apply(book).map(\.symbol)
        #expect(ascending == ["AMD", "AAPL", "MSFT", "X:BTCUSD", "C:EURUSD", "ZZZ"])
        #expect(HoldingsQuery().apply(book).map(\.symbol) == ["AAPL", "AMD", "C:EURUSD", "MSFT", "X:BTCUSD", "ZZZ"])
        #expect(HoldingsQuery(sort: .symbol, order: .desc).apply(book).first?.symbol == "ZZZ")
        // The same list every time, whatever order the holdings came in.
        #expect(HoldingsQuery(sort: .marketValue).apply(book.reversed()).map(\.symbol) == descending)
    }

    @Test func filtersByTextAndAssetType() {
        #expect(HoldingsQuery(filter: " a ").apply(book).map(\.symbol) == ["AAPL", "AMD"])
        #expect(HoldingsQuery(filter: "usd").apply(book).map(\.symbol) == ["C:EURUSD", "X:BTCUSD"])
        #expect(HoldingsQuery(assetTypes: [.crypto, .fx]).apply(book).map(\.symbol) == ["C:EURUSD", "X:BTCUSD"])
        #expect(HoldingsQuery(filter: "usd", assetTypes: [.stock]).apply(book).isEmpty)
    }

    @Test func parametersAreValidatedNamingTheParameter() throws {
        let query = try HoldingsQuery(parameters: ["sort": "dayChange", "assetType": "stock,crypto", "account": "2, 1", "filter": "a"])
        #expect(query.order == .desc, "numbers sort largest first unless asked")
        #expect(query.assetTypes == [.stock, .crypto])
        #expect(query.accounts == [1, 2])
        for (parameters, field) in [
            (["sort": "color"], "sort"), (["order": "up"], "order"), (["assetType": "bond"], "assetType"), (["account": "one"], "account"),
        ] {
            #expect(throws: PortfolioStore.ValidationError.self) { try HoldingsQuery(parameters: parameters) }
            do {
                _ = try HoldingsQuery(parameters: parameters)
            } catch {
                #expect(error.field == field)
            }
        }
    }

    @Test func aViewIDStandsForItsQueryAndEqualListsShareOne() throws {
        let query = try HoldingsQuery(parameters: ["sort": "marketValue", "filter": "a&b=c", "assetType": "crypto,stock", "account": "3"])
        let same = try HoldingsQuery(parameters: [
            "assetType": "stock,crypto", "account": "3", "filter": "a&b=c", "sort": "marketValue", "order": "desc",
        ])
        #expect(query.viewID == same.viewID)
        #expect(try HoldingsQuery(viewID: query.viewID) == query)
        #expect(!query.viewID.contains("="), "safe in a URL as it is")
        #expect(HoldingsQuery(sort: .marketValue).viewID != HoldingsQuery(sort: .marketValue, order: .asc).viewID)
        #expect(throws: PortfolioStore.ValidationError.self) { try HoldingsQuery(viewID: "not a view") }
        #expect(throws: PortfolioStore.ValidationError.self) { try HoldingsQuery(viewID: "c29ydD1jb2xvcg") }  // sort=color
    }

    @Test func assetTypesComeFromTheTickerPrefix() {
        #expect(AssetType(ticker: "AAPL") == .stock)
        #expect(AssetType(ticker: "O:AAPL230616C00150000") == .option)
        #expect(AssetType(ticker: "X:BTCUSD") == .crypto)
        #expect(AssetType(ticker: "C:EURUSD") == .fx)
        #expect(AssetType(ticker: "I:SPX") == .index)
    }
}

@Suite("Average true range")
struct AverageTrueRangeTests {
    @Test func wilderSmoothingFromTheFirstFullPeriod() {
        // Period 3 over five bars. True ranges from bar 1: max(h−l, |h−c₋₁|, |l−c₋₁|).
        let high: [Decimal] = [10, 12, 11, 15, 14]
        let low: [Decimal] = [9, 10, 9, 11, 13]
        let close: [Decimal] = [9.5, 11, 10, 14, 13.5]
        // TR1 = max(2, 2.5, 0.5) = 2.5; TR2 = max(2, 0, 2) = 2; TR3 = max(4, 5, 1) = 5; TR4 = max(1, 0, 1) = 1
        let atr = AverageTrueRange.series(high: high, low: low, close: close, period: 3)
        #expect(atr[0] == nil && atr[1] == nil && atr[2] == nil)
        #expect(atr[3] == Decimal(string: "3.1667"))  // (2.5 + 2 + 5) / 3
        #expect(atr[4] == Decimal(string: "2.4444"))  // (3.16667 × 2 + 1) / 3
        #expect(AverageTrueRange.series(high: [1, 2], low: [1, 2], close: [1, 2], period: 3) == [nil, nil])
    }
}
