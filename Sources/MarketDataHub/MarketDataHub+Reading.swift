import MarketCore

extension MarketDataHub {
    // MARK: reading

    /// Whether an upstream outage is in progress (lost, and no event since).
    public var isUpstreamOutage: Bool { outages.current != nil }

    /// The last event seen on a ticker topic, if any. A folded topic's (an order book's) is its whole
    /// state, `nil` while it is not whole: its last event is only a change.
    public func lastEvent(for topic: Topic) -> MarketEvent? { entries[topic]?.value }

    /// The last event of a topic the market is subscribed to upstream now (itself or by its wildcard)
    /// with no outage: a value that is current, as the REST gateway answers live. `nil` otherwise.
    public func currentEvent(for topic: Topic) -> MarketEvent? {
        guard outages.current == nil, wanted.topics.covers(topic) else { return nil }
        return lastEvent(for: topic)
    }

    /// Topics the hub holds an entry for (subscribers or a last value).
    public var topicEntryCount: Int { entries.count }

    /// How many subscribers are connected to the hub.
    public var subscriberCount: Int { subscribers.count }

    /// The topic set the upstream should be subscribed to right now.
    public var wantedTopics: Set<Topic> { wanted.topics }

    /// The topics one subscriber has.
    public func topics(of id: SubscriberID) -> Set<Topic> { subscribers[id]?.topics ?? [] }

    /// Events dropped for one subscriber because its buffer was full.
    public func droppedEvents(for id: SubscriberID) -> Int { subscribers[id]?.dropped ?? 0 }

    /// Events published since start.
    public var publishedCount: Int { published }


    /// Buffer use across subscribers: the fullest buffer (events queued and not yet read) and how many
    /// subscribers are lagging (have lost events not yet reported to them).
    public var bufferStatistics: (maxFill: Int, lagging: Int) {
        var fullest = 0
        for subscriber in subscribers.values { fullest = Swift.max(fullest, subscriber.queue.pending.load(ordering: .relaxed)) }
        return (fullest, laggingCount)
    }

    /// How many subscribers are lagging, without a look at every buffer.
    public var laggingSubscribers: Int { laggingCount }
}
