import MarketCore
import NIOCore
import Testing

@testable import Cluster

/// The cluster's last values asked for lately: kept a quarter second from the asking (as young as the
/// store's own writes), none after; bounded in entries and bytes, swept of what aged out on any use,
/// at most once a period.
@Suite("Cluster: recent answers of the last-value store")
struct RecentLastValuesTests {
    let start = ContinuousClock.now
    func at(_ milliseconds: Int) -> ContinuousClock.Instant { start + .milliseconds(milliseconds) }
    func topic(_ ticker: String) -> Topic { Topic(eventType: "T", ticker: ticker)! }
    func event(_ ticker: String, bytes: Int = 10) -> MarketEvent {
        MarketEvent(eventType: "T", ticker: ticker, bytes: ByteBuffer(repeating: 0x20, count: bytes))
    }

    /// What the answer says: the event's ticker, "none" (the store had none), or nil (no recent answer).
    func said(_ recent: inout RecentLastValues, _ ticker: String, at milliseconds: Int) -> String? {
        switch recent.answer(for: topic(ticker), at: at(milliseconds)) {
        case .none: return nil
        case .some(.none): return "none"
        case .some(.some(let event)): return event.ticker
        }
    }

    @Test func anAnswerIsKeptForAQuarterSecondAndAnAbsenceToo() {
        var recent = RecentLastValues()
        #expect(said(&recent, "A", at: 0) == nil, "nothing asked yet")
        recent.remember(event("A"), for: topic("A"), at: at(0), now: at(0))
        recent.remember(nil, for: topic("B"), at: at(0), now: at(0))
        #expect(said(&recent, "A", at: 249) == "A")
        #expect(said(&recent, "B", at: 249) == "none", "the store had none: known for as long")
        #expect(said(&recent, "A", at: 250) == nil, "aged out")
        #expect(said(&recent, "B", at: 250) == nil)
        #expect(recent.count == 0 && recent.bytes == 0, "an aged answer asked for is let go")
    }

    @Test func entriesAndBytesAreBoundedAndWhatAgedOutIsSweptOncePerPeriod() {
        var recent = RecentLastValues(keepFor: .milliseconds(250), maxEntries: 3, maxBytes: 100)
        for (index, ticker) in ["A", "B", "C"].enumerated() { recent.remember(event(ticker), for: topic(ticker), at: at(index), now: at(index)) }
        recent.remember(event("D"), for: topic("D"), at: at(10), now: at(10))
        #expect(recent.count == 3 && said(&recent, "D", at: 10) == nil, "full of young answers: D is not kept")
        recent.remember(event("E"), for: topic("E"), at: at(240), now: at(240))
        #expect(said(&recent, "E", at: 240) == nil, "still full, and swept less than a period ago")
        recent.remember(event("F"), for: topic("F"), at: at(300), now: at(300))
        #expect(recent.count == 1 && said(&recent, "F", at: 300) == "F", "a period on: the aged three swept")
        recent.remember(event("G", bytes: 95), for: topic("G"), at: at(310), now: at(310))
        #expect(said(&recent, "G", at: 310) == nil, "past the bytes")
        #expect(recent.bytes == 10)
        recent.remember(event("F", bytes: 50), for: topic("F"), at: at(320), now: at(320))
        #expect(recent.bytes == 50 && recent.count == 1, "a newer answer replaces the old")
        #expect(said(&recent, "X", at: 600) == nil)
        #expect(recent.count == 0 && recent.bytes == 0, "what aged out is swept on any use, a period after the last sweep")
    }

    @Test func theSweepRunsAtMostOncePerPeriod() {
        var recent = RecentLastValues()
        recent.remember(event("A"), for: topic("A"), at: at(0), now: at(0))
        recent.remember(event("B"), for: topic("B"), at: at(1), now: at(1))  // the first sweep
        recent.remember(event("C"), for: topic("C"), at: at(100), now: at(100))
        #expect(said(&recent, "X", at: 300) == nil)
        #expect(recent.count == 1, "swept at 300: A and B aged, C (200 ms) kept")
        #expect(said(&recent, "Y", at: 360) == nil)
        #expect(recent.count == 1, "C aged at 350, but the last sweep was 60 ms ago")
        #expect(said(&recent, "Z", at: 560) == nil)
        #expect(recent.count == 0, "swept again a period on")
    }

    @Test func anAnswerIsAsOldAsTheMomentTheStoreWasAsked() {
        var recent = RecentLastValues()
        recent.remember(event("A"), for: topic("A"), at: at(0), now: at(300))
        #expect(said(&recent, "A", at: 300) == nil, "asked 300 ms ago (a stalled NATS): not kept")
        recent.remember(event("B"), for: topic("B"), at: at(100), now: at(300))
        #expect(said(&recent, "B", at: 349) == "B")
        #expect(said(&recent, "B", at: 350) == nil, "a quarter second from the asking, not from the answer")
    }
}
