/// What a node makes of the lease's holder changing, as it reads it: whether the leader changed (another
/// node, or the same name in a new term: a node restarted under its name), and whether the term that
/// ended was another process's (then this node's clients are told events stopped; the end of this
/// process's own term is told by the control notice it publishes). Pure, `Sendable`.
struct LeaderChange: Equatable, Sendable {
    /// A lease holder as read: the node's name and its term (values of earlier versions name none).
    struct Holder: Equatable, Sendable {
        var node: String
        var term: String?
    }

    /// The leader is another one than before.
    var changed: Bool
    /// The same name, a new term.
    var newTerm: Bool
    /// There was a leader, and its term was not this process's own.
    var othersTermEnded: Bool

    /// - Parameters:
    ///   - me: this node's name; `ownTerm`: the term of this process's last lease, if it took one.
    init(from previous: Holder?, to next: Holder?, me: String, ownTerm: String?) {
        newTerm =
            previous != nil && next?.node == previous?.node && next?.term != nil && previous?.term != nil && next?.term != previous?.term
        changed = previous?.node != next?.node || newTerm
        if let previous {
            othersTermEnded = changed && (previous.node != me || (previous.term != nil && previous.term != ownTerm))
        } else {
            othersTermEnded = false
        }
    }
}

/// The holders of the last terms a node read in the lease, by term: a leader's positions epoch is its
/// term's name, so a new epoch's notice names the holder of the term it ended. Bounded: the oldest of
/// more than ``limit`` are forgotten.
struct TermHolders: Sendable {
    static let limit = 16
    private var holders: [String: String] = [:]
    private var order: [String] = []

    mutating func note(_ term: String, heldBy node: String) {
        guard holders.updateValue(node, forKey: term) == nil else { return }
        order.append(term)
        if order.count > Self.limit { holders[order.removeFirst()] = nil }
    }

    func holder(of term: String) -> String? { holders[term] }
}

/// Who held a term, as a node knows it.
enum TermHolder: Equatable, Sendable {
    /// This process (a node restarted under the same name is another process).
    case thisProcess
    case node(String)
}

/// The positions epochs a node hears the leader announce, and what it reads of terms in the lease.
/// Every term has a fresh name (its epoch), so an epoch that ended never comes back: a late
/// announcement of one (an old leader's last, delayed in NATS or sent before it knew its lease was
/// gone) is stale, not a new term, and would otherwise start a new history under the old epoch.
///
/// Only the lease ends a term: when it holds another term, or none. Announcements end nothing: a node
/// cannot tell a late old epoch it never read in the lease (it just started, or its NATS link was
/// down through that term) from a new one it has not read yet (it reads every 250 ms), and an
/// older-release leader's epoch is not its term. So no order of messages leaves a node refusing the
/// live leader (whose term the lease holds: never stale) or an older-release leader; a late old epoch
/// before the lease read is taken until the live leader's next announcement (before its next events,
/// at least a second after the last).
/// Bounded: the last ``limit`` terms that ended are remembered.
struct AnnouncedEpochs: Sendable {
    static let limit = 16

    enum Heard: Equatable, Sendable {
        /// The epoch this node is in.
        case current
        /// The first this node hears.
        case first
        /// Another than the one before (`ended`).
        case next(ended: String)
        /// One whose term ended already.
        case stale
    }

    private(set) var current: String?
    private var leaseTerm: String?
    private var ended: [String] = []
    /// The last read found a holder whose lease names no term (an older release): any epoch is its.
    private var termless = false

    /// Whether the lease vouches for `epoch` as read last: the term it holds (or any, while its holder
    /// names none), the epoch this node is in, or one it ended (``heard(_:)`` finds it stale). Another
    /// is a new leader's not read yet, or made up by whoever may publish control messages.
    func vouches(for epoch: String) -> Bool {
        termless || epoch == current || epoch == leaseTerm || ended.contains(epoch)
    }

    /// The lease is held by a node whose value names no term (an older release).
    mutating func leaseHeldWithoutTerm() {
        termless = true
    }

    mutating func heard(_ epoch: String) -> Heard {
        guard epoch != current else { return .current }
        guard !ended.contains(epoch) else { return .stale }
        defer { current = epoch }
        return current.map { .next(ended: $0) } ?? .first
    }

    /// The lease holds `term` now (`nil`: it holds none; a value that is not a relay node's lease, or
    /// names no term, says nothing and is not told).
    mutating func leaseRead(_ term: String?) {
        termless = false
        if let term { ended.removeAll { $0 == term } }
        guard term != leaseTerm else { return }
        if let leaseTerm, !ended.contains(leaseTerm) {
            ended.append(leaseTerm)
            if ended.count > Self.limit { ended.removeFirst() }
        }
        leaseTerm = term
    }
}
