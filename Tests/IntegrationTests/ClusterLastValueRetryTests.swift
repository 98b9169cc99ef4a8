import Foundation
import MarketDataHub
import PolygonWire
import RelayBench
import Testing

@testable import Cluster

/// A node that could not make the cluster's last-value store to its bounds goes on without it, and
/// binds one once it can: it tries again now and then, not only when it binds its buckets again.
@Suite("Cluster: the last-value store bound later", .timeLimit(.minutes(2)))
struct ClusterLastValueRetryTests {
    struct NoUpstream: Error {}

    @Test(.enabled(if: ClusterHarness.enabled, "nats-server is not installed (scripts/test installs it)"))
    func aNodeWithoutItsStoreBindsOneWhenOneCanBeHad() async throws {
        let nats = try NATSServerProcess()
        let url = try await nats.start()
        do {
            let interest = LocalInterest()
            let hub = MarketDataHub(wire: .polygon, keepsUnwantedLastValues: false, logger: testLogger) { interest.apply($0) }
            var configuration = ClusterConfiguration(
                servers: [url], name: "retry\(UInt16.random(in: 0...9999))", nodeID: "n1", leaseDuration: .seconds(1))
            // More than any NATS server reserves: the store cannot be made to its bounds.
            configuration.lastValueBytes = 1 << 50
            configuration.lastValueRetry = .milliseconds(200)
            let node = try ClusterNode(configuration: configuration, market: "stocks", hub: hub, localInterest: interest, logger: testLogger) {
                throw NoUpstream()
            }
            try await withServices([node]) {
                try await eventually("the node to read the lease") { node.status.leader != nil }
                #expect(!node.hasLastValueStore, "a store was made without its bounds")
                // One is made (by an operator, or a node of an older release): the node binds it as it is.
                let maker = try await natsClient(url, name: "maker")
                let subjects = try ClusterSubjects(cluster: configuration.name, market: "stocks")
                _ = try await maker.keyValue(bucket: subjects.lastValueBucket, ttl: nil)
                try await eventually("the node to bind the store", timeout: .seconds(10)) { node.hasLastValueStore }
                await maker.close()
            }
        } catch {
            await nats.stop()
            throw error
        }
        await nats.stop()
    }
}
