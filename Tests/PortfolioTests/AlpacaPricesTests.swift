import AlpacaWire
import Foundation
import PolygonWire
import Testing

@testable import MarketDataHub
import MarketCore
@testable import Portfolio
@testable import PortfolioDomain

/// The portfolio priced from Alpaca's stream: its trades and quotes (MessagePack doubles, at their
/// shortest decimal text), its crypto pairs named as the holdings name them.
@Suite("Portfolio: prices from Alpaca's events")
struct AlpacaPricesTests {
    static let alpaca = AlpacaWireProtocol(feed: .iex)

    @Test func aTradeIsTheLastPriceAndAQuoteItsMidExactly() {
        var prices = SymbolPrices()
        let at: Int64 = 1_700_000_000_250_000_000
        EventPrices.apply(Self.alpaca.price(in: AlpacaEvents.trade("AAPL", id: 1, price: 187.25, size: 10, nanoseconds: at)), to: &prices, now: .now)
        #expect(prices.lastTrade?.value == Decimal(string: "187.25"))
        #expect(prices.lastTrade?.at == Date(timeIntervalSince1970: 1_700_000_000.25))
        EventPrices.apply(Self.alpaca.price(in: AlpacaEvents.quote("AAPL", bid: 187.1, ask: 187.3, size: 2, nanoseconds: at)), to: &prices, now: .now)
        #expect(prices.lastQuoteMid?.value == Decimal(string: "187.2"), "the mid of 187.1 and 187.3, not of their binary doubles")
        // A bar prices nothing; a crypto trade's fractional size is no matter.
        EventPrices.apply(
            Self.alpaca.price(in: AlpacaEvents.bar("AAPL", open: 1, high: 1, low: 1, close: 1, volume: 1, trades: 1, startNanoseconds: at)),
            to: &prices, now: .now)
        #expect(prices.lastTrade?.value == Decimal(string: "187.25"))
    }

    @Test func anAlpacaHubIsFollowedOnItsOwnTopicsAndItsPairsPriceTheHeldSymbols() {
        let hubs = MarketHubs([.stocks: MarketDataHub(wire: .alpaca(.iex), history: nil), .crypto: MarketDataHub(wire: .alpaca(.crypto), history: nil)])
        #expect(hubs.priceTopics(of: "AAPL").all.map(\.description) == ["t.AAPL", "q.AAPL"])
        #expect(hubs.priceTopics(of: "X:BTC-USD").all.map(\.description) == ["t.BTC/USD", "q.BTC/USD"])
        let trade = AlpacaEvents.trade("BTC/USD", id: 1, price: 60_000.5, size: 0.5, nanoseconds: 0, crypto: true)
        #expect(hubs.heldSymbol(of: trade, on: .crypto) == "X:BTC-USD")
        // An option contract as Alpaca names it.
        let options = MarketHubs([.options: MarketDataHub(wire: .alpaca(.indicative), history: nil)])
        #expect(options.priceTopics(of: "O:SPY251219C00650000").all.map(\.description) == ["t.SPY251219C00650000", "q.SPY251219C00650000"])
        let contract = AlpacaEvents.optionTrade("SPY251219C00650000", price: 4.15, size: 2, nanoseconds: 0)
        #expect(options.heldSymbol(of: contract, on: .options) == "O:SPY251219C00650000")
        var prices = SymbolPrices()
        EventPrices.apply(Self.alpaca.price(in: contract), to: &prices, now: .now)
        #expect(prices.lastTrade?.value == Decimal(string: "4.15"))
        let polygon = MarketHubs([.stocks: MarketDataHub(wire: .polygon, history: nil)])
        #expect(polygon.priceTopics(of: "AAPL").all.map(\.description) == ["T.AAPL", "Q.AAPL"])
    }

    /// What a key may read of a held symbol's prices is checked on the topics of the symbol's own market,
    /// in that market's protocol: a key's stocks patterns do not open crypto, a market's own patterns
    /// hold there, a market priced by one topic reads both kinds through it, and a market no hub serves
    /// is read only by a key that may read it whole.
    @Test func aKeysPriceAccessIsCheckedOnTheSymbolsOwnMarketAndProtocol() throws {
        func pattern(_ text: String) throws -> Topic { try #require(Topic(parsing: text)) }
        let polygon = MarketHubs([
            .stocks: MarketDataHub(wire: .polygon, history: nil), .crypto: MarketDataHub(wire: .polygon, history: nil),
            .forex: MarketDataHub(wire: .polygon, history: nil),
        ])
        #expect(PriceAccess(entitlement: .everything, hubs: polygon).isWhole)
        let aapl = PriceAccess(entitlement: Entitlement(patterns: [try pattern("T.AAPL"), try pattern("Q.AAPL")]), hubs: polygon)
        #expect(!aapl.isWhole)
        #expect(aapl.readability(of: "AAPL") == .all)
        #expect(aapl.readability(of: "MSFT") == .none)
        #expect(aapl.readability(of: "X:BTC-USD") == .none, "stocks' T/Q patterns are not crypto's XT/XQ")
        #expect(aapl.readability(of: "I:SPX") == .none, "no hub serves indices: only a key reading the market whole")
        let cryptoTrades = PriceAccess(
            entitlement: Entitlement(patterns: [try pattern("T.*")], marketPatterns: [.crypto: [try pattern("XT.BTC-USD")], .forex: [try pattern("C.*")]]),
            hubs: polygon)
        #expect(cryptoTrades.readability(of: "X:BTC-USD") == PriceReadability(trade: true, quote: false))
        #expect(cryptoTrades.readability(of: "X:ETH-USD") == .none)
        #expect(cryptoTrades.readability(of: "MSFT") == PriceReadability(trade: true, quote: false))
        #expect(cryptoTrades.readability(of: "C:EUR-USD") == .all, "forex is priced by its quotes alone")
        let euro = PriceAccess(entitlement: Entitlement(patterns: [], marketPatterns: [.forex: [try pattern("C.EUR-USD")]]), hubs: polygon)
        #expect(euro.readability(of: "C:EURUSD") == .all, "checked in the form the key's pattern was put in")
        #expect(euro.readability(of: "C:GBPUSD") == .none)
        let indices = PriceAccess(entitlement: Entitlement(patterns: nil, markets: [.stocks, .indices]), hubs: polygon)
        #expect(indices.readability(of: "I:SPX") == .all && indices.readability(of: "AAPL") == .all)
        #expect(indices.readability(of: "X:BTC-USD") == .none, "crypto is not among its markets")

        let alpaca = MarketHubs([.stocks: MarketDataHub(wire: .alpaca(.iex), history: nil), .crypto: MarketDataHub(wire: .alpaca(.crypto), history: nil)])
        let alpacaKey = PriceAccess(
            entitlement: Entitlement(patterns: [try pattern("t.AAPL"), try pattern("q.AAPL")], marketPatterns: [.crypto: [try pattern("q.BTC/USD")]]),
            hubs: alpaca)
        #expect(alpacaKey.readability(of: "AAPL") == .all)
        #expect(alpacaKey.readability(of: "X:BTC-USD") == PriceReadability(trade: false, quote: true))
        #expect(alpacaKey.topics(of: "X:BTC-USD").quote?.description == "q.BTC/USD")
    }
}
