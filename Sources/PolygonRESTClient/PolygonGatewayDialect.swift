import Foundation
import MarketCore
import MarketREST
import NIOCore
import RESTGateway

/// Polygon's (and Massive's) REST API as the relay's gateway serves it.
///
/// - **Live** from the stream when the relay holds the ticker: `/v2/last/trade/{t}`, `/v2/last/nbbo/{t}`,
///   `/v1/last/crypto/{from}/{to}`, `/v2/snapshot/locale/us/markets/stocks/tickers/{t}`.
/// - **Cached**: bars, open/close and grouped bars of closed days (a day is closed 6 hours after it ends
///   in UTC: New York's after-hours end at 01:00 UTC); split-adjusted ones (the default) only until the
///   next 08:00 UTC, since splits take effect before a session opens; trades and quotes of windows that
///   end on a closed day, and the pages their `next_url`s name; the previous day's bar until the next
///   08:00 UTC; reference data (tickers, exchanges, conditions, holidays, financials) for the
///   reference TTL.
/// - **Passed through**, one call for identical requests in flight: everything else of today.
///
/// `Sendable`, a value type.
public struct PolygonGatewayDialect: GatewayDialect {
    public var referenceTTL: Duration

    public init(referenceTTL: Duration = .seconds(3600)) {
        self.referenceTTL = referenceTTL
    }

    public var name: String { "polygon" }

    public var pathPrefixes: [String] { ["/v1", "/v2", "/v3", "/vX"] }

    public var routeList: [String] {
        [
            "/v2/last/trade/{ticker}", "/v2/last/nbbo/{ticker}", "/v1/last/crypto/{from}/{to}", "/v1/last_quote/currencies/{from}/{to}",
            "/v2/snapshot/locale/{locale}/markets/{market}/tickers[/{ticker}]", "/v2/snapshot/locale/us/markets/stocks/{gainers|losers}",
            "/v3/snapshot[/options/{underlying}[/{contract}]|/indices]", "/v2/aggs/ticker/{ticker}/range/{multiplier}/{timespan}/{from}/{to}",
            "/v2/aggs/ticker/{ticker}/prev", "/v2/aggs/grouped/locale/us/market/{market}/{date}", "/v1/open-close/{ticker}/{date}",
            "/v1/open-close/crypto/{from}/{to}/{date}", "/v3/trades/{ticker}", "/v3/quotes/{ticker}", "/v1/indicators/{kind}/{ticker}",
            "/v1/marketstatus/{now|upcoming}", "/v1/conversion/{from}/{to}", "/v1/summaries", "/v1/related-companies/{ticker}",
            "/v2/reference/news", "/v3/reference/...", "/vX/reference/...", "/v1/reference/...",
        ]
    }

    // MARK: routes

