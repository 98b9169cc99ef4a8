import PolygonWire

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

    /// The event types whose newest value replaces the older (state), as opposed to trades and notices
    /// (`T`, `XT`, `LULD`, `NOI`), which are never merged.
    public static let stateEventTypes: Set<String> = ["Q", "XQ", "C", "A", "AM", "XA", "CA", "V", "FMV", "LV"]
}

/// One subscriber's pending merged events: the newest state event per topic not yet queued, in the
/// order their topics first became pending. Bounded by the topics the subscriber holds (a dirty set over
/// the last values), not by the event rate. Confined to the hub.
final class Conflation {
    var mode: ConflationMode
    private(set) var pending: [Topic: MarketEvent] = [:]
    private var order: [Topic] = []
    /// Events replaced while pending (told in metrics).
    private(set) var merged = 0
    var nextFlush: ContinuousClock.Instant

    init(mode: ConflationMode, now: ContinuousClock.Instant = .now) {
        self.mode = mode
        nextFlush = now + (mode.interval ?? .zero)
    }

    var isEmpty: Bool { pending.isEmpty }

    /// Whether new events are merged now, at this buffer fill.
    func isMerging(fill: Int) -> Bool {
        mode.interval != nil || (mode.whileLagging && (fill >= MarketDataHub.warningFill || !pending.isEmpty))
    }

    /// Holds a state event (replacing its topic's pending one); whether it replaced one.
    func hold(_ event: MarketEvent) -> Bool {
        let topic = event.topic
        if pending.updateValue(event, forKey: topic) == nil {
            order.append(topic)
            return false
        }
        merged += 1
        return true
    }

    /// Takes the pending events of one ticker (a trade of it flushes them first), in order.
    func take(ticker: String) -> [MarketEvent] {
        guard pending.keys.contains(where: { $0.ticker == ticker }) else { return [] }
        var taken: [MarketEvent] = []
        order.removeAll { topic in
            guard topic.ticker == ticker, let event = pending.removeValue(forKey: topic) else { return false }
            taken.append(event)
            return true
        }
        return taken
    }

    /// Takes every pending event, in the order their topics became pending.
    func takeAll() -> [MarketEvent] {
        let taken = order.compactMap { pending[$0] }
        pending.removeAll(keepingCapacity: true)
        order.removeAll(keepingCapacity: true)
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
            if ConflationMode.stateEventTypes.contains(event.eventType) {
                if conflation.hold(event) { replaced += 1 }
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
            } else if subscriber.queue.pending.load(ordering: .relaxed) > Self.bufferLimit / 2 {
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
    public func conflatedPending(for id: SubscriberID) -> Int { subscribers[id]?.conflation?.pending.count ?? 0 }
}
