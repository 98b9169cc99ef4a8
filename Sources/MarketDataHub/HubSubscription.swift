import MarketCore

/// What `MarketDataHub.subscribe(to:)` hands back: the subscriber's identity and its events.
///
/// `Sendable`. Underneath is an `AsyncStream` created with `.bufferingOldest(1000)` whose elements are
/// the subscriber's shares of upstream messages (``HubDelivery``: no copy of the events, the message's
/// events are shared) queued since its reader last took one: a ``DeliveryBatch``, which the hub adds to
/// until the reader takes it (one `yield` per read, not per message or per event). The hub bounds each
/// subscriber to its ``bufferLimit`` queued *events*: a subscriber that does not keep up loses
/// the newest events, never anybody else's. Ending the iteration (or dropping the subscription) removes
/// the subscriber from the hub, unless it is parked (then whoever parked it removes it). Relay notices
/// (`ev` `status`) travel in the same stream, in order.
public struct HubSubscription: Sendable {
    public let id: SubscriberID
    let stream: AsyncStream<DeliveryBatch>
    let queue: SubscriberQueue

    /// The events its buffer holds (its hub's ``MarketDataHub/bufferLimit``, or its key's). Any thread.
    public var bufferLimit: Int { queue.limit.load(ordering: .relaxed) }

    /// The events one by one. Use either this, or ``makeReader()``, once.
    public var events: Events { Events(stream: stream, queue: queue) }

    /// A reader that takes everything queued at once (for coalesced writes).
    public func makeReader() -> Reader { Reader(iterator: stream.makeAsyncIterator(), queue: queue) }

    /// Whether events are queued, or the stream has finished (a read would not wait). Any thread.
    public var hasQueued: Bool {
        queue.batches.load(ordering: .acquiring) > 0 || queue.finished.load(ordering: .acquiring)
    }

    /// Replayed events taken from the stream but kept by its reader for later (``HubDelivery/cut(_:afterBytes:)``),
    /// or (negative) sent since: they still count as queued, so that a new resume sees them.
    public func carried(replayed count: Int) {
        queue.replaying.add(count, ordering: .relaxed)
    }

    /// The events queued outside the bound (replays, recovered events) since it joined, in all: read
    /// after ``MarketDataHub/add(_:to:resuming:)`` returns, what its replay ends at (a reader that has
    /// taken this many of them in all has taken the replay whole). Any thread.
    public var replayedQueued: Int { queue.replayedQueued.load(ordering: .relaxed) }

    /// Whether the hub ended this subscription because it fell too far behind (`disconnect` policy).
    public var wasEvicted: Bool { queue.evicted.load(ordering: .acquiring) }

    /// The subscription's events as an `AsyncSequence` of single events.
    public struct Events: AsyncSequence, Sendable {
        public typealias Element = MarketEvent
        let stream: AsyncStream<DeliveryBatch>
        let queue: SubscriberQueue

        public func makeAsyncIterator() -> Iterator { Iterator(reader: Reader(iterator: stream.makeAsyncIterator(), queue: queue)) }

        public struct Iterator: AsyncIteratorProtocol {
            var reader: Reader
            var current: [MarketEvent] = []
            var index = 0

            public mutating func next() async -> MarketEvent? {
                if index == current.count {
                    guard let batch = await reader.nextBatch() else { return nil }
                    current = batch
                    index = 0
                }
                defer { index += 1 }
                return current[index]
            }
        }
    }

    /// Takes events in batches: waits for some, then takes whatever else is already queued without
    /// waiting. Not `Sendable`: it belongs to the one task that drains the subscription.
    public struct Reader {
        var iterator: AsyncStream<DeliveryBatch>.AsyncIterator
        let queue: SubscriberQueue

        /// Everything queued, in order, once at least one event is; `nil` when the subscription has ended.
        /// Runs in the caller's isolation (`isolation`), so a reader on an actor is resumed on that
        /// actor's executor directly, without a stop on the global pool.
        public mutating func nextBatch(isolation: isolated (any Actor)? = #isolation) async -> [MarketEvent]? {
            var deliveries: [HubDelivery] = []
            guard await nextDeliveries(into: &deliveries) else { return nil }
            var batch: [MarketEvent] = []
            batch.reserveCapacity(deliveries.reduce(0) { $0 + $1.count })
            for delivery in deliveries { delivery.append(to: &batch) }
            return batch
        }

        /// Appends everything queued, in order, once anything is, to `deliveries` (the events stay
        /// where the hub holds them); `false` when the subscription has ended. One `next()` on the
        /// stream: it holds at most one element, the subscriber's ``DeliveryBatch``, which has
        /// everything queued since the last read (at most ``HubSubscription/bufferLimit`` events). In the
        /// caller's isolation, like ``nextBatch(isolation:)``.
        public mutating func nextDeliveries(
            into deliveries: inout [HubDelivery], isolation: isolated (any Actor)? = #isolation
        ) async -> Bool {
            guard let batch = await iterator.next(isolation: isolation) else { return false }
            let (events, replayed) = batch.take(into: &deliveries)
            queue.batches.subtract(1, ordering: .relaxed)
            queue.pending.subtract(events, ordering: .relaxed)
            if replayed > 0 { queue.replaying.subtract(replayed, ordering: .relaxed) }
            return true
        }
    }
}
