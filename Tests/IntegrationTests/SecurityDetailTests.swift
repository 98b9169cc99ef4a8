import AsyncHTTPClient
import DemoFeed
import Foundation
import NIOCore
import Portfolio
import PortfolioDomain
import RelayComposition
import MarketREST
import RelayConfiguration
import RelayServer
import Testing

/// A keep-alive HTTP client, as a browser or a terminal client is: one connection, reused; closing
/// it is the client going away.
final class KeepAliveClient: Sendable {
    let client = HTTPClient(eventLoopGroupProvider: .singleton)
    let base: String

    init(port: Int) { base = "http://127.0.0.1:\(port)" }

    func get(_ path: String, headers: [(String, String)] = []) async throws -> (status: Int, json: [String: Any]) {
        let answer = try await answer(path, headers: headers)
        return (answer.status, answer.json)
    }

    /// `get`, with the answer's `Retry-After`.
    func answer(_ path: String, headers: [(String, String)] = []) async throws -> (status: Int, json: [String: Any], retryAfter: String?) {
        var request = HTTPClientRequest(url: base + path)
        for (name, value) in headers { request.headers.add(name: name, value: value) }
        let response = try await client.execute(request, timeout: .seconds(30))
        let body = try await response.body.collect(upTo: 16 << 20)
        return (Int(response.status.code), jsonObject(String(buffer: body)), response.headers.first(name: "Retry-After"))
    }

    func shutdown() async throws { try await client.shutdown() }
}

/// Holdings views and security details through the relay's endpoints, the demo feed's REST side
/// deliberately slow, its requests counted at the feed.
@Suite("Security detail and prefetching", .serialized)
struct SecurityDetailTests {
    static let symbols = ["AAPL", "AMD", "AMZN", "GOOGL", "META", "MSFT", "NVDA", "QQQ", "SPY", "TSLA"]

