import Foundation

/// Values a brokerage account's past days from daily closes: the book as of each day (its transactions
/// up to and including that day) times each symbol's close of that day, or of the last trading day
/// before it (weekends, holidays). Pure, `Sendable`.
public enum CloseValuation {
    /// A close older than this many days does not price a day (a long halt or a delisting is not hidden).
    public static let maxCloseAgeDays = 7

    /// One day's positions valued from closes; `unpriced` names the held symbols without a usable close.
    public struct DayValue: Sendable, Equatable {
        public var day: Day
        public var positionsValue: Decimal
        public var unpriced: [String]
    }

    /// The symbols held at the end of some day from `first` through `last`, each with the first and last
    /// such day: the closes a history of those days needs.
    public static func heldRanges(transactions: [Transaction], from first: Day, through last: Day, calendar: DayCalendar)
        -> [String: ClosedRange<Day>]
    {
        var ranges: [String: ClosedRange<Day>] = [:]
        walk(transactions: transactions, days: calendar.days(from: first, through: last)) { day, book in
            for position in book.open {
                let range = ranges[position.symbol]
                ranges[position.symbol] = (range?.lowerBound ?? day)...day
            }
        }
        return ranges
    }

    /// Each of `days` valued: for every symbol held that day, the newest close on or before it, if the
    /// symbol's closes were fetched for that day (`coverage`) and the close is at most
    /// ``maxCloseAgeDays`` old. `closes` are oldest first per symbol and may start before `days`.
    public static func values(
        transactions: [Transaction], days: [Day], closes: [String: [(day: Day, close: Decimal)]], coverage: [String: ClosedRange<Day>]
    ) -> [DayValue] {
        var next: [String: Int] = [:]
        // The newest close so far per symbol, with the index of its day in `days` (-1: before them).
        var latest: [String: (close: Decimal, dayIndex: Int)] = [:]
        var dayIndex: [Day: Int] = [:]
        for (offset, day) in days.enumerated() { dayIndex[day] = offset }
        var result: [DayValue] = []
        result.reserveCapacity(days.count)
        var index = 0
        walk(transactions: transactions, days: days) { day, book in
            defer { index += 1 }
            var value: Decimal = 0
            var unpriced: [String] = []
            for position in book.open {
                let symbol = position.symbol
                if let series = closes[symbol] {
                    var cursor = next[symbol] ?? 0
                    while cursor < series.count, series[cursor].day <= day {
                        latest[symbol] = (series[cursor].close, dayIndex[series[cursor].day] ?? -1)
                        cursor += 1
                    }
                    next[symbol] = cursor
                }
                if coverage[symbol]?.contains(day) == true, let close = latest[symbol], index - close.dayIndex <= maxCloseAgeDays {
                    value += position.quantity * close.close
                } else {
                    unpriced.append(symbol)
                }
            }
            result.append(DayValue(day: day, positionsValue: value, unpriced: unpriced))
        }
        return result
    }

    /// Calls `body` for each day with the book as of the end of that day.
    private static func walk(transactions: [Transaction], days: [Day], _ body: (Day, PositionBook) -> Void) {
        let ordered = transactions.enumerated().sorted { ($0.element.date, $0.offset) < ($1.element.date, $1.offset) }.map(\.element)
        var book = PositionBook()
        var applied = 0
        for day in days {
            while applied < ordered.count, ordered[applied].date <= day {
                // A stored book is valid (every write checks it); one that is not values what it can.
                try? book.apply(ordered[applied])
                applied += 1
            }
            body(day, book)
        }
    }
}
