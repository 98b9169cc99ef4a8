import CoreMetrics

/// The downstream side's metrics. `Sendable`; one set per server.
struct DownstreamMetrics: Sendable {
    /// Open downstream WebSocket connections.
    let connections: Gauge
    /// The deliveries and latencies of every market, readable (for `/v1/status`).
    let tally = DeliveryTally()

    init(factory: any MetricsFactory) {
        connections = Gauge(label: "relay_downstream_connections", factory: factory)
    }
}

/// One market's deliveries to its clients, each metric with the market's label. `Sendable`; one set per
/// market, held by each of its clients' ``ClientFeed``.
struct DeliveryMetrics: Sendable {
    /// Events written to clients (notices not counted).
    let delivered: Counter
    /// Frames written to clients (each carries everything that was queued for that client).
    let writes: Counter
    /// From the upstream message arriving to its frame written downstream, per write (oldest event).
    let deliveryLatency: Timer

    init(market: String, factory: any MetricsFactory) {
        let dimensions = [("market", market)]
        delivered = Counter(label: "relay_events_delivered_total", dimensions: dimensions, factory: factory)
        writes = Counter(label: "relay_downstream_writes_total", dimensions: dimensions, factory: factory)
        deliveryLatency = Timer(label: "relay_delivery_latency_seconds", dimensions: dimensions, factory: factory)
    }
}
