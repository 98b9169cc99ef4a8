import Foundation
import NIOCore
import PolygonWire
import Testing

@testable import MarketDataHub

private func fields(_ event: MarketEvent) -> [String: Any] {
    (try? JSONSerialization.jsonObject(with: Data(event.bytes.readableBytesView))) as? [String: Any] ?? [:]
}

private func topic(_ text: String) -> Topic { Topic(parsing: text)! }

/// A previous run as its tape gives it back: steps in order (the tape's own reader is tested on real
/// files in the tape's tests and end to end with a real relay restarted).
private struct RecordedRun: PriorRun {
    let epoch: String
    let lastMarketSequence: UInt64
    let stoppedAt: Int64
    var clean = true
    let recorded: [Recorded]

    enum Recorded {
        case events([(String, String, Int, UInt64, UInt64)], at: Int64)
        case wanted(String, Bool, at: Int64)
        case holding([String], at: Int64)
    }

    fileprivate func steps() -> IndexingIterator<[PriorRunStep]> {
        recorded.map { step -> PriorRunStep in
            switch step {
            case .events(let list, let at):
                .events(
                    list.map { event($0.0, $0.1, $0.2) }, list.map { EventPosition(topic: $0.3, market: $0.4) },
                    arrivedAt: Array(repeating: at, count: list.count))
            case .wanted(let name, let wanted, let at): .wanted(topic(name), wanted, at: at)
            case .holding(let names, let at): .holding(names.map(topic), at: at)
            }
        }.makeIterator()
    }
}

/// A hub that goes on from its previous run: same epoch, positions on, and a resume from before the
/// restart gets that run's events, a `gap` naming the time nothing was received, then this run's.
@Suite("Hub history across a restart")
struct HubRestartTests {
    let now = Int64(Date().timeIntervalSince1970 * 1000)

    /// Five AAPL trades and a quote of MSFT, received while held, then a clean stop 3 s ago.
    fileprivate func previousRun(unwantedBeforeStop: Bool = false) -> RecordedRun {
        var recorded: [RecordedRun.Recorded] = [
            .holding(["T.AAPL", "Q.*"], at: now - 10_000),
            .events([("T", "AAPL", 1, 1, 1), ("T", "AAPL", 2, 2, 2), ("Q", "MSFT", 1, 1, 3)], at: now - 9_000),
            .events([("T", "AAPL", 3, 3, 4), ("T", "AAPL", 4, 4, 5), ("T", "AAPL", 5, 5, 6)], at: now - 8_000),
        ]
        if unwantedBeforeStop { recorded.append(.wanted("T.AAPL", false, at: now - 5_000)) }
        return RecordedRun(epoch: "e1", lastMarketSequence: 6, stoppedAt: now - 3_000, recorded: recorded)
    }

    @Test func aResumeFromBeforeTheRestartGetsTheRunsEventsTheDownWindowThenThisRunsEvents() async throws {
        let hub = MarketDataHub(wire: .polygon)
        #expect(await hub.goOn(from: previousRun()) == 6)
        #expect(hub.epoch == "e1", "the epoch goes on")
        let holder = await hub.subscribe(to: topics("T.AAPL"))
        let wantedAt = Int64(Date().timeIntervalSince1970 * 1000)
        await hub.publish([event("T", "AAPL", 6)])
        let live = try await take(2, from: holder.events)
        #expect(fields(live[0])["n"] as? Int == 5, "the last value is the previous run's")
        #expect(fields(live[1])["_s"] as? Int == 6, "topic sequences go on")
        #expect(fields(live[1])["_m"] as? Int == 8, "the restart takes market sequence 7")

        let client = await hub.subscribe()
        let outcome = await hub.add([topic("T.AAPL")], to: client.id, resuming: .positions(epoch: "e1", [topic("T.AAPL"): 2]))
        #expect(outcome.replayed == [topic("T.AAPL"): 4])
        let got = try await take(6, from: client.events)
        #expect(got.prefix(3).map { fields($0)["_s"] as? Int } == [3, 4, 5], "the previous run's missed events")
        let gap = fields(got[3])
        #expect(gap["status"] as? String == "gap" && gap["unit"] as? String == "unix_ms", "\(gap)")
        #expect(gap["from"] as? Int64 == now - 3_000, "from the stop")
        let through = try #require(gap["through"] as? Int64)
        #expect(through >= wantedAt - 1 && through <= wantedAt + 1_000, "until the topic was received again")
        #expect(fields(got[4])["_s"] as? Int == 6, "then this run's")
        #expect(fields(got[5])["status"] as? String == "resumed")
        withExtendedLifetime(holder) {}
    }

    @Test func aTaggedPositionAtTheStopGetsTheGapAndOneTakenAfterTheRestartDoesNot() async throws {
        let hub = MarketDataHub(wire: .polygon)
        await hub.goOn(from: previousRun())
        let holder = await hub.subscribe(to: topics("Q.*"))
        // Where a client that began after the restart stands: the restart's own number.
        let started = await hub.position.sequence
        #expect(started == 7)
        await hub.publish([event("Q", "MSFT", 2)])
        _ = try await take(1, from: holder.events)

        let back = await hub.subscribe()
        await hub.add([topic("Q.*")], to: back.id, resuming: .marketSequence(epoch: "e1", 6))
        let crossed = try await take(3, from: back.events)
        #expect(fields(crossed[0])["status"] as? String == "gap" && fields(crossed[0])["from"] as? Int64 == now - 3_000)
        #expect(fields(crossed[1])["_m"] as? Int == 8)

        let fresh = await hub.subscribe()
        let outcome = await hub.add([topic("Q.*")], to: fresh.id, resuming: .marketSequence(epoch: "e1", started))
        #expect(outcome.gaps.isEmpty && outcome.replayed == [topic("Q.*"): 1], "\(outcome)")
        withExtendedLifetime(holder) {}
    }

