import PolygonWire
import Synchronization

/// The upstream client's messages in wire order, with the events in them counted while they wait for
/// their consumer: the queue between the upstream thread and the hub is bounded by
/// ``UpstreamConfiguration/maxQueuedEvents``. A message that would pass the bound is dropped, counted,
/// and announced to the consumer ahead of the next message that fits (``UpstreamMessage/lost(count:topics:)``).
///
/// `Sendable`; one consumer. An event counts as queued from the upstream thread's `yield` until the
/// consumer takes the message that holds it.
public struct UpstreamMessages: AsyncSequence, Sendable {
    public typealias Element = UpstreamMessage
    public typealias Failure = Never

    let stream: AsyncStream<UpstreamMessage>
    let queued: QueuedEvents

    public func makeAsyncIterator() -> Iterator { Iterator(base: stream.makeAsyncIterator(), queued: queued) }

    public struct Iterator: AsyncIteratorProtocol {
        var base: AsyncStream<UpstreamMessage>.AsyncIterator
        let queued: QueuedEvents

        public mutating func next() async -> UpstreamMessage? {
            await next(isolation: nil)
        }

        public mutating func next(isolation actor: isolated (any Actor)?) async -> UpstreamMessage? {
            let message = await base.next(isolation: actor)
            if case .events(let events) = message { queued.count.subtract(events.count, ordering: .relaxed) }
            return message
        }
    }
}

/// The count of events between the upstream thread and the consumer. `Sendable` through an atomic.
final class QueuedEvents: Sendable {
    let count = Atomic<Int>(0)
}
