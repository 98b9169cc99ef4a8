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
}

extension MarketDataHub {
    /// The topics a market's table keeps by default (about 250 MB of last values at most).
    public static let defaultTopicsKept = 500_000

    /// Lets go of the least recently updated topics nobody holds by name (nor folds into a state) until
    /// ``LastValueBound/keptAfterTrim`` are left, or none such is; called by a publish that took the
    /// table past ``LastValueBound/trimAbove``. A wildcard's holders still get every event: only the
    /// last values of the topics let go are forgotten (a new holder's snapshot lacks them until their
    /// next event).
    func trimUnwantedLastValues() {
        let excess = entries.count - lastValueBound.keptAfterTrim
        let unheld = entries.filter { $0.value.subscribers.isEmpty && $0.value.fold == nil }
        let oldest = unheld.sorted { ($0.value.last?.receivedAt ?? 0) < ($1.value.last?.receivedAt ?? 0) }.prefix(Swift.max(excess, 0))
        for (topic, _) in oldest { entries[topic] = nil }
        lastValueBound.trimmed(leaving: entries.count)
        logger.info(
            "topic table past its bound: the last values of the least recently updated topics nobody holds let go",
            metadata: ["let_go": "\(oldest.count)", "kept": "\(entries.count)", "limit": "\(lastValueBound.limit)"])
    }
}
