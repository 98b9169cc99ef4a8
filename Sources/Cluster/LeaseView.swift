/// What one node has seen of its market's lease key without a break, and so how soon a lease it takes
/// may open the upstream connection. Value type; the lease loop's own.
///
/// The lease's TTL keeps two upstream connections apart: a holder closes its upstream connection at
/// most 3/5 of the lease after it sent its last successful renewal (its upstream client's own deadline),
/// and the key lapses only a whole lease after that write. That holds while the bucket keeps its
/// values. A bucket can lose them at once — NATS restarted with the bucket in memory, or its stream lost
/// with its server — and then the key is absent while the last holder, cut off from NATS or not yet
/// told, may still be connected upstream. A node cannot tell that absence from a lapse unless it has
/// watched the key without a break, so:
///
/// - a node that, in an unbroken view, saw the key held by a relay node's lease takes a lease that
///   lapsed or was released in that same bucket: it connects at once (a lapse comes a whole lease after
///   the holder's last write; a release comes after the holder closed its upstream and after its own
///   wait below was over);
/// - any other node — just started, back on NATS, after a failed read, or one that saw the revision go
///   back (a new bucket) — connects only a whole lease after its view began: every holder of a lost
///   bucket wrote its last renewal before that bucket was lost, so before this view began, and has
///   closed its upstream by then.
///
/// A view breaks with each new NATS connection or reconnect (``NATSConnection/continuity``), each read
/// that fails, each bucket bound again, and each term of this node's own. What this cannot cover is a
/// writer with NATS permissions deleting the key (README: NATS security).
struct LeaseView: Sendable, Equatable {
    /// How long a node waits after its view began: the lease (a holder's upstream lasts at most 3/5 of it
    /// after its last renewal).
    let hold: Duration
    /// When the unbroken view began (the first read of it answered); `nil`: no view.
    private(set) var since: ContinuousClock.Instant?
    /// The NATS connection's continuity when the view began.
    private(set) var continuity: UInt64 = 0
    /// The highest revision of the key read in this view.
    private(set) var highestRevision: UInt64 = 0
    /// Whether this view saw the key held by a relay node's lease.
    private(set) var sawHolder = false

    init(hold: Duration) {
        self.hold = hold
    }

    /// The view breaks (a read failed, the bucket was bound again, this node's term ended).
    mutating func reset() {
        since = nil
        continuity = 0
        highestRevision = 0
        sawHolder = false
    }

    /// A read of the key answered at `now`: its revision if it has a value, and whether that value is a
    /// relay node's lease. `sentWith` and `answeredWith` are the NATS connection's continuity before the
    /// read was sent and after it was answered: a read across a break tells nothing (which side answered?).
    mutating func read(
        revision: UInt64?, holder: Bool, sentWith: UInt64, answeredWith continuity: UInt64, at now: ContinuousClock.Instant
    ) {
        guard sentWith == continuity else { return reset() }
        if since != nil, continuity != self.continuity || (revision ?? .max) < highestRevision { reset() }
        if since == nil {
            since = now
            self.continuity = continuity
        }
        if let revision {
            highestRevision = max(highestRevision, revision)
            if holder { sawHolder = true }
        }
    }

    /// This node took the lease with revision `revision` (the create answered at `now`, the connection's
    /// continuity then `continuity`): the instant from which it may connect upstream. A create whose
    /// revision is not above every one this view read went to another bucket (this one was lost).
    func upstreamAllowed(takenAt revision: UInt64, continuity: UInt64, now: ContinuousClock.Instant) -> ContinuousClock.Instant {
        guard let since, continuity == self.continuity, revision > highestRevision else { return now + hold }
        return sawHolder ? now : max(now, since + hold)
    }
}
