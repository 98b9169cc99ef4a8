/// What a market's previous run of the relay left for its next start to go on from (the tape's is
/// one): the epoch its positions counted in, the last market sequence it gave, when it stopped, and
/// its recent events with what decides whether they are whole, read back in order. A hub that goes on
/// from it keeps the epoch, rebuilds its recent history from the steps, and answers a resume from
/// before the restart with what the run received, then a `gap` naming the time it was down.
///
/// After a crash some positions clients hold may never have been written: counting on from the last
/// recorded would give those numbers to other events, so the numbers leap past what the run reserved
/// before giving them. `Sendable`; its ``steps()`` may block on the disk (called once, at start).
public protocol PriorRun: Sendable {
    /// The epoch its positions count in.
    var epoch: String { get }
    /// The last market sequence it gave (the next start's positions go on past it).
    var lastMarketSequence: UInt64 { get }
    /// When it stopped (Unix ms): nothing was received from then until the next start (after a crash:
    /// the last it recorded).
    var stoppedAt: Int64 { get }
    /// Whether it stopped cleanly (everything it gave is in it). After a crash, ``lastMarketSequence``
    /// is past every number it may have given (reserved ahead), and every topic's numbers leap past it.
    var clean: Bool { get }
    associatedtype Steps: IteratorProtocol<PriorRunStep>
    /// Its recent steps, oldest first, read as they are asked for.
    func steps() -> Steps
}

/// One thing a previous run did, as a restart replays it into its history.
public enum PriorRunStep {
    /// Events as received (the upstream's bytes), their positions, and when each arrived (Unix ms):
    /// `positions[i]` and `arrivedAt[i]` are `events[i]`'s.
    case events([MarketEvent], [EventPosition], arrivedAt: [Int64])
    /// It began (`true`) or stopped receiving a topic (a ticker, or a wildcard).
    case wanted(Topic, Bool, at: Int64)
    /// Everything it received then (a wildcard stands for its type): what was wanted where the reading starts.
    case holding([Topic], at: Int64)
    /// Events may have been missed here (its upstream was lost, or its recording has a hole).
    case interrupted(at: Int64)
}
