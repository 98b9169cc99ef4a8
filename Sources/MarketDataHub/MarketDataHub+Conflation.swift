import MarketCore

/// How a subscriber's state events are merged. Value type, `Sendable`.
public struct ConflationMode: Sendable, Equatable {
    /// Merge always, flushing each symbol's latest at most once per this interval (`nil`: only while
    /// the subscriber lags).
    public var interval: Duration?
    /// Merge while the subscriber's buffer is past its warning level, before any event is dropped.
    public var whileLagging: Bool

    public init(interval: Duration? = nil, whileLagging: Bool = true) {
        self.interval = interval
        self.whileLagging = whileLagging
    }
}

/// One subscriber's pending merged events: the newest state event per topic not yet queued, in the
/// order their topics first became pending. Bounded by the subscriber's buffer (``Subscriber/bufferLimit``
/// topics: a wildcard holds as many as the upstream sends), not by the event rate: at it, what is
/// pending is queued at once, as at a flush (what the buffer has no room for is lost, and told). A trade
/// takes its own ticker's pending events through an index by ticker, so its cost does not grow with the
/// other tickers pending (it used to scan them all).
/// Confined to the hub.
final class Conflation {
    var mode: ConflationMode
    /// Each pending topic's newest event, and the stamp of when the topic became pending.
    private var pending: [Topic: (event: MarketEvent, stamp: Int)] = [:]
    /// Topics in the order they became pending; an entry whose stamp is no longer its topic's is stale
    /// (taken by a trade since), skipped, and compacted away once stale entries outnumber live ones.
    private var order: [(topic: Topic, stamp: Int)] = []
    /// The pending topics of each ticker, in the order they became pending.
    private var byTicker: [String: [Topic]] = [:]
    private var stamps = 0
    /// Events replaced while pending (told in metrics).
    private(set) var merged = 0
    var nextFlush: ContinuousClock.Instant

    init(mode: ConflationMode, now: ContinuousClock.Instant = .now) {
        self.mode = mode
        nextFlush = now + (mode.interval ?? .zero)
    }

    var isEmpty: Bool { pending.isEmpty }

    /// Topics with a pending event.
    var pendingCount: Int { pending.count }

    /// Whether new events are merged now, at this buffer fill (`warningFill`: the subscriber's
    /// falling-behind fill).
    func isMerging(fill: Int, warningFill: Int) -> Bool {
        mode.interval != nil || (mode.whileLagging && (fill >= warningFill || !pending.isEmpty))
    }

    /// Holds a state event (replacing its topic's pending one); whether it replaced one.
    func hold(_ event: MarketEvent) -> Bool {
        let topic = event.topic
        if let held = pending[topic] {
            pending[topic] = (event, held.stamp)
            merged += 1
            return true
        }
        stamps += 1
        pending[topic] = (event, stamps)
        order.append((topic, stamps))
        byTicker[topic.ticker, default: []].append(topic)
        return false
    }

    /// Takes the pending events of one ticker (a trade of it flushes them first), in order.
    func take(ticker: String) -> [MarketEvent] {
        guard let topics = byTicker.removeValue(forKey: ticker) else { return [] }
        let taken = topics.compactMap { pending.removeValue(forKey: $0)?.event }
        if order.count > 2 * pending.count + 64 { order.removeAll { pending[$0.topic]?.stamp != $0.stamp } }
        return taken
    }

    /// Lets go of the pending events of the topics `removed` (a subscriber's unsubscribe: a ticker, or
    /// every ticker of a wildcard's type) that the subscriber no longer `holds`.
    func discard(_ removed: some Sequence<Topic>, holds: (Topic) -> Bool) {
        for topic in removed {
            let gone = topic.isWildcard ? pending.keys.filter { $0.eventType == topic.eventType } : [topic]
            for pendingTopic in gone where pending[pendingTopic] != nil && !holds(pendingTopic) {
                pending[pendingTopic] = nil
                byTicker[pendingTopic.ticker]?.removeAll { $0 == pendingTopic }
                if byTicker[pendingTopic.ticker]?.isEmpty == true { byTicker[pendingTopic.ticker] = nil }
            }
        }
        if order.count > 2 * pending.count + 64 { order.removeAll { pending[$0.topic]?.stamp != $0.stamp } }
    }

