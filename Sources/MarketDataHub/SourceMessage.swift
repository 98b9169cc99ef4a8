import AsyncSupport
import MarketCore
import NIOCore

/// What a source (an upstream connection, a cluster node's NATS feed) hands its market's hub, in the
/// order it happened, so a consumer can tell events before a gap from events after it. Value type,
/// `Sendable`.
public enum SourceMessage: Sendable {
    /// Events, in order (one upstream message's, or a run of them).
    case events([MarketEvent])
    /// The source is (re)authenticated: events for the wanted topics follow.
    case authenticated
    /// The source lost its connection (not by shutdown); it comes back by itself.
    case connectionLost(reason: String)
    /// A topic's last event from elsewhere (a cluster's last-value store), for a subscriber that has none.
    case seed(MarketEvent)
    /// Events lost before they reached this relay, for the reason given (`topics` `nil`: too many to list).
    case lost(count: Int, topics: Set<Topic>?, reason: String)
    /// The upstream refused these topics (e.g. Alpaca's 405 symbol limit): their subscribers are told.
    case refused(topics: Set<Topic>, code: Int, reason: String)
    /// The positions that follow belong to this epoch (a cluster leader's term).
    case epoch(String)
    /// A cluster node read in the lease that its leader had stamped the epoch's events through this
    /// market sequence: for `freshFor`, an event whose position leaps far past it is not the leader's
    /// (``MarketDataHub/leaderStamped(through:epoch:freshFor:)``). The node's own reading, at most one a
    /// renewal of the lease.
    case leaderStamped(epoch: String, through: UInt64, freshFor: Duration)
    /// A cluster leader's gap fill: recovered events of one topic, oldest first, with the leader's
    /// positions (``MarketDataHub/deliverRecovered(_:_:order:)``).
    case recovered(topic: Topic, events: [MarketEvent], order: RecoveryOrder)
    /// The source says what it is to every subscriber (a replay's start and end).
    case notice(Notice)
    /// A cluster leader's gap fill answered this node's requests up to `generation`.
    case recoveryEnded(RecoveryEnd, generation: Int)

    /// The events, if this is `.events`.
    public var events: [MarketEvent]? {
        if case .events(let events) = self { return events }
        return nil
    }
}

/// The events a ``SourceInbox`` dropped: how many, and their topics (`nil` once more than 1,000
/// different ones).
public struct DroppedEvents: Sendable {
    public var count = 0
    public var topics: Set<Topic>? = []

    public init() {}
}

/// The one queue from a source's thread to its hub: bounded by events and their bytes (``weight(of:)``),
/// ordered, losses counted and reported in place (``BoundedInbox``). Consecutive events merge into one item (up to 256), so a source
/// that hands over one event at a time (NATS) costs one queued item per run. Control messages (an
/// outage, a loss, a refusal, a new term) are bounded too, at ``maxControlMessages`` queued: whoever
/// sends them (an upstream's error frames, a publisher on the cluster's NATS) may send them faster than
/// the hub takes them, and each costs the hub a pass over its subscribers. Past the bound they are
/// dropped, and one outage in their place tells the subscribers that events may be missing.
public typealias SourceInbox = BoundedInbox<SourceMessage, DroppedEvents>

extension BoundedInbox where Element == SourceMessage, Loss == DroppedEvents {
    /// Control messages queued at once, at most (a source sends a few in a minute).
    public static var maxControlMessages: Int { 4_096 }

    /// What events weigh against a source inbox's capacity: one each, and one more for each whole 4 KB
    /// of an event's bytes. A capacity of 100,000 is then 100,000 events of a vendor's usual size (a
    /// hundred bytes or so), or some 400 MB of large ones, not 100,000 of 64 KB each (6.4 GB: a NATS
    /// publisher's or an upstream's while the hub is held up). Weighed event by event, so a run's
    /// weight is its parts' (the inbox weighs a run merged from pushes when it is taken).
    @inlinable
    public static func weight(of events: [MarketEvent]) -> Int {
        var weight = events.count
        for event in events { weight &+= event.bytes.readableBytes >> 12 }
        return weight
    }

    /// A source inbox holding at most `capacity` events and ``maxControlMessages`` control messages
    /// (a seed is neither: the node asks for those itself, as its wanted topics change).
    public static func source(capacity: Int) -> SourceInbox {
        SourceInbox(
            capacity: capacity, emptyLoss: DroppedEvents(),
            weight: { message in
                switch message {
                case .events(let events), .recovered(_, let events, _): weight(of: events)
                default: 0
                }
            },
            noteDrop: { dropped, message in
                switch message {
                case .events(let events):
                    dropped.count += events.count
                    guard dropped.topics != nil else { return }
                    for event in events { dropped.topics?.insert(event.topic) }
                case .recovered(let topic, let events, _):
                    dropped.count += events.count
                    dropped.topics?.insert(topic)
                default: return
                }
                if (dropped.topics?.count ?? 0) > 1_000 { dropped.topics = nil }
            },
            merge: { last, next in
                // Not into an empty `.events` (a control element for the bound): only runs of events merge.
                guard case .events(let more) = next, case .events(var events) = last, !events.isEmpty, events.count < 256 else { return false }
                last = .authenticated  // releases `last`'s reference: `events` is now the only one
                events += more
                last = .events(events)
                return true
            },
            controlBound: (
                maxControlMessages,
                // A seed is the node's own asking (bounded by its wanted topics), and dropping one would
                // tell its holders of a loss that did not happen; so is what the lease said (one a second).
                { message in
                    switch message {
                    case .seed, .leaderStamped: return false
                    default: return true
                    }
                },
                { dropped in
                    let counted = dropped == 1 ? "1 control message was" : "\(dropped) control messages were"
                    return .connectionLost(
                        reason: "\(counted) dropped from the source: they came faster than the relay took them; events may be missing")
                }
            ))
    }
}

/// A gap fill's results into a source's inbox, in order with the source's events: the fill reaches the
/// hub through the same door as everything else the source brings (``HubPump``). `inbox` gives the
/// source's inbox once it exists (`nil`: none, and the results go nowhere). Each part waits until the
/// inbox is less than half full, so a large fill never crowds out the live events sharing it: it goes
/// at the pace the hub takes it, as when it called the hub itself. `Sendable`.
public struct InboxOutlet: RecoveryOutlet {
    private let inbox: @Sendable () async -> SourceInbox?

    public init(_ inbox: @escaping @Sendable () async -> SourceInbox?) {
        self.inbox = inbox
    }

    public func deliverRecovered(_ topic: Topic, _ events: [MarketEvent], order: RecoveryOrder) async -> Int {
        guard let inbox = await inbox(), await inbox.push(.recovered(topic: topic, events: events, order: order), waitingBelow: inbox.capacity / 2)
        else { return 0 }
        return events.count
    }

    public func announceRecovered(_ summary: GapFillSummary, generation: Int) async {
        _ = await inbox()?.push(.recoveryEnded(.filled(summary), generation: generation))
    }

    public func noteFillSkipped(generation: Int) async {
        _ = await inbox()?.push(.recoveryEnded(.skipped, generation: generation))
    }

    public func finishFill(generation: Int) async {
        _ = await inbox()?.push(.recoveryEnded(.nothing, generation: generation))
    }
}
