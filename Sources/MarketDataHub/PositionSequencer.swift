import MarketCore

/// Gives events their positions where a cluster's leader publishes them, so every node holds the same
/// positions: a topic's sequence and the market's, in one epoch (a leadership term). Value type, owned by
/// the one task that publishes.
///
/// It keeps each topic's next number for at most ``maxTopics`` topics (a wildcard over options brings
/// every contract the vendor trades): past it, the tenth it published longest ago are let go, and a topic
/// it does not know from then on starts past every number it gave any topic, so no topic's number repeats
/// (a node that held one let go sees a break at its next event and says so, as after an interruption).
package struct PositionSequencer {
    package let epoch: String
    /// Per topic: its next number, and the market sequence of its last event.
    private var nextTopic: [Topic: (next: UInt64, last: UInt64)] = [:]
    private var nextMarket: UInt64 = 1
    /// Past every topic number given so far, once topics were let go (`nil` before): where an unknown
    /// topic starts.
    private var pastEveryNumber: UInt64?
    package let maxTopics: Int

    package init(epoch: String = EventPosition.newEpoch(), maxTopics: Int = 1_000_000) {
        self.epoch = epoch
        self.maxTopics = maxTopics
    }

    /// Topics whose next number it keeps.
    package var topicCount: Int { nextTopic.count }

    /// Topics whose events stopped for a while in this term (the upstream no longer sent them): each
    /// skips a topic sequence, so a node that held the topic sees the break at its next event and tells
    /// its clients, instead of a run that looks whole. A wildcard skips every ticker of its type.
    package mutating func interrupt(_ topics: some Sequence<Topic>) {
        for topic in topics {
            if topic.isWildcard {
                for (known, kept) in nextTopic where known.eventType == topic.eventType { nextTopic[known] = (kept.next + 1, kept.last) }
            } else {
                nextTopic[topic]?.next += 1
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
            let next = nextTopic[topic]?.next ?? pastEveryNumber ?? 1
            nextTopic[topic] = (next + 1, nextMarket)
            positions.append(EventPosition(topic: next, market: nextMarket))
            nextMarket += 1
        }
        if nextTopic.count > maxTopics { letGoOfTheIdlest() }
        return positions
    }

    /// Lets go of the tenth of its topics published longest ago (found by the topic table's selection,
    /// ``LastValueBound/smallest(_:of:)``, once per tenth of the bound in new topics); from then on an
    /// unknown topic starts past every number given.
    private mutating func letGoOfTheIdlest() {
        var lasts = nextTopic.values.map(\.last)
        // Each topic's last market sequence is its own: exactly the newest `kept` are past the cut.
        let kept = max(maxTopics - maxTopics / 10, 1)
        let cut = LastValueBound.smallest(lasts.count - kept, of: &lasts)
        // One past every next number: a topic let go that comes back skips at least one, so a node that
        // held it sees a break (an interruption meanwhile, unknown here, is not hidden).
        pastEveryNumber = max(pastEveryNumber ?? 1, (nextTopic.values.map(\.next).max() ?? 1) + 1)
        nextTopic = nextTopic.filter { $0.value.last > cut }
    }
}
