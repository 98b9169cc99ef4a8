import PortfolioDomain
import AsyncHTTPClient
import Foundation
import Logging
import NIOCore
import MarketREST
import MarketCore
import PolygonWire
import RESTGateway

/// The upstream's REST API, Polygon's paths: last trade and quote, daily aggregates, previous close,
/// market status. The demo feed serves the same paths.
///
/// `Sendable`. On the HTTP client it is given (``VendorHTTPClient``: no redirect followed); at most `gate.limit` requests at a time, in the
/// gate's order (foreground, then background, then bulk); transport errors, 429 and 5xx are retried with exponential backoff and full
/// jitter, other 4xx fail at once; cancelling the calling task cancels the request in flight (the
/// connection is closed, so the server sees it) and any wait.
public struct PolygonREST: MarketReference {
    /// The API's base URL; resolved when a request is made, so a relay can name a demo feed that is
    /// not listening yet.
    private let baseURL: @Sendable () async throws -> String
    public var apiKey: String
    public var attempts: Int
    public var initialBackoff: Duration
    /// The whole request, body included.
    public var timeout: Duration
    /// The largest body read; a larger one fails the request (and is not asked for again).
    public var maxBodyBytes = 16 << 20
    /// The most of an error's body read (its first 4 KB reach logs and clients): the rest is not read.
    static let maxErrorBodyBytes = 64 << 10
    public let gate: RequestGate
    /// The account's budget, shared with the REST gateway's clients: each attempt takes a token
    /// (waiting as long as it takes), and a vendor's 429 pauses it for its `Retry-After`.
    public var budget: (any AccountBudget)?
    /// The bound on the bytes of vendor answers being read that the REST gateway counts too: fills,
    /// portfolio and gateway reads hold no more than it together (one read alone always goes on).
    public var reading: ReadingBytes?
    private let client: HTTPClient

    public init(
        baseURL: String, apiKey: String, maxConcurrent: Int = 4, attempts: Int = 4, initialBackoff: Duration = .milliseconds(200),
        timeout: Duration = .seconds(10), client: HTTPClient
    ) {
        self.init(
            resolvingBaseURL: { baseURL }, apiKey: apiKey, maxConcurrent: maxConcurrent, attempts: attempts,
            initialBackoff: initialBackoff, timeout: timeout, client: client)
    }

    public init(
        resolvingBaseURL baseURL: @escaping @Sendable () async throws -> String, apiKey: String, maxConcurrent: Int = 4,
        attempts: Int = 4, initialBackoff: Duration = .milliseconds(200), timeout: Duration = .seconds(10),
        client: HTTPClient
    ) {
        self.baseURL = {
            let url = try await baseURL()
            return url.hasSuffix("/") ? String(url.dropLast()) : url
        }
        self.apiKey = apiKey
        self.attempts = max(1, attempts)
        self.initialBackoff = initialBackoff
        self.timeout = timeout
        self.gate = RequestGate(limit: maxConcurrent)
        self.client = client
    }

    public typealias FetchError = RESTError
    public typealias Bar = DailyBar

