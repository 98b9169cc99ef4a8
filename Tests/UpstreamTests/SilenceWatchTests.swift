import Foundation
import PolygonWire
import Testing

@testable import Upstream

@Suite("A silent upstream")
struct SilenceWatchTests {
    @Test func silenceWhileExpectedIsReconnectedOnceThenShownUntilAnEventComes() {
        var watch = SilenceWatch(after: .seconds(10), market: .crypto)
        let start = ContinuousClock.now
        let date = Date()
        func look(_ seconds: Int, events: Int, authenticated: Bool = true, subscribed: Int = 3) -> SilenceWatch.Verdict {
            watch.look(authenticated: authenticated, subscribed: subscribed, events: events, now: start + .seconds(seconds), date: date)
        }
        #expect(look(0, events: 5) == .quiet)
        #expect(look(9, events: 5) == .quiet)
        #expect(look(10, events: 5) == .reconnect && watch.silent)
        // Reconnecting: nothing counts meanwhile.
        #expect(look(11, events: 5, authenticated: false) == .quiet && !watch.silent)
        #expect(look(12, events: 5) == .quiet)
        #expect(look(22, events: 5) == .silent && watch.silent, "silent again after the reconnect: shown, not reconnected again")
        #expect(look(40, events: 5) == .silent)
        #expect(look(41, events: 6) == .recovered && !watch.silent)
        #expect(look(51, events: 6) == .reconnect, "a later silence is answered again")
    }

    @Test func nothingSubscribedOrAClosedMarketIsNeverSilent() {
        var watch = SilenceWatch(after: .seconds(1), market: .stocks)
        let start = ContinuousClock.now
        // Saturday 2026-11-21, 10:00 in New York.
        let saturday = Date(timeIntervalSince1970: 1_795_273_200)
        #expect(!MarketHours.isOpen(.stocks, at: saturday) && MarketHours.isOpen(.crypto, at: saturday))
        for second in 0..<5 {
            #expect(watch.look(authenticated: true, subscribed: 3, events: 1, now: start + .seconds(second), date: saturday) == .quiet)
        }
        var empty = SilenceWatch(after: .seconds(1), market: .crypto)
        for second in 0..<5 {
            #expect(empty.look(authenticated: true, subscribed: 0, events: 1, now: start + .seconds(second), date: saturday) == .quiet)
        }
    }

    @Test func tradingHoursFollowNewYorkTime() {
        // Thursday 2026-11-19 15:00 UTC is 10:00 in New York.
        let thursdayMorning = Date(timeIntervalSince1970: 1_795_100_400)
        #expect(MarketHours.isOpen(.stocks, at: thursdayMorning) && MarketHours.isOpen(.options, at: thursdayMorning))
        // 2026-11-20 03:00 UTC is 22:00 on Thursday in New York: stocks closed, forex open.
        let thursdayNight = Date(timeIntervalSince1970: 1_795_143_600)
        #expect(!MarketHours.isOpen(.stocks, at: thursdayNight) && MarketHours.isOpen(.forex, at: thursdayNight))
    }
}
