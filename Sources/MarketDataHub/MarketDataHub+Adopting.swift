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
        let (outOfOrder, implausible) = (history.outOfOrder, history.implausible)
        let broken = history.append(kept, positions: positions, at: now)
        // What the history did not keep is counted: a resume of it cannot be whole.
        if history.outOfOrder > outOfOrder { metrics.notKeptOutOfOrder.increment(by: history.outOfOrder - outOfOrder) }
        if history.implausible > implausible { metrics.notKeptImplausible.increment(by: history.implausible - implausible) }
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
}