    public func route(_ request: GatewayRequest, now: Int64) -> Result<GatewayRoute, GatewayProblem> {
        let segments: [String]
        let upstream: String
        switch GatewayPath.parse(request) {
        case .success(let parsed): (segments, upstream) = parsed
        case .failure(let problem): return .failure(problem)
        }
        func route(_ name: String, _ scope: RouteScope, _ policy: CachePolicy, _ priority: RequestGate.Priority = .background, live: Bool = false)
            -> Result<GatewayRoute, GatewayProblem>
        {
            .success(GatewayRoute(name: name, scope: scope, policy: policy, priority: priority, upstream: upstream, live: live))
        }
        // A page a cached answer named is cached as that answer was: the page of that cursor on that
        // path (an aggregates cursor says only `limit=…&sort=…`, the same for every range: a closed
        // range's would else make today's pages kept for a week).
        let paged: (CachePolicy) -> CachePolicy = { policy in
            if let cursor = request.parameter("cursor") { return .cursor(Self.page(request.path, cursor: cursor)) }
            return policy
        }
        // A page's cursor stands for its first request's whole query: on a route whose tickers come from
        // the query, a cursor could name tickers other than those given beside it, so paging such a
        // route needs the whole market's rights.
        let paging = request.parameter("cursor") != nil
        let s = segments
        switch (s.count, s.first) {
        case (4, "v2") where s[1] == "last" && s[2] == "trade":
            // Live for the markets whose stream has trades of this shape (stocks, options).
            let market = Market.of(ticker: s[3].uppercased())
            return route("last-trade", Self.scope(s[3], types: .trade), .pass, .foreground, live: market == .stocks || market == .options)
        case (4, "v2") where s[1] == "last" && s[2] == "nbbo":
            let market = Market.of(ticker: s[3].uppercased())
            return route("last-quote", Self.scope(s[3], types: .quote), .pass, .foreground, live: market == .stocks || market == .options)
        case (5, "v1") where s[1] == "last" && s[2] == "crypto":
            return route("last-crypto", .topics(.crypto, [Topic(checkedEventType: "XT", ticker: "\(s[3])-\(s[4])".uppercased())]), .pass, .foreground, live: true)
        case (5, "v1") where s[1] == "last_quote" && s[2] == "currencies":
            return route("last-forex", .topics(.forex, [Topic(checkedEventType: "C", ticker: "\(s[3])/\(s[4])".uppercased())]), .pass, .foreground)
        case (_, "v2") where s.count >= 6 && s[1] == "snapshot" && s[2] == "locale" && s[4] == "markets":
            guard let market = Self.snapshotMarket(s[5]) else { return .failure(.notFound("no snapshot of market \(s[5])")) }
            if s.count == 8, s[6] == "tickers" {
                // A snapshot holds the ticker's trades, quotes and bars: the key needs all three.
                let ticker = s[7].uppercased()
                let scope: RouteScope = .topics(Market.of(ticker: ticker), Self.snapshotTopics(ticker, market: Market.of(ticker: ticker)))
                return route("snapshot-ticker", scope, .pass, .foreground, live: market == .stocks && s[3] == "us")
            }
            if s.count == 7, s[6] == "tickers" {
                if let tickers = Self.tickerList(request, "tickers"), !paging {
                    return route("snapshot-tickers", Self.scope(list: tickers, market: market), .pass, .foreground)
                }
                return route("snapshot-market", .markets([market]), .pass, .foreground)
            }
            if s.count == 7, s[6] == "gainers" || s[6] == "losers" { return route("snapshot-movers", .markets([market]), .pass, .foreground) }
            return .failure(.notFound("no snapshot route \(request.path)"))
        case (_, "v3") where s.count >= 2 && s[1] == "snapshot":
            guard let (name, scope) = Self.v3Snapshot(s, request, paging: paging) else { return .failure(.notFound("no snapshot route \(request.path)")) }
            return route(name, scope, .pass, .foreground)
        case (9, "v2") where s[1] == "aggs" && s[2] == "ticker" && s[4] == "range":
            guard let multiplier = Int(s[5]), multiplier >= 1 else { return .failure(.badRequest("multiplier: a whole number ≥ 1, got \(s[5])")) }
            _ = multiplier
            guard Self.timespans.contains(s[6]) else {
                return .failure(.badRequest("timespan: one of \(Self.timespans.sorted().joined(separator: ", ")), got \(s[6])"))
            }
            guard let from = Self.day(s[7]), let to = Self.day(s[8]) else {
                return .failure(.badRequest("from and to: YYYY-MM-DD or Unix milliseconds, got \(s[7]) and \(s[8])"))
            }
            guard from <= to else { return .failure(.badRequest("from (\(s[7])) is after to (\(s[8]))")) }
            return route("aggregates", Self.scope(s[3], types: .bar), paged(Self.barPolicy(closedDay: to, request: request, now: now)))
        case (5, "v2") where s[1] == "aggs" && s[2] == "ticker" && s[4] == "prev":
            return route("previous-close", Self.scope(s[3], types: .bar), .until(GatewayCalendar.next0800(after: now)), .foreground)
        case (8, "v2") where s[1] == "aggs" && s[2] == "grouped" && s[3] == "locale" && s[5] == "market":
            guard let market = Self.snapshotMarket(s[6]) else { return .failure(.notFound("no grouped bars of market \(s[6])")) }
            guard let day = Self.day(s[7]) else { return .failure(.badRequest("date: YYYY-MM-DD, got \(s[7])")) }
            return route("grouped", .markets([market]), Self.barPolicy(closedDay: day, request: request, now: now))
        case (4, "v1") where s[1] == "open-close":
            guard let day = Self.day(s[3]) else { return .failure(.badRequest("date: YYYY-MM-DD, got \(s[3])")) }
            return route("open-close", Self.scope(s[2], types: .bar), Self.barPolicy(closedDay: day, request: request, now: now))
        case (6, "v1") where s[1] == "open-close" && s[2] == "crypto":
            guard let day = Self.day(s[5]) else { return .failure(.badRequest("date: YYYY-MM-DD, got \(s[5])")) }
            let topic = Topic(checkedEventType: "XA", ticker: "\(s[3])-\(s[4])".uppercased())
            return route("open-close", .topics(.crypto, [topic]), Self.barPolicy(closedDay: day, request: request, now: now))
        case (3, "v3") where s[1] == "trades" || s[1] == "quotes":
            let trades = s[1] == "trades"
            switch Self.windowEnd(request) {
            case .failure(let problem): return .failure(problem)
            case .success(let end):
                let policy: CachePolicy = end.map { GatewayCalendar.isClosed(day: $0, now: now) } == true ? .forever : .pass
                return route(s[1], Self.scope(s[2], types: trades ? .trade : .quote), paged(policy))
            }
        case (4, "v1") where s[1] == "indicators":
            return route("indicators", Self.scope(s[3], types: .bar), .pass)
        case (3, "v1") where s[1] == "marketstatus" && s[2] == "now":
            return route("market-status", .reference, .pass, .foreground)
        case (3, "v1") where s[1] == "marketstatus" && s[2] == "upcoming":
            return route("market-holidays", .reference, .until(now + referenceTTL.milliseconds))
        case (4, "v1") where s[1] == "conversion":
            return route("conversion", .topics(.forex, [Topic(checkedEventType: "C", ticker: "\(s[2])/\(s[3])".uppercased())]), .pass, .foreground)
        case (2, "v1") where s[1] == "summaries":
            guard let tickers = Self.tickerList(request, "ticker.any_of"), !paging else { return route("summaries", .markets(Market.trading), .pass) }
            return route("summaries", Self.scope(list: tickers, market: nil), .pass)
        case (3, "v1") where s[1] == "related-companies":
            return route("reference", .reference, .until(now + referenceTTL.milliseconds))
        case (3, "v2") where s[1] == "reference" && s[2] == "news":
            return route("news", .reference, .pass)
        case (_, _) where s.count >= 3 && s[1] == "reference" && ["v1", "v3", "vX"].contains(s[0]):
            return route("reference", .reference, paged(.until(now + referenceTTL.milliseconds)))
        default:
            return .failure(.notFound("no gateway route \(request.path)"))
        }
    }