    /// The body of `GET path?query`, a JSON document of at most `maxBytes` (``maxBodyBytes`` when
    /// `nil`). The key travels in the `Authorization` header, never in the URL (URLs end up in proxies'
    /// and servers' logs).
    public func get(
        _ path: String, query: [(String, String)] = [], priority: RequestGate.Priority = .foreground, maxBytes: Int? = nil
    ) async -> Result<ByteBuffer, FetchError> {
        let maxBodyBytes = maxBytes ?? self.maxBodyBytes
        var components = URLComponents()
        components.queryItems = query.map { URLQueryItem(name: $0.0, value: $0.1) }
        let base: String
        do { base = try await baseURL() } catch { return .failure(.transport("no REST address: \(error)")) }
        // A `+` sent as itself is a space to the vendor: one in a value (a cursor's) goes encoded.
        let queryText = (components.percentEncodedQuery ?? "").replacingOccurrences(of: "+", with: "%2B")
        let url = queryText.isEmpty ? "\(base)\(path)" : "\(base)\(path)?\(queryText)"
        var last: FetchError = .transport("not attempted")
        let backoff = Backoff(initial: initialBackoff, cap: initialBackoff * 1024)
        // Retries end with the call's whole time, three timeouts from its first attempt: a host that
        // fails slowly, or asks to be left alone for minutes, does not hold the caller for minutes.
        var retriesEnd: ContinuousClock.Instant?
        for attempt in 0..<attempts {
            if attempt > 0 {
                let delay = backoff.delay(attempt: attempt - 1)
                if let retriesEnd, ContinuousClock.now + delay >= retriesEnd { return .failure(last) }
                do { try await Task.sleep(for: delay) } catch { return .failure(.cancelled) }
            }
            if let budget, await budget.take(priority, bounded: false) == .cancelled { return .failure(.cancelled) }
            if retriesEnd == nil { retriesEnd = .now + timeout * 3 }
            do {
                let (status, body, retryAfter) = try await gate.run(priority) { [client, apiKey, timeout, maxBodyBytes, reading] in
                    // The timeout covers the whole answer, its body too: AsyncHTTPClient's own ends at
                    // the head, and a body trickled a byte at a time would hold the request for ever.
                    try await RESTDeadline.within(timeout) {
                        var request = HTTPClientRequest(url: url)
                        request.headers.add(name: "Accept", value: "application/json")
                        request.headers.add(name: "Authorization", value: "Bearer \(apiKey)")
                        let response = try await client.execute(request, timeout: .milliseconds(timeout.milliseconds))
                        let retryAfter = response.headers.first(name: "Retry-After").flatMap { Int($0) }
                        let status = Int(response.status.code)
                        // An error's body is read only as far as its text is used.
                        guard (200..<300).contains(status) else {
                            return (status, try await Self.prefix(of: response.body, upTo: Self.maxErrorBodyBytes), retryAfter)
                        }
                        return (status, try await RESTGateway.read(response.body, upTo: maxBodyBytes, counting: reading, status: status), retryAfter)
                    }
                }
                if (200..<300).contains(status) { return .success(body) }
                // Its text reaches logs and clients (a fill's reasons): never with the key in it.
                last = .status(status, Self.errorText(body, scrubbing: apiKey))
                if status == 429 {
                    if let budget { await budget.pause(for: .seconds(retryAfter ?? 1)) }
                    // A pause past the call's time is waited out by later calls, not by this one.
                    if let retriesEnd, ContinuousClock.now + .seconds(retryAfter ?? 1) >= retriesEnd { return .failure(last) }
                }
                if status != 429 && status < 500 { return .failure(last) }
            } catch {
                if Task.isCancelled || error is CancellationError { return .failure(.cancelled) }
                // A server that took the whole timeout without a whole answer (a trickled body) is not
                // asked again: each attempt would hold the caller as long again.
                if error is RESTDeadline.TimedOut { return .failure(.transport("\(error)")) }
                // Nor one that sent more than the answer may be: it would send as much again.
                if error is NIOTooManyBytesError { return .failure(.malformed("an answer of more than \(maxBodyBytes) bytes")) }
                // Nor while the relay holds as much of the vendor's answers as it may: asking again would
                // spend the account's budget on a page read again as memory is tight (its caller's own
                // pace, a fill's next turn, comes back later).
                if let refused = error as? ReadingRefused { return .failure(.transport("\(refused)")) }
                last = .transport("\(error)")
                // The relay is stopping: no later attempt can succeed.
                if let error = error as? HTTPClientError, error == .alreadyShutdown { return .failure(last) }
            }
        }
        return .failure(last)
    }

