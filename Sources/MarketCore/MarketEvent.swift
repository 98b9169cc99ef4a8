import NIOCore

/// One market event as Polygon sent it: its type, its ticker, and its original bytes.
///
/// Value type, `Sendable`. `bytes` is a slice of the frame it arrived in (no copy); the relay forwards
/// exactly these bytes, so unknown fields and number formats survive unchanged.
public struct MarketEvent: Sendable {
    /// The `ev` field, e.g. `Q`.
    public let eventType: String
    /// The ticker from the field this event type routes by, e.g. `AAPL`.
    public let ticker: String
    /// The event object's original JSON bytes, `{` to `}`.
    public let bytes: ByteBuffer
    /// When the relay received it (`MonotonicClock` nanoseconds; 0 when unknown), for delivery latency.
    public let receivedAt: UInt64
    /// Its place in its market's arrival order (``EventPosition/market``), once the hub gave it one; 0
    /// before (and for notices).
    public let sequence: UInt64

    public init(eventType: String, ticker: String, bytes: ByteBuffer, receivedAt: UInt64 = 0, sequence: UInt64 = 0) {
        self.eventType = eventType
        self.ticker = ticker
        self.bytes = bytes
        self.receivedAt = receivedAt
        self.sequence = sequence
    }

    /// The same event without a market sequence (its bytes keep their `_s` and `_m`): one of another
    /// epoch, which names no position of this one.
    public func withoutSequence() -> MarketEvent {
        MarketEvent(eventType: eventType, ticker: ticker, bytes: bytes, receivedAt: receivedAt)
    }

    /// The topic this event is delivered on, e.g. `Q.AAPL`. Only looked up (an event whose ticker no
    /// subscription can have matches nobody); never sent upstream.
    public var topic: Topic { Topic(checkedEventType: eventType, ticker: ticker) }

    /// The event's JSON text (for logs, tests and HTTP answers; not for the hot path).
    public var json: String { String(buffer: bytes) }

    /// The same event with bytes of its own, not a slice of the message it arrived in: kept for long
    /// (a last value) or queued behind a slow client, it holds its own bytes and little more. An event
    /// whose storage is less than twice its bytes is kept as it is: that is an event with bytes of its
    /// own already (a buffer's capacity is rounded up to a power of two) or the most of its message, and
    /// copying it again would only cost (a news item of megabytes once per symbol).
    public func compacted() -> MarketEvent {
        guard bytes.storageCapacity >= 2 * bytes.readableBytes else { return self }
        return MarketEvent(eventType: eventType, ticker: ticker, bytes: ByteBuffer(buffer: bytes), receivedAt: receivedAt, sequence: sequence)
    }

    /// The events, each with bytes of its own (``compacted()``); events that are the same slice (a news
    /// item routed by several symbols) share one copy, as they shared the slice.
    public static func compacted(_ events: [MarketEvent]) -> [MarketEvent] {
        var out: [MarketEvent] = []
        out.reserveCapacity(events.count)
        // The last slice copied, by address and length (compared only, never read through), and its copy.
        var last: (address: UnsafeRawPointer?, count: Int) = (nil, 0)
        var copy: ByteBuffer?
        for event in events {
            let slice = event.bytes.withUnsafeReadableBytes { (address: $0.baseAddress.map(UnsafeRawPointer.init), count: $0.count) }
            if let copy, slice.address != nil, slice.address == last.address, slice.count == last.count {
                out.append(MarketEvent(eventType: event.eventType, ticker: event.ticker, bytes: copy, receivedAt: event.receivedAt, sequence: event.sequence))
                continue
            }
            let compacted = event.compacted()
            out.append(compacted)
            last = slice
            copy = compacted.bytes
        }
        return out
    }

    /// Whether this is a relay notice rather than market data.
    public var isNotice: Bool { eventType == "status" }
}
