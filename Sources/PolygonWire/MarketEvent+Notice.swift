import NIOCore

extension MarketEvent {
    /// A status object travelling with events: the relay's notices to its subscribers, written into
    /// their event stream so they arrive in order with the events around them.
    public static func notice(_ status: StatusMessage) -> MarketEvent {
        MarketEvent(eventType: "status", ticker: status.status, bytes: ByteBuffer(string: status.json))
    }
}
