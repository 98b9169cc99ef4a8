import AsyncSupport
import MarketCore
import MarketDataHub
import ServiceLifecycle

/// A single relay's source (``MarketSource``): one upstream client, made once the upstream's address is
/// known, whose events feed the hub in order through its inbox, and whose subscriptions follow what the
/// hub wants (at most one change per 50 ms).
///
/// `Sendable`; a `Service`. Reports the connection's health to the server (``FeedStatus``).
public final class UpstreamSource: MarketSource {
    private let hub: MarketDataHub
    private let interest: LocalInterest
    private let makeUpstream: @Sendable () async throws -> UpstreamClient
    private let made = ReadySignal<UpstreamClient>()
    /// What the health report says instead of the upstream's URL (`nil`: the URL).
    private let shownURL: String?

    public init(
        hub: MarketDataHub, interest: LocalInterest, shownURL: String? = nil,
        makeUpstream: @escaping @Sendable () async throws -> UpstreamClient
    ) {
        self.hub = hub
        self.interest = interest
        self.shownURL = shownURL
        self.makeUpstream = makeUpstream
    }

    /// The upstream client, once made.
    public func upstream() async throws -> UpstreamClient { try await made.wait() }

    public func run() async throws {
        let upstream: UpstreamClient
        do {
            upstream = try await makeUpstream()
        } catch {
            made.fail(error)
            throw error
        }
        made.succeed(upstream)
        // At most one upstream change per 50 ms: a crowd reconnecting after a restart makes a handful
        // of subscribe messages, not one per client.
        let batch = Debouncer(delay: .milliseconds(50))
        interest.listen { _ in batch.poke { upstream.setWantedTopics(self.interest.topics) } }
        let hub = self.hub
        try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask { try await upstream.run() }
            // Ends when the client stops and its inbox finishes.
            group.addTask { await HubPump.run(upstream.inbox, into: hub, lossReason: "the relay fell behind its upstream") }
            if hub.folding != nil { group.addTask { await Self.renewFolds(of: hub, on: upstream) } }
            try await group.waitForAll()
        }
    }

    /// A book (a folded topic) the hub holds and cannot vouch for (after an outage, a loss, a quick
    /// unsubscribe and subscribe the upstream never saw) is asked of the upstream anew: unsubscribed and
    /// subscribed again, so the vendor sends it whole (``RenewalPacer``: after 2 s, then every 10 s while
    /// it stays so). Looks once a second until the client stops.
    private static func renewFolds(of hub: MarketDataHub, on upstream: UpstreamClient) async {
        var pacer = RenewalPacer()
        while upstream.state != .stopped {
            do {
                try await Task.sleep(for: .seconds(1))
            } catch {
                return
            }
            guard upstream.state == .authenticated else { continue }
            upstream.renewTopics(pacer.due(await hub.foldsNotWhole()))
        }
    }

    public func report() async -> FeedReport {
        guard let upstream = made.value else {
            return FeedReport(healthy: false, upstream: UpstreamReport(state: "idle", url: "not known yet"))
        }
        var report = UpstreamReport(upstream)
        if let shownURL { report.url = shownURL }
        return FeedReport(
            healthy: upstream.state == .authenticated, upstream: report,
            lastUpstreamMessageAge: upstream.lastMessageAt.map { ContinuousClock.now - $0 })
    }
}

extension UpstreamReport {
    public init(_ upstream: UpstreamClient) {
        let state = upstream.state
        let statistics = upstream.statistics
        self.init(
            state: state.name, detail: state.detail, url: upstream.configuration.endpoint.description,
            subscribedTopics: upstream.subscribedTopics.count,
            lastMessageAgeMs: upstream.lastMessageAt.map { (ContinuousClock.now - $0).milliseconds },
            messagesReceived: statistics.messagesReceived, eventsReceived: statistics.eventsReceived,
            malformedMessages: statistics.malformedMessages, oversizedMessages: statistics.oversizedMessages,
            reconnects: statistics.reconnectsByCause, lastError: statistics.lastError, silent: upstream.isSilent)
    }
}
