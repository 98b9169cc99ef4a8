import Cluster
import DemoFeed
import Foundation
import PolygonWire
import RelayBench
import Synchronization
import Testing

@Suite(
    "Cluster on NATS: lease bucket, interest size", .serialized, .timeLimit(.minutes(3)),
    .enabled(if: ClusterHarness.enabled, "nats-server is not installed (scripts/test installs it)"))
struct ClusterLeaseAndInterestTests {
    @Test func aNodeWhoseLeaseDiffersFromTheBucketRefusesToRun() async throws {
        try await ClusterHarness.with(nodes: 1) { cluster in
            _ = try await cluster.agreedLeader()
            let odd = RelayProcess(
                binary: RelayProcess.siblingBinary(),
                arguments: [
                    "serve", "--listen", "127.0.0.1:0", "--upstream", cluster.feedURL, "--upstream-key", ClusterHarness.upstreamKey,
                    "--cluster", cluster.natsURL, "--cluster-name", cluster.clusterName, "--node-id", "odd", "--no-portfolio",
                ], showLogs: false, captureLogs: true, environment: ["RELAY_CLUSTER_LEASE_SECONDS": "3"])
            _ = try? await odd.start(timeout: .seconds(30))
            try await eventually("the node with a 3 s lease to exit", timeout: .seconds(20)) { !odd.process.isRunning }
            #expect(odd.process.terminationStatus != 0)
            #expect(odd.output.contains("keeps the lease 5000 ms but this node's lease is 3000 ms"), "\(odd.output.suffix(2000))")
            // The running node was never disturbed.
            #expect(cluster.feed.monitor.snapshot.totalConnections == 1)
        }
    }
}
