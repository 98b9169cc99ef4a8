import MarketREST
import Logging
import Metrics

/// Security details, at most `capacity` of them, least recently used evicted first.
///
/// An actor, generic over the detail type so the cache's rules are tested apart from how details are
/// loaded. A request for a symbol that is being loaded joins that load (one fetch, however many ask);
/// prefetched entries count against the capacity like any other; an entry counts as cached only once
/// `isComplete` says so (a detail with a failed group is served but loaded again next time).
///
/// ``removeAll()`` (the data changed) also retires the loads under way: they read the data before the
/// change, so they still answer whoever waits on them but are neither cached nor joined by a later
/// request, which loads afresh.
///
/// A load lives as long as somebody wants it: each request and each prefetch waiting on it holds an
/// interest; a cancelled prefetch withdraws its own, and a load nobody is interested in any more is
/// cancelled (so its data source sees the cancellation). A request someone waits for keeps the load
/// going whatever happens to the prefetches that started it.
public actor SecurityCache<Detail: Sendable> {
    public let capacity: Int
    private let load: @Sendable (String) async -> Detail
    private let isComplete: @Sendable (Detail) -> Bool
    private let logger: Logger
    private let metrics: SecurityCacheMetrics
    private var entries: [String: (detail: Detail, used: UInt64)] = [:]
    private var loading: [String: Load] = [:]
    /// Loads under way when the data changed, by load id: still withdrawn from and cancelled, never cached.
    private var retired: [UInt64: Load] = [:]
    private var clock: UInt64 = 0
    private var nextID: UInt64 = 0

    private struct Load {
        let id: UInt64
        let symbol: String
        let task: Task<Detail, Never>
        var interested: Set<UInt64>
        /// Escalated when a request waits for the load (its REST requests then jump the queue).
        let urgency: RequestGate.Urgency
    }

    /// How a request was served.
    public enum Outcome: String, Sendable, Codable {
        /// A complete detail from the cache.
        case hit
        /// Loaded for this request.
        case miss
        /// Joined a load already under way (typically a prefetch).
        case joined
    }

    /// What a prefetch came to.
    public enum PrefetchOutcome: Sendable, Equatable {
        /// Already cached: nothing to do.
        case cached
        /// Loaded (or joined a load that finished).
        case loaded
        /// Cancelled before the load finished.
        case cancelled
    }

    /// What happened so far, for metrics and tests.
    public struct Counters: Sendable, Equatable {
        public var hits = 0
        public var misses = 0
        public var joined = 0
        public var evictions = 0
        public var loads = 0
        /// Loads cancelled because nobody wanted them any more.
        public var loadsCancelled = 0
    }

    public private(set) var counters = Counters()
    /// Symbols evicted, oldest eviction first (tests read the order).
    public private(set) var evicted: [String] = []

    public init(
        capacity: Int = 10, logger: Logger = Logger(label: "relay.security-cache"), metrics: SecurityCacheMetrics = .none,
        isComplete: @escaping @Sendable (Detail) -> Bool = { _ in true },
        load: @escaping @Sendable (String) async -> Detail
    ) {
        self.capacity = max(1, capacity)
        self.load = load
        self.isComplete = isComplete
        self.logger = logger
        self.metrics = metrics
    }

    /// The detail of `symbol`: from the cache when complete, else from the load under way, else loaded
    /// now. The load is not cancelled while this request waits for it.
    public func detail(_ symbol: String, priority: TaskPriority? = nil) async -> (detail: Detail, outcome: Outcome) {
        if let entry = entries[symbol], isComplete(entry.detail) {
            counters.hits += 1
            metrics.hits?.increment()
            touch(symbol)
            return (entry.detail, .hit)
        }
        let outcome: Outcome = loading[symbol] == nil ? .miss : .joined
        if outcome == .miss {
            counters.misses += 1
            metrics.misses?.increment()
        } else {
            counters.joined += 1
            metrics.joined?.increment()
        }
        let (task, token) = interest(in: symbol, priority: priority)
        loading[symbol]?.urgency.escalate()
        let detail = await task.value
        withdraw(symbol, token: token)
        return (detail, outcome)
    }

    /// Loads `symbol` into the cache unless it is there, joining a load under way; returns when the
    /// load finishes or this task is cancelled (then its interest is withdrawn at once).
    public func prefetch(_ symbol: String) async -> PrefetchOutcome {
        if contains(symbol) { return .cached }
        let (task, token) = interest(in: symbol, priority: .low)
        _ = await withTaskCancellationHandler {
            await task.value
        } onCancel: {
            Task { await self.withdraw(symbol, token: token) }
        }
        withdraw(symbol, token: token)
        return Task.isCancelled ? .cancelled : .loaded
    }

    /// Whether a complete detail of `symbol` is cached.
    public func contains(_ symbol: String) -> Bool {
        entries[symbol].map { isComplete($0.detail) } ?? false
    }

    /// Forgets every cached detail (their data changed). Loads under way finish for those waiting on
    /// them, but what they read may predate the change: they are not cached, and a new request loads again.
    public func removeAll() {
        entries.removeAll()
        for load in loading.values { retired[load.id] = load }
        loading.removeAll()
    }

    /// Cached symbols, most recently used first.
    public var symbols: [String] { entries.sorted { $0.value.used > $1.value.used }.map(\.key) }

    /// Symbols being loaded now.
    public var loadingSymbols: Set<String> { Set(loading.keys) }

    /// Registers an interest in `symbol`'s load, starting it if none is under way.
    private func interest(in symbol: String, priority: TaskPriority?) -> (Task<Detail, Never>, UInt64) {
        nextID += 1
        let token = nextID
        if var existing = loading[symbol] {
            existing.interested.insert(token)
            loading[symbol] = existing
            return (existing.task, token)
        }
        counters.loads += 1
        let id = token
        let load = self.load
        let urgency = RequestGate.Urgency()
        let task = Task(priority: priority) {
            let detail = await RequestGate.$urgency.withValue(urgency) { await load(symbol) }
            self.finish(symbol, id: id, detail)
            return detail
        }
        loading[symbol] = Load(id: id, symbol: symbol, task: task, interested: [token], urgency: urgency)
        return (task, token)
    }

    /// Withdraws one interest (again is harmless); the last one out cancels the load.
    private func withdraw(_ symbol: String, token: UInt64) {
        if var current = loading[symbol], current.interested.remove(token) != nil {
            loading[symbol] = current
            if current.interested.isEmpty {
                loading[symbol] = nil
                cancel(current)
            }
        } else if let old = retired.first(where: { $0.value.interested.contains(token) }) {
            var current = old.value
            current.interested.remove(token)
            retired[old.key] = current
            if current.interested.isEmpty {
                retired[old.key] = nil
                cancel(current)
            }
        }
    }

    private func cancel(_ load: Load) {
        load.task.cancel()
        counters.loadsCancelled += 1
        logger.debug("load cancelled: nobody wants it any more", metadata: ["symbol": "\(load.symbol)"])
    }

    private func finish(_ symbol: String, id: UInt64, _ detail: Detail) {
        // A retired load (the data changed while it ran) answers its waiters but is not kept.
        if retired.removeValue(forKey: id) != nil {
            logger.debug("load finished after the data changed: not cached", metadata: ["symbol": "\(symbol)"])
            return
        }
        // A cancelled load finishing late stores nothing: it may be partial.
        guard !Task.isCancelled else { return }
        if loading[symbol]?.id == id { loading[symbol] = nil }
        clock += 1
        entries[symbol] = (detail, clock)
        while entries.count > capacity, let oldest = entries.min(by: { $0.value.used < $1.value.used })?.key {
            entries[oldest] = nil
            evicted.append(oldest)
            counters.evictions += 1
            metrics.evictions?.increment()
            logger.debug("evicted", metadata: ["symbol": "\(oldest)"])
        }
        if evicted.count > 1000 { evicted.removeFirst(evicted.count - 1000) }
    }

    private func touch(_ symbol: String) {
        clock += 1
        entries[symbol]?.used = clock
    }
}

