import NIOCore
import PolygonWire
import Testing

@testable import MarketDataHub

/// One resume's gathering as a plain value: what each topic finds, what is given up past the bound,
/// and what each `gap` says, without a hub.
@Suite("Resume gathering: each topic whole or a gap, within the bound")
struct ResumeGatheringTests {
    private func topic(_ text: String) -> Topic { Topic(parsing: text)! }

    /// A history holding, for each of `counts`' tickers, that many `T` events, published round by round.
    private func history(_ counts: [String: Int]) -> EventHistory {
        let history = EventHistory(limits: HistoryLimits(), epoch: "e")
        for ticker in counts.keys { history.wanted(topic("T.\(ticker)"), now: 0) }
        history.wanted(topic("T.*"), now: 0)
        for round in 1...(counts.values.max() ?? 0) {
            let events = counts.keys.sorted().filter { counts[$0]! >= round }.map { event("T", $0, round) }
            _ = history.keep(events, at: Int64(round))
        }
        return history
    }

    @Test func theLargestTopicsAreGivenUpWholeAndTheRestReplayedInArrivalOrderOnce() {
        let history = history(["A": 3, "B": 4, "C": 1, "D": 5])
        var gathering = ResumeGathering(epoch: "e", limit: 4, resumeBound: 4, queued: 0)
        for ticker in ["A", "B", "C", "D"] {
            gathering.missed(topic("T.\(ticker)"), since: .topic(0), archived: nil, history: history, now: 10)
        }
        var outcome = HubResumeOutcome()
        let (replay, former) = gathering.trim(into: &outcome)
        #expect(outcome.replayed == [topic("T.A"): 3, topic("T.C"): 1], "B's 4 do not fit after C's and A's: given up whole, not cut")
        #expect(replay.map(\.sequence) == replay.map(\.sequence).sorted(), "arrival order")
        #expect(replay.count == 4 && former.isEmpty)
        // D is past the bound on its own (the history stops scanning); B only with the others.
        #expect(gathering.gapNotices.map(\.0) == [topic("T.D"), topic("T.B")])
        #expect(gathering.gapNotices[0].1.message == "T.D: its missed events are more than one resume replays (4); none are replayed")
        #expect(gathering.gapNotices[1].1.message == "T.B: 4 missed events are more than one resume replays (4); none are replayed")
        #expect(gathering.gapNotices[1].1.details["epoch"] == .text("e"))
    }

    /// A resume of many topics holds at most its limit of their events as they come (not each topic's
    /// events until the end), and gives up the same topics as a trim of them all would.
    @Test func whatIsGatheredStaysWithinTheLimitAsTopicsCome() {
        let history = history(["A": 3, "B": 4, "C": 1, "D": 2])
        var gathering = ResumeGathering(epoch: "e", limit: 4, resumeBound: 4, queued: 0)
        for ticker in ["A", "B", "C", "D"] {
            gathering.missed(topic("T.\(ticker)"), since: .topic(0), archived: nil, history: history, now: 10)
            let held = gathering.found.reduce(0) { $0 + ($1?.events.count ?? 0) }
            #expect(held <= 4, "\(held) events held after \(ticker)")
        }
        var outcome = HubResumeOutcome()
        let (replay, _) = gathering.trim(into: &outcome)
        #expect(outcome.replayed == [topic("T.C"): 1, topic("T.D"): 2], "the smallest that fit together")
        #expect(replay.count == 3)
        #expect(gathering.gapNotices.map(\.0) == [topic("T.A"), topic("T.B")], "the given up, smallest first")
    }

    /// Of two topics as large, the one gathered first is given up.
    @Test func ofTwoAsLargeTheOneGatheredFirstIsGivenUp() {
        let history = history(["A": 2, "B": 2])
        var gathering = ResumeGathering(epoch: "e", limit: 3, resumeBound: 3, queued: 0)
        for ticker in ["A", "B"] { gathering.missed(topic("T.\(ticker)"), since: .topic(0), archived: nil, history: history, now: 10) }
        var outcome = HubResumeOutcome()
        _ = gathering.trim(into: &outcome)
        #expect(outcome.replayed == [topic("T.B"): 2])
        #expect(gathering.gapNotices.map(\.0) == [topic("T.A")])
    }

