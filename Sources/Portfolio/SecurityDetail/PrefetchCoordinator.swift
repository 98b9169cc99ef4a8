import Logging
import MarketCore

/// Runs the prefetches of one client: after it views a security, the window's neighbours are loaded
/// (nearest at once, the next after ``PrefetchWindow/delay``), at low priority; prefetches that fall
/// out of a new window are cancelled, and ``cancelAll()`` (the client went away) cancels everything.
/// A new prefetch of a symbol replaces one still waiting for its turn (a delayed one becoming
/// immediate); one already loading is kept, since replacing it would only restart the same fetch. An
/// actor; every decision is logged at debug level.
public actor PrefetchCoordinator<Detail: Sendable> {
    private let cache: SecurityCache<Detail>
    private let logger: Logger
    private let metrics: SecurityCacheMetrics
    /// Each symbol's prefetch and its generation, so a replaced one finishing late removes nothing.
    private var tasks: [String: (generation: UInt64, task: Task<Void, Never>, loading: Bool)] = [:]
    private var generation: UInt64 = 0
    /// Bumped by each ``moving(order:index:)``: a `viewed` of an older move is not where the client is.
    private var move: UInt64 = 0
    /// The client went away: nothing is scheduled any more.
    private var closed = false

    public struct Counters: Sendable, Equatable {
        public var started = 0
        public var completed = 0
        public var cancelled = 0
        /// Not started, or found done when its turn came: the symbol was cached already.
        public var skipped = 0
        /// Not started: half the cache's loads were running (``SecurityCache/PrefetchOutcome/deferred``).
        public var deferred = 0
    }

    public private(set) var counters = Counters()

    public init(cache: SecurityCache<Detail>, metrics: SecurityCacheMetrics = .none, logger: Logger = Logger(label: "relay.prefetch")) {
        self.cache = cache
        self.metrics = metrics
        self.logger = logger
    }

    /// The client asked for `order[index]`: prefetches outside its window are of no use any more and
    /// are cancelled at once, before that security even loads (freeing the data source for it).
    /// Returns the move, for ``viewed(order:index:move:)``.
    @discardableResult
    public func moving(order: [String], index: Int) -> UInt64 {
        move += 1
        cancelOutside(PrefetchWindow(order: order, viewing: index))
        return move
    }

    /// The client now views `order[index]`, fully loaded: move the window there and prefetch around it.
    /// Nothing happens when the client has moved on since (`move` is not the latest) or went away.
    public func viewed(order: [String], index: Int, move: UInt64? = nil) async {
        let current = move ?? self.move
        guard current == self.move, !closed else {
            logger.debug("no prefetch: the client moved on or left", metadata: ["symbol": "\(order[index])"])
            return
        }
        let window = PrefetchWindow(order: order, viewing: index)
        cancelOutside(window)
        for symbol in window.immediate {
            await schedule(symbol, after: nil, reason: "neighbour of \(order[index])", move: current)
        }
        for symbol in window.delayed {
            await schedule(symbol, after: PrefetchWindow.delay, reason: "second neighbour of \(order[index])", move: current)
        }
    }

    /// The client loaded, sorted or filtered a list: its first security is likely next.
    public func listed(order: [String]) async {
        guard let first = PrefetchWindow.firstOf(order) else { return }
        await schedule(first, after: nil, reason: "first of a new list", move: nil)
    }

    private func cancelOutside(_ window: PrefetchWindow) {
        for (symbol, entry) in tasks where !window.covered.contains(symbol) {
            cancel(symbol, entry.task, because: "left the window")
        }
    }

    /// Symbols with a prefetch scheduled or running.
    public var pending: Set<String> { Set(tasks.keys) }

    /// Cancels every prefetch of this client. With `closing`, the client went away for good: nothing
    /// is scheduled after this, not even by a request of its that was still loading.
    public func cancelAll(closing: Bool = false) {
        if closing { closed = true }
        for (symbol, entry) in tasks { cancel(symbol, entry.task, because: "the client went away") }
    }

    private func cancel(_ symbol: String, _ task: Task<Void, Never>, because reason: String) {
        task.cancel()
        tasks[symbol] = nil
        counters.cancelled += 1
        metrics.prefetchesCancelled?.increment()
        logger.debug("prefetch cancelled: \(reason)", metadata: ["symbol": "\(symbol)"])
    }

    /// - Parameter move: the move this prefetch belongs to (`nil`: any); checked after the cache was
    ///   asked, since the client may have moved on or left while this actor waited for it.
    private func schedule(_ symbol: String, after delay: Duration?, reason: String, move: UInt64?) async {
        guard !closed else { return }
        let isCached = await cache.contains(symbol)
        guard !closed, move.map({ $0 == self.move }) ?? true else {
            logger.debug("no prefetch: the client moved on or left", metadata: ["symbol": "\(symbol)", "reason": "\(reason)"])
            return
        }
        guard !isCached else {
            counters.skipped += 1
            metrics.prefetchesSkipped?.increment()
            logger.debug("prefetch skipped: cached", metadata: ["symbol": "\(symbol)", "reason": "\(reason)"])
            return
        }
        if let old = tasks[symbol] {
            if old.loading {
                logger.debug("prefetch kept: already loading", metadata: ["symbol": "\(symbol)", "reason": "\(reason)"])
                return
            }
            cancel(symbol, old.task, because: "replaced by a new prefetch")
        }
        counters.started += 1
        metrics.prefetchesStarted?.increment()
        logger.debug(
            "prefetch \(delay == nil ? "now" : "after \(delay?.milliseconds ?? 0) ms")",
            metadata: ["symbol": "\(symbol)", "reason": "\(reason)"])
        generation += 1
        let mine = generation
        let cache = self.cache
        let task = Task(priority: .low) {
            if let delay {
                do { try await Task.sleep(for: delay) } catch { return }
            }
            guard self.loading(symbol, generation: mine) else { return }
            let outcome = await cache.prefetch(symbol)
            self.finished(symbol, generation: mine, outcome)
        }
        tasks[symbol] = (mine, task, false)
    }

    /// Marks the prefetch as loading; `false` when it was cancelled or replaced meanwhile.
    private func loading(_ symbol: String, generation: UInt64) -> Bool {
        guard !Task.isCancelled, tasks[symbol]?.generation == generation else { return false }
        tasks[symbol]?.loading = true
        return true
    }

    private func finished(_ symbol: String, generation: UInt64, _ outcome: SecurityCache<Detail>.PrefetchOutcome) {
        switch outcome {
        case .loaded:
            counters.completed += 1
            metrics.prefetchesCompleted?.increment()
            logger.debug("prefetch completed", metadata: ["symbol": "\(symbol)"])
        case .cached:
            counters.skipped += 1
            metrics.prefetchesSkipped?.increment()
            logger.debug("prefetch skipped: cached by its turn", metadata: ["symbol": "\(symbol)"])
        case .cancelled:
            break  // counted when cancelled
        case .deferred:
            counters.deferred += 1
            metrics.prefetchesDeferred?.increment()
            logger.debug("prefetch not started: the loads' room is the requests'", metadata: ["symbol": "\(symbol)"])
        }
        if tasks[symbol]?.generation == generation { tasks[symbol] = nil }
    }
}