    /// The body of a `next_url` a page named (Polygon's paging: an opaque `cursor`, and no key, which
    /// the request carries in its header again). Only its path and query are taken, asked of the API's own
    /// address: a page can never send the key elsewhere, and one naming the vendor's other host name
    /// (`api.massive.com` for `api.polygon.io`) or its port is followed all the same. A base URL with a
    /// path (a proxy's) is not asked that path twice.
    public func get(nextURL: String, priority: RequestGate.Priority = .foreground) async -> Result<ByteBuffer, FetchError> {
        let base: String
        do { base = try await baseURL() } catch { return .failure(.transport("no REST address: \(error)")) }
        // As sent (percent-encoded: an encoded `?` or `#` stays in the path), from the root, and with no
        // `.` or `..` segment (a proxy in front of the vendor would resolve it to another of its routes).
        guard let next = URLComponents(string: nextURL), next.percentEncodedPath.hasPrefix("/"),
            !next.path.split(separator: "/").contains(where: { $0 == "." || $0 == ".." })
        else { return .failure(.malformed("next_url \(VisibleText.visible(nextURL, limit: 120)) names no path of the API")) }
        let prefix = URLComponents(string: base)?.percentEncodedPath ?? ""
        let encoded = next.percentEncodedPath
        let path = !prefix.isEmpty && prefix != "/" && encoded.hasPrefix(prefix + "/") ? String(encoded.dropFirst(prefix.count)) : encoded
        let query = (next.queryItems ?? []).filter { $0.name != "apiKey" }.map { ($0.name, $0.value ?? "") }
        return await get(path, query: query, priority: priority)
    }

    public static func escaped(_ symbol: String) -> String { GatewayPath.escaped(symbol) }

    /// The first `limit` bytes of `body`; the rest is not read (leaving the body closes its connection).
    static func prefix(of body: HTTPClientResponse.Body, upTo limit: Int) async throws -> ByteBuffer {
        var kept = ByteBuffer()
        for try await part in body {
            let room = limit - kept.readableBytes
            if let slice = part.getSlice(at: part.readerIndex, length: min(room, part.readableBytes)) { kept.writeImmutableBuffer(slice) }
            if kept.readableBytes >= limit { break }
        }
        return kept
    }

    /// A vendor's error body as its text reaches logs and clients (a fill's reasons): its first 4 KB,
    /// cut in the bytes before any key that crosses the cut, then with every key replaced.
    package static func errorText(_ body: ByteBuffer, scrubbing key: String) -> String {
        let needle = Array(key.utf8)
        var end = min(body.readableBytes, 4096)
        // A key that begins within the cut and runs past it: the cut moves to its start.
        if needle.count >= 4, end < body.readableBytes, let found = body.firstOffset(of: needle, from: max(0, end - needle.count + 1)), found < end {
            end = found
        }
        let cut = body.getSlice(at: body.readerIndex, length: end) ?? ByteBuffer()
        // Scrubbed as the gateway scrubs what it passes on.
        return String(buffer: needle.count >= 4 ? cut.replacing([key], with: RESTCredentials.hidden) : cut)
    }

    /// The most bytes an answer of one value (a last trade, a last quote, a previous close) is read to.
    static let singleAnswerBytes = 64 << 10

    /// `/v2/last/trade/{ticker}`.
    public func lastTrade(_ symbol: String, priority: RequestGate.Priority = .foreground) async -> Result<LastTrade, FetchError> {
        await get("/v2/last/trade/\(Self.escaped(symbol))", priority: priority, maxBytes: Self.singleAnswerBytes).flatMap { Self.results(TradeResults.self, $0) }.map {
            LastTrade(price: $0.p, size: $0.s, timestamp: $0.t)
        }
    }

    /// `/v2/last/nbbo/{ticker}`.
    public func lastQuote(_ symbol: String, priority: RequestGate.Priority = .foreground) async -> Result<LastQuote, FetchError> {
        await get("/v2/last/nbbo/\(Self.escaped(symbol))", priority: priority, maxBytes: Self.singleAnswerBytes).flatMap { Self.results(QuoteResults.self, $0) }.map {
            LastQuote(bid: $0.p, bidSize: $0.s, ask: $0.P, askSize: $0.S, timestamp: $0.t)
        }
    }

    /// `/v2/aggs/ticker/{ticker}/prev`: the previous session's close.
    public func previousClose(_ symbol: String, priority: RequestGate.Priority = .foreground) async -> Result<Decimal, FetchError> {
        await get("/v2/aggs/ticker/\(Self.escaped(symbol))/prev", priority: priority, maxBytes: Self.singleAnswerBytes).flatMap { body in
            guard let close = PolygonWireProtocol.numberText("c", in: String(buffer: body)).flatMap(EventPrices.decimal), close > 0 else {
                return .failure(.malformed("no close"))
            }
            return .success(close)
        }
    }