    @Test func aTickerAndItsWildcardShareTheirEventsAndEachGoesOnce() {
        let history = history(["A": 3])
        var gathering = ResumeGathering(epoch: "e", limit: 100, resumeBound: 100, queued: 0)
        gathering.missed(topic("T.A"), since: .topic(0), archived: nil, history: history, now: 10)
        gathering.missed(topic("T.*"), since: .market(0), archived: nil, history: history, now: 10)
        var outcome = HubResumeOutcome()
        let (replay, _) = gathering.trim(into: &outcome)
        #expect(outcome.replayed == [topic("T.A"): 3, topic("T.*"): 3])
        #expect(replay.map(\.sequence) == [1, 2, 3], "each event once")
    }

    @Test func withoutAHistoryEveryTopicIsAGapAndABoundBelowTheResumesSaysWhy() {
        var gathering = ResumeGathering(epoch: nil, limit: 10, resumeBound: 100, queued: 90)
        gathering.missed(topic("T.A"), since: .topic(1), archived: nil, history: nil, now: 0)
        #expect(gathering.gapNotices.count == 1)
        #expect(gathering.gapNotices[0].1.message.contains("this relay keeps no history"))
        #expect(gathering.why.contains("has not read yet (90)"), "the bound is this connection's, and says so")
    }

    @Test func aFormerTermWholeOnItsTapeNamesTheTimeBetweenTheTerms() {
        let history = history(["A": 2])
        var gathering = ResumeGathering(epoch: "e", limit: 100, resumeBound: 100, queued: 0)
        let formerEvents = [event("T", "A", 7)]
        gathering.formerTerm(
            topic("T.A"), .throughEnd(formerEvents, [EventPosition(topic: 7, market: 70)], endedAt: 1_000), through: 3_500)
        gathering.formerTerm(topic("T.B"), nil, through: 3_500)
        gathering.thisTerm(of: history, now: 10)
        var outcome = HubResumeOutcome()
        let (replay, former) = gathering.trim(into: &outcome)
        #expect(former.count == 1 && replay.count == 2)
        #expect(outcome.replayed == [topic("T.A"): 3])
        let between = gathering.acrossTerms[topic("T.A")]?.notice
        #expect(between?.message.contains("nothing was received for 2.5 s between two leadership terms") == true, "\(between?.message ?? "")")
        #expect(between?.details["from"] == .number(1_000) && between?.details["through"] == .number(3_500))
        #expect(gathering.gapNotices.map(\.0) == [topic("T.B")], "no answer from the former term's tape: a gap")
    }
}

/// A hub without a history (`--no-history`, a replay at `max`) answers a resume with `gap` and the
/// last values, queued outside the buffer: bounded as a history's resumes are, so a client that asks
/// again and again and never reads does not make the hub hold more.
@Suite("Resumes on a hub without a history")
struct NoHistoryResumeTests {
    @Test func repeatedResumesOfAWildcardStopAtTheResumeBound() async throws {
        let hub = MarketDataHub(wire: .polygon, history: nil)
        // 2,000 tickers with a last value each: a `T.*` resume queues all of them after its gap.
        await hub.publish((0..<2_000).map { event("T", "S\($0)", $0) })
        let subscription = await hub.subscribe()
        let wildcard = Topic(parsing: "T.*")!
        let bound = HistoryLimits().eventsPerResume
        var withheld = 0
        for _ in 0..<80 {
            let before = subscription.queue.replaying.load(ordering: .relaxed)
            await hub.add([wildcard], to: subscription.id, resuming: .time(milliseconds: 0))
            await hub.remove([wildcard], from: subscription.id)
            if subscription.queue.replaying.load(ordering: .relaxed) - before <= 2 { withheld += 1 }
        }
        let queued = subscription.queue.replaying.load(ordering: .relaxed)
        #expect(queued <= bound, "within the bound, not 80 × 2,001 (\(queued))")
        #expect(withheld > 0, "past what may still be replayed: a `gap` without the last values, or `not resumed`; no more queued")
    }
}
