import Synchronization

/// How one process's cluster nodes (one per market, each holding or following its market's lease)
/// spread leadership across the cluster: a node that already leads a market does not take another
/// market's lease while a live node leads none, so a cluster of three with three markets holds one
/// upstream connection on each node, and the kill of one node moves only its markets.
///
/// Spreading never leaves a market leaderless: a node defers a free lease for at most ``maxDeferral``
/// (counted from when it first found that lease free), then takes it anyway (the idle node may be unable
/// to, e.g. cut off from the upstream's network).
///
/// `Sendable`; the table sits behind a `Mutex`. Every market's ``ClusterNode`` of the process reports the
/// leader it observes; each node knows the leaders of every market because every node runs a cluster
/// node for each configured market.
package final class LeadershipSpread: Sendable {
    private struct State {
        /// Market → the node holding its lease, as observed.
        var leaders: [String: String] = [:]
        /// Market → since when this node has deferred its free lease.
        var deferringSince: [String: ContinuousClock.Instant] = [:]
        /// When this node last handed a market to an idle node.
        var lastHandOff: ContinuousClock.Instant?
        /// The market it handed off and whose next leader it has not seen yet, and the nodes that led
        /// nothing then (the hand-off was for one of them).
        var handedOff: (market: String, idle: Set<String>)?
        /// The least time between two hand-offs now: ``handOffAfter``, doubled each time no node that
        /// led nothing at the hand-off took the market (the "idle" node is cut off from the upstream,
        /// or not a node at all but a name someone publishes interest under), up to
        /// ``maxHandOffInterval``.
        var interval: Duration?
    }

    /// The longest time between two hand-offs that were not taken.
    package static let maxHandOffInterval: Duration = .seconds(300)

    package let node: String
    package let maxDeferral: Duration
    /// How long a node leads a market before it may hand it to an idle node, and the least time between
    /// two hand-offs of one node.
    package let handOffAfter: Duration
    private let state = Mutex(State())

    package init(node: String, maxDeferral: Duration = .seconds(2), handOffAfter: Duration = .seconds(3)) {
        self.node = node
        self.maxDeferral = maxDeferral
        self.handOffAfter = handOffAfter
    }

    /// Whether this node, leading `market` since `leadingSince`, should hand it to an idle node now: it
    /// leads another market too, `market` is the last (by name) of those it leads (one hand-off at a
    /// time), a live node leads none, and neither this term nor the last hand-off is younger than
    /// ``handOffAfter``. A cluster whose nodes started one after another (the first took every lease)
    /// spreads this way; the hand-off is a graceful one (upstream closed, lease deleted), so the idle node
    /// takes over within a poll interval.
    package func shouldHandOff(
        market: String, liveNodes: [String], leadingSince: ContinuousClock.Instant, now: ContinuousClock.Instant = .now
    ) -> Bool {
        state.withLock { state in
            let mine = state.leaders.filter { $0.value == node }.keys.sorted()
            guard mine.count >= 2, mine.last == market, now - leadingSince >= handOffAfter else { return false }
            if let last = state.lastHandOff, now - last < (state.interval ?? handOffAfter) { return false }
            let led = Set(state.leaders.values)
            let idle = Set(liveNodes.filter { $0 != node && !led.contains($0) })
            guard !idle.isEmpty else { return false }
            state.lastHandOff = now
            state.handedOff = (market, idle)
            return true
        }
    }

    /// Notes the holder of a market's lease (`nil`: none).
    package func observe(market: String, leader: String?) {
        state.withLock { state in
            state.leaders[market] = leader
            if leader != nil { state.deferringSince[market] = nil }
            // The market handed off has a leader again: a node that led nothing took it (the interval is
            // back to its least), or not (it came back to this one, or another leader took it after its
            // own deferral): the next hand-off waits twice as long.
            if let leader, let handedOff = state.handedOff, handedOff.market == market {
                state.handedOff = nil
                state.interval = handedOff.idle.contains(leader) ? nil : min((state.interval ?? handOffAfter) * 2, Self.maxHandOffInterval)
            }
        }
    }

    /// The markets each node leads, as observed.
    package var leaders: [String: String] { state.withLock { $0.leaders } }

    /// Whether this node should leave `market`'s free lease to another node now: it leads another market
    /// and a live node (`liveNodes`, heard from within the interest TTL) leads none, and it has not yet
    /// deferred this lease for ``maxDeferral``.
    package func shouldDefer(market: String, liveNodes: [String], now: ContinuousClock.Instant = .now) -> Bool {
        state.withLock { state in
            let led = Set(state.leaders.filter { $0.key != market }.values)
            guard led.contains(node) else {
                state.deferringSince[market] = nil
                return false
            }
            let idle = liveNodes.filter { $0 != node && !led.contains($0) }
            guard !idle.isEmpty else {
                state.deferringSince[market] = nil
                return false
            }
            let since = state.deferringSince[market] ?? now
            state.deferringSince[market] = since
            return now - since < maxDeferral
        }
    }
}
