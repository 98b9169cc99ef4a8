import MarketDataHub
import Metrics
import MarketCore

/// One market the server serves at its own paths (`/crypto`, `/v2/iex`): the market, its hub, and its
/// feed's health; the protocol its clients speak is its hub's (``MarketDataHub/wire``). Value type,
/// `Sendable`. Each market's clients reach only its hub, so no event crosses markets.
package struct ServedMarket: Sendable {
    package let market: Market
    package let hub: MarketDataHub
    package let feed: any FeedStatus
    /// Its recording on the tape, when it is recorded.
    package let tape: (@Sendable () -> TapeReport)?
    /// Unread bytes a client of this market may have on top of the server's limit
    /// (``RelayServerConfiguration/ConnectionLimits/outboundBytes``): room for a market whose events can
    /// be larger than the limit (news items of megabytes). 0: none.
    package let unreadRoom: Int

    package init(market: Market, hub: MarketDataHub, feed: any FeedStatus, tape: (@Sendable () -> TapeReport)? = nil, unreadRoom: Int = 0) {
        self.market = market
        self.hub = hub
        self.feed = feed
        self.tape = tape
        self.unreadRoom = unreadRoom
    }

    /// The protocol its clients speak.
    var wire: any WireProtocol { hub.wire }

    /// Whose protocol it speaks (a label of `/healthz` and the metrics).
    var vendor: String { wire.name }

    /// The paths its WebSocket is served at.
    var paths: [String] { wire.servedPaths(of: market) }
}

/// What the server keeps per market: the served market, its topic ledger (with the market's ticker cap)
/// and its gauges. `Sendable`.
struct MarketRoute: Sendable {
    let served: ServedMarket
    let ledger: TopicLedger
    let limits: SessionLimits
    /// Broken tagged sessions waiting for their reconnect.
    let shelf: SessionShelf
    /// Seconds since the market's upstream last sent anything (data or pong), set when `/metrics` is read.
    let upstreamLastMessageAge: Gauge
    /// The market's fullest subscriber buffer (events), set when `/metrics` is read.
    let maxBufferFill: Gauge
    /// What its clients are delivered (labelled with the market).
    let delivery: DeliveryMetrics

    var market: Market { served.market }
    var hub: MarketDataHub { served.hub }
    var feed: any FeedStatus { served.feed }

    init(_ served: ServedMarket, configuration: RelayServerConfiguration, factory: any MetricsFactory) {
        self.served = served
        delivery = DeliveryMetrics(market: served.market.rawValue, factory: factory)
        let limits = configuration.connectionLimits
        let capped = served.wire.cappedEventTypes(of: served.market)
        ledger = TopicLedger(
            perKey: limits.topicsPerKey, total: limits.topics, subscriptionsPerKey: limits.subscriptionsPerKey, subscriptions: limits.subscriptions,
            cap: capped.isEmpty
                ? nil
                : .init(
                    eventTypes: capped, tickers: configuration.cappedTickers, market: served.market,
                    vendor: served.wire.name.prefix(1).uppercased() + served.wire.name.dropFirst()))
        self.limits = configuration.limits
        let hub = served.hub
        let ledger = self.ledger
        shelf = SessionShelf(
            settings: configuration.resume,
            expiredCounter: Counter(label: "relay_resumes_total", dimensions: [("result", "expired"), ("market", served.market.rawValue)], factory: factory)
        ) { released in
            ledger.release(Array(released.session.topics), for: SessionShelf.key(of: released.name))
            if let parked = released.session.parked { Task { await hub.remove(parked) } }
        }
        let dimensions = [("market", served.market.rawValue)]
        // The Prometheus convention for what describes a series: an info gauge to join on.
        Gauge(label: "relay_market_info", dimensions: dimensions + [("vendor", served.vendor)], factory: factory).record(1)
        upstreamLastMessageAge = Gauge(label: "relay_upstream_last_message_age_seconds", dimensions: dimensions, factory: factory)
        maxBufferFill = Gauge(label: "relay_subscriber_buffer_max_fill", dimensions: dimensions, factory: factory)
    }
}
