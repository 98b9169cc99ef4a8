/// What the hub hands a tap: every event it publishes, as it was received (the upstream's own bytes, not
/// the positions the hub writes into its copy), with its positions, before any subscriber is told; and,
/// in order with them, what decides whether those events are whole: the topics the hub began or stopped
/// receiving, and the upstream's losses (the tape's recorder is one). Called on the hub's executor: a
/// tap must return at once (queue and go), never wait, and never fail the hub.
public protocol EventTap: Sendable {
    /// `events` as received, positioned in `epoch` (`nil`: the hub keeps no positions): `positions[i]`
    /// is `events[i]`'s (`nil`: each event's own ``MarketEvent/sequence``, as a cluster node's adopted
    /// events carry, and no topic sequence).
    func take(_ events: [MarketEvent], positions: [EventPosition]?, epoch: String?)
    /// The hub began (`true`) or stopped receiving these topics (tickers, or wildcards `T.*`); `epoch`:
    /// the hub's now (its first subscribe comes before its first event).
    func wantedChanged(_ changes: [(topic: Topic, wanted: Bool)], epoch: String?)
    /// The upstream was lost: events after this may be missing until each topic is whole again.
    func interrupted(epoch: String?)
}

extension EventTap {
    /// Events that carry their own market sequences.
    public func take(_ events: [MarketEvent], epoch: String?) { take(events, positions: nil, epoch: epoch) }
}
