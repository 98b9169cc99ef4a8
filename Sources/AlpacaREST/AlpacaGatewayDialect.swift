import AlpacaWire
import Foundation
import MarketCore
import MarketREST
import NIOCore
import RESTGateway

/// Alpaca's market-data REST API (`data.alpaca.markets`) as the relay's gateway serves it, for
/// alpaca-py's historical clients and the other SDKs (`url_override` pointed at the relay).
///
/// - **Live** from the stream when the relay holds every symbol asked for: the latest trades, quotes
///   and minute bars of stocks, crypto and options (`/v2/stocks/trades/latest`,
///   `/v1beta3/crypto/us/latest/trades`, `/v1beta1/options/trades/latest`, … and the single-symbol
///   `/v2/stocks/{symbol}/trades/latest`), and the stocks' and crypto's snapshots (their previous daily
///   bar from the cached daily bars).
/// - **Cached**: bars, trades and quotes whose `end` lies on a closed day (bars adjusted for splits or
///   dividends only until the next 08:00 UTC), and the pages their `next_page_token`s name; the `meta`
///   routes (exchanges, conditions) and logos for the reference TTL.
/// - **Passed through**: everything else (news, screener, option chains), identical requests coalesced.
///
/// `Sendable`, a value type.
public struct AlpacaGatewayDialect: GatewayDialect {
    public var referenceTTL: Duration

    public init(referenceTTL: Duration = .seconds(3600)) {
        self.referenceTTL = referenceTTL
    }

    public var name: String { "alpaca" }

    public var pathPrefixes: [String] {
        ["/v2/stocks", "/v1beta3/crypto", "/v1beta1/options", "/v1beta1/news", "/v1beta1/screener", "/v1beta1/corporate-actions", "/v1beta1/logos",
            "/v1beta1/forex"]
    }

    public var routeList: [String] {
        [
            "/v2/stocks/{trades|quotes|bars}/latest", "/v2/stocks/snapshots", "/v2/stocks/{trades|quotes|bars|auctions}",
            "/v2/stocks/{symbol}/{trades|quotes|bars}/latest", "/v2/stocks/{symbol}/snapshot", "/v2/stocks/{symbol}/{trades|quotes|bars}",
            "/v2/stocks/meta/...", "/v1beta3/crypto/{loc}/latest/{trades|quotes|bars|orderbooks}", "/v1beta3/crypto/{loc}/snapshots",
            "/v1beta3/crypto/{loc}/{trades|quotes|bars}", "/v1beta1/options/{trades|quotes}/latest", "/v1beta1/options/snapshots[/{underlying}]",
            "/v1beta1/options/{trades|bars}", "/v1beta1/options/meta/...", "/v1beta1/news", "/v1beta1/screener/...", "/v1beta1/corporate-actions",
            "/v1beta1/logos/{symbol}", "/v1beta1/forex/...",
        ]
    }

    /// A route's kind of record: its channel letter on the stream and its key in the answer.
    enum Kind: String {
        case trades, quotes, bars

        var eventType: String {
            switch self {
            case .trades: "t"
            case .quotes: "q"
            case .bars: "b"
            }
        }

        /// The record's fields in Alpaca's REST answers (those the stream's event has too).
        var fields: [String] {
            switch self {
            case .trades: ["t", "x", "p", "s", "c", "i", "z", "tks"]
            case .quotes: ["t", "bx", "bp", "bs", "ax", "ap", "as", "c", "z"]
            case .bars: ["t", "o", "h", "l", "c", "v", "n", "vw"]
            }
        }
    }

