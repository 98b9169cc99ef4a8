import NIOCore
import PolygonWire

/// One element of a subscriber's stream: its share of one published message, or a few events of its own
/// (a notice, a snapshot on subscribe).
///
/// `Sendable`, small, and allocation-free on the hot path: the events of a publish are held once, by a
/// shared ``PublishedEvents``, and each subscriber's element names its events in it with a bit mask over
/// a window of up to 64 of them. A publish thus costs one retain per subscriber instead of a copy of
/// every matching event into an array of its own.
public struct HubDelivery: Sendable {
    @usableFromInline
    enum Content: Sendable {
        /// The events of `published.events[base ..< base + 64]` whose bits are set in `mask`.
        case selected(PublishedEvents, base: Int, mask: UInt64)
        case events([MarketEvent])
    }

    @usableFromInline let content: Content

    init(_ published: PublishedEvents, base: Int, mask: UInt64) {
        content = .selected(published, base: base, mask: mask)
    }

    init(_ events: [MarketEvent]) {
        content = .events(events)
    }

    /// How many events it carries (notices included).
    public var count: Int {
        switch content {
        case .selected(_, _, let mask): mask.nonzeroBitCount
        case .events(let events): events.count
        }
    }

    /// How many market events it carries (notices not counted).
    public var marketEventCount: Int {
        switch content {
        case .selected(_, _, let mask): mask.nonzeroBitCount
        case .events(let events): events.reduce(0) { $0 + ($1.isNotice ? 0 : 1) }
        }
    }

    /// The payload bytes its events take in a frame: each event's bytes and one separator.
    public var framedBytes: Int {
        var size = 0
        forEachEvent { size += $0.bytes.readableBytes + 1 }
        return size
    }

    /// Appends its events, in order, to a frame being built.
    public func write(into builder: inout WireFrameBuilder) {
        forEachEvent { builder.append($0) }
    }

    /// Appends its events, in order, to an array.
    public func append(to array: inout [MarketEvent]) {
        forEachEvent { array.append(copy $0) }
    }

    /// Calls `body` with each of its events, in order, lent where the hub holds them (no copy).
    private func forEachEvent(_ body: (borrowing MarketEvent) -> Void) {
        switch content {
        case .selected(let published, let base, var mask):
            published.events.withUnsafeBufferPointer { events in
                while mask != 0 {
                    body(events[base + mask.trailingZeroBitCount])
                    mask &= mask &- 1
                }
            }
        case .events(let events):
            events.withUnsafeBufferPointer { events in
                for index in events.indices { body(events[index]) }
            }
        }
    }

    /// The first `count` of its events (what fits a subscriber's remaining room).
    func prefix(_ count: Int) -> HubDelivery {
        switch content {
        case .selected(let published, let base, var mask):
            var kept: UInt64 = 0
            for _ in 0..<max(count, 0) where mask != 0 {
                let lowest = mask & (~mask &+ 1)
                kept |= lowest
                mask &= ~lowest
            }
            return HubDelivery(published, base: base, mask: kept)
        case .events(let events):
            return HubDelivery(Array(events.prefix(max(count, 0))))
        }
    }
}

/// The events of one publish, shared by every subscriber's ``HubDelivery`` of it. Immutable.
@usableFromInline
final class PublishedEvents: Sendable {
    @usableFromInline let events: [MarketEvent]

    init(_ events: [MarketEvent]) {
        self.events = events
    }
}
