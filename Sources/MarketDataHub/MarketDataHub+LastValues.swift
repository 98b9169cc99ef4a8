import CoreMetrics
import MarketCore

/// The bound on the hub's topic table. A single relay keeps a topic's last event after nobody holds it
/// by name (the topics of a wildcard, one held once), for the next subscriber's snapshot; a wildcard over
/// a market of a million option contracts, or an upstream naming ever new tickers, would grow the table
/// for ever. Past ``limit`` topics, or past ``lastValues``' bytes (an upstream or a NATS publisher naming
/// ever new tickers with large events), the entries nobody holds by name go, least recently updated
/// first, down to nine tenths of either. Held by the hub.
struct LastValueBound {
    let limit: Int
    /// What the last values and books hold, all topics together, as the process holds it (each last
    /// value's storage and each book's footprint, counted as the hub gives a last value bytes of its
    /// own, a few publishes after it arrived).
    let lastValues = ByteRoom(limit: 256 << 20)
    /// What a cluster node's books hold back while they are not whole (``MarketDataHub/TopicEntry/heldBack``),
    /// all together: within it, a publisher on NATS that keeps books from being whole (changes, and never
    /// a whole book) cannot make the hub hold up to a megabyte for each of its tickers. A change past it
    /// is not held, and the book lets go of those it held (they no longer reach a whole book without
    /// it); it holds again from its next change that fits.
    let heldBack: ByteRoom
    /// The table's size that calls for the next trim: `limit`, or more while the topics held by name
    /// alone keep it above nine tenths of it (one trim per tenth of `limit` of new topics, never one
    /// per publish); and the same for its bytes. Each falls back to its limit once the table is within
    /// what a trim leaves again (held topics let go), so the next growth past the limit is trimmed.
    private(set) var trimAbove: Int
    private var trimAboveBytes = 0

    /// - Parameter metricsFactory: counts the changes books could not hold back for want of room
    ///   (`relay_book_changes_not_held_total`).
    init(limit: Int, metricsFactory: any MetricsFactory = MetricsSystem.factory) {
        self.limit = Swift.max(limit, 10)
        trimAbove = self.limit
        heldBack = ByteRoom(limit: 64 << 20, refusals: Counter(label: "relay_book_changes_not_held_total", factory: metricsFactory))
    }

    /// The entries a trim leaves at most, when enough are unheld.
    var keptAfterTrim: Int { limit / 10 * 9 }

    /// The bytes a trim leaves at most, when enough are unheld.
    var bytesKeptAfterTrim: Int { lastValues.limit / 10 * 9 }

    /// Whether a table of `count` entries calls for a trim.
    mutating func isPast(_ count: Int) -> Bool {
        // Only once below what a trim leaves: held topics just under the bound would else bring back a
        // trim per new topic.
        if count <= keptAfterTrim { trimAbove = limit }
        if lastValues.total <= bytesKeptAfterTrim { trimAboveBytes = 0 }
        return count > trimAbove || lastValues.total > Swift.max(lastValues.limit, trimAboveBytes)
    }

    /// A trim left `count` entries.
    mutating func trimmed(leaving count: Int) {
        trimAbove = Swift.max(limit, count + limit / 10)
        trimAboveBytes = lastValues.total + lastValues.limit / 10
    }

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

/// Bytes the topic table's entries hold of one kind, all together, within ``limit``. Confined to the hub
/// (its entries give back what they held as they go).
final class ByteRoom {
    var limit: Int
    private(set) var total = 0
    /// Takes refused for want of room (and counted in `refusals`).
    private(set) var refused = 0
    private let refusals: Counter?

    init(limit: Int, refusals: Counter? = nil) {
        self.limit = limit
        self.refusals = refusals
    }

    /// Takes room for `bytes`; whether there was.
    func take(_ bytes: Int) -> Bool {
        guard total + bytes <= limit else {
            refused += 1
            refusals?.increment()
            return false
        }
        total += bytes
        return true
    }