    public func route(_ request: GatewayRequest, now: Int64) -> Result<GatewayRoute, GatewayProblem> {
        let segments: [String]
        let upstream: String
        switch GatewayPath.parse(request) {
        case .success(let parsed): (segments, upstream) = parsed
        case .failure(let problem): return .failure(problem)
        }
        let s = segments
        func route(_ name: String, _ scope: RouteScope, _ policy: CachePolicy, _ priority: RequestGate.Priority = .background, live: Bool = false)
            -> Result<GatewayRoute, GatewayProblem>
        {
            .success(GatewayRoute(name: name, scope: scope, policy: policy, priority: priority, upstream: upstream, live: live))
        }
        let symbols = Self.symbols(request)
        // The stream is one feed in one currency (crypto: Alpaca's `us` location): a request for
        // another feed, currency or location is the vendor's to answer.
        let liveable = request.parameter("feed") == nil && request.parameter("currency") == nil && (s.count < 3 || s[0] != "v1beta3" || s[2] == "us")
        func topics(_ market: Market, _ kind: Kind, _ list: [String]) -> RouteScope {
            .topics(market, list.map { Topic(checkedEventType: kind.eventType, ticker: $0) })
        }
        /// A snapshot holds trades, quotes and bars: the key needs all three of each symbol.
        func snapshotScope(_ market: Market, _ list: [String]) -> RouteScope {
            .topics(market, list.flatMap { symbol in [Kind.trades, .quotes, .bars].map { Topic(checkedEventType: $0.eventType, ticker: symbol) } })
        }
        func history(_ market: Market, _ kind: Kind, _ list: [String]) -> Result<GatewayRoute, GatewayProblem> {
            guard !list.isEmpty else { return .failure(.badRequest("symbols: one or more, comma-separated")) }
            switch Self.endDay(request) {
            case .failure(let problem): return .failure(problem)
            case .success(let end):
                var policy: CachePolicy = .pass
                if let end, GatewayCalendar.isClosed(day: end, now: now) {
                    let raw = (request.parameter("adjustment") ?? "raw") == "raw"
                    policy = kind != .bars || raw ? .forever : .until(GatewayCalendar.next0800(after: now))
                }
                // A page (`page_token`) comes with its request's every parameter again (alpaca-py sends
                // them): its own `end` says whether it may be cached.
                return route(kind.rawValue, topics(market, kind, list), policy)
            }
        }
        switch s.count >= 2 ? (s[0], s[1]) : ("", "") {
        case ("v2", "stocks"):
            let rest = Array(s.dropFirst(2))
            if rest.count == 2, let kind = Kind(rawValue: rest[0]), rest[1] == "latest" {
                guard !symbols.isEmpty else { return .failure(.badRequest("symbols: one or more, comma-separated")) }
                return route("latest-\(kind.rawValue)", topics(.stocks, kind, symbols), .pass, .foreground, live: liveable)
            }
            if rest == ["snapshots"] {
                guard !symbols.isEmpty else { return .failure(.badRequest("symbols: one or more, comma-separated")) }
                return route("snapshots", snapshotScope(.stocks, symbols), .pass, .foreground, live: liveable)
            }
            if rest.count == 1, let kind = Kind(rawValue: rest[0]) { return history(.stocks, kind, symbols) }
            if rest == ["auctions"] { return route("auctions", topics(.stocks, .trades, symbols), .pass) }
            if rest == ["meta", "exchanges"] || (rest.count == 3 && rest[0] == "meta" && rest[1] == "conditions") {
                return route("reference", .reference, .until(now + referenceTTL.milliseconds))
            }
            if rest.count >= 2 {
                let symbol = rest[0].uppercased()
                if rest.count == 3, let kind = Kind(rawValue: rest[1]), rest[2] == "latest" {
                    return route("latest-\(kind.rawValue)", topics(.stocks, kind, [symbol]), .pass, .foreground, live: liveable)
                }
                if rest.count == 2, rest[1] == "snapshot" { return route("snapshots", snapshotScope(.stocks, [symbol]), .pass, .foreground, live: liveable) }
                if rest.count == 2, let kind = Kind(rawValue: rest[1]) { return history(.stocks, kind, [symbol]) }
                if rest.count == 2, rest[1] == "auctions" { return route("auctions", topics(.stocks, .trades, [symbol]), .pass) }
            }
        case ("v1beta3", "crypto") where s.count >= 4:
            let rest = Array(s.dropFirst(3))
            if rest.count == 2, rest[0] == "latest", let kind = Kind(rawValue: rest[1]) {
                guard !symbols.isEmpty else { return .failure(.badRequest("symbols: one or more, comma-separated")) }
                return route("latest-\(kind.rawValue)", topics(.crypto, kind, symbols), .pass, .foreground, live: liveable)
            }
            if rest == ["latest", "orderbooks"] {
                return route("latest-orderbooks", .topics(.crypto, symbols.map { Topic(checkedEventType: "o", ticker: $0) }), .pass, .foreground)
            }
            if rest == ["snapshots"] {
                guard !symbols.isEmpty else { return .failure(.badRequest("symbols: one or more, comma-separated")) }
                return route("snapshots", snapshotScope(.crypto, symbols), .pass, .foreground, live: liveable)
            }
            if rest.count == 1, let kind = Kind(rawValue: rest[0]) { return history(.crypto, kind, symbols) }
        case ("v1beta1", "options"):
            let rest = Array(s.dropFirst(2))
            if rest.count == 2, let kind = Kind(rawValue: rest[0]), kind != .bars, rest[1] == "latest" {
                guard !symbols.isEmpty else { return .failure(.badRequest("symbols: one or more, comma-separated")) }
                return route("latest-\(kind.rawValue)", topics(.options, kind, symbols), .pass, .foreground, live: liveable)
            }
            if rest == ["snapshots"] { return route("snapshots", snapshotScope(.options, symbols), .pass, .foreground) }
            if rest.count == 2, rest[0] == "snapshots" { return route("option-chain", .markets([.options]), .pass) }
            if rest.count == 1, let kind = Kind(rawValue: rest[0]), kind != .quotes { return history(.options, kind, symbols) }
            if rest == ["meta", "exchanges"] || (rest.count == 3 && rest[0] == "meta" && rest[1] == "conditions") {
                return route("reference", .reference, .until(now + referenceTTL.milliseconds))
            }
        case ("v1beta1", "news"):
            return route("news", .reference, .pass)
        case ("v1beta1", "logos"), ("v1beta1", "corporate-actions"):
            return route("reference", .reference, .until(now + referenceTTL.milliseconds))
        case ("v1beta1", "screener"):
            return route("screener", .markets([s.count > 2 && s[2] == "crypto" ? .crypto : .stocks]), .pass)
        case ("v1beta1", "forex"):
            return route("forex", .markets([.forex]), .pass)
        default:
            break
        }
        return .failure(.notFound("no gateway route \(request.path)"))
    }

