import PolygonWire

/// What `MarketDataHub.subscribe(to:)` hands back: the subscriber's identity and its event stream.
///
/// `Sendable`. The stream is bounded (`.bufferingOldest(MarketDataHub.bufferLimit)`): a subscriber that
/// does not keep up loses the newest events, never anybody else's. Ending the iteration (or dropping
/// the stream) removes the subscriber from the hub.
public struct HubSubscription: Sendable {
    public let id: SubscriberID
    public let events: AsyncStream<MarketEvent>
}
