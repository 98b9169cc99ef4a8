import CoreMetrics

/// The cluster's figures on `/metrics`. `Sendable` (swift-metrics handlers are).
final class ClusterMetrics: Sendable {
    /// 1 while this node holds the upstream lease, else 0.
    let leader: Gauge
    let renewed: Counter
    let renewFailed: Counter
    /// Times this node saw the leader change (a takeover, its own included).
    let failovers: Counter
    let natsIn: Counter
    let natsOut: Counter
    private let factory: any MetricsFactory

    init(factory: any MetricsFactory) {
        self.factory = factory
        leader = Gauge(label: "relay_cluster_leader", factory: factory)
        renewed = Counter(label: "relay_cluster_lease_renewals_total", dimensions: [("result", "ok")], factory: factory)
        renewFailed = Counter(label: "relay_cluster_lease_renewals_total", dimensions: [("result", "failed")], factory: factory)
        failovers = Counter(label: "relay_cluster_failovers_total", factory: factory)
        natsIn = Counter(label: "relay_cluster_nats_messages_total", dimensions: [("direction", "in")], factory: factory)
        natsOut = Counter(label: "relay_cluster_nats_messages_total", dimensions: [("direction", "out")], factory: factory)
    }

    /// Events lost between NATS and this node's hub, by reason (`slow_consumer`, `node_queue_full`).
    func natsDropped(reason: String) -> Counter {
        Counter(label: "relay_cluster_nats_dropped_total", dimensions: [("reason", reason)], factory: factory)
    }
}
