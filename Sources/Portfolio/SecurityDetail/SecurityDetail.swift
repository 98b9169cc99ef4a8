import PortfolioDomain
import PolygonRESTClient
import Foundation

/// A group of a security's detail: loaded, or failed with the reason (the other groups stand).
public enum DetailGroup<Value: Sendable>: Sendable {
    case loaded(Value)
    case failed(String)

    public var isLoaded: Bool {
        if case .loaded = self { true } else { false }
    }

    public var value: Value? {
        if case .loaded(let value) = self { value } else { nil }
    }
}

/// What a client sees of one security: four groups, each loaded on its own.
public struct SecurityDetail: Sendable {
    public var symbol: String
    public var details: DetailGroup<Details>
    public var priceHistory: DetailGroup<PriceHistory>
    public var transactions: DetailGroup<[SymbolTransaction]>
    public var taxLots: DetailGroup<TaxLots>
    public var loadedAt: Date

    /// Fully loaded: every group is. Only a complete detail is kept as cached; prefetching of the
    /// neighbours starts only from one.
    public var isComplete: Bool {
        details.isLoaded && priceHistory.isLoaded && transactions.isLoaded && taxLots.isLoaded
    }

    /// Last trade and quote, and the market's status.
    public struct Details: Sendable, Equatable {
        public var lastTrade: Trade?
        public var lastQuote: Quote?
        public var marketStatus: PolygonREST.MarketStatus?
    }

    public enum Source: String, Sendable, Codable {
        /// The relay's own stream (the hub's last value).
        case live
        /// The upstream's REST API.
        case rest
    }

    public struct Trade: Sendable, Equatable {
        public var price: Decimal
        public var size: Decimal?
        public var at: Date
        public var source: Source
    }

    public struct Quote: Sendable, Equatable {
        public var bid: Decimal
        public var bidSize: Decimal?
        public var ask: Decimal
        public var askSize: Decimal?
        public var at: Date
        public var source: Source
    }

    /// Daily bars over the past year and their average true range.
    public struct PriceHistory: Sendable, Equatable {
        public var from: Day
        public var to: Day
        public var bars: [HistoryBar]
        /// Wilder's ATR over `atrPeriod` bars, as of the last bar; `nil` with too few bars.
        public var atr: Decimal?
        public static let atrPeriod = 14
    }

    public struct HistoryBar: Sendable, Equatable {
        public var day: Day
        public var open, high, low, close: Decimal
        public var volume: Decimal
        /// The ATR as of this bar (from the `atrPeriod`-th bar on).
        public var atr: Decimal?
    }

    /// The open FIFO lots of every active brokerage account.
    public struct TaxLots: Sendable, Equatable {
        public var lots: [TaxLot]
        public var sharesAvailable: Decimal
        public var costBasis: Decimal
        /// Cost basis per share, `nil` with no shares.
        public var averageCost: Decimal?
    }

    public struct TaxLot: Sendable, Equatable {
        public var accountID: Int64
        public var accountName: String
        public var acquired: Day
        public var quantity: Decimal
        public var unitCost: Decimal
        public var costBasis: Decimal
        /// Held more than a year (`long`) or not (`short`), as of today.
        public var term: String
    }
}

/// A transaction of one symbol, with its account's name.
public struct SymbolTransaction: Sendable, Equatable {
    public var transaction: Transaction
    public var accountName: String
}

/// Average true range, Wilder's smoothing: the first value is the mean of the first `period` true
/// ranges (each needs the previous close), later ones `(previous × (period − 1) + TR) / period`.
/// Pure; values rounded to 4 places.
public enum AverageTrueRange {
    public static func series(high: [Decimal], low: [Decimal], close: [Decimal], period: Int = 14) -> [Decimal?] {
        let count = min(high.count, low.count, close.count)
        var result = [Decimal?](repeating: nil, count: count)
        guard period > 0, count > period else { return result }
        var sum: Decimal = 0
        var atr: Decimal = 0
        for index in 1..<count {
            let previous = close[index - 1]
            let range = max(high[index] - low[index], abs(high[index] - previous), abs(low[index] - previous))
            if index <= period {
                sum += range
                if index == period {
                    atr = sum / Decimal(period)
                    result[index] = DecimalText.rounded(atr, scale: 4)
                }
            } else {
                atr = (atr * Decimal(period - 1) + range) / Decimal(period)
                result[index] = DecimalText.rounded(atr, scale: 4)
            }
        }
        return result
    }
}