    /// `symbols=A,B` (upper-cased, as the stream names them).
    static func symbols(_ request: GatewayRequest) -> [String] {
        (request.parameter("symbols") ?? "").split(separator: ",").map { $0.trimmingCharacters(in: .whitespaces).uppercased() }.filter { !$0.isEmpty }
    }

    /// The day `end` lies on (RFC 3339 or a date), `nil` without one (Alpaca's default: now).
    static func endDay(_ request: GatewayRequest) -> Result<Int64?, GatewayProblem> {
        for name in ["start", "end"] {
            guard let text = request.parameter(name) else { continue }
            guard let day = GatewayCalendar.day(text, millisecondsAllowed: false) else {
                return .failure(.badRequest("\(name): RFC 3339 or YYYY-MM-DD, got \(text.prefix(40))"))
            }
            if name == "end" { return .success(day) }
        }
        return .success(nil)
    }

    public func forClient(_ body: ByteBuffer, request: GatewayRequest) -> (body: ByteBuffer, cursors: [String])? {
        // Pages are named by an opaque token, not a link: nothing points at the vendor's host.
        // A page without one (most) is passed on as it is, not copied into a string first.
        guard body.mentions("\"next_page_token\"") else { return (body, []) }
        let text = String(buffer: body)
        guard let found = JSONText.member("next_page_token", of: Substring(text)), let token = JSONText.unquoted(found) else { return (body, []) }
        return (body, [String(token)])
    }

    public func credentialHeaders(_ credentials: RESTCredentials) -> [(String, String)] {
        [("APCA-API-KEY-ID", credentials.key), ("APCA-API-SECRET-KEY", credentials.secret ?? "")]
    }

    public func errorBody(status: Int, message: String) -> ByteBuffer {
        ByteBuffer(string: #"{"code":\#(status),"message":"\#(JSONText.escape(message))"}"#)
    }
}
