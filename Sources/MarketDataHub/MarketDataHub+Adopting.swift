import MarketCore

/// A cluster node's publishes: the positions its leader wrote into the events are kept, not made here.
extension MarketDataHub {
    /// Keeps events whose positions a cluster's leader wrote into their bytes (read, not written);
    /// returns them carrying their market sequence (as they came, if one had no position).
    func adopt(_ events: [MarketEvent], into history: EventHistory, at now: Int64) -> [MarketEvent] {
        var positions: [EventPosition] = []
        var kept: [MarketEvent] = []
        for event in events {
            guard let position = EventPosition.read(from: event.bytes) else { continue }
            positions.append(position)
            kept.append(
                MarketEvent(
                    eventType: event.eventType, ticker: event.ticker, bytes: event.bytes, receivedAt: event.receivedAt, sequence: position.market))
        }
        let (outOfOrder, implausible, pastLeader) = (history.outOfOrder, history.implausible, history.pastLeader)
        let broken = history.append(kept, positions: positions, at: now)
        // What the history did not keep is counted: a resume of it cannot be whole.
        if history.outOfOrder > outOfOrder { metrics.notKeptOutOfOrder.increment(by: history.outOfOrder - outOfOrder) }
        if history.implausible > implausible { metrics.notKeptImplausible.increment(by: history.implausible - implausible) }
        if history.pastLeader > pastLeader { metrics.notKeptPastLeader.increment(by: history.pastLeader - pastLeader) }
        // A topic whose run broke: its holders are told before the event after the break.
        for topic in broken {
            // A folded state missed what went by in the break: not vouched for until whole again.
            if let entry = entries[topic], let fold = entry.fold {
                fold.interrupt()
                entry.releaseHeldBack()
            }
            let notice = wire.render(
                Notice(
                    .gap, message: "\(topic): events are missing before this one (the cluster's upstream stopped sending it for a while)",
                    details: ["topic": .text(topic.description)]))
            let holders = (entries[topic]?.subscribers.members ?? []) + (wildcards[topic.eventType]?.members ?? [])
            for subscriber in holders { enqueue(HubDelivery([notice]), to: subscriber) }
        }
        return kept.count == events.count ? kept : events
    }

    /// A cluster node read in the lease that its leader had stamped `epoch`'s events through `through`:
    /// for `freshFor` its history keeps no event leaping far past it
    /// (``EventHistory/leaderStamped(through:until:)``), so one forged event cannot make every real
    /// event after it "out of order". Kept for the epoch if this node has not begun it yet.
    public func leaderStamped(through: UInt64, epoch: String, freshFor: Duration) {
        guard adoptsPositions else { return }
        leaderMark = (epoch, through, WallClock.nowMilliseconds() + freshFor.milliseconds)
        applyLeaderMark()
    }

    /// The mark the lease gave last, to the history of its epoch.
    func applyLeaderMark() {
        guard let (epoch, through, until) = leaderMark, let history, history.epoch == epoch else { return }
        if !history.leaderStamped(through: through, until: until), leaderMarkWarned != epoch {
            leaderMarkWarned = epoch
            logger.warning(
                "this node's history holds a market sequence past what the leader stamped (\(through)): an event with forged positions came before the lease's word; resumes by market sequence or time may miss events until the next term",
                metadata: ["epoch": "\(epoch)", "lastMarketSequence": "\(history.nextMarketSequence - 1)"])
        }
    }

    /// The newest mark the history holds (a cluster node's; `nil`: none).
    public var leaderStampedThrough: UInt64? { history?.leaderMark?.through }
}
