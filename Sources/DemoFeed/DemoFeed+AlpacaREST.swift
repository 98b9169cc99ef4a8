import AlpacaWire
import Foundation
import HTTPTypes
import Hummingbird
import NIOCore
import PolygonWire

/// Alpaca's market-data REST paths, answered from the demo market's state in Alpaca's shapes (what
/// alpaca-py's historical clients read): the latest trade, quote and minute bar of each symbol, the
/// stocks' and crypto's snapshots, and daily bars paged with `next_page_token`. The key is Alpaca's
/// `APCA-API-KEY-ID` header (crypto may come without one, as Alpaca allows). Counted like the Polygon
/// paths (``restCount(_:_:)``, endpoint `alpaca-<route>`), and under the same per-minute limit.
extension DemoFeed {
    func addAlpacaREST(to router: Router<BasicRequestContext>) {
        for (kind, crypto) in [("trades", "latest/trades"), ("quotes", "latest/quotes"), ("bars", "latest/bars")] {
            router.get("/v2/stocks/\(kind)/latest") { request, _ in self.alpacaLatest(kind, .stocks, request) }
            router.get("/v1beta3/crypto/us/\(crypto)") { request, _ in self.alpacaLatest(kind, .crypto, request) }
            router.get("/v1beta1/options/\(kind)/latest") { request, _ in self.alpacaLatest(kind, .options, request) }
        }
        router.get("/v2/stocks/snapshots") { request, _ in self.alpacaSnapshots(.stocks, request) }
        router.get("/v1beta3/crypto/us/snapshots") { request, _ in self.alpacaSnapshots(.crypto, request) }
        router.get("/v2/stocks/bars") { request, _ in self.alpacaDailyBars(request) }
    }

    /// The symbols asked for (`symbols=A,B`).
    private static func symbols(_ request: Request) -> [String] {
        (request.uri.queryParameters.get("symbols") ?? "").split(separator: ",").map { String($0).trimmingCharacters(in: .whitespaces) }
            .filter { !$0.isEmpty }
    }

    /// The relay's ticker (Polygon's form) for an Alpaca symbol.
    private static func ticker(_ symbol: String, _ market: Market) -> String {
        switch market {
        case .crypto: "X:" + symbol.replacingOccurrences(of: "/", with: "-")
        case .options: "O:" + symbol
        default: symbol
        }
    }

    private static func rfc3339(milliseconds: Int64) -> String {
        let seconds = milliseconds >= 0 ? milliseconds / 1000 : (milliseconds - 999) / 1000
        return AlpacaJSON.rfc3339(seconds: seconds, nanoseconds: UInt32((milliseconds - seconds * 1000) * 1_000_000))
    }

    /// One symbol's record in Alpaca's REST shape.
    private static func record(_ kind: String, ticker: String, state: RestState, market: Market) -> String? {
        guard let last = state.last[ticker] else { return nil }
        let price = DemoMarket.price(last.cents, ticker: ticker)
        let time = rfc3339(milliseconds: last.at)
        switch kind {
        case "trades":
            return #"{"t":"\#(time)","x":"V","p":\#(price),"s":100,"c":["@"],"i":\#(last.at % 1_000_000),"z":"C"}"#
        case "quotes":
            let spread = max(last.cents / 5000, 1)
            let bid = DemoMarket.price(last.cents - spread / 2, ticker: ticker)
            let ask = DemoMarket.price(last.cents - spread / 2 + spread, ticker: ticker)
            return #"{"t":"\#(time)","bx":"V","bp":\#(bid),"bs":5,"ax":"V","ap":\#(ask),"as":7,"c":["R"],"z":"C"}"#
        default:
            let minute = rfc3339(milliseconds: last.at / 60_000 * 60_000)
            return #"{"t":"\#(minute)","o":\#(price),"h":\#(price),"l":\#(price),"c":\#(price),"v":100,"n":1,"vw":\#(price)}"#
        }
    }

