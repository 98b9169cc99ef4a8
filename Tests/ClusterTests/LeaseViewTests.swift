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

    @Test func aTakeAcrossAReconnectWaitsALeaseFromTheTake() {
        var view = LeaseView(hold: lease)
        view.read(revision: 40, holder: true, sentWith: 1, answeredWith: 1, at: at(0))
        #expect(view.upstreamAllowed(takenAt: 41, continuity: 2, now: at(1_000)) == at(6_000))
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

    @Test func aValueNoRelayNodeWroteIsNoHolder() {
        var view = LeaseView(hold: lease)
        view.read(revision: 5, holder: false, sentWith: 1, answeredWith: 1, at: at(0))
        #expect(view.upstreamAllowed(takenAt: 6, continuity: 1, now: at(100)) == at(5_000))
    }

    @Test func withoutAViewANodeWaitsALeaseFromTheTake() {
        var view = LeaseView(hold: lease)
        view.read(revision: 5, holder: true, sentWith: 1, answeredWith: 1, at: at(0))
        view.reset()
        #expect(view.upstreamAllowed(takenAt: 6, continuity: 1, now: at(100)) == at(5_100))
    }
}
