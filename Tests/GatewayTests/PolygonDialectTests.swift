import Foundation
import MarketCore
import MarketREST
import NIOCore
@testable import PolygonRESTClient
import RESTGateway
import Testing

/// Polygon's REST paths as the gateway reads them: which route, what it reads for the key's rights,
/// how long its answer may be cached, and what is refused before any call.
@Suite("REST gateway: Polygon's routes")
struct PolygonDialectTests {
    let dialect = PolygonGatewayDialect(referenceTTL: .seconds(3600))
    /// 2026-12-02 15:00 UTC.
    let now: Int64 = 1_796_223_600_000

    func route(_ path: String, _ query: [(String, String)] = []) -> Result<GatewayRoute, GatewayProblem> {
        dialect.route(GatewayRequest(path: path, query: query.map { (name: $0.0, value: $0.1) }, base: "http://relay:8080"), now: now)
    }

    func routed(_ path: String, _ query: [(String, String)] = []) throws -> GatewayRoute {
        try route(path, query).get()
    }

    @Test func liveRoutesReadTheStreamsTopics() throws {
        let trade = try routed("/v2/last/trade/aapl")
        #expect(trade.live && trade.name == "last-trade")
        #expect(trade.scope == .topics(.stocks, [Topic(parsing: "T.AAPL")!]))
        #expect(try routed("/v2/last/nbbo/AAPL").scope == .topics(.stocks, [Topic(parsing: "Q.AAPL")!]))
        #expect(try routed("/v1/last/crypto/BTC/USD").scope == .topics(.crypto, [Topic(parsing: "XT.BTC-USD")!]))
        let snapshot = try routed("/v2/snapshot/locale/us/markets/stocks/tickers/MSFT")
        #expect(snapshot.live && snapshot.scope == .topics(.stocks, ["T.MSFT", "Q.MSFT", "AM.MSFT"].compactMap { Topic(parsing: $0) }))
        // Indices' and forex's last values are not the stream's trades: the vendor answers them.
        #expect(try !routed("/v2/last/trade/C:EURUSD").live)
        // An option's last trade is the options market's; a crypto snapshot is passed through.
        #expect(try routed("/v2/last/trade/O:SPY251219C00650000").scope == .topics(.options, [Topic(parsing: "T.O:SPY251219C00650000")!]))
        let crypto = try routed("/v2/snapshot/locale/global/markets/crypto/tickers/X:BTCUSD")
        #expect(!crypto.live && crypto.scope == .topics(.crypto, ["XT.BTC-USD", "XQ.BTC-USD", "XA.BTC-USD"].compactMap { Topic(parsing: $0) }))
        // A further page of tickers named in the query needs the whole market: the cursor could name others.
        // A list's snapshot holds each ticker's trades, quotes and bars; a list naming nothing, or narrowed
        // by another ticker filter as well, is what the vendor answers for the whole market.
        #expect(try routed("/v3/snapshot", [("ticker.any_of", "AAPL")]).scope == .topics(.stocks, ["T.AAPL", "Q.AAPL", "AM.AAPL"].compactMap { Topic(parsing: $0) }))
        #expect(try routed("/v2/snapshot/locale/us/markets/stocks/tickers", [("tickers", ",")]).scope == .markets([.stocks]))
        #expect(try routed("/v2/snapshot/locale/us/markets/stocks/tickers", [("tickers", " , ")]).scope == .markets([.stocks]))
        #expect(try routed("/v3/snapshot", [("ticker.any_of", "AAPL"), ("ticker.gte", "A")]).scope == .markets(Market.trading))
        #expect(try routed("/v3/snapshot", [("ticker.any_of", "AAPL"), ("ticker", "MSFT")]).scope == .markets(Market.trading))
        #expect(try routed("/v1/summaries", [("ticker.any_of", ",")]).scope == .markets(Market.trading))
        #expect(try routed("/v3/snapshot/indices", [("ticker.any_of", "")]).scope == .markets([.indices]))
        #expect(
            try routed("/v3/snapshot/options/SPY/O:SPY251219C00650000").scope
                == .topics(.options, ["T", "Q", "AM"].compactMap { Topic(parsing: "\($0).O:SPY251219C00650000") }))
        #expect(try routed("/v3/snapshot", [("ticker.any_of", "AAPL"), ("cursor", "abc")]).scope == .markets(Market.trading))
        #expect(try routed("/v2/snapshot/locale/us/markets/stocks/tickers").scope == .markets([.stocks]))
    }

    @Test func closedDaysAreCachedTodayPasses() throws {
        // Adjusted (the default) until the next 08:00 UTC; unadjusted for ever.
        let next0800: Int64 = 1_796_284_800_000
        #expect(try routed("/v2/aggs/ticker/AAPL/range/1/day/2026-10-01/2026-10-31").policy == .until(next0800))
        #expect(try routed("/v2/aggs/ticker/AAPL/range/1/day/2026-10-01/2026-10-31", [("adjusted", "false")]).policy == .forever)
        // Yesterday closed at 06:00 UTC today; today has not.
        #expect(try routed("/v2/aggs/ticker/AAPL/range/1/minute/2026-12-01/2026-12-01").policy == .until(next0800))
        #expect(try routed("/v2/aggs/ticker/AAPL/range/1/minute/2026-12-02/2026-12-02").policy == .pass)
        #expect(try routed("/v2/aggs/ticker/AAPL/range/1/minute/\(now - 600_000)/\(now)").policy == .pass)
        // Trades of a window that ends on a closed day; without an end, passed.
        #expect(try routed("/v3/trades/AAPL", [("timestamp.gte", "2026-11-30"), ("timestamp.lt", "2026-12-01")]).policy == .forever)
        #expect(try routed("/v3/trades/AAPL", [("timestamp.gte", "2026-11-30")]).policy == .pass)
        #expect(try routed("/v3/quotes/AAPL", [("timestamp", "2026-11-27")]).policy == .forever)
        // A page is cached as the answer that named its cursor was.
        #expect(try routed("/v3/trades/AAPL", [("cursor", "abc")]).policy == .cursor("/v3/trades/AAPL abc"))
        #expect(try routed("/v3/reference/tickers/AAPL").policy == .until(now + 3_600_000))
        #expect(try routed("/v1/marketstatus/now").policy == .pass)
        #expect(try routed("/v2/aggs/ticker/AAPL/prev").policy == .until(next0800))
    }

    @Test func identicalRequestsAreOneUpstreamRequestWithoutTheClientsKey() throws {
        let one = try routed("/v3/trades/AAPL", [("limit", "5"), ("apiKey", "secret"), ("order", "asc")])
        let other = try routed("/v3/trades/AAPL", [("order", "asc"), ("limit", "5")])
        #expect(one.upstream == other.upstream)
        #expect(one.upstream == "/v3/trades/AAPL?limit=5&order=asc")
        // A + in a value is sent encoded (a server would read a space).
        #expect(try routed("/v3/reference/tickers", [("search", "A+B")]).upstream == "/v3/reference/tickers?search=A%2BB")
    }

    @Test func whatIsNotOnePathOfTheAPIIsRefused() {
        for path in ["//evil.example/v2/last/trade/AAPL", "/v2/last/trade/..%2Fx", "/v2/../v3/trades/AAPL", "/v2/last/trade/a%5Cb", "/v2/last/trade/%00",
            "/v2/last/trade/a@evil.example"]
        {
            guard case .failure(.badRequest) = route(path) else {
                Issue.record("\(path) was not refused as a bad request: \(route(path))")
                continue
            }
        }
        guard case .failure(.notFound) = route("/v2/not/a/route") else { Issue.record("an unknown route is a 404"); return }
        // A date past any calendar is refused, not overflowed.
        guard case .failure(.badRequest) = route("/v2/aggs/ticker/AAPL/range/1/day/0/9223372036854775807") else { Issue.record("a huge date"); return }
        guard case .failure(.badRequest) = route("/v1/open-close/AAPL/9223372036854775807") else { Issue.record("a huge date"); return }
        guard case .failure(.badRequest) = route("/v3/snapshot", [("ticker.any_of", "AAPL"), ("ticker.any_of", "TSLA")]) else {
            Issue.record("a parameter given twice")
            return
        }
        guard case .failure(.badRequest) = route("/v3/trades/AAPL", [("limit", "0")]) else { Issue.record("limit 0"); return }
        guard case .failure(.badRequest) = route("/v3/trades/AAPL", [("bad name", "1")]) else { Issue.record("a parameter name with a space"); return }
        guard case .failure(.badRequest) = route("/v2/aggs/ticker/AAPL/range/1/fortnight/2026-10-01/2026-10-02") else { Issue.record("timespan"); return }
        guard case .failure(.badRequest) = route("/v2/aggs/ticker/AAPL/range/1/day/2026-10-05/2026-10-02") else { Issue.record("from after to"); return }
    }

    @Test func aPagesLinkPointsBackAtTheRelayWithoutAKey() throws {
        let body = ByteBuffer(
            string: #"{"results":[{"p":1.5}],"status":"OK","next_url":"https:\/\/api.polygon.io\/v3\/trades\/AAPL?cursor=YWJj&apiKey=upstream-secret"}"#)
        let request = GatewayRequest(path: "/v3/trades/AAPL", query: [], base: "http://relay:8080")
        let (rewritten, cursors) = try #require(dialect.forClient(body, request: request))
        let text = String(buffer: rewritten)
        #expect(text.contains(#""next_url":"http://relay:8080/v3/trades/AAPL?cursor=YWJj""#), "\(text)")
        #expect(!text.contains("upstream-secret") && !text.contains("polygon.io"))
        #expect(cursors == ["/v3/trades/AAPL YWJj"])
        #expect(text.hasPrefix(#"{"results":[{"p":1.5}]"#), "the rest of the body is as the vendor sent it")
    }

    @Test func aPagesLinkIsRewrittenInItsBytesWhateverTextSurroundsIt() throws {
        let request = GatewayRequest(path: "/v3/x", query: [], base: "http://relay:8080")
        // Characters of several bytes before and after the link: the offsets are the bytes'.
        let body = ByteBuffer(string: #"{"name":"Société Générale ✓","next_url":"https://api.polygon.io/v3/x?cursor=a","tail":"日本"}"#)
        let text = String(buffer: try #require(dialect.forClient(body, request: request)).body)
        #expect(text == #"{"name":"Société Générale ✓","next_url":"http://relay:8080/v3/x?cursor=a","tail":"日本"}"#)
        // Bytes that are not UTF-8 before it: written from the text as read.
        var invalid = ByteBuffer(string: #"{"name":""#)
        invalid.writeBytes([0xFF, 0xFE])
        invalid.writeString(#"","next_url":"https://api.polygon.io/v3/x?cursor=a","n":1}"#)
        let repaired = String(buffer: try #require(dialect.forClient(invalid, request: request)).body)
        #expect(repaired.hasSuffix(#"","next_url":"http://relay:8080/v3/x?cursor=a","n":1}"#), "\(repaired)")
    }

    /// An aggregates cursor says only `limit` and `sort` (Polygon's own sample): the same text for every
    /// range. A closed range's page names its next page by path and cursor, so today's range with the
    /// same cursor is not the page a cached answer named.
    @Test func aPagesCursorIsRememberedWithItsPath() throws {
        let closed = "/v2/aggs/ticker/AAPL/range/1/day/1578114000000/2020-01-10"
        let body = ByteBuffer(string: #"{"results":[],"next_url":"https://api.polygon.io\#(closed)?cursor=bGltaXQ9MiZzb3J0PWFzYw"}"#)
        let (_, cursors) = try #require(dialect.forClient(body, request: GatewayRequest(path: closed, query: [], base: "http://relay:8080")))
        let next = try routed(closed, [("cursor", "bGltaXQ9MiZzb3J0PWFzYw")])
        #expect(cursors == [next.policy].compactMap { if case .cursor(let page) = $0 { page } else { nil } }, "the page named is the page asked")
        let today = try routed("/v2/aggs/ticker/AAPL/range/1/minute/1578114000000/2099-01-10", [("cursor", "bGltaXQ9MiZzb3J0PWFzYw")])
        guard case .cursor(let page) = today.policy else { Issue.record("\(today.policy)"); return }
        #expect(!cursors.contains(page))
    }

    /// A link's member written with escapes, or given twice, is the link a client's JSON reader follows:
    /// it is rewritten, or the body is not passed on. A list with escapes (no link) goes as it came.
    @Test func aLinkNamedWithEscapesOrTwiceIsNotPassedOnAsItIs() throws {
        let request = GatewayRequest(path: "/v3/trades/AAPL", query: [], base: "http://relay:8080")
        let escaped = ByteBuffer(string: #"{"results":[],"next\u005furl":"https://evil.example/v3/trades/AAPL?cursor=x"}"#)
        let text = String(buffer: try #require(dialect.forClient(escaped, request: request)).body)
        #expect(!text.contains("evil") && text.contains("http://relay:8080/v3/trades/AAPL?cursor=x"), "\(text)")
        let twice = ByteBuffer(string: #"{"next_url":"https://evil.example/v3?cursor=a","next_url":"https://api.polygon.io/v3/trades/AAPL?cursor=b"}"#)
        #expect(dialect.forClient(twice, request: request) == nil)
        let twiceEscaped = ByteBuffer(string: #"{"next_url":"https://api.polygon.io/v3?cursor=a","next\u005Furl":"https://evil.example/v3?cursor=b"}"#)
        #expect(dialect.forClient(twiceEscaped, request: request) == nil)
        let escapedTwice = ByteBuffer(string: #"{"\u006eext_url":"https://api.polygon.io/v3?cursor=a","next\u005furl":"https://evil.example/v3?cursor=b"}"#)
        #expect(dialect.forClient(escapedTwice, request: request) == nil)
        // Deeper than the reader reads, with an escaped link: not passed on either.
        let deep = String(repeating: "[", count: 40) + String(repeating: "]", count: 40)
        let hidden = ByteBuffer(string: #"{"results":\#(deep),"next\u005furl":"https://evil.example/v3?cursor=b"}"#)
        #expect(dialect.forClient(hidden, request: request) == nil)
        // A byte-order mark before the object (a browser's reader skips it): not passed on.
        let marked = ByteBuffer(string: "\u{FEFF}" + #"{"next\u005furl":"https://evil.example/v3?cursor=b"}"#)
        #expect(dialect.forClient(marked, request: request) == nil)
        // A list (the market's upcoming holidays) with a `&` escaped as Go escapes it: as it came.
        let list = ByteBuffer(string: #"[{"name":"Washington\u0026Lee","status":"closed"}]"#)
        #expect(try #require(dialect.forClient(list, request: request)).body == list)
    }

    @Test func aLinkThatWouldLeaveTheRelaysHostIsNotPassedOn() throws {
        let request = GatewayRequest(path: "/v3/trades/AAPL", query: [], base: "http://relay:8080")
        // Joined to the relay's address, `@evil.example/x` names the host evil.example, and
        // `.evil.example/x` a host under it: only a path from the root is kept.
        for link in ["@evil.example/v3/trades/AAPL?cursor=a", ".evil.example/v3?cursor=a", "evil.example/v3?cursor=a"] {
            let body = ByteBuffer(string: #"{"results":[],"next_url":"\#(link)"}"#)
            let text = String(buffer: try #require(dialect.forClient(body, request: request)).body)
            #expect(text.contains(#""next_url":null"#) && !text.contains("evil"), "\(link): \(text)")
        }
        // A body naming a next page that cannot be read (nested past the reader's depth) is not passed on.
        let deep = String(repeating: "[", count: 40) + String(repeating: "]", count: 40)
        let unreadable = ByteBuffer(string: #"{"results":\#(deep),"next_url":"https://evil.example/v3?cursor=a"}"#)
        #expect(dialect.forClient(unreadable, request: request) == nil)
    }

    @Test func aVendorsErrorTextKeepsNoPartOfTheKey() {
        let key = "Pk7Qm2Zx9Lr4Tw8Yb3Nc6Vd1Hs5Jg0Fa"
        // The key at the start, and again across the 4 KB cut (after line breaks and a multi-byte
        // character, which a cut by characters would count short).
        let filler = String(repeating: "é\r\n", count: 500) + String(repeating: "x", count: 4096 - key.utf8.count - 2_000 - 10)
        let body = key + filler + key + " and more"
        let text = PolygonREST.errorText(ByteBuffer(string: body), scrubbing: key)
        #expect(text.hasPrefix("<relay-upstream-key>"))
        for part in [key.prefix(6), key.suffix(6)] { #expect(!text.contains(part), "\(part) in \(text.suffix(40))") }
        #expect(text.utf8.count <= 4096)
        // A key just past the cut, after one the scrub shortens: none of it either.
        let past = PolygonREST.errorText(ByteBuffer(string: key + String(repeating: "x", count: 4097 - key.utf8.count) + key), scrubbing: key)
        for part in [key.prefix(6), key.suffix(6)] { #expect(!past.contains(part), "\(part) in \(past.suffix(40))") }
    }

    @Test func jsonMembersKeepNumbersAsSent() throws {
        let members = try #require(JSONText.members(of: #"{"p": 189.60, "c":[0,12], "i":"a\"b", "n":null, "o":{"x":[1,{"y":2}]}}"#))
        #expect(members["p"] == "189.60")
        #expect(members["c"] == "[0,12]")
        #expect(members["i"] == #""a\"b""#)
        #expect(members["n"] == "null")
        #expect(members["o"] == #"{"x":[1,{"y":2}]}"#)
        for broken in [#"{"p":1"#, #"{"p":}"#, #"{"p":1} x"#, #"["p"]"#, #"{"p":"open}"#, String(repeating: "[", count: 40)] {
            #expect(JSONText.members(of: Substring(broken)) == nil, "\(broken)")
        }
    }

    /// An upstream's trade whose `t` (ms) has no nanoseconds in an Int64 is answered without its time,
    /// not a trap of the whole process (the stream's event is held as the vendor sent it).
    @Test func aTimeWhoseNanosecondsDoNotFitIsLeftOut() throws {
        #expect(PolygonGatewayDialect.nanoseconds("1796223600000") == "1796223600000000000")
        for far in ["10000000000000", "-10000000000000", String(Int64.max), String(Int64.min)] {
            #expect(PolygonGatewayDialect.nanoseconds(far) == nil, "\(far)")
            let answer = PolygonGatewayDialect.lastAnswer("last-trade", ["p": "1", "s": "5", "t": far, "x": "4"], ticker: "AAPL")
            let results = try #require(JSONText.members(of: Substring(String(buffer: answer)))?["results"], "\(String(buffer: answer))")
            let members = try #require(JSONText.members(of: Substring(results)))
            #expect(members["p"] == "1" && members["t"] == nil, "\(results)")
        }
    }

    @Test func todaysChangeIsLeftOutWhenTheRatioOverflows() {
        let change = PolygonGatewayDialect.todaysChange(last: "110", close: "100")
        #expect(change?.change == "10" && change?.percent == "10")
        // A REST host's tiny previous close: the ratio is NaN, which no JSON reader takes.
        #expect(PolygonGatewayDialect.todaysChange(last: "12.5", close: "1e-128") == nil)
        #expect(PolygonGatewayDialect.todaysChange(last: "12.5", close: "0") == nil)
        #expect(PolygonGatewayDialect.todaysChange(last: nil, close: "100") == nil)
    }
}