    func give(_ bytes: Int) { total -= bytes }

    /// What is held changed by `bytes`, room or not (a bound others enforce).
    func count(_ bytes: Int) { total += bytes }
}

extension MarketDataHub {
    /// What the books hold back now, all together, and the changes not held back for want of room.
    func heldBackRoom() -> (total: Int, refused: Int) { (lastValueBound.heldBack.total, lastValueBound.heldBack.refused) }

    /// What the last values and books hold now, all together.
    func lastValueBytes() -> Int { lastValueBound.lastValues.total }

    /// Books hold back at most `heldBack` bytes from now on, all together; the last values and books
    /// hold at most `lastValues`.
    func limitTable(heldBack: Int? = nil, lastValues: Int? = nil) {
        if let heldBack { lastValueBound.heldBack.limit = heldBack }
        if let lastValues { lastValueBound.lastValues.limit = lastValues }
    }

    /// The topics a market's table keeps by default (and within ``LastValueBound/lastValues``).
    public static let defaultTopicsKept = 500_000

    /// Lets go of the least recently updated topics nobody holds by name until
    /// ``LastValueBound/keptAfterTrim`` are left and they hold ``LastValueBound/bytesKeptAfterTrim``
    /// at most, or none such is; called by a publish that took the table past its bound. Topics whose
    /// state is folded (order books under a wildcard) go only after every other such topic, so the bound
    /// holds for them too. A wildcard's holders still get every event: only the last values of the topics
    /// let go are forgotten (a new holder's snapshot lacks them until their next event; a book let go,
    /// until the vendor's next whole one). Past the count alone, the oldest are found by selection, not by
    /// sorting the table: one pass and a partition (past the bytes, how many hold them is found by sorting).
    func trimUnwantedLastValues() {
        let excess = entries.count - lastValueBound.keptAfterTrim
        let excessBytes = lastValueBound.lastValues.total - lastValueBound.bytesKeptAfterTrim
        var ages: [UInt64] = []
        var sizes: [(age: UInt64, bytes: Int)] = []
        for entry in entries.values where entry.subscribers.isEmpty {
            let age = Self.trimOrder(of: entry)
            ages.append(age)
            if excessBytes > 0 { sizes.append((age, entry.lastBytes)) }
        }
        let letGo = Swift.min(Swift.max(excess, Self.oldest(holding: excessBytes, of: &sizes), 0), ages.count)
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
            for topic in doomed { removeEntry(topic) }
            gone = doomed.count
        }
        lastValueBound.trimmed(leaving: entries.count)
        logger.info(
            "topic table past its bound: the last values of the least recently updated topics nobody holds let go",
            metadata: [
                "let_go": "\(gone)", "kept": "\(entries.count)", "limit": "\(lastValueBound.limit)", "bytes": "\(lastValueBound.lastValues.total)",
                "limit_bytes": "\(lastValueBound.lastValues.limit)",
            ])
    }

    /// How many of the oldest of `sizes` hold `bytes` together (all of them, if they do not). Sorted:
    /// a trim past the bytes bound comes once per tenth of it in new bytes at most.
    private static func oldest(holding bytes: Int, of sizes: inout [(age: UInt64, bytes: Int)]) -> Int {
        guard bytes > 0 else { return 0 }
        sizes.sort { $0.age < $1.age }
        var freed = 0
        for (index, entry) in sizes.enumerated() {
            freed += entry.bytes
            if freed >= bytes { return index + 1 }
        }
        return sizes.count
    }

    /// Where an entry nobody holds by name stands in the order of letting go: a folded state after every
    /// plain last value, each by the time its last event was received.
    private static func trimOrder(of entry: TopicEntry) -> UInt64 {
        let received = Swift.min(entry.last?.receivedAt ?? 0, UInt64.max >> 1)
        return entry.fold == nil ? received : received | (1 << 63)
    }
}
