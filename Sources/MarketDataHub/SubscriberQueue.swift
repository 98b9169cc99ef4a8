import Synchronization

/// The part of a subscriber's state its reader and the hub share without going through the actor.
///
/// `Sendable` through atomics. `pending` counts events the hub has queued and the reader has not taken
/// yet; the hub refuses events beyond its ``HubSubscription/bufferLimit`` of them, which is the subscriber's
/// bound. `batches` counts queued stream elements (``DeliveryBatch``es). Both are raised after events
/// are enqueued (`pending` under the batch's lock when they join a queued one) and lowered after they
/// are taken, so they never exceed what is buffered, and a reader that takes `batches` more elements
/// never waits.
/// `evicted` tells the reader the hub ended its stream because it fell behind (`disconnect` policy);
/// `finished`, that the hub ended it at all (set after `finish()`).
final class SubscriberQueue: Sendable {
    let pending = Atomic<Int>(0)
    /// Events queued outside the bound (a resume's replay, a gap fill's recovered events, notices) and
    /// not taken yet: a new resume may replay only what keeps this within
    /// ``HistoryLimits/eventsPerResume``.
    let replaying = Atomic<Int>(0)
    /// Events queued outside the bound since the subscriber joined, in all (lowered only for what a
    /// yield that did not enqueue, or a park, withdrew): a reader that counts what it wrote of them
    /// knows when a replay queued by then has gone out whole.
    let replayedQueued = Atomic<Int>(0)
    let batches = Atomic<Int>(0)
    let evicted = Atomic<Bool>(false)
    let finished = Atomic<Bool>(false)
    /// Its bound in events (set by the hub; read by its reader to say it in an eviction).
    let limit: Atomic<Int>

    init(limit: Int) {
        self.limit = Atomic(limit)
    }

    /// `count` events were queued outside the bound (a live delivery: none).
    func queuedOutsideBound(_ count: Int) {
        guard count > 0 else { return }
        replaying.add(count, ordering: .relaxed)
        replayedQueued.add(count, ordering: .relaxed)
    }
}
