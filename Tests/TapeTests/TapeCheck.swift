import MarketCore
import PolygonWire
import Testing

/// What the relay takes from a stocks tape recorded from Polygon (the events these tests write).
let stocksCheck = EventCheck(market: .stocks, wire: PolygonWireProtocol(), maxBytes: 64 << 10)

/// What the relay takes from a tape it did not write this run: what its upstream would let through.
@Suite("Tape: the event check")
struct EventCheckTests {
    func problem(_ type: String, _ ticker: String, _ json: String) -> String? {
        Array(json.utf8).withUnsafeBytes { stocksCheck.problem(eventType: type, ticker: ticker, bytes: $0) }
    }

    @Test func anEventIsOneOfItsOwnTypeAndSymbolOfATypeTheMarketHasUnderNoWildcard() {
        #expect(problem("T", "AAPL", #"{"ev":"T","sym":"AAPL","p":1}"#) == nil)
        #expect(problem("AM", "AAPL@5m", #"{"ev":"AM","sym":"AAPL@5m"}"#) == nil, "the relay's own bars are recorded")
        #expect(problem("T", "AAPL", #"{"ev":"T","sym":"MSFT"}"#) != nil, "another symbol's")
        #expect(problem("T", "AAPL", #"{"ev":"T","sym":"AAPL"},{"ev":"status","status":"auth_failed"}"#) != nil, "two messages")
        #expect(problem("XT", "X:BTC-USD", #"{"ev":"XT","pair":"BTC-USD"}"#)?.contains("does not have") == true, "a crypto type on stocks")
        #expect(problem("T", "*", #"{"ev":"T","sym":"*"}"#) != nil, "the wildcard's own")
        #expect(problem("T", "AAPL", #"{"ev":"T","sym":"AAPL","x":"\#(String(repeating: "a", count: 70_000))"}"#)?.contains("bytes") == true)
    }
}
