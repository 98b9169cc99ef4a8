import Foundation
import MarketDataHub
import NIOCore
import PolygonWire
import Testing

@testable import GapFill

@Suite("Gap fill: REST results as WebSocket events")
struct RecoveredEventsTests {
    func json(_ event: MarketEvent) throws -> [String: Any] {
        try #require(try JSONSerialization.jsonObject(with: Data(event.bytes.readableBytesView)) as? [String: Any])
    }

    @Test func aStockTradeKeepsItsSequenceAndTakesMillisecondsAndTheFlag() throws {
        let trade = RecoveredEvents.Trade(
            conditions: [12, 37], exchange: 4, id: "71675", price: 189.05, sequence_number: 4_242, sip_timestamp: 1_700_000_000_123_456_789,
            participant_timestamp: 1_700_000_000_123_000_000, size: 100, tape: 3)
        let (event, time) = try #require(RecoveredEvents.trade(trade, type: "T", ticker: "AAPL", market: .stocks))
        #expect(time == 1_700_000_000_123)
        #expect(event.topic.description == "T.AAPL")
        let object = try json(event)
        #expect(object["ev"] as? String == "T" && object["sym"] as? String == "AAPL" && object["i"] as? String == "71675")
        #expect((object["p"] as? NSNumber)?.doubleValue == 189.05 && (object["s"] as? NSNumber)?.int64Value == 100)
        #expect((object["t"] as? NSNumber)?.int64Value == 1_700_000_000_123 && (object["q"] as? NSNumber)?.int64Value == 4_242)
        #expect(object["c"] as? [Int] == [12, 37] && (object["_r"] as? NSNumber)?.intValue == 1)
        #expect(event.json.contains(#""p":189.05,"s":100,"#), "prices as short as they read, sizes as integers: \(event.json)")
        #expect(RecoveryOrder.sequence.value(of: event) == 4_242)
    }

    @Test func cryptoAndForexTakeTheirPairFieldsAndParticipantTime() throws {
        let trade = RecoveredEvents.Trade(
            conditions: [2], exchange: 1, id: "abc", price: 97_150.5, sequence_number: nil, sip_timestamp: nil,
            participant_timestamp: 1_700_000_000_500_000_000, size: 0.05, tape: nil)
        let (crypto, _) = try #require(RecoveredEvents.trade(trade, type: "XT", ticker: "X:BTC-USD", market: .crypto))
        let object = try json(crypto)
        #expect(object["pair"] as? String == "BTC-USD" && (object["s"] as? NSNumber)?.doubleValue == 0.05)
        #expect(crypto.topic.description == "XT.X:BTC-USD")
        let quote = RecoveredEvents.Quote(
            ask_exchange: 48, ask_price: 1.0847, ask_size: nil, bid_exchange: 48, bid_price: 1.0846, bid_size: nil, conditions: nil,
            indicators: nil, sequence_number: nil, sip_timestamp: nil, participant_timestamp: 1_700_000_000_700_000_000, tape: nil)
        let (forex, time) = try #require(RecoveredEvents.quote(quote, type: "C", ticker: "C:EUR-USD", market: .forex))
        let fx = try json(forex)
        #expect(fx["p"] as? String == "EUR/USD" && (fx["a"] as? NSNumber)?.doubleValue == 1.0847 && time == 1_700_000_000_700)
        #expect(RecoveryOrder.time.value(of: forex) == 1_700_000_000_700)
    }

    @Test func aBarLeavesOutWhatRESTDoesNotGiveAndEndsAMinuteAfterItsStart() throws {
        let bar = RecoveredEvents.Bar(o: 10, h: 12.5, l: 9.75, c: 11, v: 1_200, vw: 10.9, t: 1_700_000_040_000, n: 7)
        let (event, start) = RecoveredEvents.bar(bar, type: "AM", ticker: "AAPL", market: .stocks)
        let object = try json(event)
        #expect(start == 1_700_000_040_000 && (object["e"] as? NSNumber)?.int64Value == 1_700_000_100_000)
        #expect(object["av"] == nil && object["op"] == nil && object["a"] == nil)
        #expect((object["z"] as? NSNumber)?.intValue == 7)
        #expect(RecoveryOrder.barStart.value(of: event) == 1_700_000_040_000)
    }

    @Test func onlyTypesWithARESTHistoryAreFilled() {
        #expect(RecoveredEvents.source(of: "T", in: .stocks) == .trades)
        #expect(RecoveredEvents.source(of: "XQ", in: .crypto) == nil, "crypto quotes have no REST history")
        #expect(RecoveredEvents.source(of: "A", in: .stocks) == nil, "second bars are not filled")
        #expect(RecoveredEvents.source(of: "CA", in: .forex) == .minuteBars)
        #expect(RecoveredEvents.restTicker("X:BTC-USD", in: .crypto) == "X:BTCUSD")
    }

    @Test func theOrderFieldIsAKeyNotTheTailOfAnotherOrAString() {
        let event = MarketEvent(eventType: "T", ticker: "AAPL", bytes: ByteBuffer(string: #"{"ev":"T","sym":"q\":9","xq":5,"q":42}"#))
        #expect(RecoveryOrder.sequence.value(of: event) == 42)
        let none = MarketEvent(eventType: "T", ticker: "AAPL", bytes: ByteBuffer(string: #"{"ev":"T","q":"x"}"#))
        #expect(RecoveryOrder.sequence.value(of: none) == nil)
    }
}
