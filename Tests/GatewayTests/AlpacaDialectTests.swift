import AlpacaREST
import Foundation
import MarketCore
import NIOCore
import RESTGateway
import Testing

/// Alpaca's data API paths as the gateway reads them (those alpaca-py sends).
@Suite("REST gateway: Alpaca's routes")
struct AlpacaDialectTests {
    let dialect = AlpacaGatewayDialect(referenceTTL: .seconds(3600))
    /// 2026-12-02 15:00 UTC.
    let now: Int64 = 1_796_223_600_000

    func route(_ path: String, _ query: [(String, String)] = []) -> Result<GatewayRoute, GatewayProblem> {
        dialect.route(GatewayRequest(path: path, query: query.map { (name: $0.0, value: $0.1) }, base: "http://relay:8080"), now: now)
    }

    func topics(_ market: Market, _ list: String...) -> RouteScope { .topics(market, list.compactMap { Topic(parsing: $0) }) }

    @Test func latestValuesAreLiveForEverySymbolAsked() throws {
        let trades = try route("/v2/stocks/trades/latest", [("symbols", "aapl,MSFT")]).get()
        #expect(trades.live && trades.name == "latest-trades" && trades.scope == topics(.stocks, "t.AAPL", "t.MSFT"))
        #expect(try route("/v1beta3/crypto/us/latest/quotes", [("symbols", "BTC/USD")]).get().scope == topics(.crypto, "q.BTC/USD"))
        #expect(try route("/v1beta1/options/trades/latest", [("symbols", "SPY251219C00650000")]).get().live)
        #expect(try route("/v2/stocks/AAPL/bars/latest").get().scope == topics(.stocks, "b.AAPL"))
        #expect(try route("/v2/stocks/snapshots", [("symbols", "AAPL")]).get().scope == topics(.stocks, "t.AAPL", "q.AAPL", "b.AAPL"))
        // Another feed or currency than the stream's is the vendor's to answer.
        #expect(try !route("/v2/stocks/trades/latest", [("symbols", "AAPL"), ("feed", "sip")]).get().live)
        #expect(try !route("/v1beta3/crypto/eu-1/latest/trades", [("symbols", "BTC/USD")]).get().live)
        // META's latest trade is market data, not the meta routes' reference data.
        #expect(try route("/v2/stocks/META/trades/latest").get().scope == topics(.stocks, "t.META"))
        #expect(try route("/v1beta1/forex/latest/rates", [("currency_pairs", "EURUSD")]).get().scope == .markets([.forex]))
        guard case .failure(.badRequest) = route("/v2/stocks/trades/latest") else {
            Issue.record("latest without symbols is a 400")
            return
        }
    }

    @Test func historyOfClosedDaysIsCachedAndItsPagesToo() throws {
        let closed = [("symbols", "AAPL"), ("timeframe", "1Day"), ("start", "2026-10-01T00:00:00+00:00"), ("end", "2026-11-01T00:00:00+00:00")]
        #expect(try route("/v2/stocks/bars", closed).get().policy == .forever)
        #expect(try route("/v2/stocks/bars", closed + [("adjustment", "all")]).get().policy == .until(1_796_284_800_000))
        #expect(try route("/v2/stocks/bars", [("symbols", "AAPL"), ("timeframe", "1Min")]).get().policy == .pass, "no end: up to now")
        #expect(try route("/v2/stocks/trades", [("symbols", "AAPL"), ("end", "2026-12-02T14:00:00Z")]).get().policy == .pass, "today")
        // A page's own end decides (alpaca-py sends every parameter again with the token).
        #expect(try route("/v2/stocks/bars", closed + [("page_token", "QUFQTA==")]).get().policy == .forever)
        #expect(try route("/v2/stocks/bars", [("symbols", "AAPL"), ("page_token", "QUFQTA==")]).get().policy == .pass)
        guard case .failure(.badRequest) = route("/v2/stocks/bars", [("symbols", "AAPL"), ("end", "last week")]) else {
            Issue.record("a malformed end is a 400")
            return
        }
        // An offset counts: 23:59 at -12:00 is the next day in UTC.
        #expect(try route("/v2/stocks/bars", [("symbols", "AAPL"), ("end", "2026-12-01T23:59:00-12:00")]).get().policy == .pass)
        #expect(try route("/v2/stocks/bars", [("symbols", "AAPL"), ("end", "2026-11-30T23:59:00-12:00")]).get().policy == .forever)
        // The + of an offset is sent encoded.
        #expect(try route("/v2/stocks/bars", closed).get().upstream.contains("end=2026-11-01T00%3A00%3A00%2B00%3A00"))
    }

    @Test func pagesAreNamedByATokenNeverALink() throws {
        let body = ByteBuffer(string: #"{"bars":{"AAPL":[]},"next_page_token":"QUFQTHxE"}"#)
        let (same, cursors) = try #require(dialect.forClient(body, request: GatewayRequest(path: "/v2/stocks/bars", query: [], base: "http://relay:8080")))
        #expect(same == body && cursors == ["QUFQTHxE"])
        #expect(String(buffer: dialect.errorBody(status: 403, message: "no")) == #"{"code":403,"message":"no"}"#)
        #expect(dialect.credentialHeaders(RESTCredentials(key: "id", secret: "s")).map(\.0) == ["APCA-API-KEY-ID", "APCA-API-SECRET-KEY"])
        guard case .failure(.notFound) = route("/v2/stocks/nothing/at/all/here") else {
            Issue.record("an unknown Alpaca path is a 404")
            return
        }
    }
}
