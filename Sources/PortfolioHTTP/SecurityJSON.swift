import PolygonRESTClient
import Portfolio
import PortfolioDomain
import Foundation

/// The JSON of `/v1/holdings` and `/v1/securities/{symbol}`, in the API's conventions (decimals as
/// strings, days `YYYY-MM-DD`, instants ISO 8601).
extension PortfolioJSON {
    struct HoldingOut: Encodable {
        var position: Int
        var symbol: String
        var assetType: AssetType
        var accounts: [Int64]
        var quantity: String
        var costBasis: String
        var price: String?
        var priceTime: Date?
        var priceSource: PriceObservation.Source?
        var marketValue: String?
        var unrealizedPnL: String?
        var unrealizedPnLPercent: String?
        var dayChange: String?
        var weight: String?
        var status: PriceRule.Status

        init(_ h: Holding, position: Int) {
            let p = h.valuation
            (self.position, symbol, assetType, accounts) = (position, h.symbol, h.assetType, h.accounts)
            (quantity, costBasis, price, priceTime, priceSource) = (
                text(p.quantity), text(p.costBasis), text(p.price), p.priceTime, p.priceSource
            )
            (marketValue, unrealizedPnL, unrealizedPnLPercent, dayChange, weight, status) = (
                text(p.marketValue), text(p.unrealizedPnL), text(p.unrealizedPnLPercent), text(p.dayChange), text(h.weight), p.status
            )
        }
    }

    struct ViewOut: Encodable {
        var id: String
        var sort: String
        var order: String
        var filter: String?
        var assetTypes: [AssetType]
        var accounts: [Int64]
    }

    struct HoldingsOut: Encodable {
        var view: ViewOut
        var asOf: Date
        var count: Int
        var holdings: [HoldingOut]

        init(_ v: SecurityBrowser.HoldingsView) {
            let q = v.query
            view = ViewOut(
                id: v.id, sort: q.sort.rawValue, order: q.order.rawValue, filter: q.filter, assetTypes: q.assetTypes.sorted(),
                accounts: q.accounts.sorted())
            asOf = .now
            count = v.holdings.count
            holdings = v.holdings.enumerated().map { HoldingOut($0.element, position: $0.offset) }
        }
    }

    /// `{"status":"loaded","data":…}` or `{"status":"failed","error":…}`.
    struct GroupOut<Data: Encodable>: Encodable {
        var status: String
        var data: Data?
        var error: String?

        init<Value>(_ group: DetailGroup<Value>, _ transform: (Value) -> Data) {
            switch group {
            case .loaded(let value): (status, data, error) = ("loaded", transform(value), nil)
            case .failed(let reason): (status, data, error) = ("failed", nil, reason)
            }
        }
    }

    struct TradeOut: Encodable {
        var price: String
        var size: String?
        var at: Date
        var source: SecurityDetail.Source
    }

    struct QuoteOut: Encodable {
        var bid: String
        var bidSize: String?
        var ask: String
        var askSize: String?
        var at: Date
        var source: SecurityDetail.Source
    }

    struct DetailsOut: Encodable {
        var lastTrade: TradeOut?
        var lastQuote: QuoteOut?
        var marketStatus: PolygonREST.MarketStatus?

        init(_ d: SecurityDetail.Details) {
            lastTrade = d.lastTrade.map { TradeOut(price: text($0.price), size: text($0.size), at: $0.at, source: $0.source) }
            lastQuote = d.lastQuote.map {
                QuoteOut(
                    bid: text($0.bid), bidSize: text($0.bidSize), ask: text($0.ask), askSize: text($0.askSize), at: $0.at, source: $0.source
                )
            }
            marketStatus = d.marketStatus
        }
    }

    struct BarOut: Encodable {
        var date: Day
        var open, high, low, close, volume: String
        var atr: String?
    }

    struct HistoryOut: Encodable {
        var from: Day
        var to: Day
        var atrPeriod: Int
        var atr: String?
        var bars: [BarOut]

        init(_ h: SecurityDetail.PriceHistory) {
            (from, to, atrPeriod, atr) = (h.from, h.to, SecurityDetail.PriceHistory.atrPeriod, text(h.atr))
            bars = h.bars.map {
                BarOut(
                    date: $0.day, open: text($0.open), high: text($0.high), low: text($0.low), close: text($0.close),
                    volume: text($0.volume),
                    atr: text($0.atr))
            }
        }
    }

    struct TaxLotOut: Encodable {
        var accountID: Int64
        var accountName: String
        var acquired: Day
        var quantity: String
        var unitCost: String
        var costBasis: String
        var term: String
    }

    struct TaxLotsOut: Encodable {
        var lots: [TaxLotOut]
        var sharesAvailable: String
        var costBasis: String
        var averageCost: String?

        init(_ t: SecurityDetail.TaxLots) {
            lots = t.lots.map {
                TaxLotOut(
                    accountID: $0.accountID, accountName: $0.accountName, acquired: $0.acquired, quantity: text($0.quantity),
                    unitCost: text($0.unitCost), costBasis: text($0.costBasis), term: $0.term)
            }
            (sharesAvailable, costBasis, averageCost) = (text(t.sharesAvailable), text(t.costBasis), text(t.averageCost))
        }
    }

    struct PositionInViewOut: Encodable {
        var id: String
        var position: Int
        var count: Int
        var previous: String?
        var next: String?
    }

    struct SecurityOut: Encodable {
        var symbol: String
        var assetType: AssetType
        var view: PositionInViewOut?
        /// `hit`, `miss` or `joined` (a prefetch was under way).
        var cache: String
        var complete: Bool
        var loadedAt: Date
        var details: GroupOut<DetailsOut>
        var priceHistory: GroupOut<HistoryOut>
        var transactions: GroupOut<[TransactionOut]>
        var taxLots: GroupOut<TaxLotsOut>

        init(_ answer: SecurityBrowser.DetailAnswer) {
            let d = answer.detail
            (symbol, assetType, cache, complete, loadedAt) = (
                d.symbol, AssetType(ticker: d.symbol), answer.outcome.rawValue, d.isComplete, d.loadedAt
            )
            view = answer.view.map {
                PositionInViewOut(id: $0.id, position: $0.index, count: $0.count, previous: $0.previous, next: $0.next)
            }
            details = GroupOut(d.details, DetailsOut.init)
            priceHistory = GroupOut(d.priceHistory, HistoryOut.init)
            transactions = GroupOut(d.transactions) { $0.map { TransactionOut($0.transaction, accountName: $0.accountName) } }
            taxLots = GroupOut(d.taxLots, TaxLotsOut.init)
        }
    }
}
