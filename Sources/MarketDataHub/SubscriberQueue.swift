import Synchronization

/// The part of a subscriber's state its reader and the hub share without going through the actor.
///
/// `Sendable` through atomics: `pending` counts events the hub enqueued and the reader has not taken yet
/// (incremented after each enqueue, decremented after each take, so it never exceeds what is buffered);
/// `evicted` tells the reader the hub ended its stream because it fell behind (the `disconnect` policy).
final class SubscriberQueue: Sendable {
    let pending = Atomic<Int>(0)
    let evicted = Atomic<Bool>(false)
}