    /// Runs `body` against a relay whose demo feed answers REST after `restDelay`, holding `symbols`.
    func withRelay(
        restDelay: Duration, symbols: [String] = Self.symbols, cacheSize: Int = 10, loads: Int = 16, wait: Double = 30,
        _ body: @Sendable (Relay.Components, DemoFeed) async throws -> Void
    ) async throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("relay-securities-\(UUID().uuidString)").path
        defer { try? FileManager.default.removeItem(atPath: directory) }
        var settings = RelaySettings(
            listen: .init(host: "127.0.0.1", port: 0), demoRate: 200,
            // Without the history's daily closes: they would share the feed's slow REST side and its counts.
            portfolio: .init(dataDirectory: directory, securityCacheSize: cacheSize, securityLoads: loads, securityWaitSeconds: wait,
                closeHistory: false))
        settings.demoRESTDelayMilliseconds = Int(restDelay.milliseconds)
        let relay = Relay(settings: settings, logger: testLogger)
        try await withServices([relay]) {
            let parts = try await within(.seconds(10), "the relay to start") { try await relay.ready() }
            let portfolio = try #require(parts.portfolio)
            let feed = try #require(parts.demoFeed)
            let account = try await portfolio.store.createAccount(
                name: "Core", kind: .brokerage, currency: "USD", createdAt: .now.addingTimeInterval(-3 * 366 * 86_400))
            let today = DayCalendar.utc.day(of: .now)
            for (index, symbol) in symbols.enumerated() {
                _ = try await portfolio.store.addTransaction(
                    accountID: account.id, date: DayCalendar.utc.day(today, addingYears: -2), kind: .buy, symbol: symbol,
                    quantity: Decimal(10 + index), price: 100, fees: 1)
                _ = try await portfolio.store.addTransaction(
                    accountID: account.id, date: today, kind: .buy, symbol: symbol, quantity: 5, price: 120, fees: 0)
            }
            try await portfolio.holdingsChanged()
            try await body(parts, feed)
        }
    }

    func view(_ client: KeepAliveClient, _ query: String = "") async throws -> (id: String, order: [String]) {
        let (status, json) = try await client.get("/v1/holdings\(query)")
        #expect(status == 200)
        let id = try #require((json["view"] as? [String: Any])?["id"] as? String)
        let order = (json["holdings"] as? [[String: Any]] ?? []).compactMap { $0["symbol"] as? String }
        return (id, order)
    }

    /// Waits (bounded) until `symbol` is cached.
    func cached(_ symbol: String, in parts: Relay.Components, timeout: Duration = .seconds(10)) async throws {
        let cache = try #require(parts.securities).cache
        try await eventually("\(symbol) to be prefetched into the cache", timeout: timeout) { await cache.contains(symbol) }
    }

    @Test func afterOpeningNTheNextTwoAreServedFromCache() async throws {
        try await withRelay(restDelay: .milliseconds(300)) { parts, feed in
            let client = KeepAliveClient(port: parts.port)
            defer { Task { try? await client.shutdown() } }
            let (id, order) = try await view(client)
            #expect(order == Self.symbols, "sorted by symbol by default")
            let opened = try await client.get("/v1/securities/\(order[3])?view=\(id)")
            #expect(opened.status == 200)
            #expect(opened.json["complete"] as? Bool == true, "opened: \(opened.json)")
            #expect(["miss", "joined"].contains(opened.json["cache"] as? String))
            let position = try #require(opened.json["view"] as? [String: Any])
            #expect(position["position"] as? Int == 3)
            #expect(position["previous"] as? String == order[2])
            #expect(position["next"] as? String == order[4])
            for group in ["details", "priceHistory", "transactions", "taxLots"] {
                let state = opened.json[group] as? [String: Any]
                #expect(state?["status"] as? String == "loaded", "\(group): \(state?["error"] ?? "")")
            }
            // N−1 and N+1 at once, N+2 (and N−2) after half a second.
            for neighbour in [order[2], order[4], order[5], order[1]] { try await cached(neighbour, in: parts) }
            for next in [order[4], order[5]] {
                let step = try await client.get("/v1/securities/\(next)?view=\(id)")
                #expect(step.json["cache"] as? String == "hit", "\(next) came from the cache")
            }
            #expect(feed.restCount("aggs", order[4]).started == 1, "the neighbour's history was fetched once, by the prefetch")
            // The prefetch window moved with the client: N+3 is now in it.
            try await cached(order[6], in: parts)
        }
    }

    @Test func theDetailHasFourGroupsWithHistoryATRTransactionsAndLots() async throws {
        try await withRelay(restDelay: .milliseconds(1)) { parts, _ in
            let client = KeepAliveClient(port: parts.port)
            defer { Task { try? await client.shutdown() } }
            let (status, json) = try await client.get("/v1/securities/msft")
            #expect(status == 200)
            #expect(json["symbol"] as? String == "MSFT")
            #expect(json["view"] == nil)
            let details = try #require((json["details"] as? [String: Any])?["data"] as? [String: Any])
            #expect((details["marketStatus"] as? [String: Any])?["market"] as? String == "open")
            #expect(details["lastTrade"] != nil || details["lastQuote"] != nil)
            let history = try #require((json["priceHistory"] as? [String: Any])?["data"] as? [String: Any])
            let bars = history["bars"] as? [[String: Any]] ?? []
            #expect((250...262).contains(bars.count), "a year of weekday bars, got \(bars.count)")
            #expect(history["atrPeriod"] as? Int == 14)
            #expect((history["atr"] as? String).flatMap { Decimal(string: $0) }.map { $0 > 0 } == true)
            #expect(bars.first?["atr"] == nil && bars.last?["atr"] != nil)
            // Only the past year's transactions; lots FIFO with terms.
            let transactions = try #require((json["transactions"] as? [String: Any])?["data"] as? [[String: Any]])
            #expect(transactions.count == 1, "the buy two years ago is older than a year")
            #expect(transactions.first?["accountName"] as? String == "Core")
            let lots = try #require((json["taxLots"] as? [String: Any])?["data"] as? [String: Any])
            let rows = lots["lots"] as? [[String: Any]] ?? []
            #expect(rows.map { $0["term"] as? String } == ["long", "short"])
            #expect(lots["sharesAvailable"] as? String == "20")  // 15 + 5
            #expect(lots["costBasis"] as? String == "2101")  // 15 × 100 + 1 + 5 × 120
        }
    }

    @Test func aFailedGroupIsReportedWithoutFailingTheOthersAndIsNotCached() async throws {
        try await withRelay(restDelay: .milliseconds(1)) { parts, _ in
            let client = KeepAliveClient(port: parts.port)
            defer { Task { try? await client.shutdown() } }
            // The feed has no such ticker: its REST answers 404.
            let first = try await client.get("/v1/securities/NOPE")
            #expect(first.status == 200)
            #expect(first.json["complete"] as? Bool == false)
            let history = try #require(first.json["priceHistory"] as? [String: Any])
            #expect(history["status"] as? String == "failed")
            #expect((history["error"] as? String)?.contains("404") == true)
            #expect((first.json["transactions"] as? [String: Any])?["status"] as? String == "loaded")
            #expect((first.json["taxLots"] as? [String: Any])?["status"] as? String == "loaded")
            let again = try await client.get("/v1/securities/NOPE")
            #expect(again.json["cache"] as? String == "miss", "an incomplete detail is loaded again")
        }
    }

    @Test func edgesAndTwoSecurityViewsPrefetchOnlyWhatExists() async throws {
        try await withRelay(restDelay: .milliseconds(100)) { parts, feed in
            let client = KeepAliveClient(port: parts.port)
            defer { Task { try? await client.shutdown() } }
            // A view of two: listing it prefetches the first; opening the first prefetches the other.
            let (id, order) = try await view(client, "?filter=am")
            #expect(order == ["AMD", "AMZN"])
            try await cached("AMD", in: parts)
            let opened = try await client.get("/v1/securities/AMD?view=\(id)")
            #expect(opened.json["cache"] as? String == "hit", "the list's first security was prefetched")
            try await cached("AMZN", in: parts)
            // The last of the full list: only the two before it.
            let full = try await view(client, "?sort=symbol&order=desc")
            _ = try await client.get("/v1/securities/\(full.order[9])?view=\(full.id)")
            for symbol in [full.order[8], full.order[7]] { try await cached(symbol, in: parts) }
            #expect(feed.restCount("aggs", full.order[6]).started == 0, "nothing beyond N−2")
        }
    }

    @Test func movingTheWindowCancelsTheSlowFetchAtTheSource() async throws {
        // Few holdings: fewer reference-price requests at start ahead of the test's own.
        try await withRelay(restDelay: .milliseconds(1500), symbols: Array(Self.symbols.prefix(5))) { parts, feed in
            let client = KeepAliveClient(port: parts.port)
            defer { Task { try? await client.shutdown() } }
            let (id, order) = try await view(client)
            let opened = try await client.get("/v1/securities/\(order[0])?view=\(id)")
            #expect(opened.json["complete"] as? Bool == true, "prefetching starts from a complete detail: \(opened.json)")
            // Bounded generously: on a cold, loaded CI machine the start-up reference prices (1.5 s each,
            // four at a time) are still draining ahead of this background prefetch.
            try await eventually("the prefetch of \(order[1]) to reach the feed", timeout: .seconds(30)) {
                feed.restCount("aggs", order[1]).started == 1
            }
            // Jump far away: order[1] is out of the new window, and its fetch is cancelled, not ignored.
            async let far = client.get("/v1/securities/\(order[4])?view=\(id)")
            try await eventually("the feed to see the prefetch of \(order[1]) abandoned") {
                feed.restCount("aggs", order[1]).abandoned == 1
            }
            #expect(feed.restCount("aggs", order[1]).completed == 0)
            #expect(try await far.status == 200)
        }
    }

    @Test func aClientThatGoesAwayHasItsPrefetchesCancelledAtTheSource() async throws {
        try await withRelay(restDelay: .milliseconds(1500), symbols: Array(Self.symbols.prefix(3))) { parts, feed in
            let client = KeepAliveClient(port: parts.port)
            let (id, order) = try await view(client, "?sort=symbol&order=desc")
            let opened = try await client.get("/v1/securities/\(order[0])?view=\(id)")
            #expect(opened.json["complete"] as? Bool == true, "prefetching starts from a complete detail: \(opened.json)")
            // Bounded generously: on a cold, loaded CI machine the start-up reference prices (1.5 s each,
            // four at a time) are still draining ahead of this background prefetch.
            try await eventually("the prefetch of \(order[1]) to reach the feed", timeout: .seconds(30)) {
                feed.restCount("aggs", order[1]).started == 1
            }
            try await client.shutdown()  // the connection closes
            try await eventually("the feed to see the prefetch of \(order[1]) abandoned") {
                feed.restCount("aggs", order[1]).abandoned == 1
            }
            #expect(feed.restCount("aggs", order[1]).completed == 0)
            #expect(await parts.securities?.clientCount == 0)
        }
    }

    @Test func concurrentRequestsForOneSymbolFetchItOnce() async throws {
        try await withRelay(restDelay: .milliseconds(500)) { parts, feed in
            let clients = (0..<4).map { _ in KeepAliveClient(port: parts.port) }
            defer { for client in clients { Task { try? await client.shutdown() } } }
            let outcomes = try await withThrowingTaskGroup(of: String.self) { group in
                for (index, client) in clients.enumerated() {
                    group.addTask {
                        try await client.get("/v1/securities/NVDA", headers: [("X-Relay-Client", "c\(index)")]).json["cache"] as? String
                            ?? ""
                    }
                }
                return try await group.reduce(into: []) { $0.append($1) }
            }
            #expect(outcomes.sorted() == ["joined", "joined", "joined", "miss"])
            #expect(try await #require(parts.securities).cache.counters.loads == 1, "one load for the four requests")
            #expect(feed.restCount("aggs", "NVDA").started <= 1, "the feed never saw NVDA's history asked twice: \(feed.restCountsByKey)")
        }
    }

    @Test func aTransactionWrittenDuringALoadIsNotServedStale() async throws {
        try await withRelay(restDelay: .milliseconds(1000), symbols: ["AAPL"]) { parts, _ in
            let client = KeepAliveClient(port: parts.port)
            defer { Task { try? await client.shutdown() } }
            let cache = try #require(parts.securities).cache
            // A load that read the transactions, then waits for the feed's REST answers.
            let first = Task { try await client.get("/v1/securities/AAPL").status }
            try await eventually("AAPL's load to start") { await cache.loadingSymbols.contains("AAPL") }
            let account = try #require(try await parts.portfolio?.store.accounts().first)
            let today = DayCalendar.utc.day(of: .now)
            let bought = try await httpSend(
                "POST", "http://127.0.0.1:\(parts.port)/v1/accounts/\(account.id)/transactions",
                json: #"{"date":"\#(today)","kind":"buy","symbol":"AAPL","quantity":"7","price":"100"}"#)
            #expect(bought.status == 201)
            #expect(try await first.value == 200)
            // The load that started before the write is not kept: the next request loads again and sees it.
            let after = try await client.get("/v1/securities/AAPL")
            #expect(after.json["cache"] as? String == "miss", "a detail read before the write must not be cached: \(after.json["cache"] ?? "-")")
            let transactions = try #require((after.json["transactions"] as? [String: Any])?["data"] as? [[String: Any]])
            #expect(transactions.contains { $0["quantity"] as? String == "7" }, "\(transactions)")
        }
    }

    @Test func concurrentBuysAndSellsLeaveTheHubFollowingExactlyTheHoldings() async throws {
        try await withRelay(restDelay: .milliseconds(1), symbols: ["AAPL"]) { parts, _ in
            let portfolio = try #require(parts.portfolio)
            let account = try #require(try await portfolio.store.accounts().first)
            let today = DayCalendar.utc.day(of: .now)
            let base = "http://127.0.0.1:\(parts.port)/v1/accounts/\(account.id)/transactions"
            let symbols = ["XA", "XB", "XC", "XD", "XE", "XF"]
            // Each symbol bought and sold again at once, all symbols in parallel: what is held at the end is
            // AAPL plus the symbols whose last step was a buy.
            try await withThrowingTaskGroup(of: Void.self) { group in
                for (index, symbol) in symbols.enumerated() {
                    group.addTask {
                        _ = try await httpSend("POST", base, json: #"{"date":"\#(today)","kind":"buy","symbol":"\#(symbol)","quantity":"1","price":"1"}"#)
                        if index % 2 == 0 {
                            _ = try await httpSend("POST", base, json: #"{"date":"\#(today)","kind":"sell","symbol":"\#(symbol)","quantity":"1","price":"1"}"#)
                        }
                    }
                }
                try await group.waitForAll()
            }
            let held: Set<String> = ["AAPL", "XB", "XD", "XF"]
            let followed = await portfolio.followedTopics()
            #expect(Set(followed.map(\.ticker)) == held, "\(followed)")
            #expect(followed.count == held.count * 2, "quotes and trades of each: \(followed)")
        }
    }

    @Test func theLeastRecentlyUsedIsEvictedAndMetricsCountIt() async throws {
        try await withRelay(restDelay: .milliseconds(1), cacheSize: 3) { parts, _ in
            let client = KeepAliveClient(port: parts.port)
            defer { Task { try? await client.shutdown() } }
            for symbol in ["AAPL", "AMD", "AMZN", "AAPL", "META"] { _ = try await client.get("/v1/securities/\(symbol)") }
            let cache = try #require(parts.securities).cache
            #expect(await cache.evicted == ["AMD"])
            #expect(await cache.symbols == ["META", "AAPL", "AMZN"])
            let metrics = try await httpGet("http://127.0.0.1:\(parts.port)/metrics").body
            #expect(metrics.contains(#"relay_security_cache_requests_total{outcome="hit"} 1"#))
            #expect(metrics.contains("relay_security_cache_evictions_total 1"))
        }
    }

    @Test func holdingsRequestsAreValidated() async throws {
        try await withRelay(restDelay: .milliseconds(1)) { parts, _ in
            let client = KeepAliveClient(port: parts.port)
            defer { Task { try? await client.shutdown() } }
            let bad = try await client.get("/v1/holdings?sort=colour")
            #expect(bad.status == 422)
            #expect(bad.json["field"] as? String == "sort")
            #expect(try await client.get("/v1/holdings?account=999").status == 404)
            let (id, order) = try await view(client, "?assetType=crypto")
            #expect(order.isEmpty)
            #expect(try await client.get("/v1/securities/AAPL?view=\(id)").json["field"] as? String == "symbol")
            #expect(try await client.get("/v1/securities/AAPL?view=garbage").json["field"] as? String == "view")
            // A view id works without having been listed (after a restart, say).
            let query = try HoldingsQuery(parameters: ["sort": "quantity"])
            let placed = try await client.get("/v1/securities/AAPL?view=\(query.viewID)")
            #expect((placed.json["view"] as? [String: Any])?["position"] as? Int == 9, "AAPL holds the fewest shares")
        }
    }

    @Test func loadsAreBoundedAndARequestOutwaitingItsLoadIsAnsweredWhileTheLoadEndsInTheCache() async throws {
        // One load at a time, a request waits 0.3 s for it; every REST answer takes 1.5 s.
        try await withRelay(restDelay: .milliseconds(1500), symbols: Array(Self.symbols.prefix(3)), loads: 1, wait: 0.3) { parts, feed in
            let client = KeepAliveClient(port: parts.port)
            defer { Task { try? await client.shutdown() } }
            let cache = try #require(parts.securities).cache
            let slow = try await client.answer("/v1/securities/AAPL")
            #expect(slow.status == 503, "\(slow.json)")
            #expect(slow.retryAfter == "5")
            #expect((slow.json["error"] as? String)?.contains("still loading") == true, "\(slow.json)")
            // Its load goes on, holding the only slot: a request for another symbol is refused at once,
            // without reaching the feed.
            #expect(await cache.loadingSymbols == ["AAPL"])
            let refused = try await client.answer("/v1/securities/AMD")
            #expect(refused.status == 503, "\(refused.json)")
            #expect(refused.retryAfter == "1")
            #expect((refused.json["error"] as? String)?.contains("at most 1 at once") == true, "\(refused.json)")
            #expect(feed.restCount("aggs", "AMD").started == 0)
            // The load ends into the cache: the client's next try is a hit, and the slot is free again.
            try await eventually("AAPL's load to end in the cache", timeout: .seconds(30)) { await cache.contains("AAPL") }
            let again = try await client.answer("/v1/securities/AAPL")
            #expect(again.status == 200)
            #expect(again.json["cache"] as? String == "hit")
            #expect(await cache.running == 0)
            let counters = await cache.counters
            #expect(counters.timedOut == 1 && counters.refused == 1)
        }
    }

    /// Runs `body` against a relay with a portfolio and these client keys, given its parts.
    func withKeyedRelay(_ keys: [ClientKey], _ body: @Sendable (Relay.Components) async throws -> Void) async throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("relay-securities-\(UUID().uuidString)").path
        defer { try? FileManager.default.removeItem(atPath: directory) }
        var settings = RelaySettings(
            listen: .init(host: "127.0.0.1", port: 0), demoRate: 200, portfolio: .init(dataDirectory: directory, closeHistory: false))
        settings.clientKeyRights = keys
        let relay = Relay(settings: settings, logger: testLogger)
        try await withServices([relay]) {
            try await body(try await within(.seconds(10), "the relay to start") { try await relay.ready() })
        }
    }

    @Test func aSecurityNotCachedIsLoadedOnTheKeysRESTQuotaAndACachedOneIsFree() async throws {
        var metered = try ClientKey(name: "metered", secret: "metered-key", portfolio: .read)
        metered.restRate = RESTRate(requests: 1, per: .seconds(3600))
        try await withKeyedRelay([metered, try ClientKey(name: "free", secret: "free-key", portfolio: .read)]) { parts in
            let base = "http://127.0.0.1:\(parts.port)"
            let first = try await httpGetWithHeaders("\(base)/v1/securities/AAPL", key: "metered-key")
            #expect(first.status == 200, "the quota's one request: \(first.body)")
            // A second symbol would be loaded from the vendor past the key's quota: refused, nothing loaded.
            let second = try await httpGetWithHeaders("\(base)/v1/securities/MSFT", key: "metered-key")
            #expect(second.status == 429 && second.body.contains("key \\\"metered\\\" is over its REST quota"), "\(second.body)")
            #expect((second.headers["retry-after"].flatMap(Int.init) ?? 0) >= 1)
            // What is cached costs the vendor nothing, so nothing of the quota.
            #expect(try await httpGetWithHeaders("\(base)/v1/securities/AAPL", key: "metered-key").status == 200)
            // A key without a quota of its own is not held back by another's.
            #expect(try await httpGetWithHeaders("\(base)/v1/securities/MSFT", key: "free-key").status == 200)
        }
    }

    /// A key that may not use the vendor's REST (`rest: false`, a dashboard's) sees the securities the
    /// book holds, and is refused one it would have the relay load from the vendor for it alone.
    @Test func aKeyWithoutRESTSeesHeldSecuritiesOnly() async throws {
        var dashboard = try ClientKey(name: "dashboard", secret: "dash-key", portfolio: .read)
        dashboard.rest = false
        try await withKeyedRelay([dashboard]) { parts in
            let portfolio = try #require(parts.portfolio)
            let account = try await portfolio.store.createAccount(name: "Core", kind: .brokerage, currency: "USD", createdAt: .now.addingTimeInterval(-86_400))
            _ = try await portfolio.store.addTransaction(
                accountID: account.id, date: DayCalendar.utc.day(of: .now), kind: .buy, symbol: "AAPL", quantity: 1, price: 100, fees: 0)
            try await portfolio.holdingsChanged()
            let base = "http://127.0.0.1:\(parts.port)"
            let held = try await httpGetWithHeaders("\(base)/v1/securities/AAPL", key: "dash-key")
            #expect(held.status == 200, "a held security: \(held.body)")
            let other = try await httpGetWithHeaders("\(base)/v1/securities/MSFT", key: "dash-key")
            #expect(other.status == 403 && other.body.contains("rest: false"), "\(other.body)")
        }
    }
}
