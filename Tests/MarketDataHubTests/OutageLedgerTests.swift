import MarketCore
import Testing

@testable import MarketDataHub

/// The hub's outage ledger, driven with given times (Unix ms): no hub, no clock.
@Suite("Hub: the outage ledger")
struct OutageLedgerTests {
    @Test func anOutageRunsFromTheLastEventBeforeItToTheFirstAfterIt() throws {
        var ledger = OutageLedger()
        #expect(ledger.eventsArrived(at: 1_000) == nil, "no outage: nothing ends")
        let outageRead = ledger.lost(reason: "connection closed", at: 1_500)
        let outage = try #require(outageRead)
        #expect(outage.lastEventBefore == 1_000 && outage.lostAt == 1_500)
        #expect(ledger.lost(reason: "again", at: 1_600) == nil, "one outage at a time: the second loss is the same one")
        #expect(ledger.current?.reason == "connection closed")
        let recoveryRead = ledger.eventsArrived(at: 4_000)
        let recovery = try #require(recoveryRead)
        #expect(recovery.start == 1_000 && recovery.firstEventAfter == 4_000 && recovery.gap == 3_000)
        #expect(ledger.current == nil && ledger.lastEventAt == 4_000)
        #expect(ledger.eventsArrived(at: 4_100) == nil, "told once")
    }

    @Test func withNoEventBeforeItTheWindowStartsWhenTheUpstreamWasLost() throws {
        var ledger = OutageLedger()
        let outageRead = ledger.lost(reason: "refused", at: 200)
        let outage = try #require(outageRead)
        #expect(outage.lastEventBefore == nil)
        #expect(outage.notice.details["last_event_before_ms"] == nil && outage.notice.details["lost_at_ms"] == .number(200))
        let recoveryRead = ledger.eventsArrived(at: 900)
        let recovery = try #require(recoveryRead)
        #expect(recovery.start == 200 && recovery.gap == 700)
    }

    @Test func theNoticesNameTheWindowAndTheEpoch() throws {
        var ledger = OutageLedger()
        _ = ledger.eventsArrived(at: 10)
        let outageRead = ledger.lost(reason: "ping timeout", at: 20)
        let outage = try #require(outageRead)
        #expect(outage.notice.kind == .upstreamDisconnected && outage.notice.message.contains("ping timeout"))
        let recoveryRead = ledger.eventsArrived(at: 50)
        let recovery = try #require(recoveryRead)
        let notice = recovery.notice(epoch: "e2")
        #expect(notice.kind == .upstreamReconnected)
        #expect(notice.details["last_event_before_ms"] == .number(10) && notice.details["first_event_after_ms"] == .number(50))
        #expect(notice.details["gap_ms"] == .number(40) && notice.details["epoch"] == .text("e2"))
        #expect(recovery.notice(epoch: "").details["epoch"] == nil && recovery.notice(epoch: nil).details["epoch"] == nil)
    }
}
