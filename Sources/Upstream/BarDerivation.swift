import CoreMetrics
import MarketCore
import MarketDataHub
import Synchronization

/// Derived bars (`AM.AAPL@5m`), built where the trades come in: between the upstream connection and its
/// inbox, so what reads the inbox (a single relay's hub, a cluster leader's NATS publisher) gets each
/// bar as one more event of its topic, in order with the trades, positioned, kept and sent like any.
/// Built once per derived topic however many clients hold it; on a cluster, once, on the leader.
///
/// The wanted set decides what is built (``setWanted(_:)``): a derived topic's trades are subscribed
/// upstream in its place (``UpstreamClient/setWantedTopics(_:)``). Time bars are finished by the first
/// trade past their window, or by ``tick(grace:)`` once the feed's clock passes the window's end plus
/// the grace. The feed's clock is the wall clock less how far the newest trade's own time was behind
/// it when it arrived, so a delayed feed (15 minutes) still gets its windows closed after their trades.
///
/// What cannot be vouched for is not sent: an outage or events lost before the inbox forget every open
/// bar (``reset()``), and no zero-volume bars are made for the time it covered.
///
/// `Sendable`: its state is behind a `Mutex`; the connection's thread calls ``push(_:into:)``, a task
/// ``tick(grace:)``. Pushing into the inbox under the lock keeps trades and the bars they finish in order.
final class BarDerivation: Sendable {
    let rules: (any BarRules)?
    private let active = Atomic<Bool>(false)

    private struct Series {
        let topic: Topic
        var builder: BarBuilder
    }

    private struct State {
        /// Topic ticker of the trades → the derived topics built from them.
        var bySymbol: [String: [Series]] = [:]
        var topics: Set<Topic> = []
        /// The symbols with a time series: what the clock looks at.
        var timed: [String] = []
        /// The newest trade time seen (Unix ns), and how far the wall clock was ahead of it then.
        var feedTime: Int64 = 0
        var lag: Int64 = 0
        /// The feed's time at the last reset: a trade from before it is late (its window's other trades
        /// were not all seen, and no bar, zero-volume ones included, is made for the time a reset covers).
        var resetAt: Int64 = 0
    }

    private let state = Mutex(State())
    private let built: Counter
    private let late: Counter

    /// At most this many derived topics are built at once per market (past it, the rest are refused).
    static let maxSeries = 100_000
    /// At most this many bars are made by one turn of the clock (the rest on the next turns).
    static let maxBarsPerTick = 10_000
    /// A trade stamped further ahead of the wall clock than this is not counted (a clock gone wrong would
    /// move the windows ahead and make every later trade late).
    static let maxAhead: Int64 = 5_000_000_000
    /// A trade stamped further behind the wall clock than this is not counted either: after a reset (a
    /// reconnect, a malformed message) it would open a window that long ago, and a series with
    /// zero-volume bars would make one for every window since (a trade stamped 1970 is 56 years of them).
    /// A delayed feed (15 minutes) stays well within it.
    static let maxBehind: Int64 = 3_600_000_000_000

    init(rules: (any BarRules)?, metricsFactory: any MetricsFactory) {
        self.rules = rules
        built = Counter(label: "relay_bars_built_total", factory: metricsFactory)
        late = Counter(label: "relay_bars_late_trades_total", factory: metricsFactory)
    }

    /// Splits a wanted set: the topics to ask upstream (the derived ones replaced by their trades,
    /// unless the trades' wildcard is asked anyway), and the derived topics this market can build.
    func upstreamTopics(for topics: Set<Topic>) -> (upstream: Set<Topic>, derived: Set<Topic>) {
        guard topics.contains(where: \.isDerived) else { return (topics, []) }
        var upstream = Set<Topic>()
        var derived = Set<Topic>()
        for topic in topics {
            guard topic.isDerived else {
                upstream.insert(topic)
                continue
            }
            guard let rules, rules.problem(with: topic) == nil, let source = rules.sourceTopic(of: topic) else { continue }
            derived.insert(topic)
            upstream.insert(source)
        }
        if let rules, topics.contains(.wildcard(rules.tradeEventType)) {
            upstream = upstream.filter { $0.eventType != rules.tradeEventType || $0.isWildcard }
        }
        return (upstream, derived)
    }

    /// Builds `derived` from now on: a topic already built goes on where it was, a new one starts with
    /// the next trade, one no longer wanted is dropped with its open bar. Returns the topics refused
    /// (past ``maxSeries``, or ``DerivedLimits/sizesPerSymbolBuilt`` sizes of one symbol), for their
    /// holders to be told.
    @discardableResult
    func setWanted(_ derived: Set<Topic>) -> Set<Topic> {
        state.withLock { state in
            guard derived != state.topics else { return [] }
            var next: [String: [Series]] = [:]
            var kept = Set<Topic>()
            for (symbol, series) in state.bySymbol {
                for one in series where derived.contains(one.topic) {
                    next[symbol, default: []].append(one)
                    kept.insert(one.topic)
                }
            }
            var refused = Set<Topic>()
            // In a stable order, so the same topics are refused whatever the set's order.
            for topic in derived.subtracting(kept).sorted(by: { $0.description < $1.description }) {
                guard let bar = topic.derivedBar else { continue }
                guard kept.count < Self.maxSeries, (next[bar.symbol]?.count ?? 0) < DerivedLimits.sizesPerSymbolBuilt else {
                    refused.insert(topic)
                    continue
                }
                next[bar.symbol, default: []].append(Series(topic: topic, builder: BarBuilder(spec: bar.spec)))
                kept.insert(topic)
            }
            state.bySymbol = next
            state.topics = derived
            state.timed = next.compactMap { symbol, series in
                series.contains { if case .seconds = $0.builder.spec.size { true } else { false } } ? symbol : nil
            }
            active.store(!kept.isEmpty, ordering: .releasing)
            return refused
        }
    }

