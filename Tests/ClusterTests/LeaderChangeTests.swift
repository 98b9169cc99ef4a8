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

    @Test func aNewTermsEpochNamesTheLeaderWhoseTermEndedEvenWhenTheNewOneIsKnownFirst() {
        var watch = EpochWatch()
        #expect(watch.heard("e1", knownLeader: "n2") == nil, "the first epoch is no news")
        #expect(watch.heard("e1", knownLeader: "n2") == nil, "nor is its re-announcement")
        // n2 was killed; this node read n1's lease before n1's first epoch came.
        let reason = watch.heard("e2", knownLeader: "n1")
        #expect(reason?.contains("the cluster leader n2 is gone") == true, "\(reason ?? "no reason")")
        // n1's next announcement notes n1 as the leader of e2: its end names n1.
        #expect(watch.heard("e2", knownLeader: "n1") == nil)
        #expect(watch.heard("e3", knownLeader: "n3")?.contains("n1 is gone") == true)
        // A leader no one knew of.
        var fresh = EpochWatch()
        _ = fresh.heard("a", knownLeader: nil)
        #expect(fresh.heard("b", knownLeader: nil)?.hasPrefix("the cluster's leader changed") == true)
    }
}
