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

    /// Every term has a fresh name: an epoch whose term the lease showed ended, announced again (an old
    /// leader's last announcement, late), is stale and changes nothing.
    @Test func anEpochWhoseTermEndedAndIsAnnouncedLateIsStale() {
        var epochs = AnnouncedEpochs()
        epochs.leaseRead("t1")
        #expect(epochs.heard("t1") == .first)
        #expect(epochs.heard("t1") == .current)
        epochs.leaseRead("t2")
        #expect(epochs.heard("t1") == .current, "still t1's until t2's leader says so (in order with its events)")
        #expect(epochs.heard("t2") == .next(ended: "t1"))
        #expect(epochs.heard("t1") == .stale)
        #expect(epochs.current == "t2", "still in t2")
        // A lease found empty: the term it held ended.
        epochs.leaseRead(nil)
        #expect(epochs.heard("t2") == .current)
        #expect(epochs.heard("t3") == .next(ended: "t2"))
        #expect(epochs.heard("t2") == .stale)
        // Only the last terms that ended are remembered.
        epochs.leaseRead("t3")
        for n in 4...(3 + AnnouncedEpochs.limit) {
            epochs.leaseRead("t\(n)")
            #expect(epochs.heard("t\(n)") == .next(ended: "t\(n - 1)"))
        }
        #expect(epochs.heard("t3") == .stale && epochs.heard("t1") != .stale)
    }

    /// These orders of announcements and lease reads leave no node refusing the live leader for longer
    /// than a wrong lease read lasts: a late old epoch it never read in the lease, or one announced
    /// before it read the new term there, is taken until the live leader's next announcement; an
    /// older-release leader's epoch is no term at all.
    @Test func theLiveLeaderIsRefusedOnlyWhileALeaseReadIsWrong() {
        // Just started: the lease read at t2, then t2, then t1 late (never read in the lease).
        var started = AnnouncedEpochs()
        started.leaseRead("t2")
        #expect(started.heard("t2") == .first)
        #expect(started.heard("t1") == .next(ended: "t2"))
        #expect(started.heard("t2") == .next(ended: "t1"), "the lease's term is never stale")
        // t2 announced before this node read it in the lease, then t1 late.
        var racing = AnnouncedEpochs()
        racing.leaseRead("t1")
        #expect(racing.heard("t1") == .first)
        #expect(racing.heard("t2") == .next(ended: "t1"))
        #expect(racing.heard("t1") == .next(ended: "t2"), "not read as ended yet")
        #expect(racing.heard("t2") == .next(ended: "t1"), "t2 is no term that ended")
        racing.leaseRead("t2")
        #expect(racing.heard("t1") == .stale)
        // An older-release leader (its epoch is random, its lease names no term, so it is not told)
        // after t1, and t1 late: the older leader's epoch is never stale.
        var upgrading = AnnouncedEpochs()
        upgrading.leaseRead("t1")
        #expect(upgrading.heard("t1") == .first)
        #expect(upgrading.heard("r") == .next(ended: "t1"))
        #expect(upgrading.heard("t1") == .next(ended: "r"))
        #expect(upgrading.heard("r") == .next(ended: "t1"))
        // A read that showed another term while t1's leader still leads (a lease bucket NATS made
        // again): t1 is refused only until a read shows it again.
        var misread = AnnouncedEpochs()
        misread.leaseRead("t1")
        #expect(misread.heard("t1") == .first)
        misread.leaseRead("x")
        #expect(misread.heard("t1") == .current, "the epoch it is in stays")
        #expect(misread.heard("y") == .next(ended: "t1"))
        #expect(misread.heard("t1") == .stale, "a lease naming another term ended t1")
        misread.leaseRead("t1")
        #expect(misread.heard("t1") == .next(ended: "y"), "the lease holds t1 again: live")
    }

    /// The lease vouches for its own term, the epoch a node is in and an ended one (which is then
    /// stale), and for any while its holder names no term (an older release); not for another.
    @Test func theLeaseVouchesOnlyForItsTermTheCurrentEpochAndAnyOfAnOlderRelease() {
        var epochs = AnnouncedEpochs()
        #expect(!epochs.vouches(for: "t1"), "no lease read yet")
        epochs.leaseRead("t1")
        #expect(epochs.vouches(for: "t1") && !epochs.vouches(for: "forged"))
        #expect(epochs.heard("t1") == .first)
        epochs.leaseRead("t2")
        #expect(epochs.vouches(for: "t1"), "the epoch it is in, until t2's leader says so")
        #expect(epochs.vouches(for: "t2") && !epochs.vouches(for: "forged"))
        #expect(epochs.heard("t2") == .next(ended: "t1"))
        #expect(epochs.vouches(for: "t1") && epochs.heard("t1") == .stale)
        epochs.leaseHeldWithoutTerm()
        #expect(epochs.vouches(for: "random"), "an older release's lease names no term")
        epochs.leaseRead(nil)
        #expect(!epochs.vouches(for: "random") && epochs.vouches(for: "t2"))
    }
}