    static let timespans: Set<String> = ["second", "minute", "hour", "day", "week", "month", "quarter", "year"]

    /// What the event types a route reads are, in each market's names.
    enum Reads { case trade, quote, bar }

    /// A ticker's market (by its prefix) and the topic the route reads of it there, in the WebSocket's
    /// form (crypto `X:BTCUSD` → `XT.BTC-USD`, forex `C:EURUSD` → `C.EUR/USD`).
    static func scope(_ ticker: String, types: Reads) -> RouteScope {
        let ticker = ticker.uppercased()
        let market = Market.of(ticker: ticker)
        return .topics(market, [topic(ticker, market: market, types: types)])
    }

    static func topic(_ ticker: String, market: Market, types: Reads) -> Topic {
        switch market {
        case .crypto:
            let pair = Self.pair(ticker.dropFirst(2), separator: "-")
            return Topic(checkedEventType: types == .trade ? "XT" : types == .quote ? "XQ" : "XA", ticker: pair)
        case .forex:
            let pair = Self.pair(ticker.dropFirst(2), separator: "/")
            return Topic(checkedEventType: types == .bar ? "CA" : "C", ticker: pair)
        case .indices:
            return Topic(checkedEventType: types == .bar ? "AM" : "V", ticker: ticker)
        default:
            return Topic(checkedEventType: types == .trade ? "T" : types == .quote ? "Q" : "AM", ticker: ticker)
        }
    }

    /// `BTCUSD` → `BTC-USD`: the quote currency is the longest known one it ends with.
    static func pair(_ symbol: Substring, separator: String) -> String {
        for quote in ["USDT", "USDC", "USD", "EUR", "GBP", "JPY", "CAD", "AUD", "CHF", "BTC", "ETH"] where symbol.count > quote.count && symbol.hasSuffix(quote) {
            return "\(symbol.dropLast(quote.count))\(separator)\(quote)"
        }
        return String(symbol)
    }

