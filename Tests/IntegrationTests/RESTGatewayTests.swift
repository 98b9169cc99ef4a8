#if canImport(FoundationNetworking)
    import FoundationNetworking
#endif
import DemoFeed
import Foundation
import GRDB
import MarketREST
import PolygonWire
import RelayComposition
import RelayConfiguration
import RelayServer
import RelayTestSupport
import Testing

/// A session that opens as many connections as its callers ask for (the shared one queues past a few
/// per host, which would send concurrent requests one batch after another).
let gatewaySession: URLSession = {
    let configuration = URLSessionConfiguration.ephemeral
    configuration.httpMaximumConnectionsPerHost = 256
    return URLSession(configuration: configuration)
}()

/// A GET with its headers, through URLSession (no retries of its own).
func httpGetWithHeaders(_ url: String, key: String? = nil) async throws -> (status: Int, body: String, headers: [String: String]) {
    guard let target = URL(string: url) else { throw TimeoutError(description: "bad URL \(url)") }
    var request = URLRequest(url: target)
    request.timeoutInterval = 20
    if let key { request.setValue("Bearer \(key)", forHTTPHeaderField: "Authorization") }
    let (data, response) = try await gatewaySession.data(for: request)
    let http = response as? HTTPURLResponse
    var headers: [String: String] = [:]
    for (name, value) in http?.allHeaderFields ?? [:] { headers["\(name.base)".lowercased()] = "\(value)" }
    return (http?.statusCode ?? 0, String(decoding: data, as: UTF8.self), headers)
}

/// The REST gateway over real sockets: Polygon's REST paths asked of the relay with a relay key, the
/// demo feed as the vendor (it counts every call, checks its key and can enforce a per-minute limit).
@Suite("REST gateway: the account's REST API through the relay", .serialized)
struct RESTGatewayTests {
    static let upstreamKey = "upstream-secret"

