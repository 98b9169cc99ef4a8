import Logging
import MarketCore
import MarketDataHub
import MetricsTestKit
import PolygonWire
import Testing
import Upstream

@testable import Cluster

/// `/v1/last` on a cluster node asks the cluster's last-value store and keeps its answer a quarter
/// second; a read that got no answer (no store yet, NATS failed) is not kept as "none".
@Suite("Cluster: looking up the cluster's last values")
struct ClusterLastValueLookupTests {
    struct NoUpstream: Error {}

    @Test func aReadThatGotNoAnswerIsNotKeptAsNone() async throws {
        let metrics = TestMetrics()
        let interest = LocalInterest()
        let hub = MarketDataHub(wire: .polygon, keepsUnwantedLastValues: false, logger: Logger(label: "test")) { interest.apply($0) }
        // Never run: it has no NATS connection, so no store to ask.
        let node = try ClusterNode(
            configuration: ClusterConfiguration(servers: ["nats://127.0.0.1:1"], name: "lookups", nodeID: "n1"),
            market: "stocks", hub: hub, localInterest: interest, metricsFactory: metrics, logger: Logger(label: "test")
        ) { throw NoUpstream() }
        let topic = try #require(Topic(eventType: "T", ticker: "AAPL"))
        for _ in 0..<3 {
            guard case .none = await node.lastValue(for: topic) else {
                Issue.record("a node without a store found something")
                return
            }
        }
        let label = "relay_cluster_last_value_lookups_total"
        // Each request asked again (before, the first "none" was kept: one store read, then two recent).
        #expect(metrics.counterTotal(label: label, dimensions: [("outcome", "store")]) == 3)
        #expect(metrics.counterTotal(label: label, dimensions: [("outcome", "recent")]) == 0)
    }
}
