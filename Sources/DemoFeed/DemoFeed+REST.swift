import Hummingbird
import NIOCore
import PolygonWire
import Synchronization

/// What the demo feed's REST side did with the requests for one endpoint and ticker: tests assert
/// that a slow request was abandoned by its client (cancelled), not merely ignored.
/// The REST side's counts per endpoint and ticker, and every request started. A client chooses the
/// ticker: past ``maxKeys`` keys, new ones are counted together under `other`.
struct RestTally: Sendable {
    static let maxKeys = 4_096
    private(set) var byKey: [String: RestCount] = [:]
    private(set) var started = 0

    /// The feed's own keys (`limited`, `other`) always have their place.
    private func slot(_ key: String) -> String {
        byKey[key] != nil || byKey.count < Self.maxKeys || key == "limited" || key == "other" ? key : "other"
    }

    subscript(key: String) -> RestCount {
        get { byKey[slot(key)] ?? RestCount() }
        set { byKey[slot(key)] = newValue }
    }

    /// Counts a request to `key` started; returns its number among all.
    mutating func start(_ key: String) -> Int {
        self[key].started += 1
        started += 1
        return started
    }
}

public struct RestCount: Sendable, Equatable {
    public var started = 0
    public var completed = 0
    /// The client closed the connection before the answer was ready.
    public var abandoned = 0
    /// Answered 401: the request did not carry the feed's key.
    public var unauthorized = 0

    public init(started: Int = 0, completed: Int = 0, abandoned: Int = 0) {
        self.started = started
        self.completed = completed
        self.abandoned = abandoned
    }
}

/// The market's REST state: each ticker's last trade (cents, Unix ms) and previous close (cents).
struct RestState: Sendable {
    var last: [String: (cents: Int64, at: Int64)] = [:]
    var previousClose: [String: Int64] = [:]
}

