import MarketCore
import NIOCore
import Synchronization

/// The last answer a live route rendered from each held event: asked again while its topic's held event
/// is the same one (the same bytes), the route is answered with what it rendered before instead of
/// reading the event's members and writing its vendor shape again. Clients that poll (100 of them asking
/// the same 100 tickers once a second) ask many times per change of a value.
///
/// Bounded: past `capacity` entries it starts afresh (the routes and topics asked are few; a key asking
/// for thousands of tickers only makes more misses). Each entry holds the held event's bytes (the hub's
/// own compacted copy, shared) and the answer. `Sendable`: a `Mutex`.
public final class LiveAnswerMemo<Answer: Sendable>: Sendable {
    private struct Key: Hashable {
        let route: String
        let market: Market
        let topic: Topic
    }

    private let entries = Mutex<[Key: (event: ByteBuffer, answer: Answer)]>([:])
    private let capacity: Int

    public init(capacity: Int = 8192) {
        self.capacity = capacity
    }

    /// `route`'s answer for `event`, the held event of `topic`: the one rendered before when `event` is
    /// the one it was rendered from, else `render()`'s (kept, unless `nil`).
    public func answer(_ route: String, market: Market, topic: Topic, event: MarketEvent, render: () -> Answer?) -> Answer? {
        let key = Key(route: route, market: market, topic: topic)
        if let kept = entries.withLock({ $0[key] }), kept.event == event.bytes { return kept.answer }
        guard let answer = render() else { return nil }
        entries.withLock { entries in
            if entries.count >= capacity, entries[key] == nil { entries.removeAll(keepingCapacity: true) }
            entries[key] = (event.bytes, answer)
        }
        return answer
    }

    /// How many answers are kept.
    public var count: Int { entries.withLock { $0.count } }
}
