import MarketCore
import Synchronization

/// The topics a hub wants, handed from the hub's callback (``MarketDataHub``'s `onWantedTopicsChange`)
/// to whatever asks the source for them: the upstream client of a single relay, or a cluster node.
///
/// `Sendable`, state behind a `Mutex`. The hub is made before its source, so this sits between them.
public final class LocalInterest: Sendable {
    private struct State {
        var topics: Set<Topic> = []
        var listener: (@Sendable (Set<Topic>) -> Void)?
    }

    private let state = Mutex(State())

    public init() {}

    /// Called by the hub (on the hub) with what joined and left its wanted set: applied in place.
    public func apply(_ change: WantedTopicsChange) {
        let (listener, topics) = state.withLock { state in
            change.apply(to: &state.topics)
            return (state.listener, state.topics)
        }
        listener?(topics)
    }

    /// Replaces the wanted set.
    public func set(_ topics: Set<Topic>) {
        let listener = state.withLock { state in
            state.topics = topics
            return state.listener
        }
        listener?(topics)
    }

    public var topics: Set<Topic> { state.withLock { $0.topics } }

    /// Calls `listener` with the current set now and with every new set after.
    public func listen(_ listener: @escaping @Sendable (Set<Topic>) -> Void) {
        let topics = state.withLock { state in
            state.listener = listener
            return state.topics
        }
        listener(topics)
    }
}
