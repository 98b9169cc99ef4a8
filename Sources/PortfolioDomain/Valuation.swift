import Foundation

/// A price seen for a symbol, with when and from where.
public struct PriceObservation: Sendable, Equatable, Codable {
    public enum Source: String, Sendable, Codable {
        case trade, quoteMid = "quote_mid", restLastTrade = "rest_last_trade", previousClose = "previous_close"
    }

    public var value: Decimal
    public var at: Date
    public var source: Source

    public init(value: Decimal, at: Date, source: Source) {
        self.value = value
        self.at = at
        self.source = source
    }
}

/// What is known of one symbol's price. The rule (``PriceRule``) picks from it.
public struct SymbolPrices: Sendable, Equatable {
    public var lastTrade: PriceObservation?
    public var lastQuoteMid: PriceObservation?
    /// From the upstream's REST API: last trade, or previous close when that is all there is.
    public var reference: PriceObservation?
    /// Yesterday's close, for the day change.
    public var previousClose: Decimal?

    public init(
        lastTrade: PriceObservation? = nil, lastQuoteMid: PriceObservation? = nil, reference: PriceObservation? = nil,
        previousClose: Decimal? = nil
    ) {
        self.lastTrade = lastTrade
        self.lastQuoteMid = lastQuoteMid
        self.reference = reference
        self.previousClose = previousClose
    }
}

/// What a client may read of a symbol's prices: its trades (the last trade, the REST last trade and
/// previous close, which are trades too) and its quotes (their mid). A client key limited to some
/// topics sees in a valuation only the prices of the topics it may read (``SymbolPrices/readable(_:)``);
/// a symbol it may read neither of is `withheld`. Value type, `Sendable`.
public struct PriceReadability: Sendable, Equatable {
    public var trade: Bool
    public var quote: Bool

    public init(trade: Bool, quote: Bool) {
        (self.trade, self.quote) = (trade, quote)
    }

    public static let all = PriceReadability(trade: true, quote: true)
    public static let none = PriceReadability(trade: false, quote: false)
}

extension SymbolPrices {
    /// The prices a client that may read `readability` sees: without trades, no last trade, REST
    /// reference or previous close; without quotes, no quote mid.
    public func readable(_ readability: PriceReadability) -> SymbolPrices {
        guard readability != .all else { return self }
        var seen = self
        if !readability.trade { (seen.lastTrade, seen.reference, seen.previousClose) = (nil, nil, nil) }
        if !readability.quote { seen.lastQuoteMid = nil }
        return seen
    }
}

/// The price rule: the last trade when it is fresh, else the mid of the last quote when that is fresh,
/// else the freshest price of any source, marked `stale`; none at all is `unavailable`. Fresh means
/// younger than `staleAfter` (default 15 minutes).
public struct PriceRule: Sendable {
    public var staleAfter: TimeInterval

    public init(staleAfter: TimeInterval = 15 * 60) {
        self.staleAfter = staleAfter
    }

    public enum Status: String, Sendable, Codable {
        case priced, stale, unavailable
        /// Left out for the client asking: its key may read none of the symbol's price topics.
        case withheld
    }

    public func pick(_ prices: SymbolPrices, now: Date) -> (PriceObservation?, Status) {
        func fresh(_ observation: PriceObservation?) -> Bool {
            observation.map { now.timeIntervalSince($0.at) <= staleAfter } ?? false
        }
        if fresh(prices.lastTrade) { return (prices.lastTrade, .priced) }
        if fresh(prices.lastQuoteMid) { return (prices.lastQuoteMid, .priced) }
        if fresh(prices.reference) { return (prices.reference, .priced) }
        let newest = [prices.lastTrade, prices.lastQuoteMid, prices.reference].compactMap { $0 }.max { $0.at < $1.at }
        return newest.map { ($0, .stale) } ?? (nil, .unavailable)
    }
}

/// One position valued: every figure is exact; missing figures are `nil`, never substituted.
public struct PositionValuation: Sendable, Codable, Equatable {
    public var symbol: String
    public var quantity: Decimal
    public var costBasis: Decimal
    public var price: Decimal?
    public var priceTime: Date?
    public var priceSource: PriceObservation.Source?
    public var marketValue: Decimal?
    public var unrealizedPnL: Decimal?
    /// Percent of cost basis, rounded to 4 places.
    public var unrealizedPnLPercent: Decimal?
    /// Market value change against the previous close.
    public var dayChange: Decimal?
    public var status: PriceRule.Status
}

