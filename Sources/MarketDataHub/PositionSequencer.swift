import MarketCore

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

    /// Topics whose events stopped for a while in this term (the upstream no longer sent them): each
    /// skips a topic sequence, so a node that held the topic sees the break at its next event and tells
    /// its clients, instead of a run that looks whole. A wildcard skips every ticker of its type.
    package mutating func interrupt(_ topics: some Sequence<Topic>) {
        for topic in topics {
            if topic.isWildcard {
                for (known, next) in nextTopic where known.eventType == topic.eventType { nextTopic[known] = next + 1 }
            } else if let next = nextTopic[topic] {
                nextTopic[topic] = next + 1
            }
        }
    }

    /// The events with their positions written in (one buffer per call).
    package mutating func stamp(_ events: [MarketEvent]) -> [MarketEvent] {
        EventPosition.stamp(events, positions(of: events))
    }

    /// The next positions, one per event, in order.
    package mutating func positions(of events: [MarketEvent]) -> [EventPosition] {
        var positions: [EventPosition] = []
        positions.reserveCapacity(events.count)
        for event in events {
            let topic = event.topic
            let next = nextTopic[topic] ?? 1
            nextTopic[topic] = next + 1
            positions.append(EventPosition(topic: next, market: nextMarket))
            nextMarket += 1
        }
        return positions
    }
}
