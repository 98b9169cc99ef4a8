import Foundation
import Logging
import MarketDataHub
import NIOCore
import PolygonWire
import Synchronization

/// One node's side of the cluster's data path: NATS subscriptions for exactly the topics this node's
/// hub wants, and one ordered queue from libnats' delivery thread into the hub.
///
/// Events, the leader's "upstream lost" notices, snapshots from the last-value store and loss reports
/// all travel through the same queue, so they reach the hub in the order they happened. The queue is
/// bounded (``maxQueuedEvents``): past it, events are dropped, counted, and the subscribers of their
/// topics get a `lagging` notice — never unbounded memory.
///
/// `Sendable`; state behind `Mutex`es. ``run()`` is the one consumer.
final class ClusterFeed: Sendable {
    enum Item: Sendable {
        case events([MarketEvent])
        case lost(reason: String)
        case seed(MarketEvent)
        case loss(count: Int, topics: Set<Topic>?, reason: String)
    }

    /// On the control subject, `loss:N`: the leader dropped N upstream events (its own queue was full).
    static let lossPrefix = "loss:"
    /// Events queued between libnats and the hub before newer ones are dropped.
    static let maxQueuedEvents = 100_000
    /// Events handed to the hub in one `publish`, so one late wake-up does not become one huge batch.
    static let maxBatch = 256

    private struct Inbox {
        var items: [Item] = []
        /// Events gathered since the last non-event item (appended as one `.events`).
        var run: [MarketEvent] = []
        var queuedEvents = 0
        var dropped = 0
        var droppedTopics: Set<Topic>? = []
    }

    let subjects: ClusterSubjects
    private let connection: NATSConnection
    private let hub: MarketDataHub
    private let metrics: ClusterMetrics
    private let logger: Logger
    private let inbox = Mutex(Inbox())
    private let wake: AsyncStream<Void>.Continuation
    private let wakes: AsyncStream<Void>
    private let subscriptions = Mutex<[Topic: NATSSubscription]>([:])
    private let lastValues: @Sendable (Topic) async -> MarketEvent?
    private let eventSink: Mutex<NATSMessageSink?> = Mutex(nil)

    init(
        connection: NATSConnection, subjects: ClusterSubjects, hub: MarketDataHub, metrics: ClusterMetrics, logger: Logger,
        lastValues: @escaping @Sendable (Topic) async -> MarketEvent?
    ) {
        self.connection = connection
        self.subjects = subjects
        self.hub = hub
        self.metrics = metrics
        self.logger = logger
        self.lastValues = lastValues
        (wakes, wake) = AsyncStream.makeStream(of: Void.self, bufferingPolicy: .bufferingNewest(1))
    }

    /// Subscribes to the leader's notices and makes the sink for events. Call once, before ``run()``.
    func start() {
        let subjects = self.subjects
        let sink = NATSMessageSink { [weak self] subject, payload in
            guard let self else { return }
            let length = strlen(subject)
            let topic = subject.withMemoryRebound(to: UInt8.self, capacity: length) {
                subjects.topic(fromSubject: UnsafeBufferPointer(start: $0, count: length))
            }
            guard let topic else {
                self.metrics.rejected("event", "\(String(cString: subject).prefix(200)) is not an event subject", logger: self.logger)
                return
            }
            switch ClusterChecks.event(payload, topic: topic, market: subjects.wireMarket, receivedAt: MonotonicClock.nanoseconds()) {
            case .success(let event): self.enqueue(event)
            case .failure(let rejection): self.metrics.rejected("event", "\(rejection) (subject \(topic))", logger: self.logger)
            }
        }
        eventSink.withLock { $0 = sink }
        let control = NATSMessageSink { [weak self] _, payload in
            let reason = String(decoding: payload, as: UTF8.self)
            if reason.hasPrefix(ClusterFeed.lossPrefix), let count = Int(reason.dropFirst(ClusterFeed.lossPrefix.count)) {
                self?.append(.loss(count: count, topics: nil, reason: "the cluster leader fell behind its upstream"))
                return
            }
            self?.append(.lost(reason: reason.isEmpty ? "the cluster leader lost its upstream connection" : reason))
        }
        _ = connection.subscribe(subjects.upstreamControl, sink: control)
        connection.onSlowConsumer { [weak self] subscription in
            guard let self else { return }
            let topic = subscription.flatMap { self.subjects.topic(fromSubject: $0.subject) }
            self.metrics.natsDropped(reason: "slow_consumer").increment()
            self.append(.loss(count: 1, topics: topic.map { [$0] }, reason: "NATS dropped messages for this node: slow consumer"))
        }
    }

