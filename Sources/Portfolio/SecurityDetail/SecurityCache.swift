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
///
/// What a client can make it hold is bounded. At most ``maxLoads`` loads run at once (each may wait on
/// the account's REST budget, at foreground priority): a request that would start one more is refused
/// (``DetailUnavailable``) instead of queueing, and a prefetch starts one only while fewer than half
/// of them run, so prefetches never hold the room a request needs. A request waits for its load at
/// most ``maxWait``; then it is answered "not yet" while the load goes on into the cache, so the
/// client's next try finds it there.
public actor SecurityCache<Detail: Sendable> {
    public let capacity: Int
    /// Loads running at once, at most (those the data changed under count until they end).
    public let maxLoads: Int
    /// How long a request waits for its load before it is answered "not yet".
    public let maxWait: Duration
    /// How long a load left running for the cache, and waited for by nobody, may still run: three times
    /// ``maxWait``, at least a minute.
    public let keptFor: Duration
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
        /// A request waited past ``SecurityCache/maxWait`` and left it running for the cache: it is not
        /// cancelled when the last interest is withdrawn.
        var kept = false
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
        /// Not started: half of ``SecurityCache/maxLoads`` loads were running (the rest is the requests').
        case deferred
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
        /// Requests refused because ``SecurityCache/maxLoads`` loads were running.
        public var refused = 0
        /// Requests answered "not yet" after ``SecurityCache/maxWait``, their load left running.
        public var timedOut = 0
        /// Prefetches not started because half of ``SecurityCache/maxLoads`` loads were running.
        public var prefetchesDeferred = 0
    }

    public private(set) var counters = Counters()
    /// Symbols evicted, oldest eviction first (tests read the order).
    public private(set) var evicted: [String] = []

    public init(
        capacity: Int = 10, maxLoads: Int = 16, maxWait: Duration = .seconds(30), keptFor: Duration? = nil,
        logger: Logger = Logger(label: "relay.security-cache"),
        metrics: SecurityCacheMetrics = .none, isComplete: @escaping @Sendable (Detail) -> Bool = { _ in true },
        load: @escaping @Sendable (String) async -> Detail
    ) {
        self.capacity = max(1, capacity)
        self.maxLoads = max(1, maxLoads)
        self.maxWait = maxWait
        self.keptFor = keptFor ?? Swift.max(maxWait * 3, .seconds(60))
        self.load = load
        self.isComplete = isComplete
        self.logger = logger
        self.metrics = metrics
    }

    /// The detail of `symbol`: from the cache when complete, else from the load under way, else loaded
    /// now. The load is not cancelled while this request waits for it.
    ///
    /// - Throws: ``DetailUnavailable`` when ``maxLoads`` loads run and none of them is this symbol's, or
    ///   when the load took longer than ``maxWait`` (it goes on; the cache keeps what it brings).
    public func detail(_ symbol: String, priority: TaskPriority? = nil) async throws(DetailUnavailable) -> (detail: Detail, outcome: Outcome) {
        if let entry = entries[symbol], isComplete(entry.detail) {
            counters.hits += 1
            metrics.hits?.increment()
            touch(symbol)
            return (entry.detail, .hit)
        }
        let outcome: Outcome = loading[symbol] == nil ? .miss : .joined
        if outcome == .miss, running >= maxLoads {
            counters.refused += 1
            metrics.refused?.increment()
            logger.debug("request refused: every load slot is taken", metadata: ["symbol": "\(symbol)", "loads": "\(running)"])
            throw DetailUnavailable(
                reason: "\(running) securities are loading (at most \(maxLoads) at once); try again shortly", retryAfter: .seconds(1))
        }
        if outcome == .miss {
            counters.misses += 1
            metrics.misses?.increment()
        } else {
            counters.joined += 1
            metrics.joined?.increment()
        }
        let (task, token) = interest(in: symbol, priority: priority)
        loading[symbol]?.urgency.escalate()
        // The load is not cancelled when the wait ends: the deadline cancels only its own wait.
        let detail: Detail
        do {
            detail = try await RESTDeadline.within(maxWait, { await task.value })
        } catch is RESTDeadline.TimedOut {
            // Left running for the cache (a retired one too: it still answers nobody, and ends).
            keep(symbol, token: token)
            counters.timedOut += 1
            metrics.timedOut?.increment()
            throw DetailUnavailable(
                reason: "\(symbol) is still loading after \(maxWait) (the account's REST budget may be spent); it stays loading, try again shortly",
                retryAfter: .seconds(5))
        } catch {
            // The request itself was cancelled: its interest goes like a prefetch's.
            withdraw(symbol, token: token)
            throw DetailUnavailable(reason: "the request for \(symbol) was cancelled", retryAfter: .seconds(1))
        }
        withdraw(symbol, token: token)
        return (detail, outcome)
    }

    /// Loads `symbol` into the cache unless it is there, joining a load under way; returns when the
    /// load finishes or this task is cancelled (then its interest is withdrawn at once).
    public func prefetch(_ symbol: String) async -> PrefetchOutcome {
        if contains(symbol) { return .cached }
        if loading[symbol] == nil, running * 2 >= maxLoads {
            counters.prefetchesDeferred += 1
            return .deferred
        }
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

    /// Whether asking for `symbol` now would start a load: no complete detail of it is cached and none
    /// is loading (a request then joins it).
    public func wouldLoad(_ symbol: String) -> Bool {
        !contains(symbol) && loading[symbol] == nil
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

    /// Loads running now: those that may still be joined and those the data changed under.
    public var running: Int { loading.count + retired.count }

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

    /// A request that waited past ``maxWait`` turns its interest into keeping the load going: nothing
    /// withdrawn after it cancels the load, which ends into the cache (or, retired, into nothing). A
    /// kept load nobody waits for is given ``keptFor`` to end; then it is cancelled, so loads stuck
    /// behind a spent REST budget do not hold every slot for as long as it stays spent.
    private func keep(_ symbol: String, token: UInt64) {
        guard let id = leave(symbol, token: token, keeping: true)?.id else { return }
        let keptFor = self.keptFor
        Task {
            try? await Task.sleep(for: keptFor)
            self.giveUp(id)
        }
    }

    /// A kept load still running past its time, and waited for by nobody, is cancelled.
    private func giveUp(_ id: UInt64) {
        if let (symbol, load) = loading.first(where: { $0.value.id == id }), load.interested.isEmpty {
            loading[symbol] = nil
            cancel(load)
        } else if let load = retired[id], load.interested.isEmpty {
            retired[id] = nil
            cancel(load)
        }
    }

    /// Withdraws one interest (again is harmless); the last one out cancels the load unless a request
    /// left it running (``keep(_:token:)``).
    private func withdraw(_ symbol: String, token: UInt64) {
        if let orphan = leave(symbol, token: token, keeping: false)?.orphan { cancel(orphan) }
    }

    /// Takes `token`'s interest out of the load it joined (still joinable under `symbol`, or retired
    /// since), marking that load kept when `keeping`. A load then wanted by nobody and not kept is
    /// taken out too, and returned as `orphan` for the caller to cancel. `nil`: the token holds no
    /// interest (any more).
    private func leave(_ symbol: String, token: UInt64, keeping: Bool) -> (id: UInt64, orphan: Load?)? {
        let retiredKey: UInt64?
        var load: Load
        if let current = loading[symbol], current.interested.contains(token) {
            retiredKey = nil
            load = current
        } else if let old = retired.first(where: { $0.value.interested.contains(token) }) {
            retiredKey = old.key
            load = old.value
        } else {
            return nil
        }
        load.interested.remove(token)
        if keeping { load.kept = true }
        let orphaned = load.interested.isEmpty && !load.kept
        if let retiredKey { retired[retiredKey] = orphaned ? nil : load } else { loading[symbol] = orphaned ? nil : load }
        return (load.id, orphaned ? load : nil)
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
        // Its slot is free, whether or not somebody still waits (a kept load nobody waits for ends here).
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
    public var refused: Counter?
    public var timedOut: Counter?
    public var prefetchesDeferred: Counter?

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
        refused = counter("relay_security_cache_requests_total", [("outcome", "refused_busy")])
        timedOut = counter("relay_security_cache_requests_total", [("outcome", "timed_out")])
        prefetchesDeferred = counter("relay_prefetches_total", [("event", "deferred")])
    }
}

/// A security's detail cannot be served now: too many loads run, or its load outlasted the request's
/// wait. Answered `503` with `Retry-After`.
public struct DetailUnavailable: Error, Sendable, Equatable, CustomStringConvertible {
    public var reason: String
    public var retryAfter: Duration

    public var description: String { reason }
}
