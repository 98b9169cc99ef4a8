import NIOCore
import PolygonWire
import Testing

@testable import MarketDataHub

/// A trade of `ticker` with Polygon's `q`.
private func trade(_ q: Int, _ ticker: String = "AAPL") -> MarketEvent {
    MarketEvent(eventType: "T", ticker: ticker, bytes: ByteBuffer(string: #"{"ev":"T","sym":"\#(ticker)","p":1,"q":\#(q)}"#))
}

private func sequences(_ released: GapLedger.Released) -> [String: [Int64]] {
    var out: [String: [Int64]] = [:]
    for (topic, events) in released {
        out[topic.description, default: []] += events.compactMap { PolygonWireProtocol().orderValue(.sequence, of: $0) }
    }
    return out
}

/// The gap fill's bookkeeping alone, without a hub: which recovered events go out when, and which
/// never do (those the relay had, or that were on their way live).
@Suite("Gap ledger: outages waiting for their fill")
struct GapLedgerTests {
    let aapl = Topic(eventType: "T", ticker: "AAPL")!
    let msft = Topic(eventType: "T", ticker: "MSFT")!

    @Test func anOutageAsksForEveryHeldTopicFromItsLastEventMostHeldFirst() {
        var ledger = GapLedger(wire: PolygonWireProtocol())
        let goog = Topic(eventType: "T", ticker: "GOOG")!
        let junk = Topic(eventType: "T", ticker: "ZZZZ")!
        let (request, released) = ledger.open(
            from: 1_000, through: 2_000, holders: [(aapl, 1, trade(10)), (msft, 3, trade(4)), (goog, 2, nil), (junk, 50, nil)])
        #expect(released.isEmpty)
        // Those the relay had an event of first (a ticker held on many connections that never traded
        // does not take a fill's places), each most held first.
        #expect(request.topics.map(\.topic) == [msft, aapl, junk, goog], "had an event, then most held first")
        #expect(request.topics[1].lastBefore.flatMap { PolygonWireProtocol().orderValue(.sequence, of: $0) } == 10)
        #expect(request.generation == 1 && ledger.watched == [aapl, msft, goog, junk])
    }

    @Test func recoveredEventsAreHeldUntilTheFirstLiveOneAndOnlyThoseBeforeItGoOut() {
        var ledger = GapLedger(wire: PolygonWireProtocol())
        _ = ledger.open(from: 1_000, through: 2_000, holders: [(aapl, 1, trade(10))])
        // 9 and 10 the relay had; 11…16 are new, but the first live event will turn out to be 15.
        let (accepted, now) = ledger.accept(aapl, (9...16).map { trade($0) }, order: .sequence)
        #expect(accepted == 6 && now.isEmpty && ledger.held == 6, "held: the gap's end is not known yet")
        let released = ledger.firstLive([trade(15)])
        #expect(sequences(released) == ["T.AAPL": [11, 12, 13, 14]], "15 and 16 were on their way live")
        #expect(ledger.held == 0 && ledger.watched.isEmpty)
        // Fetched again (a cluster failover): nothing arrives twice.
        #expect(ledger.accept(aapl, (11...14).map { trade($0) }, order: .sequence).accepted == 0)
    }

    /// A new leadership term: no live event of the old one will bound what is held, which carries the
    /// old term's positions; it goes out before the new epoch's notice, and the gap stays pending.
    @Test func aNewEpochReleasesWhatIsHeldAndKeepsTheGapPending() {
        var ledger = GapLedger(wire: PolygonWireProtocol())
        _ = ledger.open(from: 1_000, through: 2_000, holders: [(aapl, 1, trade(10))])
        _ = ledger.accept(aapl, [trade(11), trade(12)], order: .sequence)
        #expect(ledger.held == 2)
        #expect(sequences(ledger.releaseHeld()) == ["T.AAPL": [11, 12]])
        #expect(ledger.held == 0 && ledger.pending[aapl]?.count == 1 && ledger.watched == [aapl], "still waiting for its fill")
        #expect(ledger.releaseHeld().isEmpty)
        // The next leader's fill of the same window: nothing arrives twice.
        #expect(ledger.accept(aapl, (11...13).map { trade($0) }, order: .sequence).accepted == 1)
    }

    @Test func aSettledFillReleasesWhatAQuietTopicHeldAndAsksAfterItNextTime() {
        var ledger = GapLedger(wire: PolygonWireProtocol())
        let first = ledger.open(from: 1_000, through: 2_000, holders: [(aapl, 1, trade(10))]).request
        _ = ledger.accept(aapl, [trade(11), trade(12)], order: .sequence)
        let (settled, released) = ledger.settle(through: first.generation)
        #expect(sequences(released) == ["T.AAPL": [11, 12]], "the topic stayed quiet: its events go out at the fill's end")
        #expect(settled[aapl]?.first?.delivered == 2 && ledger.pending.isEmpty)
        // The next outage starts after what the fill brought, not after the older live event.
        let second = ledger.open(from: 3_000, through: 4_000, holders: [(aapl, 1, trade(10))]).request
        #expect(second.topics[0].lastBefore.flatMap { PolygonWireProtocol().orderValue(.sequence, of: $0) } == 12)
    }

    @Test func aTopicKeepsAtMostItsGapsAndOldOnesAreGivenUpWithWhatTheyHeld() {
        var ledger = GapLedger(wire: PolygonWireProtocol())
        ledger.gapsPerTopic = 2
        _ = ledger.open(from: 1_000, through: 2_000, holders: [(aapl, 1, trade(10))])
        _ = ledger.accept(aapl, [trade(11)], order: .sequence)
        _ = ledger.open(from: 3_000, through: 4_000, holders: [(aapl, 1, trade(10))])
        let third = ledger.open(from: 5_000, through: 6_000, holders: [(aapl, 1, trade(10))])
        #expect(sequences(third.released) == ["T.AAPL": [11]], "the oldest gap is given up, its held event delivered")
        #expect(ledger.pending[aapl]?.count == 2 && third.request.from == 3_000, "the request covers the gaps kept")
        ledger.lifetime = 1_000
        let late = ledger.open(from: 9_000, through: 10_000, holders: [])
        #expect(late.request.topics.isEmpty && ledger.pending.isEmpty, "past their lifetime every gap goes")
    }

    @Test func pastTheHeldLimitEverythingHeldGoesOutAtOnce() {
        var ledger = GapLedger(wire: PolygonWireProtocol())
        ledger.heldLimit = 3
        _ = ledger.open(from: 1_000, through: 2_000, holders: [(aapl, 1, trade(10)), (msft, 1, trade(20, "MSFT"))])
        _ = ledger.accept(msft, [trade(21, "MSFT"), trade(22, "MSFT")], order: .sequence)
        let (_, released) = ledger.accept(aapl, [trade(11), trade(12)], order: .sequence)
        #expect(sequences(released) == ["T.MSFT": [21, 22], "T.AAPL": [11, 12]])
        #expect(ledger.held == 0)
    }

    @Test func pastTheHeldBytesEverythingHeldGoesOutAtOnce() {
        var ledger = GapLedger(wire: PolygonWireProtocol())
        ledger.heldBytesLimit = 3 * trade(11).bytes.readableBytes
        _ = ledger.open(from: 1_000, through: 2_000, holders: [(aapl, 1, trade(10)), (msft, 1, trade(20, "MSFT"))])
        _ = ledger.accept(msft, [trade(21, "MSFT"), trade(22, "MSFT")], order: .sequence)
        #expect(ledger.heldBytes == 2 * trade(21, "MSFT").bytes.readableBytes)
        let (_, released) = ledger.accept(aapl, [trade(11), trade(12)], order: .sequence)
        #expect(sequences(released) == ["T.MSFT": [21, 22], "T.AAPL": [11, 12]])
        #expect(ledger.held == 0 && ledger.heldBytes == 0)
    }
}
