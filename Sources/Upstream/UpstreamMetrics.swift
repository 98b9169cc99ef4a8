import CoreMetrics

/// The upstream client's metrics. `Sendable`; made once per client from its configuration's factory.
struct UpstreamMetrics: Sendable {
    static let stateNames = [
        "idle", "connecting", "authenticating", "authenticated", "disconnected", "auth_failed", "max_connections", "stopped",
    ]

    let states: [String: Gauge]
    let reconnects: [ConnectionEnd.Cause: Counter]
    let messages: Counter
    let events: Counter
    let malformed: Counter
    let oversized: Counter
    let refused: Counter
    let dropped: Counter
    /// Topics asked for anew (unsubscribed and subscribed again) for their whole state: order books.
    let renewed: Counter

    init(factory: any MetricsFactory) {
        var states: [String: Gauge] = [:]
        for name in Self.stateNames {
            states[name] = Gauge(label: "relay_upstream_state", dimensions: [("state", name)], factory: factory)
        }
        self.states = states
        var reconnects: [ConnectionEnd.Cause: Counter] = [:]
        for cause in ConnectionEnd.Cause.allCases {
            reconnects[cause] = Counter(label: "relay_upstream_reconnects_total", dimensions: [("cause", cause.rawValue)], factory: factory)
        }
        self.reconnects = reconnects
        messages = Counter(label: "relay_upstream_messages_total", factory: factory)
        events = Counter(label: "relay_upstream_events_total", factory: factory)
        malformed = Counter(label: "relay_upstream_malformed_messages_total", factory: factory)
        oversized = Counter(label: "relay_upstream_oversized_messages_total", factory: factory)
        dropped = Counter(label: "relay_upstream_dropped_events_total", factory: factory)
        refused = Counter(label: "relay_upstream_refused_events_total", factory: factory)
        renewed = Counter(label: "relay_upstream_renewed_topics_total", factory: factory)
    }

    /// One gauge per state, 1 for the current one.
    func record(_ state: UpstreamState) {
        for (name, gauge) in states { gauge.record(name == state.name ? 1 : 0) }
    }
}

