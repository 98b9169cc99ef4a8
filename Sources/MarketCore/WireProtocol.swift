import NIOCore

/// A vendor's protocol, as the relay speaks it: the one seam between the vendor-neutral relay (hub,
/// upstream client, server, cluster, gap fill, portfolio) and a vendor's wire. Each vendor conforms once,
/// in its own module (`PolygonWire`, `AlpacaWire`), which imports this core and nothing of another
/// vendor's; the composition root names the protocols (its list is the only place that knows them).
///
/// A conformance is a value: a market's protocol may carry that market's choices (Alpaca's feed). It is
/// asked per market or per connection, never per event on the hot path: what a client's turn costs is one
/// call through the seam.
///
/// What a conformance provides (docs/protocols.md lists it with the reasons):
/// - ``name``: the protocol's name in settings, logs and status answers;
/// - ``render(_:)``: a ``Notice`` in the protocol's own words, as an event of its encoding;
/// - ``eventTypes(of:)``: the event types a market's topics have (the cluster's subjects);
/// - ``checkedEvent(_:topic:market:receivedAt:)``: an event that arrived from elsewhere (NATS), checked
///   to be exactly one event of the topic it claims;
/// - ``snapshotless(of:)``: event types whose last value is no snapshot; ``folding(of:limits:)``: those
///   whose state is folded for a late subscriber (order books); ``stateEventTypes``: those conflation
///   may merge; ``barRules(of:)``: how trades make derived bars;
/// - ``priceTopics(of:market:)``, ``heldSymbol(of:market:)`` and ``price(in:)``: how a held symbol is
///   priced from the stream (the portfolio);
/// - ``upstreamSession(key:secret:)``, ``readUpstream(_:receivedAt:market:)``, ``upstreamSendsBinary`` and
///   ``upstreamUpgradeHeader``: the client side of the vendor's stream (the upstream client);
/// - ``servedPaths(of:)``, ``downstreamSession(_:)`` (with its ``DownstreamFraming``), ``lastValueTopic(_:market:)``
///   and ``httpAnswer(_:accept:)``: the server side (downstream clients, the relay's HTTP API).
public protocol WireProtocol: Sendable {
    /// The protocol's name: `polygon`, `alpaca`.
    var name: String { get }

    /// A notice as this protocol's message: an event (``MarketEvent/notice(_:bytes:)``) whose bytes are
    /// encoded as this protocol's events are, so a notice is framed like the events around it.
    func render(_ notice: Notice) -> MarketEvent

    /// The event types the topics of `market` have, as this protocol names them.
    func eventTypes(of market: Market) -> Set<String>

    /// The event types the vendor serves for at most a fixed number of tickers per upstream connection
    /// (Polygon's options `Q` and `FMV`: 1,000 contracts); the server keeps the distinct tickers of
    /// these types under the cap (`--options-contracts`). Empty: no cap.
    func cappedEventTypes(of market: Market) -> Set<String>

    /// An event that arrived from elsewhere (a cluster's NATS subject), checked to be exactly one whole
    /// event of this protocol whose own fields name `topic`.
    func checkedEvent(_ payload: UnsafeRawBufferPointer, topic: Topic, market: Market, receivedAt: UInt64) -> Result<MarketEvent, WireRejection>

    /// Event types whose last event is no snapshot for a new subscriber (one-off events, increments).
    func snapshotless(of market: Market) -> Set<String>

    /// The event types whose topics the hub folds into a state a late subscriber starts from (an order
    /// book from its increments), and how; `nil`: none.
    func folding(of market: Market, limits: FoldLimits) -> TopicFolding?

    /// How `market`'s trades make derived bars (`AM.AAPL@5m`) and how its bar events are written; `nil`:
    /// the market has no derived bars.
    func barRules(of market: Market) -> (any BarRules)?

