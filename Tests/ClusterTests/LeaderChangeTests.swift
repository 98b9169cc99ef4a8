import Testing

@testable import Cluster

/// What a node tells its clients when the lease's holder changes as it reads it.
@Suite("Cluster lease: a change of leader, and who is told")
struct LeaderChangeTests {
    typealias Holder = LeaderChange.Holder

    @Test func anotherNodeTakingOverIsAChangeTheClientsAreToldOf() {
        let change = LeaderChange(from: Holder(node: "n1", term: "a"), to: Holder(node: "n2", term: "b"), me: "n3", ownTerm: nil)
        #expect(change.changed && !change.newTerm && change.othersTermEnded)
        #expect(LeaderChange(from: Holder(node: "n1", term: "a"), to: nil, me: "n3", ownTerm: nil).othersTermEnded)
    }

    @Test func aNodeRestartedUnderItsNameIsANewLeader() {
        // The lease lapsed and the restarted n1 took it again between two reads of n3's.
        let change = LeaderChange(from: Holder(node: "n1", term: "a"), to: Holder(node: "n1", term: "b"), me: "n3", ownTerm: nil)
        #expect(change.changed && change.newTerm && change.othersTermEnded)
        // The restarted process itself: the term that ended was its predecessor's.
        let own = LeaderChange(from: Holder(node: "n1", term: "a"), to: Holder(node: "n1", term: "b"), me: "n1", ownTerm: "b")
        #expect(own.changed && own.othersTermEnded)
    }

    @Test func renewalsAndThisProcesssOwnTermAreNoNews() {
        #expect(!LeaderChange(from: Holder(node: "n1", term: "a"), to: Holder(node: "n1", term: "a"), me: "n3", ownTerm: nil).changed)
        // Its own term ended: its control notice tells every node's clients, not this.
        let ended = LeaderChange(from: Holder(node: "n3", term: "c"), to: Holder(node: "n2", term: "d"), me: "n3", ownTerm: "c")
        #expect(ended.changed && !ended.othersTermEnded)
        #expect(!LeaderChange(from: nil, to: Holder(node: "n2", term: "d"), me: "n3", ownTerm: nil).othersTermEnded)
    }

    @Test func valuesOfAnEarlierVersionNameNoTerm() {
        #expect(!LeaderChange(from: Holder(node: "n1", term: nil), to: Holder(node: "n1", term: "b"), me: "n3", ownTerm: nil).changed)
        let ended = LeaderChange(from: Holder(node: "n3", term: nil), to: nil, me: "n3", ownTerm: "c")
        #expect(ended.changed && !ended.othersTermEnded)
    }

    /// A leader's epoch is named like its lease's term, so the term's holder as read in the lease is
    /// whom a new epoch's notice names (not the leader the node knows when the epoch arrives: it may
    /// have read the successor's lease first).
    @Test func aTermsHolderIsKnownByItsNameAndOnlyTheLastTermsAreKept() {
        var holders = TermHolders()
        holders.note("t1", heldBy: "n2")
        holders.note("t2", heldBy: "n1")
        holders.note("t1", heldBy: "n3")
        #expect(holders.holder(of: "t1") == "n3" && holders.holder(of: "t2") == "n1")
        #expect(holders.holder(of: "random-epoch") == nil, "an epoch of an earlier release's leader names no term")
        for n in 3...(2 + TermHolders.limit) { holders.note("t\(n)", heldBy: "n\(n)") }
        #expect(holders.holder(of: "t1") == nil && holders.holder(of: "t2") == nil, "the oldest forgotten")
        #expect(holders.holder(of: "t\(2 + TermHolders.limit)") != nil)
    }

    /// Every term has a fresh name: an epoch that ended and is announced again (an old leader's last
    /// announcement, late) is stale, and changes nothing.
    @Test func anEpochThatEndedAndIsAnnouncedLateIsStale() {
        var epochs = AnnouncedEpochs()
        epochs.leaseRead("t1")
        #expect(epochs.heard("t1") == .first)
        #expect(epochs.heard("t1") == .current)
        epochs.leaseRead("t2")
        #expect(epochs.heard("t1") == .current, "still t1's until t2's leader says so (in order with its events)")
        #expect(epochs.heard("t2") == .next(ended: "t1"))
        #expect(epochs.heard("t1") == .stale)
        #expect(epochs.current == "t2", "still in t2")
        // Only the last terms that ended are remembered.
        for n in 3...(2 + AnnouncedEpochs.limit) {
            epochs.leaseRead("t\(n)")
            #expect(epochs.heard("t\(n)") == .next(ended: "t\(n - 1)"))
        }
        #expect(epochs.heard("t2") == .stale && epochs.heard("t1") != .stale)
    }

    /// A node that never read the old term in the lease (just started) cannot tell its late announcement
    /// from a new term's: it takes it, but not as the end of the lease's term, whose next announcement
    /// takes the node back (the old one stale from then on).
    @Test func aLateOldEpochNeverEndsTheTermTheLeaseHolds() {
        var epochs = AnnouncedEpochs()
        epochs.leaseRead("t2")
        #expect(epochs.heard("t2") == .first)
        #expect(epochs.heard("t1") == .next(ended: "t2"))
        #expect(epochs.heard("t2") == .next(ended: "t1"), "the lease's term is not stale")
        #expect(epochs.heard("t1") == .stale)
    }

    /// The lease is the truth: a term it holds is never stale, even one a late announcement replaced
    /// before this node read the new term in the lease.
    @Test func aTermTheLeaseHoldsIsNeverStale() {
        var epochs = AnnouncedEpochs()
        epochs.leaseRead("t1")
        #expect(epochs.heard("t1") == .first)
        #expect(epochs.heard("t2") == .next(ended: "t1"), "t2 announced before this node read it in the lease")
        #expect(epochs.heard("t1") == .next(ended: "t2"), "t1 late, still the lease's as far as this node read")
        #expect(epochs.heard("t2") == .stale, "replaced by the lease's term")
        epochs.leaseRead("t2")
        #expect(epochs.heard("t2") == .next(ended: "t1"))
        #expect(epochs.heard("t1") == .stale)
    }
}