    /// Takes every pending event, in the order their topics became pending.
    func takeAll() -> [MarketEvent] {
        let taken = order.compactMap { entry in pending[entry.topic].flatMap { $0.stamp == entry.stamp ? $0.event : nil } }
        pending.removeAll(keepingCapacity: true)
        order.removeAll(keepingCapacity: true)
        byTicker.removeAll(keepingCapacity: true)
        return taken
    }
}

extension MarketDataHub {
    /// How a subscriber's state events are merged from now on (`nil`: never). Its pending ones are
    /// queued at once when merging stops.
    public func setConflation(_ mode: ConflationMode?, for id: SubscriberID) {
        guard let subscriber = subscribers[id] else { return }
        if let mode {
            if let conflation = subscriber.conflation {
                conflation.mode = mode
            } else {
                subscriber.conflation = Conflation(mode: mode)
            }
            conflating.insert(id)
        } else if let conflation = subscriber.conflation {
            subscriber.conflation = nil
            conflating.remove(id)
            let pending = conflation.takeAll()
            if !pending.isEmpty { enqueue(HubDelivery(pending), to: subscriber) }
            tell(CollectionOfOne(subscriber))
        }
        conflationChanged()
    }

    /// A subscriber's share of a publish, merged: state events wait as their topic's latest; anything
    /// else goes out at once, after the pending events of its ticker (trade-safe: a quote never arrives
    /// after the trade that followed it).
    func deliverConflating(_ delivery: HubDelivery, to subscriber: Subscriber, _ conflation: Conflation) {
        var events: [MarketEvent] = []
        delivery.append(to: &events)
        var now: [MarketEvent] = []
        var replaced = 0
        for event in events {
            if stateEventTypes.contains(event.eventType) {
                if conflation.hold(event) {
                    replaced += 1
                } else if conflation.pendingCount >= subscriber.bufferLimit {
                    // More than its buffer could take at once: held no longer, whatever the interval.
                    now += conflation.takeAll()
                }
            } else {
                now += conflation.take(ticker: event.ticker)
                now.append(event)
            }
        }
        if replaced > 0 {
            metrics.conflated.increment(by: replaced)
            resumeCounts.conflated += replaced
        }
        if !now.isEmpty { enqueue(HubDelivery(now), to: subscriber) }
    }

    /// Queues what is due: an interval subscriber's pending events once its interval passed; a lagging
    /// one's once its buffer is back under half.
    func flushConflated(now: ContinuousClock.Instant = .now) {
        var flushed: [Subscriber] = []
        for id in conflating {
            guard let subscriber = subscribers[id], let conflation = subscriber.conflation, !conflation.isEmpty else { continue }
            if let interval = conflation.mode.interval {
                guard now >= conflation.nextFlush else { continue }
                conflation.nextFlush = now + interval
            } else if subscriber.queue.pending.load(ordering: .relaxed) > subscriber.bufferLimit / 2 {
                continue
            }
            enqueue(HubDelivery(conflation.takeAll()), to: subscriber)
            flushed.append(subscriber)
        }
        tell(flushed)
    }

    /// Starts or stops the task that flushes merged events (it runs while a subscriber may merge).
    func conflationChanged() {
        if conflating.isEmpty {
            conflationTicker?.cancel()
            conflationTicker = nil
        } else if conflationTicker == nil {
            // Intervals are kept to within one tick.
            conflationTicker = Task { [weak self] in
                while !Task.isCancelled {
                    try? await Task.sleep(for: .milliseconds(20))
                    guard let self else { return }
                    await self.flushConflated()
                }
            }
        }
    }
}

extension MarketDataHub {
    /// Merged events waiting for one subscriber (at most one per topic).
    public func conflatedPending(for id: SubscriberID) -> Int { subscribers[id]?.conflation?.pendingCount ?? 0 }
}