/// A set of positions and cash valued together. The total is the `priced` rows plus the cash: a stale
/// or missing price never hides behind the total, it shows in `hasPartialFailures` and the symbol lists.
public struct Valuation: Sendable, Codable, Equatable {
    public var asOf: Date
    public var positions: [PositionValuation]
    /// Positions (priced rows) plus cash.
    public var total: Decimal
    /// The priced positions alone.
    public var positionsValue: Decimal
    /// The brokerage accounts' cash.
    public var cash: Decimal
    public var costBasis: Decimal
    public var unrealizedPnL: Decimal
    public var dayChange: Decimal
    public var hasPartialFailures: Bool
    public var unpricedSymbols: [String]
    public var staleSymbols: [String]
    /// Positions whose price the client's key may not read (``PriceRule/Status/withheld``): left out of
    /// the total as unpriced ones are.
    public var withheldSymbols: [String] = []
    /// The accounts in the total, each with its value and how it was had (the portfolio's valuation).
    public var accounts: [AccountValue] = []

    /// - Parameter readability: what the client asking may read of each symbol's prices (`nil`: all).
    public static func of(
        _ positions: [PositionBook.Position], cash: Decimal = 0, prices: [String: SymbolPrices], rule: PriceRule, now: Date,
        readability: ((String) -> PriceReadability)? = nil
    ) -> Valuation {
        var rows: [PositionValuation] = []
        var total: Decimal = 0
        var cost: Decimal = 0
        var pnl: Decimal = 0
        var dayChange: Decimal = 0
        var unpriced: [String] = []
        var stale: [String] = []
        var withheld: [String] = []
        for position in positions.sorted(by: { $0.symbol < $1.symbol }) {
            let quantity = position.quantity
            let basis = position.costBasis
            let readable = readability?(position.symbol) ?? .all
            let seen = (prices[position.symbol] ?? SymbolPrices()).readable(readable)
            var (price, status) = rule.pick(seen, now: now)
            if readable == .none { (price, status) = (nil, .withheld) }
            var row = PositionValuation(symbol: position.symbol, quantity: quantity, costBasis: basis, status: status)
            if let price {
                let value = quantity * price.value
                row.price = price.value
                row.priceTime = price.at
                row.priceSource = price.source
                row.marketValue = value
                row.unrealizedPnL = value - basis
                row.unrealizedPnLPercent = basis == 0 ? nil : DecimalText.rounded((value - basis) / basis * 100, scale: 4)
                row.dayChange = seen.previousClose.map { quantity * (price.value - $0) }
            }
            switch status {
            case .priced:
                total += row.marketValue ?? 0
                cost += basis
                pnl += row.unrealizedPnL ?? 0
                dayChange += row.dayChange ?? 0
            case .stale: stale.append(position.symbol)
            case .unavailable: unpriced.append(position.symbol)
            case .withheld: withheld.append(position.symbol)
            }
            rows.append(row)
        }
        return Valuation(
            asOf: now, positions: rows, total: total + cash, positionsValue: total, cash: cash, costBasis: cost, unrealizedPnL: pnl, dayChange: dayChange,
            hasPartialFailures: !unpriced.isEmpty || !stale.isEmpty || !withheld.isEmpty, unpricedSymbols: unpriced, staleSymbols: stale,
            withheldSymbols: withheld)
    }
}

/// One account's part of a valuation.
public struct AccountValue: Sendable, Codable, Equatable {
    public enum Basis: String, Sendable, Codable {
        /// Positions valued now from live prices, plus cash (brokerage).
        case live
        /// The last value entered (savings), as of `asOf`.
        case lastUpdate = "last_update"
    }

    public var id: Int64
    public var name: String
    public var kind: AccountKind
    /// `nil`: no value known yet (a savings account without an update).
    public var value: Decimal?
    /// Brokerage accounts' cash (part of `value`).
    public var cash: Decimal?
    public var asOf: Date?
    public var basis: Basis
    /// Part of the value is missing (unpriced or stale positions, or no value at all).
    public var partial: Bool

    public init(
        id: Int64, name: String, kind: AccountKind, value: Decimal?, cash: Decimal?, asOf: Date?, basis: Basis, partial: Bool
    ) {
        (self.id, self.name, self.kind, self.value, self.cash, self.asOf, self.basis, self.partial) = (
            id, name, kind, value, cash, asOf, basis, partial
        )
    }
}
