import Synchronization
import Testing

@testable import RelayServer

@Suite("Admission: the places a connection takes, given back together")
struct AdmissionTests {
    @Test func aRefusalGivesBackEveryPlaceTakenBeforeItAndAnAdmittedConnectionGivesBackAllWhenItGoes() {
        let given = Mutex<[String]>([])
        let refusal = ConnectionRefusal(message: "over", reason: "limit")

        var refused = Admission()
        #expect(refused.take(nil) { given.withLock { $0.append("address") } } == nil)
        #expect(refused.take(nil) { given.withLock { $0.append("key") } } == nil)
        #expect(given.withLock { $0 }.isEmpty, "a place is held until given back")
        #expect(refused.take(refusal) { given.withLock { $0.append("push") } }?.reason == "limit")
        #expect(given.withLock { $0 } == ["key", "address"], "the places taken, the last first; not the refused one's")
        refused.release()
        #expect(given.withLock { $0 } == ["key", "address"], "nothing given back twice")

        given.withLock { $0 = [] }
        var admitted = Admission()
        for place in ["address", "key", "push"] { #expect(admitted.take(nil) { given.withLock { $0.append(place) } } == nil) }
        admitted.release()
        #expect(given.withLock { $0 } == ["push", "key", "address"])
    }
}
