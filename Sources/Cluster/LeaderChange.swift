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

/// The epochs a follower hears on the control subject, each with the leader it knew of when the epoch
/// was last announced: a new term's first notice names the leader whose term ended. (By the time the new
/// term's epoch arrives, the node may already have read the new leader's lease.)
struct EpochWatch: Equatable, Sendable {
    private var epoch: String?
    private var leader: String?

    /// Notes `epoch` as announced while `knownLeader` was the leader this node knew of. A new term after
    /// another returns the reason to tell the clients; the first epoch, and re-announcements, nil.
    mutating func heard(_ epoch: String, knownLeader: String?) -> String? {
        defer { (self.epoch, self.leader) = (epoch, knownLeader) }
        guard let previous = self.epoch, previous != epoch else { return nil }
        let old = (leader ?? knownLeader).map { "the cluster leader \($0) is gone" } ?? "the cluster's leader changed"
        return "\(old): a new term began; events between the last leader's and the new one's may be missing"
    }
}
