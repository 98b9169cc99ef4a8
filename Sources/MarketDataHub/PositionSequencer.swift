import PolygonWire

/// Gives events their positions where a cluster's leader publishes them, so every node holds the same
/// positions: a topic's sequence and the market's, in one epoch (a leadership term). Value type, owned by
/// the one task that publishes.
package struct PositionSequencer {
    package let epoch: String
    private var nextTopic: [Topic: UInt64] = [:]
    private var nextMarket: UInt64 = 1

    package init(epoch: String = EventPosition.newEpoch()) {
        self.epoch = epoch
    }

    /// The events with their positions written in (one buffer per call).
    package mutating func stamp(_ events: [MarketEvent]) -> [MarketEvent] {
        var positions: [EventPosition] = []
        positions.reserveCapacity(events.count)
        for event in events {
            let topic = event.topic
            let next = nextTopic[topic] ?? 1
            nextTopic[topic] = next + 1
            positions.append(EventPosition(topic: next, market: nextMarket))
            nextMarket += 1
        }
        return EventPosition.stamp(events, positions)
    }
}
