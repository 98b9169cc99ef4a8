import MarketCore

/// The upstream's outages as a hub sees them: when the last event arrived, an outage in progress (and
/// why it began), and, at the first event after it, the window in which none arrived. A plain value;
/// the caller gives the times (Unix ms), so tests drive it with any clock.
struct OutageLedger: Sendable {
    /// An outage in progress: when the last event before it arrived and why it began.
    struct Outage: Sendable, Equatable {
        var lastEventBefore: Int64?
        var lostAt: Int64
        var reason: String

        /// Its `upstream_disconnected` notice.
        var notice: Notice {
            var details: [String: Notice.Value] = ["lost_at_ms": .number(lostAt)]
            if let before = lastEventBefore { details["last_event_before_ms"] = .number(before) }
            return Notice(
                .upstreamDisconnected, message: "upstream connection lost (\(reason)); subscriptions are kept and resume when it is back",
                details: details)
        }
    }

    /// An outage that ended: the window with no events, from the last event before it (or when it was
    /// lost, with none before) to the first after it.
    struct Recovery: Sendable, Equatable {
        var start: Int64
        var firstEventAfter: Int64

        var gap: Int64 { firstEventAfter - start }

        /// Its `upstream_reconnected` notice, naming the epoch positions count in from here (a
        /// failover's new one, on a cluster), so that a client that stays connected can resume later.
        func notice(epoch: String?) -> Notice {
            var details: [String: Notice.Value] = [
                "last_event_before_ms": .number(start), "first_event_after_ms": .number(firstEventAfter), "gap_ms": .number(gap),
            ]
            if let epoch, !epoch.isEmpty { details["epoch"] = .text(epoch) }
            return Notice(
                .upstreamReconnected,
                message: "upstream reconnected; no events were received between \(start) and \(firstEventAfter) (Unix ms, \(gap) ms)",
                details: details)
        }
    }

    private(set) var current: Outage?
    private(set) var lastEventAt: Int64?

    /// The upstream was lost at `now`: the outage that begins, or `nil` while one is in progress.
    mutating func lost(reason: String, at now: Int64) -> Outage? {
        guard current == nil else { return nil }
        let outage = Outage(lastEventBefore: lastEventAt, lostAt: now, reason: reason)
        current = outage
        return outage
    }

    /// Events arrived at `now`: the outage they end, if one was in progress.
    mutating func eventsArrived(at now: Int64) -> Recovery? {
        defer { lastEventAt = now }
        guard let outage = current else { return nil }
        current = nil
        return Recovery(start: outage.lastEventBefore ?? outage.lostAt, firstEventAfter: now)
    }
}
