import Foundation
import NIOCore
import PolygonWire

#if canImport(FoundationNetworking)
    import FoundationNetworking
#endif

/// Prices from the upstream's REST API (Polygon's `/v2/last/trade/{ticker}` and
/// `/v2/aggs/ticker/{ticker}/prev`), for symbols with no live tick yet: at start, or with the market
/// closed. The demo feed serves the same endpoints.
///
/// `Sendable`. Every symbol gets its own `Result`; requests run concurrently up to `maxConcurrent`;
/// transport errors, 429 and 5xx are retried with exponential backoff and full jitter, other 4xx fail
/// at once; cancellation stops waiting and retrying.
public struct ReferencePrices: Sendable {
    public var baseURL: String
    public var apiKey: String
    public var maxConcurrent: Int
    public var attempts: Int
    public var initialBackoff: Duration

    public init(baseURL: String, apiKey: String, maxConcurrent: Int = 4, attempts: Int = 4, initialBackoff: Duration = .milliseconds(200)) {
        self.baseURL = baseURL.hasSuffix("/") ? String(baseURL.dropLast()) : baseURL
        self.apiKey = apiKey
        self.maxConcurrent = max(1, maxConcurrent)
        self.attempts = max(1, attempts)
        self.initialBackoff = initialBackoff
    }

    /// What the REST API knows of one symbol.
    public struct Reference: Sendable, Equatable {
        public var lastTrade: PriceObservation?
        public var previousClose: Decimal?
    }

    public enum FetchError: Error, Sendable, Equatable, CustomStringConvertible {
        case status(Int, String)
        case malformed(String)
        case transport(String)

        public var description: String {
            switch self {
            case .status(let code, let body): "HTTP \(code): \(body.prefix(200))"
            case .malformed(let what): "unreadable answer: \(what)"
            case .transport(let error): "request failed: \(error)"
            }
        }
    }

    /// References for many symbols, concurrently, each with its own outcome.
    public func fetch(_ symbols: [String]) async -> [String: Result<Reference, FetchError>] {
        await withTaskGroup(of: (String, Result<Reference, FetchError>).self) { group in
            var results: [String: Result<Reference, FetchError>] = [:]
            var pending = symbols[...]
            func startNext() {
                guard let symbol = pending.popFirst() else { return }
                group.addTask { (symbol, await self.reference(for: symbol)) }
            }
            for _ in 0..<maxConcurrent { startNext() }
            for await (symbol, result) in group {
                results[symbol] = result
                startNext()
            }
            return results
        }
    }

    /// One symbol's last trade and previous close; succeeds when either is known.
    public func reference(for symbol: String) async -> Result<Reference, FetchError> {
        let escaped = symbol.addingPercentEncoding(withAllowedCharacters: .urlPathAllowed) ?? symbol
        async let trade = get("/v2/last/trade/\(escaped)")
        async let previous = get("/v2/aggs/ticker/\(escaped)/prev")
        let (tradeBody, previousBody) = await (trade, previous)
        var reference = Reference()
        if case .success(let body) = tradeBody, let price = EventPrices.number("p", in: body), price > 0 {
            let nanoseconds = EventPrices.number("t", in: body).map { NSDecimalNumber(decimal: $0).doubleValue } ?? 0
            reference.lastTrade = PriceObservation(value: price, at: Date(timeIntervalSince1970: nanoseconds / 1e9), source: .restLastTrade)
        }
        if case .success(let body) = previousBody, let close = EventPrices.number("c", in: body), close > 0 {
            reference.previousClose = close
        }
        if reference.lastTrade == nil, reference.previousClose == nil {
            if case .failure(let error) = tradeBody { return .failure(error) }
            if case .failure(let error) = previousBody { return .failure(error) }
            return .failure(.malformed("no price for \(symbol)"))
        }
        return .success(reference)
    }

    private func get(_ path: String) async -> Result<ByteBuffer, FetchError> {
        let separator = path.contains("?") ? "&" : "?"
        guard
            let url = URL(
                string: "\(baseURL)\(path)\(separator)apiKey=\(apiKey.addingPercentEncoding(withAllowedCharacters: .alphanumerics) ?? "")")
        else {
            return .failure(.malformed("bad URL \(baseURL)\(path)"))
        }
        var last: FetchError = .transport("not attempted")
        for attempt in 0..<attempts {
            if attempt > 0 {
                let backoff = Backoff(initial: initialBackoff, cap: initialBackoff * 1024)
                do { try await Task.sleep(for: backoff.delay(attempt: attempt - 1)) } catch { return .failure(.transport("cancelled")) }
            }
            do {
                var request = URLRequest(url: url)
                request.timeoutInterval = 10
                let (data, response) = try await URLSession.shared.data(for: request)
                let status = (response as? HTTPURLResponse)?.statusCode ?? 0
                if (200..<300).contains(status) { return .success(ByteBuffer(bytes: data)) }
                last = .status(status, String(decoding: data, as: UTF8.self))
                if status != 429 && status < 500 { return .failure(last) }
            } catch {
                if Task.isCancelled { return .failure(.transport("cancelled")) }
                last = .transport("\(error)")
            }
        }
        return .failure(last)
    }
}
