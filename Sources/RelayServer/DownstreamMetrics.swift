import CoreMetrics

/// The downstream side's metrics. `Sendable`; one set per server.
struct DownstreamMetrics: Sendable {
    /// Events written to clients (notices not counted).
    let delivered: Counter
    /// Open downstream WebSocket connections.
    let connections: Gauge
    /// Frames written to clients (each carries everything that was queued for that client).
    let writes: Counter
    /// From the upstream message arriving to its frame written downstream, per write (oldest event).
    let deliveryLatency: Timer
    /// The same deliveries and latencies, readable (for `/v1/status`).
    let tally = DeliveryTally()

    init(factory: any MetricsFactory) {
        delivered = Counter(label: "relay_events_delivered_total", factory: factory)
        connections = Gauge(label: "relay_downstream_connections", factory: factory)
        writes = Counter(label: "relay_downstream_writes_total", factory: factory)
        deliveryLatency = Timer(label: "relay_delivery_latency_seconds", factory: factory)
    }
}
