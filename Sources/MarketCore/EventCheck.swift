/// What the relay takes as one event of a market when it did not read it from its upstream itself this
/// run (a message from NATS, a record of a tape): exactly one event of the market's protocol whose own
/// fields name its topic (``WireProtocol/checkedEvent(_:topic:market:receivedAt:)``), of a type the
/// market has, under a ticker that is no wildcard, within the size bounds (``EventBounds``; a type the
/// hub folds, whose whole state the vendor sends at once, within `maxFoldedBytes`), with plausible
/// positions written in it, if any. (A derived bar's `@` is allowed: the relay's own bars are
/// recorded and go from a leader to its nodes.) Whoever can write to NATS or to
/// a tape's folder could else put other messages into every client's frames (an event's bytes go out
/// as they are), or keep in the hub, as a topic's last value and in its history, what nobody bounded.
///
/// Value type, `Sendable`: one per market and source.
public struct EventCheck: Sendable {
    public let market: Market
    public let wire: any WireProtocol
    public let bounds: EventBounds
    public let maxFoldedBytes: Int
    /// The types a larger event may be of (none unless `maxFoldedBytes` is past `maxBytes`).
    private let foldedTypes: Set<String>
    /// The market's event types.
    private let eventTypes: Set<String>

    public init(market: Market, wire: any WireProtocol, maxBytes: Int, maxFoldedBytes: Int? = nil) {
        self.market = market
        self.wire = wire
        bounds = EventBounds(maxBytes: maxBytes)
        self.maxFoldedBytes = Swift.max(maxBytes, maxFoldedBytes ?? maxBytes)
        foldedTypes = self.maxFoldedBytes > maxBytes ? wire.folding(of: market, limits: FoldLimits())?.eventTypes ?? [] : []
        eventTypes = wire.eventTypes(of: market)
    }

    /// The event `payload` is, as an event of `topic`, or why it is none the relay takes.
    public func event(_ payload: UnsafeRawBufferPointer, topic: Topic, receivedAt: UInt64 = 0) -> Result<MarketEvent, WireRejection> {
        let limit = payload.count > bounds.maxBytes && foldedTypes.contains(topic.eventType) ? maxFoldedBytes : bounds.maxBytes
        if let problem = bounds.problem(bytes: payload.count, ticker: topic.ticker, maxBytes: limit) { return .failure(WireRejection(problem)) }
        guard eventTypes.contains(topic.eventType) else {
            return .failure(WireRejection("an event of type \"\(topic.eventType.prefix(16))\", which the market does not have"))
        }
        guard !topic.ticker.utf8.contains(UInt8(ascii: "*")) else { return .failure(WireRejection("a ticker with *, which names a wildcard")) }
        switch wire.checkedEvent(payload, topic: topic, market: market, receivedAt: receivedAt) {
        case .success(let event):
            // No arithmetic is done on a position that could overflow (0, or past the largest).
            if let position = EventPosition.readWritten(from: event.bytes), !position.isPlausible {
                return .failure(WireRejection("implausible position _s \(position.topic), _m \(position.market) (1 through \(EventPosition.maxSequence))"))
            }
            return .success(event)
        case .failure(let rejection):
            return .failure(rejection)
        }
    }

    /// Why the event of type `eventType` under `ticker` whose bytes are `bytes` is none the relay takes
    /// (``event(_:topic:receivedAt:)``), or `nil`.
    public func problem(eventType: String, ticker: String, bytes: UnsafeRawBufferPointer) -> String? {
        guard let topic = Topic(eventType: eventType, ticker: ticker) else { return "an event of no topic" }
        if case .failure(let rejection) = event(bytes, topic: topic) { return "\(rejection) (\(topic))" }
        return nil
    }
}
