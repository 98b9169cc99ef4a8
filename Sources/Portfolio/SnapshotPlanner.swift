import Foundation

/// The daily snapshot rules, as pure functions: one value per account per local day from its creation
/// to today (or to the day before it closed), the latest value of a day winning, days without one
/// carrying the previous value forward; and one portfolio total per day over the accounts active then.
public struct SnapshotPlanner: Sendable {
    public let calendar: DayCalendar

    public init(calendar: DayCalendar) {
        self.calendar = calendar
    }

    /// A value seen for an account at an instant (an entered update, or a live valuation).
    public struct Observation: Sendable, Equatable {
        public var at: Date
        public var value: Decimal
        public var partial: Bool
        public var source: SnapshotSource

        public init(at: Date, value: Decimal, partial: Bool = false, source: SnapshotSource) {
            self.at = at
            self.value = value
            self.partial = partial
            self.source = source
        }
    }

    /// The last day an account counts: the day before it closed, or `today`.
    public func lastDay(of account: Account, today: Day) -> Day {
        guard let closedAt = account.closedAt else { return today }
        return min(today, calendar.previous(calendar.day(of: closedAt)))
    }

    /// Every day's snapshot for one account, gap-free. Observations before the creation day seed the
    /// first day; before any value, a day is `0`, `partial`, source `none`.
    public func accountSnapshots(for account: Account, observations: [Observation], today: Day) -> [AccountSnapshot] {
        let first = calendar.day(of: account.createdAt)
        let last = lastDay(of: account, today: today)
        guard first <= last else { return [] }
        // The latest observation of each day wins.
        var latest: [Day: Observation] = [:]
        var carriedIn: Observation?
        for observation in observations {
            let day = calendar.day(of: observation.at)
            if day < first {
                if carriedIn.map({ observation.at >= $0.at }) ?? true { carriedIn = observation }
                continue
            }
            if let existing = latest[day], existing.at > observation.at { continue }
            latest[day] = observation
        }
        var snapshots: [AccountSnapshot] = []
        var previous: AccountSnapshot? = carriedIn.map {
            AccountSnapshot(accountID: account.id, day: first, value: $0.value, partial: $0.partial, source: .carried)
        }
        for day in calendar.days(from: first, through: last) {
            let snapshot: AccountSnapshot
            if let observation = latest[day] {
                snapshot = AccountSnapshot(
                    accountID: account.id, day: day, value: observation.value, partial: observation.partial, source: observation.source)
            } else if let previous, previous.source != .none {
                snapshot = AccountSnapshot(
                    accountID: account.id, day: day, value: previous.value, partial: previous.partial, source: .carried)
            } else {
                snapshot = AccountSnapshot(accountID: account.id, day: day, value: 0, partial: true, source: .none)
            }
            snapshots.append(snapshot)
            previous = snapshot
        }
        return snapshots
    }

    /// The portfolio total of each day: the sum of that day's snapshots of the accounts active on it
    /// (created on or before it, not closed on or before it); `0` on a day no account was active (a
    /// total, not a missing row, so a stale one never stands). Days before an account closed keep it.
    public func portfolioSnapshots(accounts: [Account], snapshots: [AccountSnapshot], from start: Day, through end: Day)
        -> [PortfolioSnapshot]
    {
        var byDay: [Day: [Int64: AccountSnapshot]] = [:]
        for snapshot in snapshots { byDay[snapshot.day, default: [:]][snapshot.accountID] = snapshot }
        return calendar.days(from: start, through: end).map { day in
            let active = accounts.filter { account in
                calendar.day(of: account.createdAt) <= day && day <= lastDay(of: account, today: end)
            }
            guard !active.isEmpty else { return PortfolioSnapshot(day: day, total: 0, partial: false) }
            var total: Decimal = 0
            var partial = false
            for account in active {
                guard let snapshot = byDay[day]?[account.id] else {
                    partial = true
                    continue
                }
                total += snapshot.value
                partial = partial || snapshot.partial
            }
            return PortfolioSnapshot(day: day, total: total, partial: partial)
        }
    }
}
