import NIOCore

/// Something the relay tells a subscriber in its event stream, in no vendor's words: that it lost
/// events, that the upstream went and came back, what a resume replayed, where a gap is. Each
/// ``WireProtocol`` renders it as its own kind of message (``WireProtocol/render(_:)``), once, when the
/// hub makes it; it then travels among the events it belongs between.
///
/// Value type, `Sendable`.
public struct Notice: Sendable, Equatable {
    /// What happened. The raw values are the relay's documented status names.
    public enum Kind: String, Sendable, CaseIterable {
        /// This connection fell behind and lost events (`dropped` says how many).
        case lagging
        /// The upstream connection was lost; events stop until it is back.
        case upstreamDisconnected = "upstream_disconnected"
        /// The upstream is back; the details name the window with no events.
        case upstreamReconnected = "upstream_reconnected"
        /// A resume's missed events were all sent: live events follow.
        case resumed
        /// A topic's missed events are not all held (or the epoch changed).
        case gap
        /// Gap fill's events of an outage were sent (each flagged as recovered).
        case recovered
        /// The market's positions start again under a new epoch.
        case epoch
        /// The upstream refused topics (its `code` says why, in its own numbering).
        case refused
        /// The market's events are a recorded day replayed, not live: at the replay's start (what day,
        /// what window, what speed) and at its end (`state` `started` or `ended`).
        case replay
    }

    /// A detail's value: what the relay's notices carry, in shapes every protocol can write.
    public indirect enum Value: Sendable, Equatable {
        case number(Int64)
        case text(String)
        case flag(Bool)
        case list([Value])
        /// Named values in the order given.
        case object([Detail])
    }

    /// One named value.
    public struct Detail: Sendable, Equatable {
        public let key: String
        public let value: Value

        public init(_ key: String, _ value: Value) {
            self.key = key
            self.value = value
        }
    }

    public var kind: Kind
    /// The sentence a person reads.
    public var message: String
    /// Named values beside the message (times, counts, topics).
    public var details: [String: Value]

    public init(_ kind: Kind, message: String, details: [String: Value] = [:]) {
        self.kind = kind
        self.message = message
        self.details = details
    }

    /// The details in the order every rendering writes them: the numbers by key, then the rest by key.
    public var orderedDetails: [Detail] {
        let sorted = details.sorted { $0.key < $1.key }.map { Detail($0.key, $0.value) }
        return sorted.filter { if case .number = $0.value { true } else { false } }
            + sorted.filter { if case .number = $0.value { false } else { true } }
    }

    /// Counts per topic as an object (topics in order).
    public static func counts(_ counts: [Topic: Int]) -> Value {
        .object(counts.sorted { $0.key < $1.key }.map { Detail($0.key.description, .number(Int64($0.value))) })
    }

    /// Topics as a list of their names, in order.
    public static func topics(_ topics: [Topic]) -> Value {
        .list(topics.sorted().map { .text($0.description) })
    }
}

extension MarketEvent {
    /// The event type every rendered notice has: what tells notices from market data in a stream.
    public static let noticeType = "status"

    /// A rendered notice as an event: `bytes` in its protocol's own encoding, its kind as the ticker.
    public static func notice(_ kind: Notice.Kind, bytes: ByteBuffer) -> MarketEvent {
        MarketEvent(eventType: noticeType, ticker: kind.rawValue, bytes: bytes)
    }

    /// The kind of a rendered notice; `nil` for market data.
    public var noticeKind: Notice.Kind? { isNotice ? Notice.Kind(rawValue: ticker) : nil }
}