    /// A relay on a demo feed with the gateway on (its cache in a fresh directory unless `cache` names one).
    static func withGateway(
        feed feedConfiguration: DemoFeedConfiguration = DemoFeedConfiguration(port: 0, apiKey: upstreamKey),
        cache: String? = nil, configure: (inout RelaySettings) -> Void = { _ in },
        _ body: (Relay.Components, DemoFeed, String) async throws -> Void
    ) async throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("relay-gateway-\(UUID().uuidString)").path
        defer { try? FileManager.default.removeItem(atPath: directory) }
        try await withFaultyFeedRelay(
            feed: feedConfiguration, restFromFeed: true,
            configure: { settings in
                var gateway = GatewaySettings()
                gateway.cachePath = cache ?? "\(directory)/rest-cache.sqlite"
                settings.gateway = gateway
                configure(&settings)
            }
        ) { parts, feed, _ in
            try await body(parts, feed, "http://127.0.0.1:\(parts.port)")
        }
    }

    static func object(_ text: String) -> [String: Any] { jsonObject(text) }

    /// A client subscribed to AAPL's trades, quotes and minute bars that has seen a trade of it (so the
    /// relay holds one).
    static func aaplHolder(_ base: String) async throws -> WSTestClient {
        let client = try await subscribedClient(base.replacingOccurrences(of: "http", with: "ws") + "/stocks", "T.AAPL,Q.AAPL,AM.AAPL")
        let deadline = ContinuousClock.now + .seconds(10)
        while ContinuousClock.now < deadline {
            if try await client.nextEvents(1, timeout: deadline - .now).contains(where: { $0.eventType == "T" }) { return client }
        }
        throw TimeoutError(description: "no trade of AAPL within 10 s")
    }

    /// Waits until the feed generated at least `count` trades of AAPL in the last minute (its REST history).
    static func feedTraded(_ feed: DemoFeed, _ count: Int) async throws {
        let port = try await feed.listeningPort()
        try await eventually("\(count) trades of AAPL at the feed", timeout: .seconds(20)) {
            let now = WallClock.nowMilliseconds() * 1_000_000
            let answer = try? await httpGet(
                "http://127.0.0.1:\(port)/v3/trades/AAPL?timestamp.gte=\(now - 60_000_000_000)&limit=1000&apiKey=\(Self.upstreamKey)")
            return ((jsonObject(answer?.body ?? "{}")["results"] as? [Any])?.count ?? 0) >= count
        }
    }

    @Test func heldTickersAreAnsweredLiveWithoutAnUpstreamCall() async throws {
        try await Self.withGateway { _, feed, base in
            let client = try await Self.aaplHolder(base)
            let trade = try await httpGetWithHeaders("\(base)/v2/last/trade/AAPL", key: "client-key")
            #expect(trade.status == 200, "\(trade.body)")
            #expect(trade.headers["x-relay-source"] == "live")
            let results = Self.object(trade.body)["results"] as? [String: Any]
            #expect(results?["T"] as? String == "AAPL")
            #expect((results?["p"] as? NSNumber)?.doubleValue ?? 0 > 0)
            // REST's `t` is in nanoseconds.
            #expect((results?["t"] as? NSNumber)?.int64Value ?? 0 > 1_000_000_000_000_000_000)
            let quote = try await httpGetWithHeaders("\(base)/v2/last/nbbo/AAPL", key: "client-key")
            #expect(quote.headers["x-relay-source"] == "live", "\(quote.body)")
            let nbbo = Self.object(quote.body)["results"] as? [String: Any]
            #expect(((nbbo?["p"] as? NSNumber)?.doubleValue ?? 0) <= ((nbbo?["P"] as? NSNumber)?.doubleValue ?? 0))
            #expect(feed.restCount("trade", "AAPL").started == 0, "the vendor was not asked for a held ticker")
            #expect(feed.restCount("nbbo", "AAPL").started == 0)

            // A snapshot: live, with the previous day from the vendor once, then from the cache.
            for _ in 0..<3 {
                let snapshot = try await httpGetWithHeaders("\(base)/v2/snapshot/locale/us/markets/stocks/tickers/AAPL", key: "client-key")
                #expect(snapshot.status == 200 && snapshot.headers["x-relay-source"] == "live", "\(snapshot.body)")
                let ticker = Self.object(snapshot.body)["ticker"] as? [String: Any]
                #expect(ticker?["prevDay"] != nil && ticker?["lastTrade"] != nil && ticker?["todaysChange"] != nil, "\(snapshot.body)")
            }
            #expect(feed.restCount("prev", "AAPL").started == 1, "the previous day is asked once and cached")
            #expect(feed.restCount("snapshot", "AAPL").started == 0)

            // A ticker nobody subscribed to is the vendor's answer.
            let other = try await httpGetWithHeaders("\(base)/v2/last/trade/MSFT", key: "client-key")
            #expect(other.status == 200 && other.headers["x-relay-source"] == "upstream", "\(other.body)")
            #expect(feed.restCount("trade", "MSFT").started == 1)
            #expect(!other.body.contains(Self.upstreamKey))
            await client.close()
        }
    }

    @Test func closedDaysAreCachedAcrossARestart() async throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("relay-gateway-cache-\(UUID().uuidString)").path
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let cache = "\(directory)/rest-cache.sqlite"
        let path = "/v2/aggs/ticker/AAPL/range/1/day/2026-10-01/2026-10-31"
        var first = ""
        try await Self.withGateway(cache: cache) { _, feed, base in
            let answer = try await httpGetWithHeaders("\(base)\(path)", key: "client-key")
            #expect(answer.status == 200 && answer.headers["x-relay-source"] == "upstream", "\(answer.body)")
            let again = try await httpGetWithHeaders("\(base)\(path)?apiKey=client-key")
            #expect(again.headers["x-relay-source"] == "cache", "the client's own apiKey is not part of the request")
            #expect(again.body == answer.body)
            #expect(feed.restCount("aggs", "AAPL").started == 1)
            first = answer.body
            // What cannot change any more (unadjusted bars of closed days) is kept a week at most.
            let unadjusted = try await httpGetWithHeaders("\(base)\(path)?adjusted=false", key: "client-key")
            #expect(unadjusted.status == 200, "\(unadjusted.body)")
        }
        let expiries = try await sideConnection(to: cache).read { db in try Int64?.fetchAll(db, sql: "SELECT expires_at FROM answers") }
        #expect(expiries.count == 2)
        #expect(expiries.allSatisfy { ($0 ?? .max) <= WallClock.nowMilliseconds() + 7 * 86_400_000 }, "\(expiries)")
        // A new relay (and a new feed) on the same cache file.
        try await Self.withGateway(cache: cache) { _, feed, base in
            let answer = try await httpGetWithHeaders("\(base)\(path)", key: "client-key")
            #expect(answer.headers["x-relay-source"] == "cache", "\(answer.body)")
            #expect(answer.body == first)
            #expect(feed.restCount("aggs", "AAPL").started == 0, "answered from the cache the first relay kept")
            // Today's data passes through.
            let today = WallClock.nowMilliseconds()
            let minutes = try await httpGetWithHeaders("\(base)/v2/aggs/ticker/AAPL/range/1/minute/\(today - 600_000)/\(today)", key: "client-key")
            #expect(minutes.headers["x-relay-source"] == "upstream", "\(minutes.body)")
        }
    }

    @Test func identicalRequestsInFlightAreOneUpstreamCall() async throws {
        var feedConfiguration = DemoFeedConfiguration(port: 0, apiKey: Self.upstreamKey)
        feedConfiguration.restDelay = .milliseconds(400)
        try await Self.withGateway(feed: feedConfiguration) { _, feed, base in
            let today = WallClock.nowMilliseconds()
            let url = "\(base)/v2/aggs/ticker/AAPL/range/1/minute/\(today - 600_000)/\(today)"
            let answers = try await withThrowingTaskGroup(of: (Int, String).self) { group in
                for _ in 0..<50 {
                    group.addTask {
                        let answer = try await httpGetWithHeaders(url, key: "client-key")
                        return (answer.status, answer.headers["x-relay-source"] ?? "")
                    }
                }
                return try await group.reduce(into: []) { $0.append($1) }
            }
            #expect(answers.allSatisfy { $0.0 == 200 }, "\(answers.filter { $0.0 != 200 }.prefix(3))")
            #expect(feed.restCount("aggs", "AAPL").started == 1, "50 identical requests, one upstream call")
            #expect(answers.filter { $0.1 == "coalesced" }.count == 49)
            // The metrics count the same: one call to the vendor, by its status, and each answer by outcome.
            let metrics = try await httpGet("\(base)/metrics", key: "client-key").body
            let lines = metrics.split(separator: "\n").filter { $0.hasPrefix("relay_rest_upstream_calls_total") || $0.hasPrefix("relay_rest_requests_total") }
            #expect(lines.contains { $0.contains(#"status="200""#) && $0.hasSuffix(" 1") }, "\(lines)")
            #expect(lines.contains { $0.contains(#"outcome="coalesced""#) && $0.hasSuffix(" 49") }, "\(lines)")
        }
    }

    @Test func theAccountsBudgetHoldsAndNoRequestHangs() async throws {
        try await Self.withGateway(configure: { settings in
            settings.gateway?.budget = RESTRate(requests: 5, per: .seconds(60))
            settings.gateway?.maxWait = .seconds(2)
        }) { _, feed, base in
            let started = ContinuousClock.now
            let now = WallClock.nowMilliseconds() * 1_000_000
            let answers = try await withThrowingTaskGroup(of: (Int, String?).self) { group in
                for index in 0..<200 {
                    group.addTask {
                        // Distinct requests (no coalescing), none cacheable.
                        let answer = try await httpGetWithHeaders(
                            "\(base)/v3/trades/AAPL?timestamp.gte=\(now - Int64(index + 1) * 1_000_000_000)&limit=5", key: "client-key")
                        return (answer.status, answer.headers["retry-after"])
                    }
                }
                return try await group.reduce(into: []) { $0.append($1) }
            }
            #expect(feed.restCount("trades", "AAPL").started <= 5, "the vendor saw at most the budget")
            #expect(answers.filter { $0.0 == 200 }.count <= 5)
            let refused = answers.filter { $0.0 == 429 }
            #expect(refused.count >= 195, "\(Dictionary(grouping: answers, by: \.0).mapValues(\.count))")
            #expect(refused.allSatisfy { ($0.1.flatMap(Int.init) ?? 0) >= 1 }, "each 429 says when to come back")
            #expect(ContinuousClock.now - started < .seconds(15), "no request hung")
        }
    }

    @Test func oneKeysCallsUnderWayAreBoundedAndTheOthersAreServedMeanwhile() async throws {
        var feedConfiguration = DemoFeedConfiguration(port: 0, apiKey: Self.upstreamKey)
        feedConfiguration.restDelay = .seconds(2)
        let keys = [try ClientKey(name: "greedy", secret: "greedy-key"), try ClientKey(name: "other", secret: "other-key")]
        try await Self.withGateway(
            feed: feedConfiguration,
            configure: { settings in
                settings.gateway?.flightsPerKey = 2
                settings.clientKeyRights = keys
            }
        ) { _, _, base in
            let now = WallClock.nowMilliseconds() * 1_000_000
            // Distinct requests (no coalescing), none cacheable, each held 2 s by the vendor.
            let url: @Sendable (Int) -> String = { index in "\(base)/v3/trades/AAPL?timestamp.gte=\(now - Int64(index + 1) * 1_000_000_000)&limit=5" }
            let (greedy, other) = try await withThrowingTaskGroup(of: (String, Int, String).self) { group in
                for index in 0..<3 {
                    group.addTask {
                        let answer = try await httpGetWithHeaders(url(index), key: "greedy-key")
                        return ("greedy", answer.status, answer.body)
                    }
                }
                group.addTask {
                    // Started once the greedy key's calls are under way.
                    try await Task.sleep(for: .milliseconds(500))
                    let answer = try await httpGetWithHeaders(url(9), key: "other-key")
                    return ("other", answer.status, answer.body)
                }
                let all = try await group.reduce(into: []) { $0.append($1) }
                return (all.filter { $0.0 == "greedy" }, all.filter { $0.0 == "other" })
            }
            #expect(greedy.filter { $0.1 == 200 }.count == 2, "\(greedy.map { ($0.1, $0.2.prefix(120)) })")
            let refused = try #require(greedy.first { $0.1 == 429 })
            #expect(refused.2.contains("rest.flightsPerKey"), "\(refused.2)")
            #expect(other.first?.1 == 200, "another key is served meanwhile: \(other)")
            // Its calls done, the key starts new ones.
            #expect(try await httpGetWithHeaders(url(10), key: "greedy-key").status == 200)
        }
    }

    @Test func theVendorsRateLimitIsPassedOnAndBackedOff() async throws {
        var feedConfiguration = DemoFeedConfiguration(port: 0, apiKey: Self.upstreamKey)
        feedConfiguration.restPerMinute = 2
        try await Self.withGateway(feed: feedConfiguration) { _, feed, base in
            for ticker in ["MSFT", "NVDA"] {
                let answer = try await httpGetWithHeaders("\(base)/v2/last/trade/\(ticker)", key: "client-key")
                #expect(answer.status == 200, "\(answer.body)")
            }
            let limited = try await httpGetWithHeaders("\(base)/v2/last/trade/AMZN", key: "client-key")
            #expect(limited.status == 429, "\(limited.body)")
            #expect((limited.headers["retry-after"].flatMap(Int.init) ?? 0) >= 1)
            #expect(feed.restLimited == 1)
            // The budget waits out the vendor's Retry-After: the next request is not sent to be refused.
            let next = try await httpGetWithHeaders("\(base)/v2/last/trade/GOOGL", key: "client-key")
            #expect(next.status == 429 && next.headers["x-relay-source"] == "relay", "\(next.body)")
            #expect(feed.restLimited == 1, "the vendor was not asked again inside its Retry-After")
        }
    }

    @Test func badInputGetsAClearAnswerAndNoPathLeavesTheVendorsHost() async throws {
        var noRest = try ClientKey(name: "no-rest", secret: "no-rest-secret")
        noRest.rest = false
        let keys = [noRest, try ClientKey(name: "aapl-only", secret: "aapl-secret", topics: ["T.AAPL", "Q.AAPL", "AM.AAPL"])]
        try await Self.withGateway(configure: { settings in
            settings.clientKeyRights = keys
        }) { _, feed, base in
            let unknown = try await httpGetWithHeaders("\(base)/v2/nothing/here", key: "client-key")
            #expect(unknown.status == 404 && unknown.body.contains("/v2/last/trade/{ticker}"), "\(unknown.body)")
            let multiplier = try await httpGetWithHeaders("\(base)/v2/aggs/ticker/AAPL/range/x/day/2026-10-01/2026-10-02", key: "client-key")
            #expect(multiplier.status == 400 && multiplier.body.contains("multiplier"), "\(multiplier.body)")
            let window = try await httpGetWithHeaders("\(base)/v3/trades/AAPL?timestamp.lt=yesterday", key: "client-key")
            #expect(window.status == 400, "\(window.body)")
            let noRight = try await httpGetWithHeaders("\(base)/v2/last/trade/AAPL", key: "no-rest-secret")
            #expect(noRight.status == 403 && noRight.body.contains("rest"), "\(noRight.body)")
            let outside = try await httpGetWithHeaders("\(base)/v2/last/trade/MSFT", key: "aapl-secret")
            #expect(outside.status == 403 && outside.body.contains("MSFT"), "\(outside.body)")
            let wholeMarket = try await httpGetWithHeaders("\(base)/v2/snapshot/locale/us/markets/stocks/tickers", key: "aapl-secret")
            #expect(wholeMarket.status == 403, "\(wholeMarket.body)")
            // A list that names nothing, or a list given twice (the vendor might read the other), is not a
            // way around the key's topics.
            let calls0 = feed.restRequests
            let emptyList = try await httpGetWithHeaders("\(base)/v2/snapshot/locale/us/markets/stocks/tickers?tickers=,", key: "aapl-secret")
            #expect(emptyList.status == 403, "\(emptyList.body)")
            let twice = try await httpGetWithHeaders("\(base)/v2/snapshot/locale/us/markets/stocks/tickers?tickers=AAPL&tickers=MSFT", key: "aapl-secret")
            #expect(twice.status == 400 && twice.body.contains("more than once"), "\(twice.body)")
            #expect(feed.restRequests == calls0, "neither reached the vendor")
            let noKey = try await httpGetWithHeaders("\(base)/v2/last/trade/AAPL")
            #expect(noKey.status == 401)
            // The vendor's own error passes through with its status.
            let missing = try await httpGetWithHeaders("\(base)/v2/last/trade/NOSUCH", key: "client-key")
            #expect(missing.status == 404 && missing.body.contains("no data for NOSUCH"), "\(missing.body)")
            // Paths that would leave the vendor's host or its path are refused before any call.
            let calls = feed.restRequests
            for attempt in ["/v2/last/trade/..%2F..%2Fevil", "/v2/last/trade/%2F%2Fevil.example", "/v2/last/trade/a%5Cb", "/v2/../v1/x"] {
                let answer = try await httpGetWithHeaders("\(base)\(attempt)", key: "client-key")
                #expect(answer.status == 400 || answer.status == 404, "\(attempt): \(answer.status) \(answer.body)")
            }
            #expect(feed.restRequests == calls, "no refused path reached the vendor")
        }
    }

    /// The demo feed runs in the relay's process: a value the gateway passes on (the vendor judges it)
    /// past what the demo's arithmetic holds is answered, and the relay lives.
    @Test func valuesPastTheDemoFeedsRangeAreAnsweredAndTheRelayLives() async throws {
        try await Self.withGateway { _, _, base in
            for path in [
                "/v3/trades/AAPL?timestamp.gte=9223372036854775807", "/v3/quotes/AAPL?timestamp=9223372036854775807",
                "/v3/trades/MSFT?cursor=0_1_1_-1_0", "/v3/trades/MSFT?cursor=0_1_1_10_-5", "/v3/trades/MSFT?cursor=0_1_1_99999999999_0",
                "/v2/aggs/ticker/MSFT/range/1/day/0000-01-03/0000-01-04", "/v2/aggs/ticker/META/range/1/day/0001-01-01/2026-01-01",
            ] {
                let answer = try await httpGetWithHeaders("\(base)\(path)", key: "client-key")
                #expect(answer.status < 500, "\(path): \(answer.status) \(answer.body.prefix(200))")
            }
            let alive = try await httpGetWithHeaders("\(base)/v2/last/trade/MSFT", key: "client-key")
            #expect(alive.status == 200, "\(alive.body)")
        }
        // Alpaca's daily bars come from the same walk: a day in year 0 takes no step.
        let today = WallClock.nowMilliseconds() / 86_400_000
        #expect(DemoHistory.bars(ticker: "MSFT", from: -719_000, through: -718_999, today: today, previousClose: 41_500).isEmpty)
        #expect(DemoHistory.bars(ticker: "MSFT", from: today - 30, through: today, today: today, previousClose: 41_500).count >= 15)
    }

    @Test func pagesPointBackAtTheRelayAndNeverCarryAKey() async throws {
        try await Self.withGateway { _, feed, base in
            try await Self.feedTraded(feed, 10)
            let now = WallClock.nowMilliseconds() * 1_000_000
            var url: String? = "\(base)/v3/trades/AAPL?timestamp.gte=\(now - 60_000_000_000)&timestamp.lt=\(now)&order=asc&limit=3&apiKey=client-key"
            var pages = 0
            var sequences: [Int64] = []
            while let next = url, pages < 5 {
                let answer = try await httpGetWithHeaders(next, key: "client-key")
                #expect(answer.status == 200, "\(answer.body.prefix(300))")
                #expect(!answer.body.contains(Self.upstreamKey) && !answer.body.contains("apiKey"), "no key in a page")
                let object = Self.object(answer.body)
                sequences += (object["results"] as? [[String: Any]] ?? []).compactMap { ($0["sequence_number"] as? NSNumber)?.int64Value }
                url = object["next_url"] as? String
                if let url { #expect(url.hasPrefix("\(base)/v3/trades/AAPL?"), "next_url points at the relay: \(url)") }
                pages += 1
            }
            #expect(pages >= 2, "more than one page")
            #expect(Set(sequences).count == sequences.count)
            // A next_url needs the relay key like any request.
            if let url {
                let anonymous = try await httpGetWithHeaders(url)
                #expect(anonymous.status == 401)
            }
            _ = feed
        }
    }

    @Test func aVendorThatDoesNotAnswerInTimeIsA504() async throws {
        let hostile = try HostileREST { _, _ in .trickle(length: 1000, every: .milliseconds(50)) }
        defer { hostile.close() }
        try await Self.withGateway(configure: { settings in
            settings.upstreamRESTURL = "http://127.0.0.1:\(hostile.port)"
            settings.gateway?.timeout = .seconds(1)
        }) { _, _, base in
            let started = ContinuousClock.now
            let answer = try await httpGetWithHeaders("\(base)/v2/last/trade/ZZZZ", key: "client-key")
            #expect(answer.status == 504, "\(answer.body)")
            #expect(ContinuousClock.now - started < .seconds(5))
            #expect(hostile.requests.withLock { $0.allSatisfy { $0.authorization == "Bearer \(Self.upstreamKey)" } })
        }
    }

    @Test func aVendorsPageThatIsNotJSONIsPassedOnAsTextAndNeverKept() async throws {
        let hostile = try HostileREST { request, _ in
            request.target.contains("/range/1/day/") ? .typed("text/html", "<html><script>alert(1)</script>down for maintenance</html>") : .json("{}")
        }
        defer { hostile.close() }
        try await Self.withGateway(configure: { settings in
            settings.upstreamRESTURL = "http://127.0.0.1:\(hostile.port)"
        }) { _, _, base in
            // A closed month: kept for ever when it is a page of JSON.
            let path = "/v2/aggs/ticker/AAPL/range/1/day/2026-10-01/2026-10-31"
            for _ in 0..<2 {
                let answer = try await httpGetWithHeaders("\(base)\(path)", key: "client-key")
                #expect(answer.status == 200 && answer.headers["content-type"]?.hasPrefix("text/plain") == true, "\(answer.headers)")
                #expect(answer.headers["x-content-type-options"] == "nosniff")
                #expect(answer.headers["x-relay-source"] == "upstream", "never kept: \(answer.headers)")
            }
            #expect(hostile.requests.withLock { $0.filter { $0.target.contains("/range/1/day/") }.count } == 2)
        }
    }

    @Test func aVendorsStatusThatIsNoFinalAnswerIsNotPassedOn() async throws {
        let hostile = try HostileREST { request, _ in
            request.target.contains("ZZZZ") ? .status(999, #"{"status":"OK"}"#) : .status(99, #"{"status":"OK"}"#)
        }
        defer { hostile.close() }
        try await Self.withGateway(configure: { settings in
            settings.upstreamRESTURL = "http://127.0.0.1:\(hostile.port)"
        }) { _, _, base in
            for symbol in ["ZZZZ", "YYYY"] {
                let answer = try await httpGetWithHeaders("\(base)/v2/last/trade/\(symbol)", key: "client-key")
                #expect(answer.status == 502 && answer.headers["x-relay-source"] == "relay", "\(symbol): \(answer.status) \(answer.body)")
                // 999 is read and refused by the relay; 099 is no status line at all to the HTTP client.
                let why = symbol == "ZZZZ" ? "status 999, which is no final HTTP answer" : "could not be reached"
                #expect(answer.body.contains(why), "\(answer.body)")
            }
            #expect(hostile.requests.withLock { $0.count } == 2)
        }
    }

    @Test func aVendorsRetryAfterOfADayPausesTheAccountForTwoMinutesAtMost() async throws {
        let hostile = try HostileREST { _, _ in .limited(retryAfter: "86400") }
        defer { hostile.close() }
        try await Self.withGateway(configure: { settings in
            settings.upstreamRESTURL = "http://127.0.0.1:\(hostile.port)"
        }) { _, _, base in
            let limited = try await httpGetWithHeaders("\(base)/v2/last/trade/ZZZZ", key: "client-key")
            #expect(limited.status == 429 && limited.headers["retry-after"] == "3600", "passed on within an hour: \(limited.headers)")
            // The account pauses: the next call is the relay's own 429, for two minutes at most.
            let paused = try await httpGetWithHeaders("\(base)/v2/last/trade/YYYY", key: "client-key")
            let after = Int(paused.headers["retry-after"] ?? "") ?? 0
            #expect(paused.status == 429 && paused.headers["x-relay-source"] == "relay" && after > 100 && after <= 121, "\(paused.headers)")
            #expect(hostile.requests.withLock { $0.count } == 1)
        }
    }

    @Test func answersBeingSentAreBoundedAndAClientThatStopsReadingIsLetGo() async throws {
        // An 8 MB page of bars for any range, a small answer for anything else.
        let rows = (0..<80_000).map { #"{"v":1000,"o":1.25,"c":1.5,"h":1.75,"l":1.0,"t":\#(1_577_836_800_000 + Int64($0) * 60_000),"n":10}"# }
        let page = #"{"ticker":"AAPL","status":"OK","results":[\#(rows.joined(separator: ","))],"resultsCount":\#(rows.count)}"#
        let hostile = try HostileREST { request, _ in
            request.target.contains("/range/") ? .json(page) : .json(#"{"status":"OK","results":{"T":"MSFT","p":1.5,"s":1,"t":1}}"#)
        }
        defer { hostile.close() }
        try await Self.withGateway(configure: { settings in
            settings.upstreamRESTURL = "http://127.0.0.1:\(hostile.port)"
            settings.gateway?.answersInFlightBytes = 1 << 20
            settings.gateway?.sendTimeout = .seconds(8)
            settings.metricsPublic = true
        }) { parts, _, base in
            let path = "/v2/aggs/ticker/AAPL/range/1/day/2020-01-01/2020-12-31"
            // A client that asks for the page and does not read it (a 4 KiB receive buffer).
            let stalled = try RawSocket(port: parts.port, receiveBuffer: 4096)
            stalled.send("GET \(path) HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer client-key\r\n\r\n")
            try await eventually("the unread page to be counted as being sent", timeout: .seconds(20)) {
                await metric(parts.port, "relay_rest_answer_bytes_in_flight") >= Double(page.utf8.count)
            }
            // Another client's page would pass the bound: told to come back, not given 8 MB more to hold.
            let refused = try await httpGetWithHeaders("\(base)\(path)", key: "client-key")
            let refusals = await metric(parts.port, "relay_rest_answers_refused_total")
            #expect(refused.status == 503, "\(refused.body.prefix(300))")
            #expect(refused.headers["retry-after"] == "1")
            let saysTheBound = refused.body.contains("at most 1 MB at once")
            #expect(saysTheBound, "\(refused.body.prefix(300))")
            #expect(refusals == 1)
            // A small answer is not held back by it.
            let small = try await httpGetWithHeaders("\(base)/v2/last/trade/MSFT", key: "client-key")
            #expect(small.status == 200, "\(small.body)")
            // The stalled client took nothing for 8 s: the relay closed it and its bytes went back.
            try await eventually("the stalled connection's page to be given back", timeout: .seconds(30)) {
                await metric(parts.port, "relay_rest_answer_bytes_in_flight") == 0
            }
            // Closed by the relay: what it holds ends in EOF (a finished answer would leave the keep-alive
            // connection open).
            #expect(stalled.readsToEOF(within: .seconds(10)), "the relay closed the stalled connection")
            let served = try await httpGetWithHeaders("\(base)\(path)", key: "client-key")
            #expect(served.status == 200)
            #expect(served.headers["x-relay-source"] == "cache")
            let servedWhole = served.body == page
            #expect(servedWhole, "\(served.body.utf8.count) bytes, not the page's \(page.utf8.count)")
            #expect(hostile.requests.withLock { $0.filter { $0.target.contains("/range/") }.count } == 1)
            withExtendedLifetime(stalled) {}
        }
    }

    /// Bodies are read whole before anything is sent: what the vendor is sending, across requests, is
    /// bounded too. A page the vendor stops sending part way holds its bytes until the request timeout;
    /// another page that would pass the bound meanwhile is refused, a small answer is not.
    @Test func bodiesBeingReadFromTheVendorAreBounded() async throws {
        let hostile = try HostileREST { request, _ in
            request.target.contains("/range/")
                ? .held(sent: 900_000, length: 2_000_000) : .json(#"{"status":"OK","results":{"T":"MSFT","p":1.5,"s":1,"t":1}}"#)
        }
        defer { hostile.close() }
        try await Self.withGateway(configure: { settings in
            settings.upstreamRESTURL = "http://127.0.0.1:\(hostile.port)"
            settings.gateway?.answersInFlightBytes = 1 << 20
            settings.gateway?.timeout = .seconds(4)
            settings.metricsPublic = true
        }) { parts, _, base in
            let first = Task { try await httpGetWithHeaders("\(base)/v2/aggs/ticker/AAPL/range/1/day/2020-01-01/2020-12-31", key: "client-key") }
            try await eventually("the first page's bytes to be counted as being read", timeout: .seconds(10)) {
                await metric(parts.port, "relay_rest_answer_bytes_reading") >= 900_000
            }
            // Another page (another range: not the same call) would pass the bound: told to come back.
            let refused = try await httpGetWithHeaders("\(base)/v2/aggs/ticker/AAPL/range/1/day/2019-01-01/2019-12-31", key: "client-key")
            #expect(refused.status == 503, "\(refused.body.prefix(300))")
            #expect(refused.headers["retry-after"] == "1")
            let saysTheBound = refused.body.contains("reading") && refused.body.contains("at most 1 MB at once")
            #expect(saysTheBound, "\(refused.body.prefix(300))")
            #expect(await metric(parts.port, "relay_rest_reads_refused_total") == 1)
            let small = try await httpGetWithHeaders("\(base)/v2/last/trade/MSFT", key: "client-key")
            #expect(small.status == 200, "\(small.body)")
            // The held page ends at the request timeout, and its bytes go back.
            let timedOut = try await first.value
            #expect(timedOut.status == 504, "\(timedOut.body.prefix(300))")
            try await eventually("the held page's bytes to be given back") { await metric(parts.port, "relay_rest_answer_bytes_reading") == 0 }
        }
    }

    @Test(.enabled(if: pythonClientAvailable, "python3 -m pip install -r Tests/Interop/requirements.txt"))
    func polygonsOfficialRESTClientWorksThroughTheRelay() async throws {
        try await Self.withGateway { parts, feed, base in
            let client = try await Self.aaplHolder(base)
            try await Self.feedTraded(feed, 10)
            let script = URL(fileURLWithPath: interopScript).deletingLastPathComponent().appendingPathComponent("rest_gateway_client.py").path
            let result = try await runPython(
                script,
                ["--port", "\(parts.port)", "--key", "client-key", "--feed-port", "\(try await feed.listeningPort())", "--feed-key", Self.upstreamKey],
                timeout: .seconds(60))
            #expect(result.status == 0, "\(result.output)")
            #expect(feed.restCount("trade", "AAPL").started == 0, "the official client's last trade was answered live")
            await client.close()
        }
    }
}

/// Alpaca's side of the gateway: alpaca-py's historical clients through the relay on an Alpaca demo feed.
@Suite("REST gateway: Alpaca's data API through the relay", .serialized)
struct AlpacaRESTGatewayTests {
    /// A relay on an Alpaca demo feed of stocks, its gateway on.
    func withAlpacaGateway(_ body: (Relay.Components, DemoFeed, String) async throws -> Void) async throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("relay-alpaca-gateway-\(UUID().uuidString)").path
        defer { try? FileManager.default.removeItem(atPath: directory) }
        var feedConfiguration = DemoFeedConfiguration(port: 0, apiKey: "alpaca-key", eventsPerSecond: 2000, tickInterval: .milliseconds(10), seed: 3)
        feedConfiguration.alpaca = true
        feedConfiguration.markets = [.stocks]
        let feed = DemoFeed(configuration: feedConfiguration, logger: testLogger)
        try await withServices([feed]) {
            var settings = RelaySettings(
                listen: .init(host: "127.0.0.1", port: 0), upstreamKey: "alpaca-key", clientKeys: ["client-key"], upstreamTuning: fastUpstreamTuning())
            settings.vendors = Relay.vendors
            settings.upstreams = [try MarketUpstream(url: try await feed.url(for: .stocks), vendors: Relay.vendors)]
            settings.upstreamSecret = "alpaca-secret"
            settings.portfolio = nil
            var gateway = GatewaySettings()
            gateway.cachePath = "\(directory)/rest-cache.sqlite"
            gateway.alpacaURL = "http://127.0.0.1:\(try await feed.listeningPort())"
            settings.gateway = gateway
            let relay = Relay(settings: settings, logger: testLogger)
            try await withServices([relay]) {
                let parts = try await within(.seconds(10), "the relay to start") { try await relay.ready() }
                try await waitFor(try #require(parts.upstreams[.stocks]).stateUpdates(), "the upstream to authenticate") { $0 == .authenticated }
                try await body(parts, feed, "http://127.0.0.1:\(parts.port)")
            }
        }
    }

    /// An Alpaca JSON client subscribed to AAPL's and MSFT's trades, quotes and bars that has seen a
    /// trade and a quote of each.
    func holder(_ base: String) async throws -> WSTestClient {
        let client = WSTestClient(url: base.replacingOccurrences(of: "http", with: "ws") + "/v2/iex")
        _ = try await client.nextFrame()
        client.send(#"{"action":"auth","key":"client-key","secret":"x"}"#)
        #expect(try await client.nextFrame().contains("authenticated"))
        client.send(#"{"action":"subscribe","trades":["AAPL","MSFT"],"quotes":["AAPL","MSFT"],"bars":["AAPL"]}"#)
        var seen: Set<String> = []
        let deadline = ContinuousClock.now + .seconds(15)
        while seen.count < 4 {
            let frame = try await client.nextFrame(timeout: deadline - .now)
            for kind in ["t", "q"] {
                for symbol in ["AAPL", "MSFT"] where frame.contains(#""T":"\#(kind)","S":"\#(symbol)""#) { seen.insert("\(kind)\(symbol)") }
            }
        }
        return client
    }

    @Test func heldSymbolsAreLiveAndOtherAnswersComeFromAlpaca() async throws {
        try await withAlpacaGateway { _, feed, base in
            let client = try await holder(base)
            let trades = try await httpGetWithHeaders("\(base)/v2/stocks/trades/latest?symbols=AAPL,MSFT", key: "client-key")
            #expect(trades.status == 200 && trades.headers["x-relay-source"] == "live", "\(trades.body)")
            let map = jsonObject(trades.body)["trades"] as? [String: Any]
            #expect(Set(map?.keys.map { $0 } ?? []) == ["AAPL", "MSFT"])
            let one = try await httpGetWithHeaders("\(base)/v2/stocks/AAPL/quotes/latest", key: "client-key")
            #expect(one.headers["x-relay-source"] == "live" && jsonObject(one.body)["symbol"] as? String == "AAPL", "\(one.body)")
            #expect(feed.restCount("alpaca-trades-latest").started == 0 && feed.restCount("alpaca-quotes-latest").started == 0)
            // A symbol not held: Alpaca's answer, with the relay's credentials.
            let other = try await httpGetWithHeaders("\(base)/v2/stocks/trades/latest?symbols=AAPL,NVDA", key: "client-key")
            #expect(other.status == 200 && other.headers["x-relay-source"] == "upstream", "\(other.body)")
            #expect(feed.restCount("alpaca-trades-latest").unauthorized == 0, "the relay sent the account's key id")
            // Alpaca's error shape for what the gateway refuses.
            let refused = try await httpGetWithHeaders("\(base)/v2/stocks/trades/latest", key: "client-key")
            #expect(refused.status == 400 && jsonObject(refused.body)["message"] != nil && jsonObject(refused.body)["code"] != nil, "\(refused.body)")
            // Snapshots of held symbols are live, with one call for the previous day's bars of the set,
            // whatever order a client names it in.
            let barsBefore = feed.restCount("alpaca-bars").started
            for list in ["MSFT,AAPL", "AAPL,MSFT"] {
                let snapshots = try await httpGetWithHeaders("\(base)/v2/stocks/snapshots?symbols=\(list)", key: "client-key")
                #expect(snapshots.status == 200 && snapshots.headers["x-relay-source"] == "live", "\(list): \(snapshots.body.prefix(300))")
                #expect(snapshots.body.contains("prevDailyBar"), "\(snapshots.body.prefix(300))")
            }
            #expect(feed.restCount("alpaca-bars").started - barsBefore == 1, "one call for the set")

            let python = try #require(alpacaPython, "python3 -m venv .build/alpaca-venv && .build/alpaca-venv/bin/pip install -r Tests/Interop/alpaca-requirements.txt")
            let script = URL(fileURLWithPath: interopScript).deletingLastPathComponent().appendingPathComponent("alpaca_rest_client.py").path
            let result = try await runPython(
                script,
                ["--url", base, "--key", "client-key", "--feed-url", "http://127.0.0.1:\(try await feed.listeningPort())", "--feed-key", "alpaca-key"],
                timeout: .seconds(60), python: python)
            #expect(result.status == 0, "\(result.output)")
            #expect(feed.restCount("alpaca-trades-latest").started == 1, "alpaca-py's latest trades of held symbols were live")
            // A month of daily bars (closed days) is cached: asked again, the feed is not.
            let bars = feed.restCount("alpaca-bars").started
            let again = try await runPython(
                script,
                ["--url", base, "--key", "client-key", "--feed-url", "http://127.0.0.1:\(try await feed.listeningPort())", "--feed-key", "alpaca-key"],
                timeout: .seconds(60), python: python)
            #expect(again.status == 0, "\(again.output)")
            // The second run's only bars calls are its own check against the feed (3 pages), none through the relay.
            #expect(feed.restCount("alpaca-bars").started - bars == 3, "the relay answered the bars from its cache")
            await client.close()
        }
    }
}
