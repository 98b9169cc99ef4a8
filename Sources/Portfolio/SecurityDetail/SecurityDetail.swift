import PortfolioDomain
import MarketCore
import MarketREST
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

/// `{"status":"loaded","data":…}` or `{"status":"failed","error":…}`.
extension DetailGroup: Encodable where Value: Encodable {
    enum CodingKeys: String, CodingKey { case status, data, error }

    public func encode(to encoder: any Encoder) throws {
        var c = encoder.container(keyedBy: CodingKeys.self)
        switch self {
        case .loaded(let value):
            try c.encode("loaded", forKey: .status)
            try c.encode(value, forKey: .data)
        case .failed(let reason):
            try c.encode("failed", forKey: .status)
            try c.encode(reason, forKey: .error)
        }
    }
}

/// What a client sees of one security: four groups, each loaded on its own.
public struct SecurityDetail: Sendable, Encodable {
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

    enum CodingKeys: String, CodingKey { case symbol, assetType, complete, loadedAt, details, priceHistory, transactions, taxLots }

    public func encode(to encoder: any Encoder) throws {
        var c = encoder.container(keyedBy: CodingKeys.self)
        try c.encode(symbol, forKey: .symbol)
        try c.encode(AssetType(ticker: symbol), forKey: .assetType)
        try c.encode(isComplete, forKey: .complete)
        try c.encode(loadedAt, forKey: .loadedAt)
        try c.encode(details, forKey: .details)
        try c.encode(priceHistory, forKey: .priceHistory)
        try c.encode(transactions, forKey: .transactions)
        try c.encode(taxLots, forKey: .taxLots)
    }

    /// Last trade and quote, and the market's status.
    public struct Details: Sendable, Equatable, Encodable {
        public var lastTrade: Trade?
        public var lastQuote: Quote?
        public var marketStatus: MarketStatus?
        /// The topics whose values were left out because the client's key may not read them.
        public var withheld: [String]? = nil
    }

    /// The detail without what a client's key may not read (``PriceAccess``): the last trade and the
    /// daily price history (bars of trades) without the symbol's trades topic, the last quote without
    /// its quotes topic; the topics left out are named in `details.withheld`. (The cache keeps the whole
    /// detail; each answer is cut for its client.)
    public func withholding(_ readable: PriceReadability, topics: PriceTopics) -> SecurityDetail {
        guard readable != .all else { return self }
        var copy = self
        // A market priced by one kind of topic names it for both.
        let (trade, quote) = (topics.trade ?? topics.quote, topics.quote ?? topics.trade)
        if !readable.trade { copy.priceHistory = .failed("withheld: this key may not read \(trade?.description ?? "T.\(symbol)")") }
        guard case .loaded(var values) = details else { return copy }
        var withheld: [String] = []
        if !readable.trade {
            values.lastTrade = nil
            withheld.append(trade?.description ?? "T.\(symbol)")
        }
        if !readable.quote {
            values.lastQuote = nil
            withheld.append(quote?.description ?? "Q.\(symbol)")
        }
        withheld = withheld.reduce(into: []) { kept, topic in if !kept.contains(topic) { kept.append(topic) } }
        values.withheld = withheld
        copy.details = .loaded(values)
        return copy
    }

    public enum Source: String, Sendable, Codable {
        /// The relay's own stream (the hub's last value).
        case live
        /// The upstream's REST API.
        case rest
    }

    public struct Trade: Sendable, Equatable, Encodable {
        public var price: Decimal
        public var size: Decimal?
        public var at: Date
        public var source: Source
    }

    public struct Quote: Sendable, Equatable, Encodable {
        public var bid: Decimal
        public var bidSize: Decimal?
        public var ask: Decimal
        public var askSize: Decimal?
        public var at: Date
        public var source: Source
    }

    /// Daily bars over the past year and their average true range.
    public struct PriceHistory: Sendable, Equatable, Encodable {
        public var from: Day
        public var to: Day
        public var bars: [HistoryBar]
        /// Wilder's ATR over `atrPeriod` bars, as of the last bar; `nil` with too few bars.
        public var atr: Decimal?
        public static let atrPeriod = 14

        enum CodingKeys: String, CodingKey { case from, to, bars, atr, atrPeriod }

        public func encode(to encoder: any Encoder) throws {
            var c = encoder.container(keyedBy: CodingKeys.self)
            try c.encode(from, forKey: .from)
            try c.encode(to, forKey: .to)
            try c.encode(bars, forKey: .bars)
            try c.encodeIfPresent(atr, forKey: .atr)
            try c.encode(Self.atrPeriod, forKey: .atrPeriod)
        }
    }

    public struct HistoryBar: Sendable, Equatable, Encodable {
        public var day: Day
        public var open, high, low, close: Decimal
        public var volume: Decimal
        /// The ATR as of this bar (from the `atrPeriod`-th bar on).
        public var atr: Decimal?

        /// On the wire the day is `date`, as a transaction's.
        enum CodingKeys: String, CodingKey { case day = "date", open, high, low, close, volume, atr }
    }

    /// The open FIFO lots of every active brokerage account.
    public struct TaxLots: Sendable, Equatable, Encodable {
        public var lots: [TaxLot]
        public var sharesAvailable: Decimal
        public var costBasis: Decimal
        /// Cost basis per share, `nil` with no shares.
        public var averageCost: Decimal?
    }

    public struct TaxLot: Sendable, Equatable, Encodable {
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
public struct SymbolTransaction: Sendable, Equatable, Encodable {
    public var transaction: Transaction
    public var accountName: String

    enum CodingKeys: String, CodingKey { case accountName }

    /// The transaction with its account's name beside its fields.
    public func encode(to encoder: any Encoder) throws {
        try transaction.encode(to: encoder)
        var c = encoder.container(keyedBy: CodingKeys.self)
        try c.encode(accountName, forKey: .accountName)
    }
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
