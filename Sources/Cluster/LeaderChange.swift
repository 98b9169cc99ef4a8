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
