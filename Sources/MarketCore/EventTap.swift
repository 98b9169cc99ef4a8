/// What the hub hands a tap: every event it publishes, once its position is given, in arrival order,
/// before any subscriber is told (the tape's recorder is one). Called on the hub's executor, inside
/// its publish: a tap must return at once (queue and go), never wait, and never fail the publish.
public protocol EventTap: Sendable {
    /// `events` positioned in `epoch` (`nil`: the hub keeps no positions).
    func take(_ events: [MarketEvent], epoch: String?)
}
