import MarketCore

/// The bound on the hub's topic table. A single relay keeps a topic's last event after nobody holds it
/// by name (the topics of a wildcard, one held once), for the next subscriber's snapshot; a wildcard over
/// a market of a million option contracts, or an upstream naming ever new tickers, would grow the table
/// for ever. Past ``limit`` topics the entries nobody holds by name go, least recently updated first,
/// down to nine tenths of it. Value type, held by the hub.
struct LastValueBound: Sendable {
    let limit: Int
    /// The table's size that calls for the next trim: `limit`, or more while the topics held by name
    /// alone keep it above nine tenths of it (one trim per tenth of `limit` of new topics, never one
    /// per publish).
    private(set) var trimAbove: Int

    init(limit: Int) {
        self.limit = Swift.max(limit, 10)
        trimAbove = self.limit
    }

    /// The entries a trim leaves at most, when enough are unheld.
    var keptAfterTrim: Int { limit / 10 * 9 }

    /// A trim left `count` entries.
    mutating func trimmed(leaving count: Int) { trimAbove = Swift.max(limit, count + limit / 10) }

    /// The `count`-th smallest of `values` (1 ≤ `count` ≤ `values.count`), found by partitioning in
    /// place (Hoare's selection, the pivot the middle of three): `values` then starts with the `count`
    /// smallest, in no order. Linear on average, where sorting a table of half a million topics to
    /// let go of a tenth of it cost its n log n on the hub.
    static func smallest(_ count: Int, of values: inout [UInt64]) -> UInt64 {
        precondition(count >= 1 && count <= values.count, "asked for the \(count)-th of \(values.count)")
        let target = count - 1
        var low = 0
        var high = values.count - 1
        while low < high {
            let middle = low + (high - low) / 2
            // The median of the first, middle and last: sorted input (ages arrive in order) stays linear.
            if values[middle] < values[low] { values.swapAt(middle, low) }
            if values[high] < values[low] { values.swapAt(high, low) }
            if values[high] < values[middle] { values.swapAt(high, middle) }
            let pivot = values[middle]
            var left = low
            var right = high
            while left <= right {
                while values[left] < pivot { left += 1 }
                while pivot < values[right] { right -= 1 }
                if left <= right {
                    values.swapAt(left, right)
                    left += 1
                    right -= 1
                }
            }
            if target <= right {
                high = right
            } else if target >= left {
                low = left
            } else {
                return values[target]
            }
        }
        return values[target]
    }
}

extension MarketDataHub {
    /// The topics a market's table keeps by default (about 250 MB of last values at most).
    public static let defaultTopicsKept = 500_000

    /// Lets go of the least recently updated topics nobody holds by name until
    /// ``LastValueBound/keptAfterTrim`` are left, or none such is; called by a publish that took the
    /// table past ``LastValueBound/trimAbove``. Topics whose state is folded (order books under a
    /// wildcard) go only after every other such topic, so the bound holds for them too. A wildcard's
    /// holders still get every event: only the last values of the topics let go are forgotten (a new
    /// holder's snapshot lacks them until their next event; a book let go, until the vendor's next whole
    /// one). The oldest are found by selection, not by sorting the table: one pass and a partition.
    func trimUnwantedLastValues() {
        let excess = entries.count - lastValueBound.keptAfterTrim
        var ages: [UInt64] = []
        for entry in entries.values where entry.subscribers.isEmpty { ages.append(Self.trimOrder(of: entry)) }
        let letGo = Swift.min(Swift.max(excess, 0), ages.count)
        var gone = 0
        if letGo > 0 {
            let cut = LastValueBound.smallest(letGo, of: &ages)
            // Every entry older than the cut goes, and as many as are still needed of those at it.
            var atCut = letGo - ages.prefix(letGo).count { $0 < cut }
            var doomed: [Topic] = []
            doomed.reserveCapacity(letGo)
            for (topic, entry) in entries where entry.subscribers.isEmpty {
                let age = Self.trimOrder(of: entry)
                if age < cut {
                    doomed.append(topic)
                } else if age == cut, atCut > 0 {
                    atCut -= 1
                    doomed.append(topic)
                }
            }
            for topic in doomed { entries[topic] = nil }
            gone = doomed.count
        }
        lastValueBound.trimmed(leaving: entries.count)
        logger.info(
            "topic table past its bound: the last values of the least recently updated topics nobody holds let go",
            metadata: ["let_go": "\(gone)", "kept": "\(entries.count)", "limit": "\(lastValueBound.limit)"])
    }

    /// Where an entry nobody holds by name stands in the order of letting go: a folded state after every
    /// plain last value, each by the time its last event was received.
    private static func trimOrder(of entry: TopicEntry) -> UInt64 {
        let received = Swift.min(entry.last?.receivedAt ?? 0, UInt64.max >> 1)
        return entry.fold == nil ? received : received | (1 << 63)
    }
}