    /// `/v3/snapshot[/indices|/options/{underlying}[/{contract}]]`: the route's name and what it reads
    /// (`nil`: none of them). A page (`paging`) of a list reads the whole market (its cursor stands for
    /// the first request's whole query).
    static func v3Snapshot(_ s: [String], _ request: GatewayRequest, paging: Bool) -> (name: String, scope: RouteScope)? {
        switch (s.count, s.count > 2 ? s[2] : "") {
        case (2, _):
            guard let tickers = tickerList(request, "ticker.any_of") ?? tickerList(request, "ticker"), !paging else {
                return ("snapshot-unified", .markets(Market.trading))
            }
            return ("snapshot-unified", scope(list: tickers, market: nil))
        case (3, "indices"):
            guard let tickers = tickerList(request, "ticker.any_of"), !paging else { return ("snapshot-indices", .markets([.indices])) }
            return ("snapshot-indices", scope(list: tickers, market: .indices))
        case (4, "options"):
            return ("snapshot-options", .markets([.options]))
        case (5, "options"):
            // A contract's snapshot holds its last trade, last quote and day bar.
            let contract = s[4].uppercased()
            return ("snapshot-option", .topics(.options, snapshotTopics(contract, market: .options)))
        default:
            return nil
        }
    }

    /// A comma-separated list of tickers: each one's trades, quotes and bars (a snapshot or summary
    /// holds all three), all in one market (else the whole markets; none named: every market asked).
    static func scope(list: String, market: Market?) -> RouteScope {
        let tickers = list.split(separator: ",").map { $0.trimmingCharacters(in: .whitespaces).uppercased() }.filter { !$0.isEmpty }
        let markets = Set(tickers.map { market ?? Market.of(ticker: $0) })
        guard markets.count == 1, let only = markets.first else { return .markets(markets.isEmpty ? market.map { [$0] } ?? Market.trading : Array(markets).sorted()) }
        return .topics(only, tickers.flatMap { snapshotTopics($0, market: only) })
    }

    /// What a snapshot of a ticker holds: its trades, quotes and bars (the key needs all three).
    static func snapshotTopics(_ ticker: String, market: Market) -> [Topic] {
        [Reads.trade, .quote, .bar].map { topic(ticker, market: market, types: $0) }
    }

    /// The tickers a list route's `name` parameter names, when they are all it is narrowed by: `nil` when
    /// it names none (absent, empty, only commas) or another `ticker…` filter stands beside it (`ticker`
    /// with `ticker.any_of`, `ticker.gte`): what the vendor answers then is not the list checked, so
    /// the route needs the whole market's rights.
    static func tickerList(_ request: GatewayRequest, _ name: String) -> String? {
        guard let list = request.parameter(name), list.split(separator: ",").contains(where: { !$0.trimmingCharacters(in: .whitespaces).isEmpty }) else {
            return nil
        }
        guard request.query.allSatisfy({ $0.name == name || !$0.name.hasPrefix("ticker") }) else { return nil }
        return list
    }

    static func snapshotMarket(_ name: String) -> Market? {
        switch name {
        case "stocks": .stocks
        case "crypto": .crypto
        case "forex", "fx": .forex
        case "options": .options
        case "indices": .indices
        case "otc": .stocks
        default: nil
        }
    }

    /// `YYYY-MM-DD` or Unix milliseconds, as days since 1970-01-01.
    static func day(_ text: String) -> Int64? { GatewayCalendar.day(text, millisecondsAllowed: true) }

    /// Bars through a closed day cannot change; split-adjusted ones (the default) change when a split
    /// takes effect, before a session opens: kept until the next 08:00 UTC.
    static func barPolicy(closedDay day: Int64, request: GatewayRequest, now: Int64) -> CachePolicy {
        guard GatewayCalendar.isClosed(day: day, now: now) else { return .pass }
        return request.parameter("adjusted") == "false" ? .forever : .until(GatewayCalendar.next0800(after: now))
    }

    /// The day a trades or quotes window ends on (its `timestamp.lt`/`.lte` or `timestamp` as a date or
    /// Unix ns), `nil` when it has no end; a malformed bound is a 400.
    static func windowEnd(_ request: GatewayRequest) -> Result<Int64?, GatewayProblem> {
        var end: Int64?
        for name in ["timestamp", "timestamp.lt", "timestamp.lte", "timestamp.gt", "timestamp.gte"] {
            guard let text = request.parameter(name) else { continue }
            let day: Int64?
            if let nanoseconds = Int64(text) {
                day = nanoseconds >= 0 ? nanoseconds / 1_000_000 / GatewayCalendar.dayMs : nil
            } else {
                day = GatewayCalendar.day(text, millisecondsAllowed: false)
            }
            guard let day else { return .failure(.badRequest("\(name): a date (YYYY-MM-DD) or Unix nanoseconds, got \(text.prefix(40))")) }
            if name == "timestamp" || name == "timestamp.lt" || name == "timestamp.lte" { end = min(end ?? day, day) }
        }
        return .success(end)
    }

