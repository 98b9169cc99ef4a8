import PolygonWire

/// What `MarketDataHub.subscribe(to:)` hands back: the subscriber's identity and its event stream.
///
/// `Sendable`. The stream is bounded (`.bufferingOldest(MarketDataHub.bufferLimit)`): a subscriber that
/// does not keep up loses the newest events, never anybody else's. Ending the iteration (or dropping
/// the stream) removes the subscriber from the hub. Relay notices (`ev` `status`) travel in the same
/// stream, in order with the events around them.
public struct HubSubscription: Sendable {
    public let id: SubscriberID
    public let events: AsyncStream<MarketEvent>
    let queue: SubscriberQueue

    /// A reader that takes everything queued at once (for coalesced writes). Use either the reader or
    /// `events`, not both; one reader per subscription.
    public func makeReader() -> Reader { Reader(iterator: events.makeAsyncIterator(), queue: queue) }

    /// Whether the hub ended this subscription because it fell too far behind (`disconnect` policy).
    public var wasEvicted: Bool { queue.evicted.load(ordering: .acquiring) }

    /// Takes events in batches: waits for one, then takes whatever else is already queued without
    /// waiting. Not `Sendable`: it belongs to the one task that drains the subscription.
    public struct Reader {
        var iterator: AsyncStream<MarketEvent>.AsyncIterator
        let queue: SubscriberQueue

        /// The next batch, at most `limit` events; `nil` when the subscription has ended.
        public mutating func nextBatch(limit: Int = 4096) async -> [MarketEvent]? {
            guard let first = await iterator.next() else { return nil }
            queue.pending.subtract(1, ordering: .relaxed)
            let queued = min(queue.pending.load(ordering: .acquiring), limit - 1)
            guard queued > 0 else { return [first] }
            var batch = [first]
            batch.reserveCapacity(queued + 1)
            // These are already buffered (the hub counts after enqueueing), so `next()` does not wait.
            for _ in 0..<queued {
                guard let event = await iterator.next() else { break }
                batch.append(event)
            }
            queue.pending.subtract(batch.count - 1, ordering: .relaxed)
            return batch
        }
    }
}
