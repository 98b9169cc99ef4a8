import Hummingbird
import NIOCore
import PolygonWire

/// Polygon's REST history, answered from what the feed generated (``DemoTape``): exactly the trades,
/// quotes and bars it streamed, whether or not anybody was connected.
///
/// - `GET /v3/trades/{ticker}` and `GET /v3/quotes/{ticker}`: `timestamp` with `.gte` `.gt` `.lte`
///   `.lt` (Unix ns), `order` (`asc`, default `desc`), `limit` (default 1,000, at most 50,000); past a page,
///   `next_url` with an opaque `cursor` (and no key).
/// - `GET /v2/aggs/ticker/{ticker}/range/1/minute/{from}/{to}` (Unix ms): the bars that start within.
extension DemoFeed {
    func addHistory(to router: Router<BasicRequestContext>) {
        router.get("/v3/trades/:ticker") { request, context in
            try await self.historyPage(.trade, request, context)
        }
        router.get("/v3/quotes/:ticker") { request, context in
            try await self.historyPage(.quote, request, context)
        }
    }

    /// The tape that knows `ticker`, and its number there.
    func tape(for ticker: String) -> (tape: DemoTape, ticker: UInt16)? {
        for market in Market.allCases {
            if let tape = tapes[market], let number = tape.ticker(ticker) { return (tape, number) }
        }
        return nil
    }

    /// A page of trades or quotes: the window and order from the query, or from the cursor of an earlier page.
    private struct Page {
        var from: Int64
        var to: Int64
        var ascending: Bool
        var limit: Int
        var offset: Int

        /// From `timestamp.gte` etc. in Unix ns, as a window of whole milliseconds `[from, to)`.
        init?(query: [String: String]) {
            if let cursor = query["cursor"] {
                let parts = cursor.split(separator: "_").compactMap { Int64($0) }
                // Any text may come back as a cursor: a page of 1 to 50,000 from an offset of 0 on.
                guard parts.count == 5, (1...50_000).contains(parts[3]), parts[4] >= 0 else { return nil }
                (from, to, ascending, limit, offset) = (parts[0], parts[1], parts[2] == 1, Int(parts[3]), Int(parts[4]))
                return
            }
            func nanoseconds(_ name: String) -> Int64?? {
                guard let text = query[name] else { return .some(nil) }
                return Int64(text).map { .some($0) } ?? nil
            }
            guard let gte = nanoseconds("timestamp.gte"), let gt = nanoseconds("timestamp.gt"), let lte = nanoseconds("timestamp.lte"),
                let lt = nanoseconds("timestamp.lt"), let exact = nanoseconds("timestamp")
            else { return nil }
            let million: Int64 = 1_000_000
            // (Divided first: any Int64 may come, and adding to the largest would trap.)
            func ceilMs(_ ns: Int64) -> Int64 { ns / million + (ns > 0 && ns % million != 0 ? 1 : 0) }
            from = Swift.max(gte.map(ceilMs) ?? .min, gt.map { $0 / million + 1 } ?? .min, exact.map(ceilMs) ?? .min)
            to = Swift.min(lt.map(ceilMs) ?? .max, lte.map { $0 / million + 1 } ?? .max, exact.map { $0 / million + 1 } ?? .max)
            ascending = query["order"] == "asc"
            limit = Swift.min(Swift.max(query["limit"].flatMap(Int.init) ?? 1_000, 1), 50_000)
            offset = 0
        }

        var cursor: String { "\(from)_\(to)_\(ascending ? 1 : 0)_\(limit)_\(offset)" }
    }

