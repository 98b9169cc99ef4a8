import Foundation
import MarketDataHub

/// What `/v1/status` answers (and the dashboard's overview draws): the feed's state now, the
/// downstream's counts, rates and latency, the last minutes as one sample per second, and the recent
/// changes of state. An actor that samples once a second while the server runs.
actor StatusBoard {
    /// One second of the relay.
    struct Sample: Sendable {
        var at: Date
        var published: Int
        var tally: DeliveryTally.Counts
        var connections: Int
        var lagging: Int
    }

    /// A change of the upstream's state or the cluster role.
    struct Change: Sendable, Encodable {
        var at: Date
        var what: String
        var detail: String?
    }

    static let keptSeconds = 300
    static let keptChanges = 50

    private let hub: MarketDataHub
    private let feed: any FeedStatus
    private let sessions: SessionRegistry
    private let tally: DeliveryTally
    private var samples: [Sample] = []
    private var changes: [Change] = []
    private var lastUpstreamState: String?
    private var lastRole: String?

    init(hub: MarketDataHub, feed: any FeedStatus, sessions: SessionRegistry, tally: DeliveryTally) {
        self.hub = hub
        self.feed = feed
        self.sessions = sessions
        self.tally = tally
    }

    /// Samples once a second until cancelled.
    func run() async {
        while !Task.isCancelled {
            await sample()
            do { try await Task.sleep(for: .seconds(1)) } catch { return }
        }
    }

    func sample() async {
        let report = await feed.report()
        note(upstream: report.upstream, cluster: report.cluster)
        let sample = Sample(
            at: .now, published: await hub.publishedCount, tally: tally.read(), connections: sessions.count,
            lagging: await hub.bufferStatistics.lagging)
        samples.append(sample)
        if samples.count > Self.keptSeconds + 1 { samples.removeFirst(samples.count - Self.keptSeconds - 1) }
    }

    private func note(upstream: UpstreamReport, cluster: ClusterReport?) {
        if upstream.state != lastUpstreamState {
            let from = lastUpstreamState.map { " (was \($0))" } ?? ""
            record(Change(at: .now, what: "upstream \(upstream.state)\(from)", detail: upstream.detail ?? upstream.lastError))
            lastUpstreamState = upstream.state
        }
        if let cluster, cluster.role != lastRole {
            record(Change(at: .now, what: "cluster role \(cluster.role)", detail: cluster.leader.map { "leader \($0)" }))
            lastRole = cluster.role
        }
    }

    private func record(_ change: Change) {
        changes.append(change)
        if changes.count > Self.keptChanges { changes.removeFirst(changes.count - Self.keptChanges) }
    }

    /// The `/v1/status` body.
    struct Status: Sendable, Encodable {
        struct Clients: Sendable, Encodable {
            var connections: Int
            var subscribers: Int
            var lagging: Int
        }
        struct Rates: Sendable, Encodable {
            /// Events per second into the hub and written to clients, over the last second sampled.
            var eventsIn: Double
            var eventsOut: Double
        }
        struct Latency: Sendable, Encodable {
            /// Upstream frame in to client frame written, over the last 10 s (`nil`: nothing written).
            var p50Ms: Double?
            var p99Ms: Double?
        }
        /// One value per second, oldest first, up to the last five minutes.
        struct Series: Sendable, Encodable {
            var intervalSeconds = 1
            var eventsIn: [Double] = []
            var eventsOut: [Double] = []
            var p99Ms: [Double?] = []
            var connections: [Int] = []
            var lagging: [Int] = []
        }
        struct Viewer: Sendable, Encodable {
            /// Whether the relay asks for client keys.
            var keysRequired: Bool
            /// The presented key's name and portfolio right (`none`, `read`, `write`).
            var key: String?
            var portfolio: String
        }

        var now: Date
        var market: String
        var healthy: Bool
        var upstream: UpstreamReport
        var cluster: ClusterReport?
        var clients: Clients
        var eventsPublished: Int
        var eventsDelivered: Int
        var dropped: Int
        var rates: Rates
        var latency: Latency
        var series: Series
        var changes: [Change]
        /// Whether the portfolio sidecar runs on this relay.
        var portfolio: Bool
        var viewer: Viewer
    }

    func status(market: String, portfolio: Bool, viewer: Status.Viewer) async -> Status {
        let report = await feed.report()
        note(upstream: report.upstream, cluster: report.cluster)
        var series = Status.Series()
        for (earlier, later) in zip(samples, samples.dropFirst()) {
            let seconds = max(later.at.timeIntervalSince(earlier.at), 0.001)
            series.eventsIn.append(Double(later.published - earlier.published) / seconds)
            series.eventsOut.append(Double(later.tally.delivered - earlier.tally.delivered) / seconds)
            series.p99Ms.append(DeliveryTally.quantile(0.99, from: earlier.tally, to: later.tally).map { $0 * 1000 })
            series.connections.append(later.connections)
            series.lagging.append(later.lagging)
        }
        let latest = samples.last
        let tenSecondsAgo = samples.count > 10 ? samples[samples.count - 11] : samples.first
        var latency = Status.Latency()
        if let latest, let tenSecondsAgo {
            latency.p50Ms = DeliveryTally.quantile(0.5, from: tenSecondsAgo.tally, to: latest.tally).map { $0 * 1000 }
            latency.p99Ms = DeliveryTally.quantile(0.99, from: tenSecondsAgo.tally, to: latest.tally).map { $0 * 1000 }
        }
        return Status(
            now: .now, market: market, healthy: report.healthy, upstream: report.upstream, cluster: report.cluster,
            clients: .init(connections: sessions.count, subscribers: await hub.subscriberCount, lagging: await hub.bufferStatistics.lagging),
            eventsPublished: await hub.publishedCount, eventsDelivered: tally.read().delivered, dropped: await hub.droppedTotal,
            rates: .init(eventsIn: series.eventsIn.last ?? 0, eventsOut: series.eventsOut.last ?? 0), latency: latency, series: series,
            changes: changes.reversed(), portfolio: portfolio, viewer: viewer)
    }
}
