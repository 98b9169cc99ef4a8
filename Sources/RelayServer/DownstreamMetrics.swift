import CoreMetrics

/// The downstream side's metrics. `Sendable`; one set per server.
struct DownstreamMetrics: Sendable {
    /// Events written to clients (notices not counted).
    let delivered: Counter
    /// Open downstream WebSocket connections.
    let connections: Gauge
    /// Seconds since the upstream last sent anything (data or pong), set when `/metrics` is read.
    let upstreamLastMessageAge: Gauge

    init(factory: any MetricsFactory) {
        delivered = Counter(label: "relay_events_delivered_total", factory: factory)
        connections = Gauge(label: "relay_downstream_connections", factory: factory)
        upstreamLastMessageAge = Gauge(label: "relay_upstream_last_message_age_seconds", factory: factory)
    }
}
