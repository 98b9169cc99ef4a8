import Testing

@testable import Tape

/// A run of wanted-set marks with no events between them, kept as what it says.
@Suite("Tape: a run of wanted marks, coalesced")
struct WantedMarkRunTests {
    func shown(_ run: WantedMarkRun) -> [String] {
        run.records().map { record in
            guard case .wanted(let topic, let wanted, let at) = record else { return "?" }
            return "\(wanted ? "+" : "-")\(topic)@\(at)"
        }
    }

    @Test func eachTopicKeepsItsFirstDropAndItsLastTakeInTheOrderTheyCame() {
        var run = WantedMarkRun(epoch: "e")
        run.add("Q.A", wanted: true, at: 1)  // taken and dropped: nothing
        run.add("Q.B", wanted: false, at: 2)  // dropped, taken, dropped: its first drop
        run.add("Q.C", wanted: false, at: 3)  // dropped and taken again: both
        run.add("Q.A", wanted: false, at: 4)
        run.add("Q.D", wanted: true, at: 5)  // taken, dropped, taken: its last take
        run.add("Q.B", wanted: true, at: 6)
        run.add("Q.D", wanted: false, at: 7)
        run.add("Q.C", wanted: true, at: 8)
        run.add("Q.B", wanted: false, at: 9)
        run.add("Q.D", wanted: true, at: 10)
        run.add("Q.E", wanted: true, at: 11)  // one change: itself
        #expect(shown(run) == ["-Q.B@2", "-Q.C@3", "+Q.C@8", "+Q.D@10", "+Q.E@11"])
        #expect(run.topicCount == 5)
    }
}
