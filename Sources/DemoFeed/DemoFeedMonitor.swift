import PolygonWire
import Synchronization

/// What the demo feed has seen of its clients: connections and every action they sent.
///
/// `Sendable`, state behind a `Mutex`. Tests use it to observe, at the feed, what the relay did
/// upstream: how many connections it holds, what it subscribed and unsubscribed.
public final class DemoFeedMonitor: Sendable {
    /// One action a client sent, in arrival order.
    public struct ObservedAction: Sendable, Equatable {
        public var connection: Int
        public var kind: ClientAction.Kind
        public var params: String
        /// The market path the connection is on.
        public var market: Market = .stocks
    }

    /// The counters and the action log at one moment.
    public struct Snapshot: Sendable {
        public var openConnections = 0
        /// The most connections that were ever open at once.
        public var maxOpenConnections = 0
        public var totalConnections = 0
        public var authenticatedConnections = 0
        /// The actions, oldest first: the newest of them (``record(_:)``).
        public private(set) var actions: [ObservedAction] = []
        /// Actions let go of, oldest first, to keep the log within ``maxActionBytes``.
        public private(set) var actionsLetGo = 0
        private var actionBytes = 0
        public var framesSent = 0
        public var eventsSent = 0

        /// The log's bound: a relay that runs on the demo feed for days, its clients churning topics,
        /// sends it actions without end. Past it the older half is let go.
        public static let maxActionBytes = 16 << 20

        /// Logs `action`.
        public mutating func record(_ action: ObservedAction) {
            actions.append(action)
            actionBytes += action.params.utf8.count + 64
            guard actionBytes > Self.maxActionBytes else { return }
            let drop = max(actions.count / 2, 1)
            actionBytes -= actions[..<drop].reduce(0) { $0 + $1.params.utf8.count + 64 }
            actions.removeFirst(drop)
            actionsLetGo += drop
        }

        /// Every topic named in a subscribe or unsubscribe, in order.
        public func topics(_ kind: ClientAction.Kind) -> [String] {
            actions.filter { $0.kind == kind }.flatMap { Topic.parseList($0.params).topics.map(\.description) }
        }
    }

    private struct State {
        var snapshot = Snapshot()
        var watchers: [Int: AsyncStream<Snapshot>.Continuation] = [:]
        var nextWatcher = 0
    }

    private let state = Mutex(State())

    public init() {}

    public var snapshot: Snapshot { state.withLock { $0.snapshot } }

    /// The current snapshot, then one after every change.
    public func updates() -> AsyncStream<Snapshot> {
        let (stream, continuation) = AsyncStream.makeStream(of: Snapshot.self, bufferingPolicy: .bufferingNewest(1))
        let id = state.withLock { state in
            let id = state.nextWatcher
            state.nextWatcher += 1
            state.watchers[id] = continuation
            continuation.yield(state.snapshot)
            return id
        }
        continuation.onTermination = { [weak self] _ in
            _ = self?.state.withLock { $0.watchers.removeValue(forKey: id) }
        }
        return stream
    }

    func update(_ change: (inout Snapshot) -> Void) {
        state.withLock { state in
            change(&state.snapshot)
            for watcher in state.watchers.values { watcher.yield(state.snapshot) }
        }
    }

    func countSent(frames: Int, events: Int) {
        state.withLock { state in
            state.snapshot.framesSent += frames
            state.snapshot.eventsSent += events
        }
    }
}