    // MARK: what this node wants

    /// Makes the NATS subscriptions equal to `topics` (the hub's wanted set, in which no ticker is
    /// covered by a wildcard, so no event arrives twice). New ticker topics are seeded from the
    /// cluster's last-value store.
    func setWanted(_ topics: Set<Topic>) {
        guard let sink = eventSink.withLock({ $0 }) else { return }
        let (added, removed): ([Topic], [NATSSubscription]) = subscriptions.withLock { current in
            let added = topics.filter { current[$0] == nil }
            var removed: [NATSSubscription] = []
            for topic in current.keys where !topics.contains(topic) {
                if let subscription = current.removeValue(forKey: topic) { removed.append(subscription) }
            }
            for topic in added {
                if let subscription = connection.subscribe(subjects.subject(for: topic), sink: sink) {
                    current[topic] = subscription
                }
            }
            return (Array(added), removed)
        }
        for subscription in removed { subscription.cancel() }
        let seeds = added.filter { !$0.isWildcard }
        guard !seeds.isEmpty else { return }
        Task {
            for topic in seeds {
                if let event = await lastValues(topic) { append(.seed(event)) }
            }
        }
    }

    /// How many subjects this node is subscribed to.
    var subscriptionCount: Int { subscriptions.withLock { $0.count } }

    /// Tells every subscriber of this node that events stopped (once per outage; the first event after
    /// it announces the gap).
    func announceLost(_ reason: String) {
        append(.lost(reason: reason))
    }

    // MARK: the queue

    private func enqueue(_ event: MarketEvent) {
        let wasEmpty: Bool? = inbox.withLock { inbox in
            guard inbox.queuedEvents < Self.maxQueuedEvents else {
                inbox.dropped += 1
                if inbox.droppedTopics != nil {
                    inbox.droppedTopics?.insert(event.topic)
                    if (inbox.droppedTopics?.count ?? 0) > 1000 { inbox.droppedTopics = nil }
                }
                return nil
            }
            let wasEmpty = inbox.items.isEmpty && inbox.run.isEmpty
            inbox.run.append(event)
            inbox.queuedEvents += 1
            if inbox.run.count >= Self.maxBatch {
                inbox.items.append(.events(inbox.run))
                inbox.run = []
            }
            return wasEmpty
        }
        if wasEmpty == true { wake.yield() }
    }

    private func append(_ item: Item) {
        inbox.withLock { inbox in
            if !inbox.run.isEmpty {
                inbox.items.append(.events(inbox.run))
                inbox.run = []
            }
            inbox.items.append(item)
        }
        wake.yield()
    }

    /// Feeds the hub, in order, until cancelled.
    func run() async {
        for await _ in wakes {
            while true {
                let (items, dropped, droppedTopics): ([Item], Int, Set<Topic>?) = inbox.withLock { inbox in
                    if !inbox.run.isEmpty {
                        inbox.items.append(.events(inbox.run))
                        inbox.run = []
                    }
                    defer {
                        inbox.items = []
                        inbox.queuedEvents = 0
                        inbox.dropped = 0
                        inbox.droppedTopics = []
                    }
                    return (inbox.items, inbox.dropped, inbox.droppedTopics)
                }
                if items.isEmpty && dropped == 0 { break }
                for item in items {
                    switch item {
                    case .events(let events):
                        metrics.natsIn.increment(by: events.count)
                        await hub.publish(events)
                    case .lost(let reason):
                        await hub.upstreamLost(reason: reason)
                    case .seed(let event):
                        await hub.seed(event)
                    case .loss(let count, let topics, let reason):
                        await hub.reportLoss(count, topics: topics, reason: reason)
                    }
                }
                if dropped > 0 {
                    metrics.natsDropped(reason: "node_queue_full").increment(by: dropped)
                    logger.warning("cluster events dropped: this node's queue was full", metadata: ["dropped": "\(dropped)"])
                    await hub.reportLoss(dropped, topics: droppedTopics, reason: "this relay node fell behind the cluster")
                }
            }
        }
    }

    func stop() {
        wake.finish()
        let all = subscriptions.withLock { current in
            defer { current.removeAll() }
            return Array(current.values)
        }
        for subscription in all { subscription.cancel() }
    }
}
