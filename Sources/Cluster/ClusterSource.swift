import MarketCore
import MarketDataHub
import Upstream

/// A cluster node as its market's source (``MarketSource``): the node runs (lease, NATS feed into the
/// hub's inbox, the upstream while it leads), and reports the cluster section and this node's upstream
/// connection while it leads (`standby` while it follows). `Sendable`.
public struct ClusterSource: MarketSource {
    public let node: ClusterNode
    /// The upstream's address as shown while a follower.
    public let upstream: String

    public init(node: ClusterNode, upstream: String) {
        self.node = node
        self.upstream = upstream
    }

    public func run() async throws { try await node.run() }

    public func report() async -> FeedReport {
        let status = node.status
        if let connection = node.upstream {
            return FeedReport(
                healthy: node.isHealthy && connection.state == .authenticated, upstream: UpstreamReport(connection), cluster: status,
                lastUpstreamMessageAge: connection.lastMessageAt.map { ContinuousClock.now - $0 })
        }
        let detail = status.leader.map { "held by the cluster leader \($0)" } ?? "no cluster leader yet"
        return FeedReport(
            healthy: node.isHealthy, upstream: UpstreamReport(state: "standby", detail: detail, url: upstream), cluster: status)
    }

    public func lastValue(for topic: Topic) async -> LastValueLookup { await node.lastValue(for: topic) }
}
