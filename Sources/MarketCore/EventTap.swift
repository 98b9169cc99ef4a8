/// What the hub hands a tap: every event it publishes, as it was received (the upstream's own bytes, not
/// the positions the hub writes into its copy), with its place in the market's arrival order, before any
/// subscriber is told (the tape's recorder is one). Called on the hub's executor, inside its publish: a
/// tap must return at once (queue and go), never wait, and never fail the publish.
public protocol EventTap: Sendable {
    /// `events` as received, positioned in `epoch` (`nil`: the hub keeps no positions): their market
    /// sequences run on from `firstSequence` one by one (`0`: each event's own ``MarketEvent/sequence``,
    /// as a cluster node's adopted events carry).
    func take(_ events: [MarketEvent], firstSequence: UInt64, epoch: String?)
}

extension EventTap {
    /// Events that carry their own market sequences.
    public func take(_ events: [MarketEvent], epoch: String?) { take(events, firstSequence: 0, epoch: epoch) }
}
