import Foundation
import MarketDataHub
import NIOCore
import PolygonWire
import Testing

@testable import MarketREST
@testable import PolygonRESTClient

@Suite("Gap fill: REST results as WebSocket events")
struct RecoveredEventsTests {
    func json(_ event: MarketEvent) throws -> [String: Any] {
        try #require(try JSONSerialization.jsonObject(with: Data(event.bytes.readableBytesView)) as? [String: Any])
    }

    /// The results of a REST page.
    func results(_ page: String) throws -> [RESTPage.Result] {
        var found: [RESTPage.Result] = []
        _ = try RESTPage.read(Array(page.utf8)) { found.append($0) }
        return found
    }

    @Test func aStockTradeKeepsItsSequenceAndTakesMillisecondsAndTheFlag() throws {
        let page = #"{"results":[{"conditions":[12,37],"exchange":4,"id":"71675","participant_timestamp":1700000000123000000,"price":189.05,"sequence_number":4242,"sip_timestamp":1700000000123456789,"size":100,"tape":3,"trf_id":3}],"status":"OK","request_id":"x"}"#
        let result = try #require(try results(page).first)
        let (event, time) = try #require(RecoveredEvents.trade(result, type: "T", ticker: "AAPL", market: .stocks))
        #expect(time == 1_700_000_000_123)
        #expect(event.topic.description == "T.AAPL")
        let object = try json(event)
        #expect(object["ev"] as? String == "T" && object["sym"] as? String == "AAPL" && object["i"] as? String == "71675")
        #expect((object["p"] as? NSNumber)?.doubleValue == 189.05 && (object["s"] as? NSNumber)?.int64Value == 100)
        #expect((object["t"] as? NSNumber)?.int64Value == 1_700_000_000_123 && (object["q"] as? NSNumber)?.int64Value == 4_242)
        #expect(object["c"] as? [Int] == [12, 37] && (object["_r"] as? NSNumber)?.intValue == 1)
        #expect(event.json.contains(#""p":189.05,"s":100,"#), "numbers exactly as REST wrote them: \(event.json)")
        #expect(PolygonWireProtocol().orderValue(.sequence, of: event) == 4_242)
    }

    @Test func aListPaddedWithWhitespaceIsWrittenWithoutIt() throws {
        // A hostile host pads a list to megabytes: the event carries the numbers only.
        let padding = String(repeating: " ", count: 1 << 20)
        let page = #"{"results":[{"conditions":[12,\#(padding)37\#(padding)],"price":1,"sequence_number":1,"sip_timestamp":1700000000123456789,"size":1}]}"#
        let result = try #require(try results(page).first)
        let (event, _) = try #require(RecoveredEvents.trade(result, type: "T", ticker: "AAPL", market: .stocks))
        #expect(event.bytes.readableBytes < 200, "\(event.bytes.readableBytes) bytes")
        #expect(try json(event)["c"] as? [Int] == [12, 37])
        let empty = #"{"results":[{"conditions":[\#(padding)],"price":1,"sequence_number":2,"sip_timestamp":1700000000123456789,"size":1}]}"#
        let emptyResult = try #require(try results(empty).first)
        let (bare, _) = try #require(RecoveredEvents.trade(emptyResult, type: "T", ticker: "AAPL", market: .stocks))
        #expect(bare.bytes.readableBytes < 200 && bare.json.contains(#""c":[]"#), "\(bare.bytes.readableBytes) bytes")
    }

