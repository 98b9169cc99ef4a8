import Logging

/// Runs the prefetches of one client: after it views a security, the window's neighbours are loaded
/// (nearest at once, the next after ``PrefetchWindow/delay``), prefetches that fall out of a new window
/// are cancelled, a new prefetch of a symbol replaces the old one, and ``cancelAll()`` (the client went
/// away) cancels everything. An actor.
public actor PrefetchCoordinator<Detail: Sendable> {
    private let cache: SecurityCache<Detail>
    private let logger: Logger
    /// Each symbol's prefetch and its generation, so a replaced one finishing late removes nothing.
    private var tasks: [String: (generation: UInt64, task: Task<Void, Never>)] = [:]
    private var generation: UInt64 = 0

    public struct Counters: Sendable, Equatable {
        public var started = 0
        public var cancelled = 0
    }

    public private(set) var counters = Counters()

    public init(cache: SecurityCache<Detail>, logger: Logger = Logger(label: "relay.prefetch")) {
        self.cache = cache
        self.logger = logger
    }

    /// The client now views `order[index]` (fully loaded): move the window there.
    public func viewed(order: [String], index: Int) async {
        let window = PrefetchWindow(order: order, viewing: index)
        for (symbol, entry) in tasks where !window.covered.contains(symbol) {
            entry.task.cancel()
            tasks[symbol] = nil
            counters.cancelled += 1
            logger.debug("prefetch cancelled: left the window", metadata: ["symbol": "\(symbol)"])
        }
        for symbol in window.immediate { await schedule(symbol, after: nil) }
        for symbol in window.delayed { await schedule(symbol, after: PrefetchWindow.delay) }
    }

    /// Symbols with a prefetch scheduled or running.
    public var pending: Set<String> { Set(tasks.keys) }

    /// Cancels every prefetch of this client.
    public func cancelAll() {
        for entry in tasks.values { entry.task.cancel() }
        counters.cancelled += tasks.count
        tasks.removeAll()
    }

    private func schedule(_ symbol: String, after delay: Duration?) async {
        guard await !cache.contains(symbol) else { return }
        if let old = tasks[symbol] {
            old.task.cancel()
            counters.cancelled += 1
        }
        counters.started += 1
        generation += 1
        let mine = generation
        let cache = self.cache
        let task = Task(priority: .low) {
            if let delay {
                do { try await Task.sleep(for: delay) } catch { return }
            }
            guard let load = await cache.prefetch(symbol) else { return }
            // Cancelling this prefetch cancels the load it started.
            await withTaskCancellationHandler {
                _ = await load.value
            } onCancel: {
                load.cancel()
            }
            self.finished(symbol, generation: mine)
        }
        tasks[symbol] = (mine, task)
    }

    private func finished(_ symbol: String, generation: UInt64) {
        if tasks[symbol]?.generation == generation { tasks[symbol] = nil }
    }
}