    /// Event types whose newest value replaces the older (quotes, bars, index values): what conflation
    /// may merge for a slow client. Trades, statuses and increments never are.
    var stateEventTypes: Set<String> { get }

    /// The topics that price a held symbol (a relay ticker such as `AAPL` or `X:BTC-USD`) on `market`:
    /// its trades' and its quotes'.
    func priceTopics(of symbol: String, market: Market) -> PriceTopics

    /// The held symbol an event of `market` prices (the relay's ticker for the event's own symbol).
    func heldSymbol(of event: MarketEvent, market: Market) -> String

    /// The price a trade, quote or index value says; `nil` for any other event.
    func price(in event: MarketEvent) -> PriceReading?

    // MARK: the upstream

    /// A new connection's client session (the login with `key` and, where the vendor has one, `secret`).
    func upstreamSession(key: String, secret: String?) -> any UpstreamSession

    /// One whole server message of `market`'s stream: its events (slices of `message`, no copy) and its
    /// control messages. Pure (no session state): the connection reads off its lock.
    func readUpstream(_ message: ByteBuffer, receivedAt: UInt64, market: Market) throws -> UpstreamReading

    /// Whether the client's messages go as binary frames (Alpaca's MessagePack) rather than text.
    var upstreamSendsBinary: Bool { get }

    /// A header the upstream upgrade request carries (`name:` with its colon, as libwebsockets wants it).
    var upstreamUpgradeHeader: (name: String, value: String)? { get }

    // MARK: downstream

    /// The paths a market's WebSocket is served at (the first is its main one).
    func servedPaths(of market: Market) -> [String]

    /// A new downstream connection's session (its codec chosen from the upgrade's `Content-Type`).
    func downstreamSession(_ context: DownstreamContext) -> any DownstreamSession

    /// A topic as the relay's HTTP API names it (`/v1/last/{market}/{topic}`), in the protocol's form; or
    /// why it is none (answered 400).
    func lastValueTopic(_ topic: Topic, market: Market) -> Result<Topic, WireRejection>

    /// What orders a type's events against each other (gap fill: which recovered events the relay
    /// already had live).
    func recoveryOrder(of eventType: String) -> RecoveryOrder
    /// The value of `order`'s field in `event`, if it has one.
    func orderValue(_ order: RecoveryOrder, of event: MarketEvent) -> Int64?

    /// A topic of `market` as a client writes it, for messages (`Q.AAPL`).
    func exampleTopic(of market: Market) -> String

    /// An event as an HTTP answer's body for the request's `Accept`, its content type, and whether the
    /// answer depends on `Accept` (`Vary`); `nil`: it cannot be written.
    func httpAnswer(_ event: MarketEvent, accept: String?) -> (body: ByteBuffer, contentType: String, negotiated: Bool)?
}

/// Why an event from elsewhere was not taken, for the counter and the log.
public struct WireRejection: Error, Sendable, Equatable, CustomStringConvertible {
    public let reason: String
    public init(_ reason: String) { self.reason = reason }
    public var description: String { reason }
}

extension WireProtocol {
    /// `entitlement` with `market`'s own patterns written as this protocol writes that market's topics
    /// (``lastValueTopic(_:market:)``), so that a topic in this protocol's form can be checked against it
    /// (``Entitlement/inForm(of:_:)``).
    public func entitlement(_ entitlement: Entitlement, inFormOf market: Market) -> Entitlement {
        entitlement.inForm(of: market) { (try? lastValueTopic($0, market: market).get()) ?? $0 }
    }

    /// Whether rights already in this protocol's form (``entitlement(_:inFormOf:)``) allow `topic` on
    /// `market`, the topic taken in that form too (`C.C:EURUSD` as `C.C:EUR-USD`).
    public func allows(_ topic: Topic, on market: Market, by inForm: Entitlement) -> Bool {
        inForm.allows((try? lastValueTopic(topic, market: market).get()) ?? topic, in: market)
    }
}
