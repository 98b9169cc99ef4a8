import Foundation
import Testing

@testable import Portfolio
@testable import PortfolioDomain

@Suite("History from closes")
struct CloseValuationTests {
    let calendar = DayCalendar.utc

    func buy(_ date: String, _ symbol: String, _ quantity: String) -> Transaction {
        Transaction(id: 0, accountID: 1, date: day(date), kind: .buy, symbol: symbol, quantity: dec(quantity), price: 1, fees: 0)
    }

    @Test func eachDayIsTheBookOfThatDayTimesItsCloseCarriedOverTheWeekend() {
        // 2024-03-01 is a Friday.
        let transactions = [buy("2024-03-01", "AAA", "10"), buy("2024-03-04", "AAA", "5")]
        let days = calendar.days(from: day("2024-02-29"), through: day("2024-03-04"))
        let closes: [String: [(day: Day, close: Decimal)]] = ["AAA": [(day("2024-03-01"), dec("2")), (day("2024-03-04"), dec("3"))]]
        let values = CloseValuation.values(
            transactions: transactions, days: days, closes: closes, coverage: ["AAA": day("2024-02-20")...day("2024-03-04")])
        #expect(values.map(\.positionsValue) == ["0", "20", "20", "20", "45"].map(dec), "nothing held, Friday, Saturday, Sunday, Monday")
        #expect(values.allSatisfy { $0.unpriced.isEmpty })
    }

    @Test func aDayWithoutAUsableCloseNamesItsSymbols() {
        let transactions = [buy("2024-03-01", "AAA", "1"), buy("2024-03-01", "BBB", "1")]
        let days = calendar.days(from: day("2024-03-01"), through: day("2024-03-12"))
        let closes: [String: [(day: Day, close: Decimal)]] = ["AAA": [(day("2024-03-01"), dec("2"))], "BBB": [(day("2024-03-01"), dec("7"))]]
        // BBB's closes were never fetched past the 5th; AAA's last close is eleven days old by the 12th.
        let values = CloseValuation.values(
            transactions: transactions, days: days, closes: closes,
            coverage: ["AAA": day("2024-02-01")...day("2024-03-12"), "BBB": day("2024-02-01")...day("2024-03-05")])
        #expect(values.first?.positionsValue == dec("9"))
        #expect(values.first?.unpriced == [])
        #expect(values[5].unpriced == ["BBB"], "the 6th: BBB not covered")
        #expect(values[5].positionsValue == dec("2"))
        #expect(values.last?.unpriced == ["AAA", "BBB"], "the 12th: AAA's close is too old")
    }

    @Test func theClosesAHistoryNeedsAreTheDaysEachSymbolWasHeld() {
        var sell = buy("2024-03-05", "AAA", "10")
        sell.kind = .sell
        let ranges = CloseValuation.heldRanges(
            transactions: [buy("2024-03-01", "AAA", "10"), sell, buy("2024-03-03", "BBB", "1")], from: day("2024-02-28"),
            through: day("2024-03-10"), calendar: calendar)
        #expect(ranges["AAA"] == day("2024-03-01")...day("2024-03-04"))
        #expect(ranges["BBB"] == day("2024-03-03")...day("2024-03-10"))
    }
}
