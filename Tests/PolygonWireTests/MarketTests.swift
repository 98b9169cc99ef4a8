import NIOCore
import Testing

@testable import PolygonWire

@Suite("Markets: event types, ticker form, routing")
struct MarketTests {
    @Test func tickersNameTheirMarket() {
        #expect(Market.of(ticker: "X:BTC-USD") == .crypto)
        #expect(Market.of(ticker: "C:EUR-USD") == .forex)
        #expect(Market.of(ticker: "O:SPY251219C00650000") == .options)
        #expect(Market.of(ticker: "I:SPX") == .indices)
        #expect(Market.of(ticker: "AAPL") == .stocks)
        #expect(Market.of(ticker: "BRK.B") == .stocks)
        #expect(Market(path: "/crypto") == .crypto && Market(path: "wss://socket.massive.com/options") == .options)
        #expect(Market(path: "/futures") == .futures && Market(path: "/bonds") == nil)
    }

    @Test func eventTickersBecomeTopicTickers() {
        #expect(Market.crypto.topicTicker("BTC-USD") == "X:BTC-USD")
        #expect(Market.crypto.topicTicker("X:BTC-USD") == "X:BTC-USD")
        #expect(Market.forex.topicTicker("EUR/USD") == "C:EUR-USD")
        #expect(Market.forex.topicTicker("C:EURUSD") == "C:EUR-USD")
        #expect(Market.forex.topicTicker("C:EUR-USD") == "C:EUR-USD")
        #expect(Market.indices.topicTicker("SPX") == "I:SPX")
        #expect(Market.stocks.topicTicker("AAPL") == "AAPL")
        #expect(Market.crypto.topicTicker("*") == "*")
    }

    @Test func aTopicOfAnotherMarketNamesIt() throws {
        #expect(Market.stocks.problem(with: try #require(Topic(parsing: "XT.X:BTC-USD"))) == "crypto topic: use /crypto")
        #expect(Market.stocks.problem(with: try #require(Topic(parsing: "T.O:SPY251219C00650000"))) == "options ticker: use /options")
        #expect(Market.crypto.problem(with: try #require(Topic(parsing: "XT.BTC-USD"))) == nil, "written in crypto's form")
        #expect(Market.futures.problem(with: try #require(Topic(parsing: "T.ESZ5"))) == nil)
        #expect(Market.indices.problem(with: try #require(Topic(parsing: "T.I:SPX"))) == "stocks topic: use /stocks")
        #expect(Market.forex.problem(with: try #require(Topic(parsing: "ZZ.EUR"))) == "no ZZ events on forex")
    }

    @Test func theParserRoutesEachMarketsEventsByItsTopicTicker() throws {
        let crypto = try FrameParser.parse(
            ByteBuffer(string: #"[{"ev":"XT","pair":"BTC-USD","p":33021.9,"t":1,"s":0.01,"c":[2],"i":1,"x":3,"r":1}]"#), market: .crypto)
        #expect(crypto.events.map(\.topic.description) == ["XT.X:BTC-USD"])
        #expect(String(buffer: crypto.events[0].bytes).contains(#""pair":"BTC-USD""#), "bytes untouched")
        let forex = try FrameParser.parse(ByteBuffer(string: #"[{"ev":"C","p":"USD/CNH","x":"44","a":6.83366,"b":6.83363,"t":1}]"#), market: .forex)
        #expect(forex.events.map(\.topic.description) == ["C.C:USD-CNH"])
        let indices = try FrameParser.parse(ByteBuffer(string: #"[{"ev":"V","val":3988.5,"T":"I:SPX","t":1}]"#), market: .indices)
        #expect(indices.events.map(\.topic.description) == ["V.I:SPX"])
        let stocks = try FrameParser.parse(ByteBuffer(string: #"[{"ev":"T","sym":"MSFT","p":1,"t":1}]"#))
        #expect(stocks.events.map(\.topic.description) == ["T.MSFT"])
    }
}
