import CoreMetrics

/// The downstream side's metrics. `Sendable`; one set per server.
struct DownstreamMetrics: Sendable {
    /// Events written to clients (notices not counted).
    let delivered: Counter
    /// Open downstream WebSocket connections.
    let connections: Gauge
    /// Seconds since the upstream last sent anything (data or pong), set when `/metrics` is read.
    let upstreamLastMessageAge: Gauge
    /// Frames written to clients (each carries everything that was queued for that client).
    let writes: Counter
    /// From the upstream message arriving to its frame written downstream, per write (oldest event).
    let deliveryLatency: Timer
    /// The fullest subscriber buffer (events), set when `/metrics` is read.
    let maxBufferFill: Gauge
    /// The same deliveries and latencies, readable (for `/v1/status`).
    let tally = DeliveryTally()

    init(factory: any MetricsFactory) {
        delivered = Counter(label: "relay_events_delivered_total", factory: factory)
        connections = Gauge(label: "relay_downstream_connections", factory: factory)
        upstreamLastMessageAge = Gauge(label: "relay_upstream_last_message_age_seconds", factory: factory)
        writes = Counter(label: "relay_downstream_writes_total", factory: factory)
        deliveryLatency = Timer(label: "relay_delivery_latency_seconds", factory: factory)
        maxBufferFill = Gauge(label: "relay_subscriber_buffer_max_fill", factory: factory)
    }
}
