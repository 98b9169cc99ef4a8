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

/// Lets a repeating warning through once per interval, counting what it held back.
struct LogThrottle: Sendable {
    private var lastLogged: [String: ContinuousClock.Instant] = [:]
    private var suppressed: [String: Int] = [:]

    /// Whether to log `key` now, and how many occurrences were held back since it last was.
    mutating func admit(_ key: String, every interval: Duration, now: ContinuousClock.Instant = .now) -> (log: Bool, suppressed: Int) {
        if let last = lastLogged[key], now - last < interval {
            suppressed[key, default: 0] += 1
            return (false, 0)
        }
        lastLogged[key] = now
        let held = suppressed.removeValue(forKey: key) ?? 0
        return (true, held)
    }
}
