/// What one downstream connection may ask for, so no client can grow the relay's state, its upstream
/// subscriptions or its work without bound. Value type, `Sendable`. Every limit is answered with an
/// `error` status naming it; the connection goes on.
public struct SessionLimits: Sendable, Equatable {
    /// Topics in one subscribe or unsubscribe message; a longer message changes nothing.
    public var topicsPerMessage: Int
    /// Topics one connection may hold; subscriptions past it are refused.
    public var topicsPerConnection: Int
    /// Client messages per second, sustained; more are answered and dropped.
    public var messagesPerSecond: Int
    /// Messages allowed at once before the rate applies (a client that subscribes symbol by symbol at
    /// start, as Go's client does per `Subscribe` call, sends hundreds in a burst).
    public var messageBurst: Int
    /// Longest ticker accepted.
    public var maxTickerLength: Int
    /// The event types the connection's market has in its protocol (`nil`: any); a topic of another
    /// type is refused. Set by the protocol's downstream session (`WireProtocol.eventTypes(of:)`).
    public var eventTypes: Set<String>?

    public init(
        topicsPerMessage: Int = 1_000, topicsPerConnection: Int = 10_000, messagesPerSecond: Int = 50, messageBurst: Int = 1_000,
        maxTickerLength: Int = 40, eventTypes: Set<String>? = nil
    ) {
        self.messageBurst = messageBurst
        self.topicsPerMessage = topicsPerMessage
        self.topicsPerConnection = topicsPerConnection
        self.messagesPerSecond = messagesPerSecond
        self.maxTickerLength = maxTickerLength
        self.eventTypes = eventTypes
    }

    /// The largest message read: room for a subscribe of ``topicsPerMessage`` topics, each with its
    /// resume position (128 bytes a topic, at least 64 KiB). A larger one is answered with an `error`
    /// unread, not parsed whole (on the connection's event loop) for a change it could not make.
    public var messageBytes: Int { Swift.max(64 << 10, topicsPerMessage * 128) }

    /// The `error` a message of `bytes` past ``messageBytes`` is answered with.
    public func tooLarge(_ bytes: Int) -> String {
        "too many topics, or too much else, in one message: \(bytes) bytes (at most \(messageBytes), room for \(topicsPerMessage) topics with their positions); nothing was changed"
    }

    /// Why a topic is refused, or `nil` when it is fine.
    public func problem(with topic: Topic) -> String? {
        if let eventTypes, !eventTypes.contains(topic.eventType) {
            return "unknown event type \(topic.eventType) (this market has \(eventTypes.sorted().joined(separator: ", ")))"
        }
        if topic.isWildcard { return nil }
        if topic.ticker.utf8.count > maxTickerLength { return "ticker longer than \(maxTickerLength) characters" }
        return Topic.isTicker(topic.ticker) ? nil : "a ticker has letters, digits and . : / - _ only, a letter or digit among them (and @ before a derived bar's size)"
    }
}

/// A client's message rate: a token bucket of `messageBurst` tokens refilled at `messagesPerSecond`,
/// and when the client was last told it went past it (at most once a second). Value type, `Sendable`.
public struct MessageRate: Sendable {
    private let perSecond: Double
    private let burst: Double
    private var tokens: Double
    private var filledAt: ContinuousClock.Instant?
    private var toldAt: ContinuousClock.Instant?

    public init(_ limits: SessionLimits) {
        self.init(perSecond: limits.messagesPerSecond, burst: limits.messageBurst)
    }

    /// `burst` tokens (at least one) refilled at `perSecond`.
    public init(perSecond: Int, burst: Int) {
        self.perSecond = Double(perSecond)
        self.burst = Double(max(burst, 1))
        tokens = self.burst
    }

    /// Takes a token for a message arriving at `now`; `false` when there is none.
    public mutating func admit(at now: ContinuousClock.Instant) -> Bool {
        if let filledAt {
            let elapsed = now - filledAt
            tokens = min(burst, tokens + perSecond * (Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) / 1e18))
        }
        filledAt = now
        guard tokens >= 1 else { return false }
        tokens -= 1
        return true
    }

    /// Takes `tokens` more for a message already admitted that costs more than one (a large reply): the
    /// next messages wait for them, at most a burst's worth of time.
    public mutating func charge(_ tokens: Double) {
        self.tokens = max(self.tokens - tokens, -burst)
    }

    /// Whether a refused message is to be answered: the first in any second is, the rest are not.
    public mutating func tellsRefusal(at now: ContinuousClock.Instant) -> Bool {
        if let toldAt, now - toldAt < .seconds(1) { return false }
        toldAt = now
        return true
    }
}
