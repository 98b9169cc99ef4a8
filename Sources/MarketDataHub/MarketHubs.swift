import PolygonWire

/// The hubs of the markets a relay serves, found by the market a ticker names (`X:BTC-USD` → crypto,
/// plain tickers → stocks; ``Market/of(ticker:)``), for consumers that follow symbols of several markets
/// (the portfolio). Value type, `Sendable`.
package struct MarketHubs: Sendable {
    package let hubs: [Market: MarketDataHub]

    package init(_ hubs: [Market: MarketDataHub]) {
        self.hubs = hubs
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