    /// `/v2/aggs/ticker/{ticker}/range/1/day/{from}/{to}`: daily bars, oldest first, one a day at most
    /// (a day sent twice: its last), each within `from...to` (UTC days of their start) with a close
    /// above 0. A body larger than such days' bars can be is not read.
    public func dailyBars(_ symbol: String, from: Day, to: Day, priority: RequestGate.Priority = .foreground) async -> Result<
        [Bar], FetchError
    > {
        let path = "/v2/aggs/ticker/\(Self.escaped(symbol))/range/1/day/\(from)/\(to)"
        let calendar = DayCalendar.utc
        let days = max(0, Int(calendar.startOfDay(to).timeIntervalSince(calendar.startOfDay(from)) / 86_400)) + 1
        let query = [("adjusted", "true"), ("sort", "asc"), ("limit", "50000")]
        return await get(path, query: query, priority: priority, maxBytes: min(maxBodyBytes, 4096 + Self.dailyBarBytes * days)).flatMap { body in
            do {
                let page = try JSONDecoder().decode(AggregatesPage.self, from: Data(body.readableBytesView))
                return .success(Self.clipped(page.results ?? [], from: from, to: to))
            } catch {
                return .failure(.malformed("aggregates: \(error)"))
            }
        }
    }

    /// The most one daily bar's row takes in an aggregates page, generously (a real one about 110 bytes).
    static let dailyBarBytes = 512

    /// Rows as bars: those of days in `from...to` with a close above 0, one a day (its last), oldest first.
    static func clipped(_ rows: [AggregatesPage.Row], from: Day, to: Day) -> [Bar] {
        var byDay: [Day: Bar] = [:]
        for row in rows where row.c > 0 {
            let day = DayCalendar.utc.day(of: Date(timeIntervalSince1970: Double(row.t) / 1000))
            guard from <= day, day <= to else { continue }
            byDay[day] = Bar(start: row.t, open: row.o, high: row.h, low: row.l, close: row.c, volume: row.v)
        }
        return byDay.sorted { $0.key < $1.key }.map(\.value)
    }

    /// `/v1/marketstatus/now`: bounded (``MarketStatus/bounded()``; a real answer is about 500 bytes).
    public func marketStatus(priority: RequestGate.Priority = .foreground) async -> Result<MarketStatus, FetchError> {
        await get("/v1/marketstatus/now", priority: priority, maxBytes: Self.singleAnswerBytes).flatMap { body in
            do {
                guard let status = try JSONDecoder().decode(MarketStatus.self, from: Data(body.readableBytesView)).bounded() else {
                    return .failure(.malformed("market status: a market name of more than \(MarketStatus.maxText) bytes"))
                }
                return .success(status)
            } catch {
                return .failure(.malformed("market status: \(error)"))
            }
        }
    }

    struct AggregatesPage: Decodable {
        struct Row: Decodable {
            var t: Int64
            var o, h, l, c: Decimal
            var v: Decimal
        }
        var results: [Row]?
    }

    /// `/v2/last/trade`'s results: price, size, SIP time in Unix nanoseconds.
    struct TradeResults: Decodable {
        var p: Decimal
        var s: Decimal?
        var t: Int64
    }

    /// `/v2/last/nbbo`'s results: bid and ask with sizes, SIP time in Unix nanoseconds.
    struct QuoteResults: Decodable {
        var p: Decimal
        var s: Decimal?
        var P: Decimal
        var S: Decimal?
        var t: Int64
    }

    struct Envelope<Results: Decodable>: Decodable {
        var results: Results?
    }

    static func results<T: Decodable>(_ type: T.Type, _ body: ByteBuffer) -> Result<T, FetchError> {
        do {
            guard let results = try JSONDecoder().decode(Envelope<T>.self, from: Data(body.readableBytesView)).results else {
                return .failure(.malformed("no results"))
            }
            return .success(results)
        } catch {
            return .failure(.malformed("\(T.self): \(error)"))
        }
    }
}