    // MARK: for the client

    /// What names a page to the cache's remembered cursors: its path (as read, escapes decoded) and its
    /// cursor.
    static func page(_ path: String, cursor: String) -> String { "\(path.removingPercentEncoding ?? path) \(cursor)" }

    public func forClient(_ body: ByteBuffer, request: GatewayRequest) -> (body: ByteBuffer, cursors: [String])? {
        // A page without one (every cached closed day) is passed on as it is, not copied into a string
        // first. A name written with escapes (`next\u005furl`) has a `\u`: such a body is read whole.
        let named = body.mentions("\"next_url\"")
        guard named || body.mentions("\\u") else { return (body, []) }
        let text = String(buffer: body)
        // Named but not readable as one member of one JSON object, or named twice: its link is not
        // passed on as it is. A body that only has a `\u` (a `&` escaped as Go escapes it) and is a list
        // names no link a client follows: passed on as it is (anything else, a byte-order mark before an
        // object included, is not).
        let value: Substring
        switch JSONText.reading("next_url", of: Substring(text)) {
        case .twice: return nil
        case .unreadable:
            let list = text.utf8.first { !JSONText.isSpace($0) } == UInt8(ascii: "[")
            return !named && list ? (body, []) : nil
        case .found(nil): return (body, [])
        case .found(let found?): value = found
        }
        let replacement: String
        var cursors: [String] = []
        // Only a path from the root is kept, put on the relay's address: anything else (`@host/…`,
        // `.host/…`) would make a link to another host once joined to it.
        if let link = JSONText.unquoted(value).map({ String($0).replacingOccurrences(of: "\\/", with: "/") }), let components = URLComponents(string: link),
            components.percentEncodedPath.hasPrefix("/")
        {
            let items = (components.queryItems ?? []).filter { $0.name != "apiKey" }
            cursors = items.filter { $0.name == "cursor" }.compactMap(\.value).map { Self.page(components.percentEncodedPath, cursor: $0) }
            var kept = URLComponents()
            kept.queryItems = items
            // A `+` in a value is sent encoded: a client's `+` reads as a space.
            let query = kept.percentEncodedQuery.map { "?\($0.replacingOccurrences(of: "+", with: "%2B"))" } ?? ""
            replacement = "\"\(JSONText.escape(request.base + components.percentEncodedPath + query))\""
        } else {
            replacement = "null"
        }
        return (Self.splice(body, text: text, replacing: value, with: replacement), cursors)
    }

    /// `body` with the bytes of `value` (a slice of `text`, the body read as text) replaced, in one copy.
    /// A body that is not all valid UTF-8 (its text repaired, so its offsets differ) is written from the text.
    static func splice(_ body: ByteBuffer, text: String, replacing value: Substring, with replacement: String) -> ByteBuffer {
        guard text.utf8.count == body.readableBytes else {
            var rewritten = text
            rewritten.replaceSubrange(value.startIndex..<value.endIndex, with: replacement)
            return ByteBuffer(string: rewritten)
        }
        let start = text.utf8.distance(from: text.startIndex, to: value.startIndex)
        let end = text.utf8.distance(from: text.startIndex, to: value.endIndex)
        let view = body.readableBytesView
        var out = ByteBufferAllocator().buffer(capacity: body.readableBytes - (end - start) + replacement.utf8.count)
        out.writeBytes(view[view.startIndex..<(view.startIndex + start)])
        out.writeString(replacement)
        out.writeBytes(view[(view.startIndex + end)...])
        return out
    }

    public func credentialHeaders(_ credentials: RESTCredentials) -> [(String, String)] {
        [("Authorization", "Bearer \(credentials.key)")]
    }

    public func errorBody(status: Int, message: String) -> ByteBuffer {
        let word = status == 404 ? "NOT_FOUND" : status == 403 ? "NOT_AUTHORIZED" : "ERROR"
        return ByteBuffer(string: #"{"status":"\#(word)","request_id":"relay","error":"\#(JSONText.escape(message))"}"#)
    }
}
