import MarketCore

/// The hubs of the markets a relay serves, found by the market a ticker names (`X:BTC-USD` → crypto,
/// plain tickers → stocks; ``Market/of(ticker:)``), for consumers that follow symbols of several markets
/// (the portfolio). Each hub's protocol (``MarketDataHub/wire``) says how a symbol is priced on it.
/// Value type, `Sendable`.
package struct MarketHubs: Sendable {
    package let hubs: [Market: MarketDataHub]

    package init(_ hubs: [Market: MarketDataHub]) {
        self.hubs = hubs
    }

    /// The topics that price a held symbol on the hub that serves it, in that hub's protocol (Polygon's
    /// `T`/`Q`, Alpaca's `t`/`q` of `BTC/USD` for `X:BTC-USD`); none when no hub serves its market.
    package func priceTopics(of symbol: String) -> PriceTopics {
        let market = Market.of(ticker: symbol)
        return hubs[market]?.wire.priceTopics(of: symbol, market: market) ?? PriceTopics(trade: nil, quote: nil)
    }

    /// The held symbol an event of `market` prices (an Alpaca crypto pair `BTC/USD` prices `X:BTC-USD`).
    package func heldSymbol(of event: MarketEvent, on market: Market) -> String {
        hubs[market]?.wire.heldSymbol(of: event, market: market) ?? event.ticker
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
}
