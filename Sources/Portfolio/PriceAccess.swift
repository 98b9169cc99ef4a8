import MarketCore
import MarketDataHub
import PortfolioDomain

/// What one client key may read of the prices the portfolio shows: the topics of its entitlement, as
/// the market feed and `/v1/last/**` check them. A held symbol's trades and quotes are the topics its
/// market's protocol prices it from (``WireProtocol/priceTopics(of:market:)``: `T.AAPL`/`Q.AAPL` on
/// Polygon's stocks, `t.BTC/USD`/`q.BTC/USD` on Alpaca's crypto), checked in that protocol's form on
/// that market; a market priced by one kind of topic (Polygon's forex quotes, its index values) reads
/// both kinds through it. A symbol of a market no hub serves (priced from REST alone) is read only by a
/// key that may read its whole market.
///
/// Built once per request (or per stream of a key), used for every symbol it shows. Value type, `Sendable`.
public struct PriceAccess: Sendable {
    /// Every price of every symbol (no keys, or a key whose topics are not narrowed).
    public static let everything = PriceAccess(entitlement: .everything, hubs: nil)

    private let entitlement: Entitlement
    /// The rights as one value: ``Entitlement/everything`` for every key that reads every price, so
    /// that all of them share what is kept per rights (a pushed frame, a view's order).
    public var rights: Entitlement { isWhole ? .everything : entitlement }
    private let hubs: MarketHubs?
    /// The entitlement in each served market's protocol form.
    private let inForm: [Market: Entitlement]
    /// Whether the key reads every market whole (the common case: nothing to check per symbol).
    public let isWhole: Bool

    package init(entitlement: Entitlement, hubs: MarketHubs?) {
        self.entitlement = entitlement
        self.hubs = hubs
        let served = hubs?.hubs ?? [:]
        isWhole = entitlement.patterns == nil && entitlement.marketPatterns.isEmpty && entitlement.markets == nil
        var inForm: [Market: Entitlement] = [:]
        if !isWhole {
            for (market, hub) in served { inForm[market] = hub.wire.entitlement(entitlement, inFormOf: market) }
        }
        self.inForm = inForm
    }

    /// The topics that price `symbol` on the hub serving its market (both `nil` when none does).
    public func topics(of symbol: String) -> PriceTopics {
        hubs?.priceTopics(of: symbol) ?? PriceTopics(trade: nil, quote: nil)
    }

    /// ``readability(of:)`` as a valuation takes it (``Valuation/of(_:cash:prices:rule:now:readability:)``):
    /// `nil` when every price may be read.
    public var perSymbol: ((String) -> PriceReadability)? {
        isWhole ? nil : { readability(of: $0) }
    }

    /// What the key may read of `symbol`'s prices.
    public func readability(of symbol: String) -> PriceReadability {
        if isWhole { return .all }
        let market = Market.of(ticker: symbol)
        let whole = entitlement.allowsWhole(market: market) ? PriceReadability.all : .none
        guard let rights = inForm[market], let wire = hubs?.hubs[market]?.wire else { return whole }
        let topics = topics(of: symbol)
        // Checked in the form the key's patterns were put in (`C.C:EURUSD` as `C.C:EUR-USD`).
        let trade = topics.trade.map { wire.allows($0, on: market, by: rights) }
        let quote = topics.quote.map { wire.allows($0, on: market, by: rights) }
        if trade == nil && quote == nil { return whole }
        // One kind of topic prices the market: it stands for the other.
        return PriceReadability(trade: trade ?? quote ?? false, quote: quote ?? trade ?? false)
    }
}