    private func historyPage(_ kind: DemoTape.Record.Kind, _ request: Request, _ context: some RequestContext) async throws -> Response {
        var query: [String: String] = [:]
        for (name, value) in request.uri.queryParameters { query[String(name)] = String(value) }
        guard let page = Page(query: query) else {
            return Self.restJSON(#"{"status":"ERROR","request_id":"demo","error":"timestamp.* must be Unix nanoseconds; cursor as given"}"#, status: .badRequest)
        }
        let host = request.head.authority ?? "127.0.0.1:\(configuration.port)"
        let path = request.uri.path
        return try await restAnswer(kind == .trade ? "trades" : "quotes", request, context) { ticker, _ in
            guard let (tape, number) = self.tape(for: ticker) else {
                return #"{"results":[],"status":"OK","request_id":"demo"}"#
            }
            var records = tape.records(kind, ticker: number, from: page.from, to: page.to)
            if !page.ascending { records.reverse() }
            let slice = records.dropFirst(page.offset).prefix(page.limit)
            let rows = slice.map { Self.restRow($0, market: tape.market) }
            var body = #"{"results":[\#(rows.joined(separator: ","))],"status":"OK","request_id":"demo""#
            if page.offset + slice.count < records.count {
                var next = page
                next.offset += slice.count
                body += #","next_url":"http://\#(host)\#(path)?cursor=\#(next.cursor)""#
            }
            return body + "}"
        }
    }

    /// A trade or quote as `/v3/trades` and `/v3/quotes` give it, in the market's shape.
    static func restRow(_ record: DemoTape.Record, market: Market) -> String {
        let decimals = DemoMarket.decimals(of: market)
        let nanoseconds = record.time * 1_000_000
        func price(_ units: Int32) -> String { DemoMarket.price(Int64(units), decimals: decimals) }
        switch (record.kind, market) {
        case (.trade, .crypto):
            return
                #"{"conditions":[2],"exchange":\#(record.exchange),"id":"\#(record.sequence)","participant_timestamp":\#(nanoseconds),"price":\#(price(record.price)),"size":\#(Double(record.size) / 100)}"#
        case (.trade, _):
            return
                #"{"conditions":[0],"exchange":\#(record.exchange),"id":"\#(record.sequence)","participant_timestamp":\#(nanoseconds),"price":\#(price(record.price)),"sequence_number":\#(record.sequence),"sip_timestamp":\#(nanoseconds),"size":\#(record.size),"tape":3}"#
        case (.quote, .forex):
            return
                #"{"ask_exchange":\#(record.askExchange),"ask_price":\#(price(record.ask)),"bid_exchange":\#(record.exchange),"bid_price":\#(price(record.price)),"participant_timestamp":\#(nanoseconds)}"#
        case (.quote, _):
            return
                #"{"ask_exchange":\#(record.askExchange),"ask_price":\#(price(record.ask)),"ask_size":\#(record.askSize),"bid_exchange":\#(record.exchange),"bid_price":\#(price(record.price)),"bid_size":\#(record.size),"conditions":[0],"indicators":[604],"participant_timestamp":\#(nanoseconds),"sequence_number":\#(record.sequence),"sip_timestamp":\#(nanoseconds),"tape":3}"#
        }
    }

    /// Minute bars (`range/1/minute`) that start within `from...to` (Unix ms), as Polygon's aggregates.
    func minuteBars(ticker: String, from: Int64, to: Int64) -> String {
        guard let (tape, number) = tape(for: ticker) else {
            return #"{"ticker":"\#(ticker)","queryCount":0,"resultsCount":0,"adjusted":true,"results":[],"status":"OK","request_id":"demo","count":0}"#
        }
        let decimals = DemoMarket.decimals(of: tape.market)
        func price(_ units: Int64) -> String { DemoMarket.price(units, decimals: decimals) }
        let rows = tape.bars(ticker: number, from: from, through: to).map { bar -> String in
            switch tape.market {
            case .forex:
                #"{"v":\#(bar.trades),"o":\#(price(bar.open)),"c":\#(price(bar.close)),"h":\#(price(bar.high)),"l":\#(price(bar.low)),"t":\#(bar.start),"n":\#(bar.trades)}"#
            case .indices:
                #"{"o":\#(price(bar.open)),"c":\#(price(bar.close)),"h":\#(price(bar.high)),"l":\#(price(bar.low)),"t":\#(bar.start)}"#
            default:
                #"{"v":\#(bar.volume),"vw":\#(price(bar.vwap)),"o":\#(price(bar.open)),"c":\#(price(bar.close)),"h":\#(price(bar.high)),"l":\#(price(bar.low)),"t":\#(bar.start),"n":\#(bar.trades)}"#
            }
        }
        return
            #"{"ticker":"\#(ticker)","queryCount":\#(rows.count),"resultsCount":\#(rows.count),"adjusted":true,"results":[\#(rows.joined(separator: ","))],"status":"OK","request_id":"demo","count":\#(rows.count)}"#
    }
}
