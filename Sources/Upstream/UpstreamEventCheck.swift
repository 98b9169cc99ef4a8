import MarketCore

/// What the relay takes from its upstream, event by event, beside the message's own checks: an event
/// of a type the market has, under a ticker no longer than a client could name, of at most
/// ``UpstreamConfiguration/maxEventBytes``. The same bounds as an event from NATS has
/// (`ClusterChecks`): past them the hub would keep, as a topic's last value and in its history, what
/// nobody bounded in bytes, and a type it has never seen would open a history line for good. A type
/// the hub folds (an order book, whose whole state the vendor sends at once) may take a whole message:
/// the fold keeps its own bound of levels. What fails is dropped and counted, never a crash. Value
/// type; one per connection.
struct UpstreamEventCheck: Sendable {
    let bounds: EventBounds
    let maxFoldedBytes: Int
    let eventTypes: Set<String>
    let foldedTypes: Set<String>

    init(market: Market, wire: any WireProtocol, maxBytes: Int, maxFoldedBytes: Int) {
        bounds = EventBounds(maxBytes: maxBytes)
        self.maxFoldedBytes = Swift.max(maxBytes, maxFoldedBytes)
        eventTypes = wire.eventTypes(of: market)
        foldedTypes = wire.folding(of: market, limits: FoldLimits())?.eventTypes ?? []
    }

    /// Why a ticker the upstream names is none the relay takes (``Topic/namesRelayTopic(_:)``): the
    /// wildcard's `*` (its events would be the `T.*` topic's own), or a derived bar's `@` (they would
    /// reach the holders of the relay's own bars as if it had built them). `nil`: none.
    static func problem(ticker: String) -> String? {
        Topic.namesRelayTopic(ticker) ? "a ticker with * or @, which names the relay's own topics" : nil
    }

    /// The events that pass, and what the first one that did not was (`nil`: all passed, and `events`
    /// comes back as it was, not copied).
    func passing(_ events: [MarketEvent]) -> (events: [MarketEvent], refused: Int, first: String?) {
        // A message's events are mostly of one type: its set lookup is made once per run of them.
        var checkedType: String?
        var kept: [MarketEvent]?
        var first: String?
        for (index, event) in events.enumerated() {
            let bytes = event.bytes.readableBytes
            let limit = bytes > bounds.maxBytes && foldedTypes.contains(event.eventType) ? maxFoldedBytes : bounds.maxBytes
            var problem = bounds.problem(bytes: bytes, ticker: event.ticker, maxBytes: limit) ?? Self.problem(ticker: event.ticker)
            if problem == nil, event.eventType != checkedType {
                if eventTypes.contains(event.eventType) {
                    checkedType = event.eventType
                } else {
                    problem = "an event of type \"\(event.eventType.prefix(16))\", which the market does not have"
                }
            }
            if let problem {
                if kept == nil { kept = Array(events[..<index]) }
                if first == nil { first = problem }
            } else {
                kept?.append(event)
            }
        }
        guard let kept else { return (events, 0, nil) }
        return (kept, events.count - kept.count, first)
    }
}
