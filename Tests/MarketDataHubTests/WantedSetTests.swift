import PolygonWire
import Testing

@testable import MarketDataHub

/// The hub's wanted set as a value: which topics its source is asked for, step by step.
@Suite("What a hub wants from its source")
struct WantedSetTests {
    let aapl = Topic(parsing: "Q.AAPL")!
    let msft = Topic(parsing: "Q.MSFT")!
    let trade = Topic(parsing: "T.AAPL")!

    func names(_ step: WantedSet.Step) -> [String] { step.map { "\($0.wanted ? "+" : "-")\($0.topic)" } }

    @Test func aTickerIsWantedFromItsFirstSubscriberToItsLast() {
        var set = WantedSet()
        #expect(names(set.tickerSubscribed(aapl)) == ["+Q.AAPL"])
        #expect(set.topics == [aapl])
        #expect(names(set.tickerUnsubscribed(aapl)) == ["-Q.AAPL"])
        #expect(set.topics.isEmpty)
    }

    @Test func aWildcardReplacesItsTypesTickersAndGivesThemBack() {
        var set = WantedSet()
        _ = set.tickerSubscribed(aapl)
        _ = set.tickerSubscribed(msft)
        _ = set.tickerSubscribed(trade)
        let wildcard = set.wildcardSubscribed("Q")
        #expect(names(wildcard).first == "+Q.*" && Set(names(wildcard).dropFirst()) == ["-Q.AAPL", "-Q.MSFT"], "added first, then its tickers go")
        #expect(set.topics == [.wildcard("Q"), trade], "another type's ticker stays")
        // A ticker of a wildcarded type changes nothing upstream while the wildcard is held.
        #expect(set.tickerUnsubscribed(msft).isEmpty)
        let back = set.wildcardUnsubscribed("Q")
        #expect(names(back) == ["-Q.*", "+Q.AAPL"], "the wildcard goes first, then the tickers still held come back")
        #expect(set.topics == [aapl, trade])
    }

    @Test func aCallReportsWhatItChangedOnceAndATopicThatCameAndWentIsNoChange() {
        var set = WantedSet()
        #expect(set.takeChange() == nil)
        _ = set.tickerSubscribed(aapl)
        _ = set.tickerSubscribed(msft)
        _ = set.tickerUnsubscribed(msft)
        #expect(set.takeChange() == WantedTopicsChange(added: [aapl]))
        #expect(set.takeChange() == nil, "reported once")
        _ = set.tickerUnsubscribed(aapl)
        _ = set.tickerSubscribed(aapl)
        #expect(set.takeChange() == nil, "left and came back within one call")
        _ = set.wildcardSubscribed("Q")
        #expect(set.takeChange() == WantedTopicsChange(added: [.wildcard("Q")], removed: [aapl]))
    }

    @Test func aWildcardThatLingersStaysWantedAndTakenAgainChangesNothingUntilItsLingerEnds() {
        var set = WantedSet()
        let start = ContinuousClock.now
        _ = set.tickerSubscribed(aapl)
        _ = set.wildcardSubscribed("Q")
        _ = set.takeChange()
        set.linger("Q", until: start + .seconds(5))
        #expect(set.topics == [.wildcard("Q")], "still wanted while it lingers")
        #expect(set.tickerSubscribed(msft).isEmpty, "its tickers stay covered")
        #expect(set.wildcardSubscribed("Q").isEmpty, "taken again: nothing changes")
        #expect(set.nextLingerEnd == nil)
        set.linger("Q", until: start + .seconds(5))
        #expect(set.lingerEnded(by: start + .seconds(4)).isEmpty)
        #expect(set.takeChange() == nil, "a toggle within the linger is no change at all")
        #expect(set.nextLingerEnd == start + .seconds(5))
        #expect(set.lingerEnded(by: start + .seconds(5)) == ["Q"])
        #expect(set.topics == [.wildcard("Q")], "wanted until the hub lets it go")
        let back = set.wildcardUnsubscribed("Q")
        #expect(names(back).first == "-Q.*" && Set(names(back).dropFirst()) == ["+Q.AAPL", "+Q.MSFT"])
        #expect(set.nextLingerEnd == nil)
        // A linger of a type whose wildcard is not wanted is nothing.
        set.linger("T", until: start)
        #expect(set.lingerEnded(by: start + .seconds(1)).isEmpty)
    }
}
