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
        /// Held symbols without a price (a day valued from closes).
        public var unpriced: [String]

        public init(at: Date, value: Decimal, partial: Bool = false, source: SnapshotSource, unpriced: [String] = []) {
            self.at = at
            self.value = value
            self.partial = partial
            self.source = source
            self.unpriced = unpriced
        }
    }

    /// The last day an account counts: the day before it closed, or `today`.
    public func lastDay(of account: Account, today: Day) -> Day {
        guard let closedAt = account.closedAt else { return today }
        return min(today, calendar.previous(calendar.day(of: closedAt)))
    }

    /// Every day's snapshot for one account, gap-free. Observations before the creation day seed the
    /// first day; before any value, a day is its cash (`0` without), `partial`, source `none`.
    ///
    /// - Parameter cash: a brokerage account's cash at the end of each day that changed it, in day
    ///   order (``PositionBook/cashByDay(_:)``); its observations are then the value of its positions,
    ///   and each day's snapshot adds that day's cash (so a deposit dated in the past moves every day
    ///   since). `nil` for accounts without cash (savings), whose observations are their whole value.
    /// - Parameter from: the first day wanted (the creation day when `nil` or earlier); observations
    ///   before it seed that day as those before the creation day do.
    public func accountSnapshots(
        for account: Account, observations: [Observation], today: Day, cash cashChanges: [(day: Day, cash: Decimal)]? = nil,
        from: Day? = nil
    ) -> [AccountSnapshot] {
        let created = calendar.day(of: account.createdAt)
        let first = from.map { max($0, created) } ?? created
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
        var cashIndex = 0
        var cashNow: Decimal = 0
        func cash(on day: Day) -> Decimal? {
            guard let cashChanges else { return nil }
            while cashIndex < cashChanges.count, cashChanges[cashIndex].day <= day {
                cashNow = cashChanges[cashIndex].cash
                cashIndex += 1
            }
            return cashNow
        }
        var snapshots: [AccountSnapshot] = []
        // What the last day's value came from (the positions' value for a brokerage account).
        var previous: (value: Decimal, partial: Bool, unpriced: [String])? = carriedIn.map { ($0.value, $0.partial, $0.unpriced) }
        for day in calendar.days(from: first, through: last) {
            let dayCash = cash(on: day)
            let snapshot: AccountSnapshot
            if let observation = latest[day] {
                snapshot = AccountSnapshot(
                    accountID: account.id, day: day, value: observation.value + (dayCash ?? 0), cash: dayCash, partial: observation.partial,
                    source: observation.source, unpriced: observation.unpriced)
                previous = (observation.value, observation.partial, observation.unpriced)
            } else if let previous {
                snapshot = AccountSnapshot(
                    accountID: account.id, day: day, value: previous.value + (dayCash ?? 0), cash: dayCash, partial: previous.partial,
                    source: .carried, unpriced: previous.unpriced)
            } else {
                snapshot = AccountSnapshot(accountID: account.id, day: day, value: dayCash ?? 0, cash: dayCash, partial: true, source: .none)
            }
            snapshots.append(snapshot)
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
            var cash: Decimal = 0
            var partial = false
            for account in active {
                guard let snapshot = byDay[day]?[account.id] else {
                    partial = true
                    continue
                }
                total += snapshot.value
                cash += snapshot.cash ?? 0
                partial = partial || snapshot.partial
            }
            return PortfolioSnapshot(day: day, total: total, cash: cash, partial: partial)
        }
    }
}
