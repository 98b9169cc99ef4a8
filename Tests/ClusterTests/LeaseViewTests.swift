import Testing

@testable import Cluster

/// When a node that took the lease may connect upstream: at once only when it watched the lease held
/// and then lapse or be released in the same bucket; otherwise a whole lease after its view began.
@Suite("Cluster lease: when a taken lease may connect upstream")
struct LeaseViewTests {
    let lease = Duration.seconds(5)
    let start = ContinuousClock.now

    func at(_ milliseconds: Int) -> ContinuousClock.Instant { start + .milliseconds(milliseconds) }

    @Test func aNodeThatSawTheLeaseHeldConnectsAtOnceWhenItLapses() {
        var view = LeaseView(hold: lease)
        view.read(revision: 7, holder: true, sentWith: 1, answeredWith: 1, at: at(0))
        view.read(revision: 8, holder: true, sentWith: 1, answeredWith: 1, at: at(1_000))
        view.read(revision: nil, holder: false, sentWith: 1, answeredWith: 1, at: at(6_000))
        #expect(view.upstreamAllowed(takenAt: 9, continuity: 1, now: at(6_100)) == at(6_100))
    }

    @Test func aNodeThatNeverSawTheLeaseHeldWaitsALeaseFromWhenItsViewBegan() {
        var view = LeaseView(hold: lease)
        view.read(revision: nil, holder: false, sentWith: 1, answeredWith: 1, at: at(0))
        view.read(revision: nil, holder: false, sentWith: 1, answeredWith: 1, at: at(250))
        // The bucket was new (revision 1), or emptied: a holder NATS forgot may still be connected.
        #expect(view.upstreamAllowed(takenAt: 1, continuity: 1, now: at(300)) == at(5_000))
        // Taken long after the view began: nothing to wait for.
        #expect(view.upstreamAllowed(takenAt: 1, continuity: 1, now: at(9_000)) == at(9_000))
    }

    @Test func aNATSReconnectBreaksTheView() {
        var view = LeaseView(hold: lease)
        view.read(revision: 40, holder: true, sentWith: 1, answeredWith: 1, at: at(0))
        // NATS restarted: the connection's continuity moved; the bucket came back empty.
        view.read(revision: nil, holder: false, sentWith: 2, answeredWith: 2, at: at(2_000))
        #expect(view.since == at(2_000) && !view.sawHolder)
        #expect(view.upstreamAllowed(takenAt: 1, continuity: 2, now: at(2_300)) == at(7_000))
    }

    @Test func aReadAnsweredAcrossAReconnectTellsNothing() {
        var view = LeaseView(hold: lease)
        view.read(revision: 40, holder: true, sentWith: 1, answeredWith: 2, at: at(0))
        #expect(view.since == nil && !view.sawHolder)
    }


    @Test func aRevisionGoingBackMeansANewBucket() {
        var view = LeaseView(hold: lease)
        view.read(revision: 40, holder: true, sentWith: 1, answeredWith: 1, at: at(0))
        // The create landed at or below a revision already read: another bucket than the one watched.
        #expect(view.upstreamAllowed(takenAt: 3, continuity: 1, now: at(500)) == at(5_500))
        // A read that goes back restarts the view there.
        view.read(revision: 2, holder: true, sentWith: 1, answeredWith: 1, at: at(600))
        #expect(view.since == at(600) && view.highestRevision == 2)
    }

    /// One read of the bucket at 0 ms, then a take: when the upstream may open (ms).
    struct TakeCase: Sendable, CustomTestStringConvertible {
        let testDescription: String
        let revision: UInt64
        let holder: Bool
        var reset = false
        let takenAt: UInt64
        let continuity: UInt64
        let now: Int
        let allowed: Int
    }

    @Test(arguments: [
        // A reconnect between the read and the take: the view no longer counts, a lease from the take.
        TakeCase(testDescription: "a take across a reconnect", revision: 40, holder: true, takenAt: 41, continuity: 2, now: 1_000, allowed: 6_000),
        // A value no relay node wrote is no holder: a lease from the read.
        TakeCase(testDescription: "a value no node wrote", revision: 5, holder: false, takenAt: 6, continuity: 1, now: 100, allowed: 5_000),
        // Without a view (reset), a lease from the take.
        TakeCase(testDescription: "no view", revision: 5, holder: true, reset: true, takenAt: 6, continuity: 1, now: 100, allowed: 5_100),
    ])
    func whenATakeMayOpenTheUpstream(_ take: TakeCase) {
        var view = LeaseView(hold: lease)
        view.read(revision: take.revision, holder: take.holder, sentWith: 1, answeredWith: 1, at: at(0))
        if take.reset { view.reset() }
        #expect(view.upstreamAllowed(takenAt: take.takenAt, continuity: take.continuity, now: at(take.now)) == at(take.allowed))
    }
}
