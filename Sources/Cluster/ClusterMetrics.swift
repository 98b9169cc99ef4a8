import MarketCore
import CoreMetrics
import Logging
import Synchronization

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
    private let interestCappedCount: Counter
    private let interestRefusedTopics: Counter
    private let factory: any MetricsFactory

    init(factory: any MetricsFactory) {
        self.factory = factory
        leader = Gauge(label: "relay_cluster_leader", factory: factory)
        renewed = Counter(label: "relay_cluster_lease_renewals_total", dimensions: [("result", "ok")], factory: factory)
        renewFailed = Counter(label: "relay_cluster_lease_renewals_total", dimensions: [("result", "failed")], factory: factory)
        failovers = Counter(label: "relay_cluster_failovers_total", factory: factory)
        natsIn = Counter(label: "relay_cluster_nats_messages_total", dimensions: [("direction", "in")], factory: factory)
        natsOut = Counter(label: "relay_cluster_nats_messages_total", dimensions: [("direction", "out")], factory: factory)
        interestCappedCount = Counter(label: "relay_cluster_interest_capped_total", factory: factory)
        interestRefusedTopics = Counter(label: "relay_cluster_interest_refused_topics_total", factory: factory)
    }

    /// What arrived from NATS and was refused, by kind (`event`, `interest`, `lease`): counted, logged
    /// (at most once per 10 s per kind, with the count held back), never used.
    /// (`why` is made only for a line that is logged: a publisher's flood of junk costs a count each.)
    func rejected(_ kind: String, _ why: @autoclosure () -> String, logger: Logger) {
        counter("relay_cluster_rejected_total", "kind", kind).increment()
        warnings.log(.warning, kind, "cluster: refused a NATS message (\(kind)): \(why())", to: logger)
    }

    /// The counter of `label` with one dimension, made once (each kind, outcome or reason is one of a
    /// few literals) and kept: a message counted does not look it up in the registry, whose lock a
    /// scrape of `/metrics` holds.
    private func counter(_ label: String, _ dimension: String, _ value: String) -> Counter {
        let key = CounterKey(label: label, value: value)
        if let made = counters.withLock({ $0[key] }) { return made }
        let made = Counter(label: label, dimensions: [(dimension, value)], factory: factory)
        return counters.withLock { counters in
            if let raced = counters[key] { return raced }
            counters[key] = made
            return made
        }
    }

    private struct CounterKey: Hashable {
        let label: String
        let value: String
    }

    private let counters = Mutex<[CounterKey: Counter]>([:])

    /// A `/v1/last` request for the cluster's last values: answered by `store` (a lookup), `joined` (the
    /// lookup under way for its topic) or `recent` (an answer of the last quarter second), or `refused`
    /// (`503`: as many lookups as allowed were under way).
    func lastValueLookup(_ outcome: String) {
        counter("relay_cluster_last_value_lookups_total", "outcome", outcome).increment()
    }

    /// A publish libnats refused (closed, or its reconnect buffer full), by what was published (`event`,
    /// `interest`, `control`, `last_value`): counted, logged at most once per 10 s per kind.
    func publishFailed(_ kind: String, logger: Logger) {
        counter("relay_cluster_publish_failures_total", "kind", kind).increment()
        warnings.log(
            .warning, "publish-" + kind, "cluster: a NATS publish (\(kind)) was refused (not connected, or the reconnect buffer is full)", to: logger)
    }

    /// This node's clients want more topics than the cluster takes from one node: counted (the topics
    /// left out, per publish) and logged at most once per 10 s.
    func interestCapped(wanted: Int, cap: Int, logger: Logger) {
        interestCappedCount.increment()
        warnings.log(
            .error, "interest-cap",
            "this node's clients want \(wanted) topics but the cluster takes at most \(cap) per node (cluster.maxTopicsPerNode): \(wanted - cap) are not asked upstream",
            to: logger)
    }

    /// A node's topics the cluster's union had no room for (past `cluster.maxTopics`): counted per topic
    /// and logged at most once per 10 s.
    func interestPastTheUnion(_ count: Int, node: String, cap: Int, logger: Logger) {
        interestRefusedTopics.increment(by: count)
        warnings.log(
            .warning, "interest-union",
            "node \(node) asked for \(count) topics the cluster does not ask upstream: it asks for at most \(cap) distinct topics (cluster.maxTopics)",
            to: logger)
    }

    /// A warning of `kind` (one of a few literals), logged at most once per 10 s.
    func warn(_ kind: String, _ message: @autoclosure () -> String, logger: Logger) {
        warnings.log(.warning, kind, "\(message())", to: logger)
    }

    /// One log line per kind per 10 s, counting those held back.
    private let warnings = ThrottledLog()

    /// Events lost between NATS and this node's hub, by reason (`slow_consumer`, `node_queue_full`).
    func natsDropped(reason: String) -> Counter {
        counter("relay_cluster_nats_dropped_total", "reason", reason)
    }
}
