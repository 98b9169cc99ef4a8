import AlpacaWire
import MarketCore

/// The hubs of the markets a relay serves, found by the market a ticker names (`X:BTC-USD` → crypto,
/// plain tickers → stocks; ``Market/of(ticker:)``), for consumers that follow symbols of several markets
/// (the portfolio). Value type, `Sendable`.
package struct MarketHubs: Sendable {
    package let hubs: [Market: MarketDataHub]
    /// Markets whose hubs carry Alpaca's events (`t.AAPL`, `q.BTC/USD`) rather than Polygon's.
    package let alpaca: Set<Market>

    package init(_ hubs: [Market: MarketDataHub], alpaca: Set<Market> = []) {
        self.hubs = hubs
        self.alpaca = alpaca
    }

    /// The topics that price a held symbol on the hub that serves it: Polygon's (``priceTopics(of:)``),
    /// or Alpaca's trades and quotes (`t`/`q`, a crypto pair and an option contract as Alpaca names
    /// them: `X:BTC-USD` is `BTC/USD`, `O:SPY251219C00650000` is `SPY251219C00650000`).
    package func priceTopics(of symbol: String) -> [Topic] {
        let market = Market.of(ticker: symbol)
        guard alpaca.contains(market) else { return Self.priceTopics(of: symbol) }
        let ticker = AlpacaSymbol.of(symbol, market: market)
        return ["t", "q"].compactMap { Topic(eventType: $0, ticker: ticker) }
    }

    /// The held symbol an event prices (an Alpaca crypto pair `BTC/USD` prices `X:BTC-USD`, a contract
    /// `SPY251219C00650000` prices `O:SPY251219C00650000`).
    package func heldSymbol(of event: MarketEvent, on market: Market) -> String {
        alpaca.contains(market) ? AlpacaSymbol.ticker(of: event.ticker, market: market) : event.ticker
    }

    /// One hub serving stocks (a one-market relay, tests).
    package init(stocks hub: MarketDataHub) {
        self.init([.stocks: hub])
    }

    /// The market a ticker names and its hub, or `nil` when that market is not served.
    package func hub(for ticker: String) -> (market: Market, hub: MarketDataHub)? {
        let market = Market.of(ticker: ticker)
        return hubs[market].map { (market, $0) }
    }

    /// The topics that price a ticker on its market: its trades and quotes (`T`/`Q`; crypto `XT`/`XQ`;
    /// forex quotes `C`; index values `V`).
    package static func priceTopics(of ticker: String) -> [Topic] {
        let types: [String] =
            switch Market.of(ticker: ticker) {
            case .crypto: ["XT", "XQ"]
            case .forex: ["C"]
            case .indices: ["V"]
            default: ["T", "Q"]
            }
        return types.compactMap { Topic(eventType: $0, ticker: ticker) }
    }
}