extension DemoFeed {
    /// Polygon's REST paths, answered from the market's state:
    /// `/v2/last/trade/{t}`, `/v2/last/nbbo/{t}`, `/v2/aggs/ticker/{t}/prev`,
    /// `/v2/aggs/ticker/{t}/range/1/day/{from}/{to}`, `/v2/aggs/ticker/{t}/range/1/minute/{from}/{to}`
    /// (from what it streamed), `/v1/marketstatus/now`, and the history of ``addHistory(to:)``.
    func addREST(to router: Router<BasicRequestContext>) {
        addHistory(to: router)
        router.get("/v2/last/trade/:ticker") { request, context in
            try await self.restAnswer("trade", request, context) { ticker, state in
                guard let last = state.last[ticker] else { return nil }
                return
                    #"{"status":"OK","request_id":"demo","results":{"T":"\#(ticker)","p":\#(DemoMarket.price(last.cents, ticker: ticker)),"s":100,"t":\#(last.at * 1_000_000),"x":4}}"#
            }
        }
        router.get("/v2/last/nbbo/:ticker") { request, context in
            try await self.restAnswer("nbbo", request, context) { ticker, state in
                guard let last = state.last[ticker] else { return nil }
                let spread = max(last.cents / 5000, 1)
                let bid = last.cents - spread / 2
                return
                    #"{"status":"OK","request_id":"demo","results":{"T":"\#(ticker)","p":\#(DemoMarket.price(bid, ticker: ticker)),"s":5,"x":11,"P":\#(DemoMarket.price(bid + spread, ticker: ticker)),"S":7,"X":19,"t":\#(last.at * 1_000_000)}}"#
            }
        }
        router.get("/v2/aggs/ticker/:ticker/prev") { request, context in
            try await self.restAnswer("prev", request, context) { ticker, state in
                guard let close = state.previousClose[ticker] else { return nil }
                let price = DemoMarket.price(close, ticker: ticker)
                let day = (WallClock.nowMilliseconds() / 86_400_000 - 1) * 86_400_000
                return
                    #"{"ticker":"\#(ticker)","status":"OK","queryCount":1,"resultsCount":1,"adjusted":true,"request_id":"demo","results":[{"T":"\#(ticker)","o":\#(price),"h":\#(price),"l":\#(price),"c":\#(price),"v":1000000,"t":\#(day)}]}"#
            }
        }
        router.get("/v2/aggs/ticker/:ticker/range/:multiplier/:timespan/:from/:to") { request, context in
            let parameters = context.parameters
            if parameters.get("multiplier") == "1", parameters.get("timespan") == "minute" {
                guard let from = parameters.get("from").flatMap({ Int64($0) }), let to = parameters.get("to").flatMap({ Int64($0) }) else {
                    return Self.restJSON(#"{"status":"ERROR","error":"minute bars: from and to in Unix milliseconds"}"#, status: .badRequest)
                }
                return try await self.restAnswer("aggs", request, context) { ticker, _ in self.minuteBars(ticker: ticker, from: from, to: to) }
            }
            guard parameters.get("multiplier") == "1", parameters.get("timespan") == "day" else {
                return Self.restJSON(#"{"status":"ERROR","error":"the demo feed has daily and minute bars only (range/1/day, range/1/minute)"}"#, status: .badRequest)
            }
            guard let from = Self.day(parameters.get("from")), let to = Self.day(parameters.get("to")) else {
                return Self.restJSON(#"{"status":"ERROR","error":"from and to: YYYY-MM-DD or Unix milliseconds"}"#, status: .badRequest)
            }
            return try await self.restAnswer("aggs", request, context) { ticker, state in
                guard let close = state.previousClose[ticker] else { return nil }
                let today = WallClock.nowMilliseconds() / 86_400_000
                let bars = DemoHistory.bars(ticker: ticker, from: from, through: to, today: today, previousClose: close)
                let rows = bars.map { bar in
                    #"{"v":\#(bar.volume),"vw":\#(DemoMarket.price((bar.high + bar.low + bar.close) / 3, ticker: ticker)),"o":\#(DemoMarket.price(bar.open, ticker: ticker)),"c":\#(DemoMarket.price(bar.close, ticker: ticker)),"h":\#(DemoMarket.price(bar.high, ticker: ticker)),"l":\#(DemoMarket.price(bar.low, ticker: ticker)),"t":\#(bar.day * 86_400_000),"n":\#(bar.volume / 100)}"#
                }
                return
                    #"{"ticker":"\#(ticker)","queryCount":\#(rows.count),"resultsCount":\#(rows.count),"adjusted":true,"results":[\#(rows.joined(separator: ","))],"status":"OK","request_id":"demo","count":\#(rows.count)}"#
            }
        }
        router.get("/v2/snapshot/locale/us/markets/stocks/tickers/:ticker") { request, context in
            try await self.restAnswer("snapshot", request, context) { ticker, state in
                guard let last = state.last[ticker] else { return nil }
                let price = DemoMarket.price(last.cents, ticker: ticker)
                let spread = max(last.cents / 5000, 1)
                let bid = last.cents - spread / 2
                let previous = state.previousClose[ticker] ?? last.cents
                let day = #"{"o":\#(DemoMarket.price(previous, ticker: ticker)),"h":\#(price),"l":\#(price),"c":\#(price),"v":100000,"vw":\#(price)}"#
                return #"{"request_id":"demo","status":"OK","ticker":{"ticker":"\#(ticker)","day":\#(day),"lastQuote":{"P":\#(DemoMarket.price(bid + spread, ticker: ticker)),"S":7,"p":\#(DemoMarket.price(bid, ticker: ticker)),"s":5,"t":\#(last.at * 1_000_000)},"lastTrade":{"c":[0],"i":"1","p":\#(price),"s":100,"t":\#(last.at * 1_000_000),"x":4},"prevDay":{"o":\#(DemoMarket.price(previous, ticker: ticker)),"h":\#(DemoMarket.price(previous, ticker: ticker)),"l":\#(DemoMarket.price(previous, ticker: ticker)),"c":\#(DemoMarket.price(previous, ticker: ticker)),"v":1000000,"vw":\#(DemoMarket.price(previous, ticker: ticker))},"updated":\#(last.at * 1_000_000)}}"#
            }
        }
        router.get("/v1/marketstatus/now") { request, context in
            // The demo market trades around the clock.
            try await self.restAnswer("status", request, context, ticker: "") { _, _ in
                #"{"market":"open","serverTime":"\#(WallClock.nowMilliseconds())","earlyHours":false,"afterHours":false,"exchanges":{"nasdaq":"open","nyse":"open","otc":"open"},"currencies":{"crypto":"open","fx":"open"}}"#
            }
        }
    }

    /// `YYYY-MM-DD` or Unix milliseconds, as days since the epoch.
    static func day(_ text: String?) -> Int64? {
        guard let text else { return nil }
        if let milliseconds = Int64(text) { return milliseconds / 86_400_000 }
        return CivilDay.days(text)
    }

    /// A Polygon-style REST answer from the market's state: the key (when one is set) as `apiKey`,
    /// 404 for an unknown ticker, the configured failures and delay first. With a delay, the wait is
    /// cancelled when the client closes the connection, and counted as abandoned; watching for that
    /// consumes the connection's inbound side (Hummingbird closes it after the answer), so a delayed
    /// answer says `Connection: close` and a client does not send its next request into a closing
    /// connection.
    func restAnswer(
        _ endpoint: String, _ request: Request, _ context: some RequestContext, ticker fixedTicker: String? = nil,
        _ body: @escaping @Sendable (String, RestState) -> String?
    ) async throws -> Response {
        let ticker = fixedTicker ?? (context.parameters.get("ticker") ?? "").uppercased()
        let key = Self.restKey(endpoint, ticker)
        // This request's number among all the feed's REST requests (the first `restFailures` fail).
        let number = restCounts.withLock { $0.start(key) }
        if let delay = configuration.restDelay {
            do {
                try await request.body.consumeWithCancellationOnInboundClose { _ in try await Task.sleep(for: delay) }
            } catch {
                restCounts.withLock { $0[key].abandoned += 1 }
                throw error
            }
            var response = answer(ticker, countedAs: key, number: number, request, body)
            response.headers[.connection] = "close"
            return response
        }
        return answer(ticker, countedAs: key, number: number, request, body)
    }

    private func answer(
        _ ticker: String, countedAs countKey: String, number: Int, _ request: Request, _ body: @Sendable (String, RestState) -> String?
    ) -> Response {
        defer { restCounts.withLock { $0[countKey].completed += 1 } }
        if number <= configuration.restFailures {
            return Self.restJSON(#"{"status":"ERROR","error":"temporarily unavailable"}"#, status: .serviceUnavailable)
        }
        if let retryAfter = overLimit() {
            restCounts.withLock { $0["limited"].completed += 1 }
            var response = Self.restJSON(
                #"{"status":"ERROR","request_id":"demo","error":"You've exceeded the maximum requests per minute, please wait or upgrade your subscription to continue."}"#,
                status: .tooManyRequests)
            response.headers[.retryAfter] = String(retryAfter)
            return response
        }
        if !presentsKey(request) {
            restCounts.withLock { $0[countKey].unauthorized += 1 }
            return Self.restJSON(#"{"status":"ERROR","error":"Unknown API Key"}"#, status: .unauthorized)
        }
        guard let text = body(ticker, restState.withLock { $0 }) else {
            return Self.restJSON(#"{"status":"NOT_FOUND","message":"no data for \#(ticker)"}"#, status: .notFound)
        }
        return Self.restJSON(text, status: .ok)
    }

    /// Seconds until the minute's window ends when this request is past ``DemoFeedConfiguration/restPerMinute``.
    func overLimit() -> Int? {
        guard let limit = configuration.restPerMinute else { return nil }
        let now = WallClock.nowMilliseconds()
        return restWindow.withLock { window in
            if now - window.start >= 60_000 { window = (now, 0) }
            window.count += 1
            return window.count > limit ? Int((window.start + 60_000 - now + 999) / 1000) : nil
        }
    }

    /// Requests answered 429 for the per-minute limit.
    public var restLimited: Int { restCounts.withLock { $0["limited"].completed } }

    /// REST requests received, all endpoints together.
    public var restRequests: Int { restCounts.withLock { $0.started } }

    /// What the REST side did for `endpoint` (`trade`, `nbbo`, `prev`, `aggs`, `status`) and `ticker`.
    public func restCount(_ endpoint: String, _ ticker: String = "") -> RestCount {
        restCounts.withLock { $0[Self.restKey(endpoint, ticker)] }
    }

    static func restKey(_ endpoint: String, _ ticker: String) -> String {
        ticker.isEmpty ? endpoint : "\(endpoint) \(ticker)"
    }

    /// Every endpoint-and-ticker key with its counts (diagnostics).
    public var restCountsByKey: [String: RestCount] { restCounts.withLock { $0.byKey } }

    /// Whether a request carries the feed's key (always, when the feed has none), as Polygon takes it:
    /// `Authorization: Bearer KEY` or the `apiKey` query parameter.
    func presentsKey(_ request: Request) -> Bool {
        guard let key = configuration.apiKey else { return true }
        let bearer = request.headers[.authorization].flatMap { $0.hasPrefix("Bearer ") ? String($0.dropFirst(7)) : nil }
        let queryKey = request.uri.queryParameters.get("apiKey").map { String($0) }
        return (bearer ?? queryKey) == key
    }

    static func restJSON(_ text: String, status: HTTPResponse.Status) -> Response {
        Response(status: status, headers: [.contentType: "application/json"], body: .init(byteBuffer: ByteBuffer(string: text)))
    }
}
