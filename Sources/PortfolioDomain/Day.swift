import Foundation

/// A calendar day, `2024-03-10`, in the portfolio's configured time zone. Value type, `Sendable`.
///
/// Snapshots are per calendar day in one IANA zone (default UTC): an instant belongs to the day its
/// local date says, so a DST change moves no update to the wrong day.
public struct Day: Hashable, Comparable, Sendable, Codable, CustomStringConvertible {
    public let year: Int
    public let month: Int
    public let day: Int

    public init(year: Int, month: Int, day: Int) {
        self.year = year
        self.month = month
        self.day = day
    }

    /// Parses `YYYY-MM-DD` (a real date: `2023-02-29` is refused).
    public init?(_ text: String) {
        let parts = text.split(separator: "-")
        guard parts.count == 3, parts[0].count == 4, parts[1].count == 2, parts[2].count == 2,
            let year = Int(parts[0]), let month = Int(parts[1]), let day = Int(parts[2])
        else { return nil }
        var calendar = Calendar(identifier: .gregorian)
        calendar.timeZone = TimeZone(identifier: "UTC") ?? calendar.timeZone
        guard let date = calendar.date(from: DateComponents(year: year, month: month, day: day)),
            calendar.dateComponents([.year, .month, .day], from: date) == DateComponents(year: year, month: month, day: day)
        else { return nil }
        self.init(year: year, month: month, day: day)
    }

    public var description: String {
        String(format: "%04d-%02d-%02d", year, month, day)
    }

    public static func < (lhs: Day, rhs: Day) -> Bool {
        (lhs.year, lhs.month, lhs.day) < (rhs.year, rhs.month, rhs.day)
    }

    public init(from decoder: any Decoder) throws {
        let text = try decoder.singleValueContainer().decode(String.self)
        guard let day = Day(text) else {
            throw DecodingError.dataCorrupted(.init(codingPath: decoder.codingPath, debugDescription: "expected YYYY-MM-DD, got \(text)"))
        }
        self = day
    }

    public func encode(to encoder: any Encoder) throws {
        var container = encoder.singleValueContainer()
        try container.encode(description)
    }
}

/// Days and instants in one time zone.
public struct DayCalendar: Sendable {
    public let timeZone: TimeZone
    private let calendar: Calendar

    /// - Parameter identifier: an IANA zone, e.g. `America/New_York`; `nil` when unknown.
    public init?(timeZone identifier: String) {
        guard let zone = TimeZone(identifier: identifier) else { return nil }
        self.init(zone: zone)
    }

    public init(zone: TimeZone) {
        timeZone = zone
        var calendar = Calendar(identifier: .gregorian)
        calendar.timeZone = zone
        self.calendar = calendar
    }

    public static let utc = DayCalendar(zone: TimeZone(secondsFromGMT: 0) ?? .current)

    /// The local day an instant falls on.
    public func day(of instant: Date) -> Day {
        let parts = calendar.dateComponents([.year, .month, .day], from: instant)
        return Day(year: parts.year ?? 1970, month: parts.month ?? 1, day: parts.day ?? 1)
    }

    /// The day after (calendar arithmetic, so 23- and 25-hour DST days count as one day).
    public func next(_ day: Day) -> Day { self.day(day, addingDays: 1) }

    public func previous(_ day: Day) -> Day { self.day(day, addingDays: -1) }

    /// The day `days` later (earlier when negative), counted in calendar days.
    public func day(_ day: Day, addingDays days: Int) -> Day {
        let date = startOfDay(day)
        return self.day(of: calendar.date(byAdding: .day, value: days, to: date) ?? date.addingTimeInterval(Double(days) * 86_400))
    }

    /// The same date `years` later (earlier when negative); 29 February becomes 28 February.
    public func day(_ day: Day, addingYears years: Int) -> Day {
        let date = startOfDay(day)
        return self.day(of: calendar.date(byAdding: .year, value: years, to: date) ?? date.addingTimeInterval(Double(years) * 365 * 86_400))
    }

    /// The instant a local day begins.
    public func startOfDay(_ day: Day) -> Date {
        calendar.date(from: DateComponents(year: day.year, month: day.month, day: day.day)) ?? Date(timeIntervalSince1970: 0)
    }

    /// Every day from `start` through `end`, inclusive; empty when `end` is before `start`.
    public func days(from start: Day, through end: Day) -> [Day] {
        var days: [Day] = []
        var current = start
        while current <= end {
            days.append(current)
            current = next(current)
        }
        return days
    }
}