    /// The derived topics built from any of `sources` (trade topics the upstream refused).
    func derived(from sources: Set<Topic>) -> Set<Topic> {
        guard active.load(ordering: .acquiring), let rules else { return [] }
        return state.withLock { state in
            var found = Set<Topic>()
            for source in sources where source.eventType == rules.tradeEventType {
                for series in state.bySymbol[source.ticker] ?? [] { found.insert(series.topic) }
            }
            return found
        }
    }

    /// Pushes one upstream message's events into `inbox`, followed by the bars its trades finished.
    /// Returns whether the inbox took them (when not, every open bar is forgotten: trades were lost).
    func push(_ events: [MarketEvent], into inbox: SourceInbox) -> Bool {
        guard active.load(ordering: .acquiring), let rules else { return inbox.push(.events(events)) }
        let tradeType = rules.tradeEventType
        return state.withLock { state in
            var bars: [MarketEvent] = []
            var now: Int64?
            for event in events where event.eventType == tradeType {
                guard let count = state.bySymbol[event.ticker]?.count, let trade = rules.trade(in: event) else { continue }
                let wall = now ?? WallClock.nowNanoseconds()
                now = wall
                guard trade.time <= wall + Self.maxAhead, trade.time >= wall - Self.maxBehind, trade.time >= state.resetAt else {
                    late.increment()
                    continue
                }
                if trade.time > state.feedTime {
                    state.feedTime = trade.time
                    state.lag = max(0, wall - trade.time)
                }
                for index in 0..<count {
                    // In place: the series' builders are not copied per trade.
                    let (finished, wasLate) = state.bySymbol[event.ticker, default: []][index].builder.take(trade)
                    if wasLate { late.increment() }
                    guard !finished.isEmpty, let topic = state.bySymbol[event.ticker]?[index].topic else { continue }
                    for bar in finished { bars.append(render(bar, topic, rules: rules, receivedAt: event.receivedAt)) }
                }
            }
            // The bars in a push of their own: when the inbox is full they are what is lost, not the trades.
            let pushed = inbox.push(.events(events))
            if !pushed || (!bars.isEmpty && !inbox.push(.events(bars))) {
                Self.reset(&state)
            } else if !bars.isEmpty {
                built.increment(by: bars.count)
            }
            return pushed
        }
    }

    /// Finishes the time bars whose window, plus `grace`, the feed's clock has passed, into `inbox`.
    func tick(grace: Duration, into inbox: SourceInbox) {
        guard active.load(ordering: .acquiring), let rules else { return }
        let graceNanoseconds = Int64(grace.components.seconds) * 1_000_000_000 + grace.components.attoseconds / 1_000_000_000
        state.withLock { state in
            guard state.feedTime > 0 else { return }
            let feedNow = WallClock.nowNanoseconds() - state.lag
            let receivedAt = MonotonicClock.nanoseconds()
            var bars: [MarketEvent] = []
            let timed = state.timed
            for symbol in timed where bars.count < Self.maxBarsPerTick {
                let count = state.bySymbol[symbol]?.count ?? 0
                for index in 0..<count {
                    let finished = state.bySymbol[symbol, default: []][index].builder.close(now: feedNow, grace: graceNanoseconds)
                    guard !finished.isEmpty, let topic = state.bySymbol[symbol]?[index].topic else { continue }
                    for bar in finished { bars.append(render(bar, topic, rules: rules, receivedAt: receivedAt)) }
                }
            }
            guard !bars.isEmpty else { return }
            built.increment(by: bars.count)
            if !inbox.push(.events(bars)) { Self.reset(&state) }
        }
    }

    /// Forgets every open bar: the trades in them were not all seen.
    func reset() {
        guard active.load(ordering: .acquiring) else { return }
        state.withLock { Self.reset(&$0) }
    }

    private static func reset(_ state: inout State) {
        // The feed's time now, at most (one trade stamped ahead of the wall clock moved `feedTime` there,
        // and every trade until then would be late).
        state.resetAt = state.feedTime > 0 ? min(state.feedTime, WallClock.nowNanoseconds() - state.lag) : 0
        for symbol in Array(state.bySymbol.keys) {
            let count = state.bySymbol[symbol]?.count ?? 0
            for index in 0..<count { state.bySymbol[symbol, default: []][index].builder.reset() }
        }
    }

    private func render(_ bar: Bar, _ topic: Topic, rules: any BarRules, receivedAt: UInt64) -> MarketEvent {
        MarketEvent(eventType: topic.eventType, ticker: topic.ticker, bytes: rules.render(bar, eventType: topic.eventType, ticker: topic.ticker), receivedAt: receivedAt)
    }
}
