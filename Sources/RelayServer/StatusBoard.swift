import Foundation
import MarketDataHub
import MarketCore
import RESTGateway

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

    /// Each market: its hub, feed and broken tagged sessions.
    private let markets: [MarketRoute]
    private let sessions: SessionRegistry
    private let tally: DeliveryTally
    private var samples: [Sample] = []
    private var changes: [Change] = []
    /// Per market: its upstream's last state and its cluster role, as last noted.
    private var lastUpstreamState: [Market: String] = [:]
    private var lastRole: [Market: String] = [:]
    private var lastFills: [Market: GapFillCounts] = [:]

    private let gateways: [RESTGateway]

    init(markets: [MarketRoute], sessions: SessionRegistry, tally: DeliveryTally, gateways: [RESTGateway] = []) {
        self.gateways = gateways
        self.markets = markets
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
        var published = 0
        var lagging = 0
        for served in markets {
            let report = await served.feed.report()
            note(served.market, upstream: report.upstream, cluster: report.cluster)
            note(served.market, gapFill: await served.hub.gapFillStatistics)
            published += await served.hub.publishedCount
            lagging += await served.hub.laggingSubscribers
        }
        let sample = Sample(at: .now, published: published, tally: tally.read(), connections: sessions.count, lagging: lagging)
        samples.append(sample)
        if samples.count > Self.keptSeconds + 1 { samples.removeFirst(samples.count - Self.keptSeconds - 1) }
    }

    private func note(_ market: Market, upstream: UpstreamReport, cluster: ClusterReport?) {
        // One market's changes read as before; several name their market.
        let prefix = markets.count > 1 ? "\(market) " : ""
        if upstream.state != lastUpstreamState[market] {
            let from = lastUpstreamState[market].map { " (was \($0))" } ?? ""
            record(Change(at: .now, what: "\(prefix)upstream \(upstream.state)\(from)", detail: upstream.detail ?? upstream.lastError))
            lastUpstreamState[market] = upstream.state
        }
        if let cluster, cluster.role != lastRole[market] {
            record(Change(at: .now, what: "\(prefix)cluster role \(cluster.role)", detail: cluster.leader.map { "leader \($0)" }))
            lastRole[market] = cluster.role
        }
    }

    /// Each gap fill that ended since the last sample, as one change.
    private func note(_ market: Market, gapFill: GapFillCounts) {
        let seen = lastFills[market] ?? GapFillCounts()
        defer { lastFills[market] = gapFill }
        let prefix = markets.count > 1 ? "\(market) " : ""
        if gapFill.skipped > seen.skipped {
            record(Change(at: .now, what: "\(prefix)gap not filled", detail: "the outage was longer than the fill covers (gapFill.maxWindowSeconds)"))
        }
        guard gapFill.fills > seen.fills, let last = gapFill.last else { return }
        let seconds = Double(last.through - last.from) / 1000
        record(
            Change(
                at: .now, what: "\(prefix)gap filled\(last.complete ? "" : " (incomplete)")",
                detail: "\(last.events) events of \(last.topics) topics recovered from a \(String(format: "%.1f", seconds)) s outage"
                    + (last.complete ? "" : "; \(last.missing) topics missing")))
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

        /// One market's feed and counts.
        struct MarketStatus: Sendable, Encodable {
            var market: String
            /// Whose protocol its WebSocket speaks (`polygon`, `alpaca`), and where.
            var vendor: String
            var path: String
            var healthy: Bool
            var upstream: UpstreamReport
            var cluster: ClusterReport?
            var subscribers: Int
            var eventsPublished: Int
            /// The epoch of the market's positions and what its history holds (`nil`: no history).
            var history: History?
            /// Gap fills after upstream outages since start (`nil`: none yet).
            var gapFill: GapFillCounts?
            /// Its recording on the tape (`nil`: not recorded).
            var tape: TapeReport?
        }

        /// One market's history for resumes.
        struct History: Sendable, Encodable {
            var epoch: String
            var memoryBytes: Int
            var events: Int
            var topics: Int
            var lastMarketSequence: UInt64
            /// The market sequence of the oldest event the memory holds (a resume from before it
            /// reads the tape).
            var oldestMarketSequence: UInt64?
            /// On a cluster node: the market sequence the lease last said the leader had stamped through
            /// (an event far past it is not kept).
            var leaderStampedThrough: UInt64?
            /// Resumes, replays, gaps and conflation since start.
            var counts: ResumeCounts
            /// Broken tagged sessions waiting for their client.
            var sessionsKept: Int
        }

        var now: Date
        /// The first market (the one a one-market relay serves), whose feed `upstream` and `cluster` show.
        var market: String
        /// Every market, in the order configured.
        var markets: [MarketStatus]
        /// Whether every market's feed is healthy.
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
        /// The REST gateways, one per vendor account (empty: off).
        var gateways: [GatewayReport]
    }

    private func gatewayReports() async -> [GatewayReport] {
        var reports: [GatewayReport] = []
        for gateway in gateways { reports.append(await gateway.report()) }
        return reports
    }

    func status(portfolio: Bool, viewer: Status.Viewer) async -> Status {
        var perMarket: [Status.MarketStatus] = []
        var subscribers = 0
        var lagging = 0
        var published = 0
        var dropped = 0
        for served in markets {
            let report = await served.feed.report()
            note(served.market, upstream: report.upstream, cluster: report.cluster)
            let marketSubscribers = await served.hub.subscriberCount
            let marketPublished = await served.hub.publishedCount
            subscribers += marketSubscribers
            published += marketPublished
            lagging += await served.hub.laggingSubscribers
            dropped += await served.hub.droppedTotal
            let gapFill = await served.hub.gapFillStatistics
            var history: Status.History?
            if let epoch = served.hub.epoch, let held = await served.hub.historyStatistics {
                history = .init(
                    epoch: epoch, memoryBytes: held.memory, events: held.events, topics: held.topics,
                    lastMarketSequence: await served.hub.lastMarketSequence, oldestMarketSequence: await served.hub.oldestHeldSequence,
                    leaderStampedThrough: await served.hub.leaderStampedThrough,
                    counts: await served.hub.resumeStatistics,
                    sessionsKept: served.shelf.count)
            }
            perMarket.append(
                .init(
                    market: served.market.rawValue, vendor: served.served.vendor, path: served.served.paths.first ?? "/\(served.market)",
                    healthy: report.healthy, upstream: report.upstream, cluster: report.cluster,
                    subscribers: marketSubscribers, eventsPublished: marketPublished, history: history,
                    gapFill: gapFill.fills + gapFill.skipped > 0 ? gapFill : nil, tape: served.served.tape?()))
        }
        let first = perMarket.first
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
            now: .now, market: first?.market ?? "", markets: perMarket, healthy: perMarket.allSatisfy(\.healthy),
            upstream: first?.upstream ?? UpstreamReport(state: "idle", url: "none"), cluster: first?.cluster,
            clients: .init(connections: sessions.count, subscribers: subscribers, lagging: lagging),
            eventsPublished: published, eventsDelivered: tally.read().delivered, dropped: dropped,
            rates: .init(eventsIn: series.eventsIn.last ?? 0, eventsOut: series.eventsOut.last ?? 0), latency: latency, series: series,
            changes: changes.reversed(), portfolio: portfolio, viewer: viewer, gateways: await gatewayReports())
    }
}
