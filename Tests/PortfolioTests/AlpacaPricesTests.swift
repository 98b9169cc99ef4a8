import AlpacaWire
import Foundation
import PolygonWire
import Testing

@testable import MarketDataHub
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
        #expect(hubs.priceTopics(of: "AAPL").map(\.description) == ["t.AAPL", "q.AAPL"])
        #expect(hubs.priceTopics(of: "X:BTC-USD").map(\.description) == ["t.BTC/USD", "q.BTC/USD"])
        let trade = AlpacaEvents.trade("BTC/USD", id: 1, price: 60_000.5, size: 0.5, nanoseconds: 0, crypto: true)
        #expect(hubs.heldSymbol(of: trade, on: .crypto) == "X:BTC-USD")
        // An option contract as Alpaca names it.
        let options = MarketHubs([.options: MarketDataHub(wire: .alpaca(.indicative), history: nil)])
        #expect(options.priceTopics(of: "O:SPY251219C00650000").map(\.description) == ["t.SPY251219C00650000", "q.SPY251219C00650000"])
        let contract = AlpacaEvents.optionTrade("SPY251219C00650000", price: 4.15, size: 2, nanoseconds: 0)
        #expect(options.heldSymbol(of: contract, on: .options) == "O:SPY251219C00650000")
        var prices = SymbolPrices()
        EventPrices.apply(Self.alpaca.price(in: contract), to: &prices, now: .now)
        #expect(prices.lastTrade?.value == Decimal(string: "4.15"))
        let polygon = MarketHubs([.stocks: MarketDataHub(wire: .polygon, history: nil)])
        #expect(polygon.priceTopics(of: "AAPL").map(\.description) == ["T.AAPL", "Q.AAPL"])
    }
}