/// The cache's and the prefetcher's counters in swift-metrics; `.none` records nothing (tests).
public struct SecurityCacheMetrics: Sendable {
    public var hits: Counter?
    public var misses: Counter?
    public var joined: Counter?
    public var evictions: Counter?
    public var prefetchesStarted: Counter?
    public var prefetchesCompleted: Counter?
    public var prefetchesCancelled: Counter?
    public var prefetchesSkipped: Counter?

    public static let none = SecurityCacheMetrics()

    init() {}

    /// Counters named `relay_security_cache_*` and `relay_prefetch_*` in `factory`.
    public init(factory: any MetricsFactory) {
        func counter(_ label: String, _ dimensions: [(String, String)] = []) -> Counter {
            Counter(label: label, dimensions: dimensions, factory: factory)
        }
        hits = counter("relay_security_cache_requests_total", [("outcome", "hit")])
        misses = counter("relay_security_cache_requests_total", [("outcome", "miss")])
        joined = counter("relay_security_cache_requests_total", [("outcome", "joined")])
        evictions = counter("relay_security_cache_evictions_total")
        prefetchesStarted = counter("relay_prefetches_total", [("event", "started")])
        prefetchesCompleted = counter("relay_prefetches_total", [("event", "completed")])
        prefetchesCancelled = counter("relay_prefetches_total", [("event", "cancelled")])
        prefetchesSkipped = counter("relay_prefetches_total", [("event", "skipped_cached")])
    }
}
