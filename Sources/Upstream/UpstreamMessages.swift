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
            if message != nil { queued.messages.subtract(1, ordering: .relaxed) }
            if case .events(let events) = message { queued.count.subtract(events.count, ordering: .relaxed) }
            return message
        }

        /// The next message, and every message already queued behind it (taken without waiting), in
        /// order; `nil` once the client has stopped. A consumer that falls behind catches up in fewer,
        /// larger steps (one hub publish for several upstream messages).
        public mutating func nextRun(limit: Int = 64) async -> [UpstreamMessage]? {
            guard let first = await next() else { return nil }
            var run = [first]
            // Counted after they were yielded, so these are buffered and `next()` does not wait.
            var behind = Swift.min(queued.messages.load(ordering: .relaxed), limit - 1)
            while behind > 0, let more = await next() {
                run.append(more)
                behind -= 1
            }
            return run
        }
    }
}

/// The count of events (and messages) between the upstream thread and the consumer. `Sendable`
/// through atomics.
final class QueuedEvents: Sendable {
    let count = Atomic<Int>(0)
    let messages = Atomic<Int>(0)
}