    private func alpacaLatest(_ kind: String, _ market: Market, _ request: Request) -> Response {
        alpacaAnswer("\(kind)-latest", request, crypto: market == .crypto) { state in
            let entries = Self.symbols(request).compactMap { symbol in
                Self.record(kind, ticker: Self.ticker(symbol, market), state: state, market: market).map { #""\#(symbol)":\#($0)"# }
            }
            return #"{"\#(kind)":{\#(entries.joined(separator: ","))}}"#
        }
    }

    private func alpacaSnapshots(_ market: Market, _ request: Request) -> Response {
        alpacaAnswer("snapshots", request, crypto: market == .crypto) { state in
            let entries = Self.symbols(request).compactMap { symbol -> String? in
                let ticker = Self.ticker(symbol, market)
                guard let trade = Self.record("trades", ticker: ticker, state: state, market: market),
                    let quote = Self.record("quotes", ticker: ticker, state: state, market: market),
                    let bar = Self.record("bars", ticker: ticker, state: state, market: market)
                else { return nil }
                let close = state.previousClose[ticker].map { DemoMarket.price($0, ticker: ticker) } ?? "0"
                let day = Self.rfc3339(milliseconds: WallClock.nowMilliseconds() / 86_400_000 * 86_400_000)
                let previous = #"{"t":"\#(Self.rfc3339(milliseconds: (WallClock.nowMilliseconds() / 86_400_000 - 1) * 86_400_000))","o":\#(close),"h":\#(close),"l":\#(close),"c":\#(close),"v":1000000,"n":10000,"vw":\#(close)}"#
                let price = state.last[ticker].map { DemoMarket.price($0.cents, ticker: ticker) } ?? close
                let daily = #"{"t":"\#(day)","o":\#(close),"h":\#(price),"l":\#(price),"c":\#(price),"v":100000,"n":1000,"vw":\#(price)}"#
                return #""\#(symbol)":{"latestTrade":\#(trade),"latestQuote":\#(quote),"minuteBar":\#(bar),"dailyBar":\#(daily),"prevDailyBar":\#(previous)}"#
            }
            let map = entries.joined(separator: ",")
            return market == .crypto ? #"{"snapshots":{\#(map)}}"# : "{\(map)}"
        }
    }

    /// Daily bars of `symbols` from `start` through `end` (dates or RFC 3339), `limit` (at most 10) a
    /// page, paged with an opaque `next_page_token`.
    private func alpacaDailyBars(_ request: Request) -> Response {
        alpacaAnswer("bars", request, crypto: false) { state in
            let query = request.uri.queryParameters
            guard let start = query.get("start").flatMap({ CivilDay.days($0.prefix(10)) }),
                let end = (query.get("end") ?? query.get("start")).flatMap({ CivilDay.days($0.prefix(10)) })
            else { return nil }
            // At most 10 bars a page (Alpaca's is 10,000): a month of days takes several pages.
            let limit = max(1, min(Int(query.get("limit") ?? "10") ?? 10, 10))
            let offset = max(0, query.get("page_token").flatMap { Int($0.dropFirst()) } ?? 0)
            let today = WallClock.nowMilliseconds() / 86_400_000
            var rows: [(String, String)] = []
            for symbol in Self.symbols(request) {
                guard let close = state.previousClose[symbol] else { continue }
                for bar in DemoHistory.bars(ticker: symbol, from: start, through: end, today: today, previousClose: close) {
                    let price = { (cents: Int64) in DemoMarket.price(cents, ticker: symbol) }
                    rows.append((symbol, #"{"t":"\#(Self.rfc3339(milliseconds: bar.day * 86_400_000))","o":\#(price(bar.open)),"h":\#(price(bar.high)),"l":\#(price(bar.low)),"c":\#(price(bar.close)),"v":\#(bar.volume),"n":\#(bar.volume / 100),"vw":\#(price((bar.high + bar.low + bar.close) / 3))}"#))
                }
            }
            let page = rows.dropFirst(offset).prefix(limit)
            let grouped = Dictionary(grouping: page, by: \.0).sorted { $0.key < $1.key }
            let bars = grouped.map { symbol, rows in #""\#(symbol)":[\#(rows.map(\.1).joined(separator: ","))]"# }.joined(separator: ",")
            let next = offset + page.count < rows.count ? #""p\#(offset + page.count)""# : "null"
            return #"{"bars":{\#(bars)},"next_page_token":\#(next)}"#
        }
    }

    /// An Alpaca-shaped answer: counted, limited per minute, the key checked (crypto may have none).
    private func alpacaAnswer(_ endpoint: String, _ request: Request, crypto: Bool, _ body: (RestState) -> String?) -> Response {
        let key = "alpaca-\(endpoint)"
        _ = restCounts.withLock { $0.start(key) }
        defer { restCounts.withLock { $0[key].completed += 1 } }
        if let retryAfter = overLimit() {
            restCounts.withLock { $0["limited"].completed += 1 }
            var response = Self.restJSON(#"{"code":42910000,"message":"too many requests"}"#, status: .tooManyRequests)
            response.headers[.retryAfter] = String(retryAfter)
            return response
        }
        let presented = HTTPField.Name("APCA-API-KEY-ID").flatMap { request.headers[$0] }
        if let expected = configuration.apiKey, presented != expected, !(crypto && presented == nil) {
            restCounts.withLock { $0[key].unauthorized += 1 }
            return Self.restJSON(#"{"code":40110000,"message":"request is not authorized"}"#, status: .unauthorized)
        }
        guard let text = body(restState.withLock { $0 }) else {
            return Self.restJSON(#"{"code":42210000,"message":"invalid request: symbols, start and end"}"#, status: .unprocessableContent)
        }
        return Self.restJSON(text, status: .ok)
    }
}
