import CoreMetrics
import Logging
import PolygonWire

/// Fans market events out to subscribers, each filtered to its own topics.
///
/// An actor: every mutation of the routing tables happens on it. It never awaits a subscriber: each
/// subscriber has its own bounded `AsyncStream` (`.bufferingOldest(1000)`), and a slow one fills its own
/// buffer and loses its own events, counted in ``droppedEvents(for:)``.
///
/// The hub reference-counts what its subscribers want and reports the *upstream* set through
/// `onWantedTopicsChange` whenever it changes: a topic is wanted from its first subscriber until its last
/// one leaves, and a ticker topic is left out while the wildcard of its event type is wanted (the
/// wildcard already brings its events, and asking for both would make the upstream send them twice).
public actor MarketDataHub {
    /// How many events a subscriber's stream holds before newer events are dropped for it.
    public static let bufferLimit = 1000

    private struct Subscriber {
        let continuation: AsyncStream<MarketEvent>.Continuation
        var topics: Set<Topic> = []
        var dropped = 0
    }

    private var nextID: UInt64 = 1
    private var subscribers: [SubscriberID: Subscriber] = [:]
    /// Ticker topic → subscribers.
    private var byTopic: [Topic: Set<SubscriberID>] = [:]
    /// Event type → subscribers of its wildcard.
    private var byWildcard: [String: Set<SubscriberID>] = [:]
    private var lastEvents: [Topic: MarketEvent] = [:]
    private var upstreamWanted: Set<Topic> = []
    private var published = 0
    /// Wall time of the last event published, in ms.
    private var lastEventAt: Int64?
    private var outage: Outage?

    /// An upstream outage in progress: when the last event before it arrived, and whether the upstream
    /// is authenticated again (the notice goes out with the first event after that).
    private struct Outage {
        var lastEventBefore: Int64?
        var lostAt: Int64
        var reason: String
    }
    private let onWantedTopicsChange: @Sendable (Set<Topic>) -> Void
    private let logger: Logger
    private let subscribersGauge: Gauge
    private let publishedCounter: Counter
    private let droppedCounter: Counter

    /// - Parameter onWantedTopicsChange: called, on the hub, with the whole new upstream topic set each
    ///   time it changes. It must not block (the upstream client queues the change and returns).
    public init(
        logger: Logger = Logger(label: "relay.hub"),
        metricsFactory: any MetricsFactory = MetricsSystem.factory,
        onWantedTopicsChange: @escaping @Sendable (Set<Topic>) -> Void = { _ in }
    ) {
        self.logger = logger
        self.onWantedTopicsChange = onWantedTopicsChange
        subscribersGauge = Gauge(label: "relay_subscribers", factory: metricsFactory)
        publishedCounter = Counter(label: "relay_hub_events_published_total", factory: metricsFactory)
        droppedCounter = Counter(label: "relay_events_dropped_total", dimensions: [("reason", "buffer_full")], factory: metricsFactory)
    }

    // MARK: subscribing

    /// Adds a subscriber for `topics` (more can be added later with ``add(_:to:)``).
    public func subscribe(to topics: Set<Topic> = []) -> HubSubscription {
        let id = SubscriberID(nextID)
        nextID += 1
        let (stream, continuation) = AsyncStream.makeStream(
            of: MarketEvent.self, bufferingPolicy: .bufferingOldest(Self.bufferLimit))
        continuation.onTermination = { [weak self] _ in
            guard let self else { return }
            Task { await self.remove(id) }
        }
        subscribers[id] = Subscriber(continuation: continuation)
        subscribersGauge.record(subscribers.count)
        add(topics, to: id)
        return HubSubscription(id: id, events: stream)
    }

    /// Adds topics to a subscriber; topics it already has are ignored.
    public func add(_ topics: some Sequence<Topic>, to id: SubscriberID) {
        guard var subscriber = subscribers[id] else { return }
        var changed = false
        for topic in topics where subscriber.topics.insert(topic).inserted {
            if topic.isWildcard {
                byWildcard[topic.eventType, default: []].insert(id)
            } else {
                byTopic[topic, default: []].insert(id)
            }
            changed = true
        }
        subscribers[id] = subscriber
        if changed { refreshUpstreamWanted() }
    }

    /// Removes topics from a subscriber; topics it does not have are ignored.
    public func remove(_ topics: some Sequence<Topic>, from id: SubscriberID) {
        guard var subscriber = subscribers[id] else { return }
        var changed = false
        for topic in topics where subscriber.topics.remove(topic) != nil {
            unindex(topic, id)
            changed = true
        }
        subscribers[id] = subscriber
        if changed { refreshUpstreamWanted() }
    }

    /// Removes a subscriber and finishes its stream. Called automatically when the stream terminates.
    public func remove(_ id: SubscriberID) {
        guard let subscriber = subscribers.removeValue(forKey: id) else { return }
        subscribersGauge.record(subscribers.count)
        for topic in subscriber.topics { unindex(topic, id) }
        subscriber.continuation.finish()
        if !subscriber.topics.isEmpty { refreshUpstreamWanted() }
    }

    private func unindex(_ topic: Topic, _ id: SubscriberID) {
        if topic.isWildcard {
            byWildcard[topic.eventType]?.remove(id)
            if byWildcard[topic.eventType]?.isEmpty == true { byWildcard[topic.eventType] = nil }
        } else {
            byTopic[topic]?.remove(id)
            if byTopic[topic]?.isEmpty == true { byTopic[topic] = nil }
        }
    }

    private func refreshUpstreamWanted() {
        var wanted = Set(byWildcard.keys.map(Topic.wildcard))
        for topic in byTopic.keys where byWildcard[topic.eventType] == nil {
            wanted.insert(topic)
        }
        guard wanted != upstreamWanted else { return }
        upstreamWanted = wanted
        onWantedTopicsChange(wanted)
    }

    // MARK: publishing

    /// Delivers events, in order, to every subscriber whose topics match, and caches the last event per
    /// topic. Never suspends.
    public func publish(_ events: [MarketEvent]) {
        if let outage, !events.isEmpty {
            self.outage = nil
            announceRecovery(from: outage, firstEventAfter: WallClock.nowMilliseconds())
        }
        if !events.isEmpty {
            lastEventAt = WallClock.nowMilliseconds()
            publishedCounter.increment(by: events.count)
        }
        for event in events {
            let topic = event.topic
            lastEvents[topic] = event
            published += 1
            let exact = byTopic[topic]
            let wild = byWildcard[event.eventType]
            switch (exact, wild) {
            case (nil, nil):
                continue
            case (let ids?, nil), (nil, let ids?):
                for id in ids { deliver(event, to: id) }
            case (let a?, let b?):
                for id in a.union(b) { deliver(event, to: id) }
            }
        }
    }

    // MARK: upstream outages

    /// The upstream connection was lost. Every subscriber with topics is told at once, once per outage;
    /// when events flow again each is told the window in which none arrived.
    public func upstreamLost(reason: String) {
        guard outage == nil else { return }
        let now = WallClock.nowMilliseconds()
        outage = Outage(lastEventBefore: lastEventAt, lostAt: now, reason: reason)
        var numbers: [String: Int64] = ["lost_at_ms": now]
        if let lastEventAt { numbers["last_event_before_ms"] = lastEventAt }
        notifySubscribersWithTopics(
            StatusMessage(
                status: StatusMessage.Kind.upstreamDisconnected,
                message: "upstream connection lost (\(reason)); subscriptions are kept and resume when it is back",
                numbers: numbers))
        logger.debug("subscribers told the upstream is down", metadata: ["subscribers": "\(subscribers.count)"])
    }

    private func announceRecovery(from outage: Outage, firstEventAfter: Int64) {
        let start = outage.lastEventBefore ?? outage.lostAt
        let numbers: [String: Int64] = [
            "last_event_before_ms": start, "first_event_after_ms": firstEventAfter, "gap_ms": firstEventAfter - start,
        ]
        notifySubscribersWithTopics(
            StatusMessage(
                status: StatusMessage.Kind.upstreamReconnected,
                message:
                    "upstream reconnected; no events were received between \(start) and \(firstEventAfter) (Unix ms, \(firstEventAfter - start) ms)",
                numbers: numbers))
    }

    private func notifySubscribersWithTopics(_ status: StatusMessage) {
        let notice = MarketEvent.notice(status)
        for (id, subscriber) in subscribers where !subscriber.topics.isEmpty {
            deliver(notice, to: id)
        }
    }

    /// Whether an upstream outage is in progress (lost, and no event since).
    public var isUpstreamOutage: Bool { outage != nil }

    private func deliver(_ event: MarketEvent, to id: SubscriberID) {
        guard let continuation = subscribers[id]?.continuation else { return }
        if case .dropped = continuation.yield(event) {
            subscribers[id]?.dropped += 1
            droppedCounter.increment()
        }
    }

    // MARK: reading

    /// The last event seen on a ticker topic, if any.
    public func lastEvent(for topic: Topic) -> MarketEvent? { lastEvents[topic] }

    /// How many subscribers are connected to the hub.
    public var subscriberCount: Int { subscribers.count }

    /// The topic set the upstream should be subscribed to right now.
    public var wantedTopics: Set<Topic> { upstreamWanted }

    /// The topics one subscriber has.
    public func topics(of id: SubscriberID) -> Set<Topic> { subscribers[id]?.topics ?? [] }

    /// Events dropped for one subscriber because its buffer was full.
    public func droppedEvents(for id: SubscriberID) -> Int { subscribers[id]?.dropped ?? 0 }

    /// Events published since start.
    public var publishedCount: Int { published }
}