    @Test func cryptoAndForexTakeTheirPairFieldsAndParticipantTime() throws {
        let trades = #"{"results":[{"conditions":[2],"exchange":1,"id":"abc","participant_timestamp":1700000000500000000,"price":97150.5,"size":0.05}]}"#
        let trade = try #require(try results(trades).first)
        let (crypto, _) = try #require(RecoveredEvents.trade(trade, type: "XT", ticker: "X:BTC-USD", market: .crypto))
        let object = try json(crypto)
        #expect(object["pair"] as? String == "BTC-USD" && (object["s"] as? NSNumber)?.doubleValue == 0.05)
        #expect(crypto.topic.description == "XT.X:BTC-USD")
        let quotes = #"{"results":[{"ask_exchange":48,"ask_price":1.0847,"bid_exchange":48,"bid_price":1.0846,"participant_timestamp":1700000000700000000}],"next_url":"https:\/\/api.polygon.io\/v3\/quotes\/C:EURUSD?cursor=YWJj"}"#
        var found: [RESTPage.Result] = []
        let next = try RESTPage.read(Array(quotes.utf8)) { found.append($0) }
        #expect(next == "https://api.polygon.io/v3/quotes/C:EURUSD?cursor=YWJj")
        let quote = try #require(found.first)
        let (forex, time) = try #require(RecoveredEvents.quote(quote, type: "C", ticker: "C:EUR-USD", market: .forex))
        let fx = try json(forex)
        #expect(fx["p"] as? String == "EUR/USD" && (fx["a"] as? NSNumber)?.doubleValue == 1.0847 && time == 1_700_000_000_700)
        #expect(PolygonWireProtocol().orderValue(.time, of: forex) == 1_700_000_000_700)
    }

    @Test func aBarLeavesOutWhatRESTDoesNotGiveAndEndsAMinuteAfterItsStart() throws {
        let page = #"{"ticker":"AAPL","results":[{"v":1200,"vw":10.9,"o":10,"c":11,"h":12.5,"l":9.75,"t":1700000040000,"n":7}],"status":"OK"}"#
        let result = try #require(try results(page).first)
        let (event, start) = try #require(RecoveredEvents.bar(result, type: "AM", ticker: "AAPL", market: .stocks))
        let object = try json(event)
        #expect(start == 1_700_000_040_000 && (object["e"] as? NSNumber)?.int64Value == 1_700_000_100_000)
        #expect(object["av"] == nil && object["op"] == nil && object["a"] == nil)
        #expect(object["z"] == nil, "REST's trade count n is not the WebSocket's z (average trade size)")
        #expect(PolygonWireProtocol().orderValue(.barStart, of: event) == 1_700_000_040_000)
    }

    @Test func malformedPagesThrowAndAResultWithAFieldOfTheWrongKindIsRefused() throws {
        let broken = [#"{"results":[{"price":1"#, #"{"results":[{"price":1,}]}"#, "[", "{\"results\":[{\"id\":\"x\u{01}\"}]}", ""]
        for page in broken {
            #expect(throws: RESTPage.Malformed.self, "\(page)") { _ = try results(page) }
        }
        let noPrice = #"{"results":[{"price":"1.5","sip_timestamp":1700000000000000000}]}"#
        let noPriceResult = try #require(try results(noPrice).first)
        #expect(RecoveredEvents.trade(noPriceResult, type: "T", ticker: "AAPL", market: .stocks) == nil, "no price")
        let partial = #"{"results":[{"price":2,"sip_timestamp":1700000000000000000,"conditions":["x"],"id":7}]}"#
        let partialResult = try #require(try results(partial).first)
        #expect(
            RecoveredEvents.trade(partialResult, type: "T", ticker: "AAPL", market: .stocks) == nil,
            "a string in conditions and a number id: the result is not trusted")
        let nulls = #"{"results":[{"price":2,"sip_timestamp":1700000000000000000,"conditions":null}]}"#
        let nullsResult = try #require(try results(nulls).first)
        let (event, _) = try #require(RecoveredEvents.trade(nullsResult, type: "T", ticker: "AAPL", market: .stocks), "null is absent")
        #expect(try json(event)["c"] == nil)
        #expect(try results(#"{"results":[],"status":"OK"}"#).isEmpty)
    }

