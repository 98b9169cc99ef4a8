import PolygonWire

/// What the upstream client delivers, in the order it happened on the wire: events, and the moments
/// the connection was lost and (re)authenticated, so a consumer can tell events before a gap from
/// events after it. Value type, `Sendable`.
public enum UpstreamMessage: Sendable {
    /// One upstream message's events.
    case events([MarketEvent])
    /// `auth_success`: events for the wanted topics follow.
    case authenticated
    /// The connection ended (not by shutdown); a reconnect follows.
    case connectionLost(reason: String)
    /// Events dropped because the queue to the consumer was full (`topics` is `nil` when too many
    /// different ones were lost to list). Comes before the next message that was kept.
    case lost(count: Int, topics: Set<Topic>?)

    /// The events, if this is `.events`.
    public var events: [MarketEvent]? {
        if case .events(let events) = self { return events }
        return nil
    }
}
