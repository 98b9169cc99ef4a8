import Logging

/// Security details, at most `capacity` of them, least recently used evicted first.
///
/// An actor, generic over the detail type so the cache's rules are tested apart from how details are
/// loaded. A request for a symbol that is being loaded joins that load (one fetch, however many ask);
/// prefetched entries count against the capacity like any other; an entry counts as cached only once
/// `isComplete` says so (a detail with a failed group is served but loaded again next time).
public actor SecurityCache<Detail: Sendable> {
    public let capacity: Int
    private let load: @Sendable (String) async -> Detail
    private let isComplete: @Sendable (Detail) -> Bool
    private let logger: Logger
    private var entries: [String: (detail: Detail, used: UInt64)] = [:]
    private var loading: [String: Task<Detail, Never>] = [:]
    private var clock: UInt64 = 0

    /// What happened so far, for metrics and tests.
    public struct Counters: Sendable, Equatable {
        public var hits = 0
        public var misses = 0
        public var joined = 0
        public var evictions = 0
        public var loads = 0
    }

    public private(set) var counters = Counters()
    /// Symbols evicted, oldest eviction first (tests read the order).
    public private(set) var evicted: [String] = []

    public init(
        capacity: Int = 10, logger: Logger = Logger(label: "relay.security-cache"),
        isComplete: @escaping @Sendable (Detail) -> Bool = { _ in true },
        load: @escaping @Sendable (String) async -> Detail
    ) {
        self.capacity = max(1, capacity)
        self.load = load
        self.isComplete = isComplete
        self.logger = logger
    }

    /// The detail of `symbol`: from the cache when complete, else from the load under way, else loaded
    /// now. Cancelling the caller does not cancel a load others may share.
    public func detail(_ symbol: String, priority: TaskPriority? = nil) async -> Detail {
        if let entry = entries[symbol], isComplete(entry.detail) {
            counters.hits += 1
            touch(symbol)
            return entry.detail
        }
        if let task = loading[symbol] {
            counters.joined += 1
            return await task.value
        }
        counters.misses += 1
        return await start(symbol, priority: priority).value
    }

    /// Loads `symbol` into the cache unless it is there or on its way; the returned task can be
    /// cancelled (the load sees the cancellation). `nil` when there is nothing to do.
    @discardableResult
    public func prefetch(_ symbol: String) -> Task<Detail, Never>? {
        if let entry = entries[symbol], isComplete(entry.detail) { return nil }
        if loading[symbol] != nil { return nil }
        logger.debug("prefetch", metadata: ["symbol": "\(symbol)"])
        return start(symbol, priority: .low)
    }

    /// Whether a complete detail of `symbol` is cached.
    public func contains(_ symbol: String) -> Bool {
        entries[symbol].map { isComplete($0.detail) } ?? false
    }

    /// Cached symbols, most recently used first.
    public var symbols: [String] { entries.sorted { $0.value.used > $1.value.used }.map(\.key) }

    private func start(_ symbol: String, priority: TaskPriority?) -> Task<Detail, Never> {
        counters.loads += 1
        let load = self.load
        let task = Task(priority: priority) {
            let detail = await load(symbol)
            self.finish(symbol, detail)
            return detail
        }
        loading[symbol] = task
        return task
    }

    private func finish(_ symbol: String, _ detail: Detail) {
        loading[symbol] = nil
        clock += 1
        entries[symbol] = (detail, clock)
        while entries.count > capacity, let oldest = entries.min(by: { $0.value.used < $1.value.used })?.key {
            entries[oldest] = nil
            evicted.append(oldest)
            counters.evictions += 1
            logger.debug("evicted", metadata: ["symbol": "\(oldest)"])
        }
    }

    private func touch(_ symbol: String) {
        clock += 1
        entries[symbol]?.used = clock
    }
}