    /// Values that once reached clients and the history: nothing but exact JSON is copied.
    @Test func onlyExactJSONValuesAndPlausibleTimesAreCopied() throws {
        for number in ["0", "-1", "10.5", "1e9", "1.5E-3", "-0.25"] {
            #expect(RESTPage.isNumber(Array(number.utf8)), "\(number)")
        }
        for number in ["", "-", "1nullfalse", "01", "1.", ".5", "1e", "+1", "--1", "1.5.5", "nan", String(repeating: "9", count: 41)] {
            #expect(!RESTPage.isNumber(Array(number.utf8)), "\(number)")
        }
        for string in [#""""#, #""ok""#, #""a\"b""#, #""\u00e9\n\/""#] {
            #expect(RESTPage.isString(Array(string.utf8)[...]), "\(string)")
        }
        for string in [#""\q\u""#, #""\u12""#, #""a"#, "\"\u{01}\"", #""a\""#, #""""""#] {
            #expect(!RESTPage.isString(Array(string.utf8)[...]), "\(string)")
        }
        let cases = [
            #"{"results":[{"price":1nullfalse,"sip_timestamp":1700000000000000000}]}"#,
            #"{"results":[{"price":1,"size":-,"sip_timestamp":1700000000000000000}]}"#,
            #"{"results":[{"price":1,"id":"\q\u","sip_timestamp":1700000000000000000}]}"#,
            #"{"results":[{"price":1,"sip_timestamp":9223372036854775807}]}"#,
            #"{"results":[{"price":1,"sip_timestamp":-5}]}"#,
        ]
        for page in cases {
            let result = try #require(try results(page).first)
            #expect(RecoveredEvents.trade(result, type: "T", ticker: "AAPL", market: .stocks) == nil, "\(page)")
        }
        // A bar whose end would overflow.
        let bar = try #require(try results(#"{"results":[{"t":9223372036854775807,"o":1,"h":1,"l":1,"c":1}]}"#).first)
        #expect(RecoveredEvents.bar(bar, type: "AM", ticker: "AAPL", market: .stocks) == nil)
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
        #expect(PolygonWireProtocol().orderValue(.sequence, of: event) == 42)
        let none = MarketEvent(eventType: "T", ticker: "AAPL", bytes: ByteBuffer(string: #"{"ev":"T","q":"x"}"#))
        #expect(PolygonWireProtocol().orderValue(.sequence, of: none) == nil)
    }
}

/// What a REST host chooses reaches a reason, a log or a client bounded and visible.
@Suite("Gap fill: a REST host's text is bounded")
struct RESTHostTextTests {
    @Test func aNextURLLongerThanAPageMayNameIsAnUnreadablePage() throws {
        let short = #"{"results":[],"next_url":"https:\/\/api.polygon.io\/v3\/trades\/AAPL?cursor=YWJj"}"#
        #expect(try RESTPage.read(Array(short.utf8)) { _ in } == "https://api.polygon.io/v3/trades/AAPL?cursor=YWJj")
        let long = #"{"results":[],"next_url":"https:\/\/api.polygon.io\/v3\/trades\/AAPL?cursor="# + String(repeating: "a", count: RESTPage.maxNextURLBytes) + #""}"#
        #expect(throws: (any Error).self) { try RESTPage.read(Array(long.utf8)) { _ in } }
    }

    @Test func anErrorsDescriptionCarriesABoundedVisibleLineOfWhatTheHostChose() {
        // One letter and a million combining marks is one character: a cut by characters kept it all.
        let zalgo = "a" + String(repeating: "\u{301}", count: 1_000_000) + "\nline two"
        for error in [RESTError.status(500, zalgo), .malformed(zalgo), .transport(zalgo)] {
            let text = error.description
            #expect(text.utf8.count <= 64 + RESTError.describedBytes, "\(text.utf8.count) bytes")
            #expect(!text.contains("\n"))
        }
    }
}
