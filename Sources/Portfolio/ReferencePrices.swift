import PortfolioDomain
import Foundation
import MarketREST

/// Prices from the upstream's REST API (the last trade and the previous close), for symbols with no
/// live tick yet: at start, or with the market closed. The demo feed serves the same endpoints.
///
/// `Sendable`. Every symbol gets its own `Result`; concurrency, retries and cancellation are the REST
/// client's (these requests are bulk ones: security details, prefetched or waited for, go first).
public struct ReferencePrices: Sendable {
    public let rest: any MarketReference

    public init(rest: any MarketReference) {
        self.rest = rest
    }

    /// What the REST API knows of one symbol.
    public struct Reference: Sendable, Equatable {
        public var lastTrade: PriceObservation?
        public var previousClose: Decimal?
    }

    public typealias FetchError = RESTError

    /// References for many symbols, concurrently (as far as the REST client's limit allows), each with
    /// its own outcome.
    public func fetch(_ symbols: [String]) async -> [String: Result<Reference, FetchError>] {
        await withTaskGroup(of: (String, Result<Reference, FetchError>).self) { group in
            for symbol in Set(symbols) {
                group.addTask { (symbol, await self.reference(for: symbol)) }
            }
            var results: [String: Result<Reference, FetchError>] = [:]
            for await (symbol, result) in group { results[symbol] = result }
            return results
        }
    }

    /// One symbol's last trade and previous close; succeeds when either is known.
    public func reference(for symbol: String) async -> Result<Reference, FetchError> {
        async let trade = rest.lastTrade(symbol, priority: .bulk)
        async let previous = rest.previousClose(symbol, priority: .bulk)
        let (tradeResult, previousResult) = await (trade, previous)
        var reference = Reference()
        if case .success(let last) = tradeResult, last.price > 0 {
            reference.lastTrade = PriceObservation(value: last.price, at: EventPrices.seen(last.timestamp, now: .now), source: .restLastTrade)
        }
        if case .success(let close) = previousResult { reference.previousClose = close }
        if reference.lastTrade == nil, reference.previousClose == nil {
            if case .failure(let error) = tradeResult { return .failure(error) }
            if case .failure(let error) = previousResult { return .failure(error) }
            return .failure(.malformed("no price for \(symbol)"))
        }
        return .success(reference)
    }
}
