import MarketCore

/// The demo market's past: one daily bar per weekday, the same for a ticker every time it is asked
/// for, ending at the previous close the live market opened at.
///
/// Pure and `Sendable`. Prices walk backwards from that close by a return drawn from the ticker and
/// the day alone, so any range of days is consistent with every other.
public enum DemoHistory {
    /// A bar, in cents and shares; `day` counts days since 1970-01-01 (UTC).
    public struct Bar: Sendable, Equatable {
        public var day: Int64
        public var open, high, low, close: Int64
        public var volume: Int64
    }

    /// The weekday bars from `first` through `last` (days since the epoch), the last one at most the
    /// day before `today`, whose close is `previousClose`.
    public static func bars(ticker: String, from first: Int64, through last: Int64, today: Int64, previousClose: Int64) -> [Bar] {
        // Five years back from yesterday at most: the walk back from yesterday's close takes a step a
        // day, and a request for year 0 would otherwise take 740,000 (and the prices past any Int64).
        let floor = today - 1 - 5 * 366
        let end = min(last, today - 1)
        guard first <= end, end >= floor else { return [] }
        let start = max(first, floor)
        var bars: [Bar] = []
        var close = previousClose
        var day = today - 1
        while day >= start {
            defer { day -= 1 }
            guard isWeekday(day) else { continue }
            var rng = SplitMix64(seed: seed(ticker) ^ UInt64(bitPattern: day) &* 0x9E37_79B9_7F4A_7C15)
            // A return of up to ±2.5 %, then the day's range around open and close.
            let move = Int64.random(in: -250...250, using: &rng)
            // (Five years of ±2.5 % cannot reach it; kept from any arithmetic that could trap.)
            guard close < 1 << 40 else { break }
            let open = max(close * 10_000 / (10_000 + move), 1_00)
            let high = max(open, close) + max(close, open) * Int64.random(in: 0...150, using: &rng) / 10_000
            let low = max(min(open, close) - min(close, open) * Int64.random(in: 0...150, using: &rng) / 10_000, 1)
            let volume = Int64.random(in: 500_000...5_000_000, using: &rng)
            if day <= end { bars.append(Bar(day: day, open: open, high: high, low: low, close: close, volume: volume)) }
            close = open
        }
        return bars.reversed()
    }

    /// 1970-01-01 was a Thursday.
    static func isWeekday(_ day: Int64) -> Bool {
        let weekday = ((day % 7) + 7 + 3) % 7  // 0 = Monday
        return weekday < 5
    }

    /// FNV-1a of the ticker: stable across runs, unlike `Hasher`.
    static func seed(_ ticker: String) -> UInt64 {
        var hash: UInt64 = 0xcbf2_9ce4_8422_2325
        for byte in ticker.utf8 {
            hash ^= UInt64(byte)
            hash &*= 0x100_0000_01b3
        }
        return hash
    }
}