    /// The clients of a stopping relay leave before it stops: a topic let go then was whole until it
    /// was let go, and the gap starts there.
    @Test func aTopicLetGoBeforeTheStopIsWholeUntilThen() async throws {
        let hub = MarketDataHub(wire: .polygon)
        await hub.goOn(from: previousRun(unwantedBeforeStop: true))
        let client = await hub.subscribe()
        await hub.add([topic("T.AAPL")], to: client.id, resuming: .positions(epoch: "e1", [topic("T.AAPL"): 4]))
        let got = try await take(3, from: client.events)
        #expect(fields(got[0])["_s"] as? Int == 5)
        #expect(fields(got[1])["status"] as? String == "gap" && fields(got[1])["from"] as? Int64 == now - 5_000, "\(fields(got[1]))")
        #expect(fields(got[2])["status"] as? String == "resumed")
    }

    @Test func aPositionOfAnotherEpochOrFromBeforeTheRunsWholeRunIsAPlainGap() async throws {
        let hub = MarketDataHub(wire: .polygon)
        await hub.goOn(from: previousRun())
        let client = await hub.subscribe()
        let outcome = await hub.add([topic("T.AAPL")], to: client.id, resuming: .positions(epoch: "other", [topic("T.AAPL"): 4]))
        #expect(outcome.gaps == [topic("T.AAPL")] && outcome.replayed.isEmpty)
        // MSFT quotes were wanted through the wildcard only: a ticker resume of one before its first
        // recorded event is no longer held.
        let second = await hub.subscribe()
        let missed = await hub.add([topic("Q.MSFT")], to: second.id, resuming: .positions(epoch: "e1", [topic("Q.MSFT"): 0]))
        #expect(missed.replayed == [topic("Q.MSFT"): 1], "its whole run began with its first event: \(missed)")
    }

    /// After a crash the run may have given numbers it never recorded: they are never given again
    /// (every topic's numbers leap past what it reserved), and a client holding one is told the gap.
    @Test func afterACrashNumbersLeapPastTheReservedAndAPositionNeverRecordedCrossesTheRestart() async throws {
        var crashed = previousRun()
        crashed = RecordedRun(epoch: "e1", lastMarketSequence: 1_000, stoppedAt: now - 3_000, clean: false, recorded: crashed.recorded)
        let hub = MarketDataHub(wire: .polygon)
        await hub.goOn(from: crashed)
        let holder = await hub.subscribe(to: topics("T.AAPL"))
        await hub.publish([event("T", "AAPL", 9)])
        let live = try await take(2, from: holder.events)
        #expect(fields(live[1])["_s"] as? Int == 1_002 && fields(live[1])["_m"] as? Int == 1_002, "\(fields(live[1]))")
        // A client holding AAPL trade 7, which the crashed run gave and never recorded.
        let client = await hub.subscribe()
        let outcome = await hub.add([topic("T.AAPL")], to: client.id, resuming: .positions(epoch: "e1", [topic("T.AAPL"): 7]))
        #expect(outcome.replayed == [topic("T.AAPL"): 1] && outcome.gaps == [topic("T.AAPL")], "\(outcome)")
        let got = try await take(3, from: client.events)
        #expect(fields(got[0])["status"] as? String == "gap" && fields(got[0])["from"] as? Int64 == now - 3_000)
        #expect(fields(got[1])["_s"] as? Int == 1_002)
        // One holding 4 (recorded) gets 5, the gap, then 1002.
        let older = await hub.subscribe()
        await hub.add([topic("T.AAPL")], to: older.id, resuming: .positions(epoch: "e1", [topic("T.AAPL"): 4]))
        let replayed = try await take(3, from: older.events)
        #expect(replayed.map { fields($0)["_s"] as? Int } == [5, nil, 1_002])
        withExtendedLifetime(holder) {}
    }

    /// An upstream loss takes a market sequence of its own: a client that had every event before it is
    /// told the gap (the outage's events never arrived), one that came after it stands at the mark.
    @Test func aClientThatHadEveryEventBeforeAnUpstreamLossIsToldTheGap() async throws {
        let hub = MarketDataHub(wire: .polygon)
        let epoch = try #require(hub.epoch)
        let holder = await hub.subscribe(to: topics("Q.*"))
        await hub.publish([event("Q", "A", 1), event("Q", "A", 2)])
        _ = try await take(2, from: holder.events)
        await hub.upstreamLost(reason: "test")
        #expect(await hub.position.sequence == 3, "the loss's own number")
        await hub.publish([event("Q", "A", 3)])
        let back = await hub.subscribe()
        let outcome = await hub.add([topic("Q.*")], to: back.id, resuming: .marketSequence(epoch: epoch, 2))
        #expect(outcome.gaps == [topic("Q.*")], "\(outcome)")
        let later = await hub.subscribe()
        let whole = await hub.add([topic("Q.*")], to: later.id, resuming: .marketSequence(epoch: epoch, 3))
        #expect(whole.gaps.isEmpty && whole.replayed == [topic("Q.*"): 1], "\(whole)")
        withExtendedLifetime(holder) {}
    }
}
