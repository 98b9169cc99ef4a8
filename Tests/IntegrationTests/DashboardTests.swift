import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
import PolygonWire
import RelayComposition
import RelayConfiguration
import Testing

@testable import RelayServer

/// Issue 14's server side, over real sockets: the page and its files without a key (cache-busted,
/// under a strict content policy), and `/v1/status` with one, live.
@Suite("Dashboard: the page, its files and /v1/status", .timeLimit(.minutes(2)))
struct DashboardTests {
    struct Answer {
        var status: Int
        var body: String
        var headers: [String: String]
    }

    func get(_ url: String, key: String? = nil) async throws -> Answer {
        var request = URLRequest(url: try #require(URL(string: url)))
        request.timeoutInterval = 10
        if let key { request.setValue("Bearer \(key)", forHTTPHeaderField: "Authorization") }
        let (data, response) = try await URLSession.shared.data(for: request)
        let http = try #require(response as? HTTPURLResponse)
        var headers: [String: String] = [:]
        for (name, value) in http.allHeaderFields { headers[String(describing: name).lowercased()] = String(describing: value) }
        return Answer(status: http.statusCode, body: String(decoding: data, as: UTF8.self), headers: headers)
    }

    func withRelay(_ body: @Sendable (_ base: String) async throws -> Void) async throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("relay-dashboard-\(UUID().uuidString)").path
        defer { try? FileManager.default.removeItem(atPath: directory) }
        var settings = RelaySettings(listen: .init(host: "127.0.0.1", port: 0), demoRate: 500, portfolio: .init(dataDirectory: directory))
        settings.clientKeyRights = [
            try ClientKey(name: "ops", secret: "ops-secret", portfolio: .none),
            try ClientKey(name: "owner", secret: "owner-secret", portfolio: .write),
        ]
        let relay = Relay(settings: settings, logger: testLogger)
        try await withServices([relay]) {
            let parts = try await within(.seconds(10), "the relay to start") { try await relay.ready() }
            try await body("http://127.0.0.1:\(parts.port)")
        }
    }

    @Test func thePageAndItsFilesAreServedWithoutAKeyCacheBustedUnderAContentPolicy() async throws {
        try await withRelay { base in
            let page = try await get(base + "/")
            #expect(page.status == 200, "the page needs no key: it asks for one")
            #expect(page.headers["content-type"]?.hasPrefix("text/html") == true)
            #expect(page.headers["cache-control"] == "no-cache", "the page is never cached: it names this build's files")
            #expect(page.headers["content-security-policy"]?.contains("script-src 'self'") == true)
            #expect(page.body.contains(#"<meta name="relay-keys" content="required">"#))
            let prefix = try #require(page.body.firstMatch(of: /\/ui\/([0-9a-f]{12})\//), "assets under a versioned prefix")
            let version = String(prefix.1)
            // Every file the page names, and every module those import, is there and cached for good.
            var pending = page.body.matches(of: /\/ui\/[0-9a-f]{12}\/([a-z]+\.(?:js|css|svg))/).map { String($0.1) }
            var seen: Set<String> = []
            while let name = pending.popLast() {
                guard seen.insert(name).inserted else { continue }
                let asset = try await get(base + "/ui/\(version)/\(name)")
                #expect(asset.status == 200, "\(name)")
                #expect(asset.headers["cache-control"]?.contains("immutable") == true, "\(name) is cached for good")
                pending += asset.body.matches(of: /from "\.\/([a-z]+\.js)"/).map { String($0.1) }
            }
            #expect(seen.isSuperset(of: ["app.js", "api.js", "charts.js", "overview.js", "quotes.js", "portfolio.js", "security.js", "style.css"]))
            // An older build's page gets today's file, not cached; names that are not files are 404.
            let old = try await get(base + "/ui/000000000000/app.js")
            #expect(old.status == 200 && old.headers["cache-control"] == "no-cache")
            #expect(try await get(base + "/ui/\(version)/index.html").status == 404)
            #expect(try await get(base + "/ui/\(version)/..%2FPackage.swift").status == 404)
            #expect(try await get(base + "/ui/\(version)/nope.js").status == 404)
        }
    }

    @Test func statusIsLiveAndSaysWhatTheKeyMaySee() async throws {
        try await withRelay { base in
            #expect(try await get(base + "/v1/status").status == 401)
            let first = try await get(base + "/v1/status", key: "owner-secret")
            #expect(first.status == 200)
            let status = jsonObject(first.body)
            #expect((status["viewer"] as? [String: Any])?["portfolio"] as? String == "write")
            #expect((status["viewer"] as? [String: Any])?["keysRequired"] as? Bool == true)
            #expect(status["portfolio"] as? Bool == true)
            #expect(status["market"] as? String == "stocks")
            let ops = jsonObject(try await get(base + "/v1/status", key: "ops-secret").body)
            #expect((ops["viewer"] as? [String: Any])?["portfolio"] as? String == "none")
            // A holding, so the relay wants events (the portfolio subscribes to what it holds).
            let owner = ["Authorization": "Bearer owner-secret"]
            let account = try await httpSend(
                "POST", base + "/v1/accounts", json: #"{"name":"A","kind":"brokerage","createdAt":"2024-01-01T00:00:00Z"}"#, headers: owner)
            #expect(account.status == 201)
            let buy = try await httpSend(
                "POST", base + "/v1/accounts/1/transactions", json: #"{"date":"2024-01-02","kind":"buy","symbol":"AAPL","quantity":"1","price":"1"}"#,
                headers: owner)
            #expect(buy.status == 201)
            // The upstream connects, events flow in, and the per-second series fills.
            let liveBody = try await within(.seconds(20), "the demo upstream connected and three seconds sampled") { () -> String in
                while true {
                    let body = try await get(base + "/v1/status", key: "owner-secret").body
                    let now = jsonObject(body)
                    let upstream = now["upstream"] as? [String: Any]
                    let series = now["series"] as? [String: Any]
                    if upstream?["state"] as? String == "authenticated", ((series?["eventsIn"] as? [Any])?.count ?? 0) >= 3,
                        (now["eventsPublished"] as? Int ?? 0) > 0
                    {
                        return body
                    }
                    try await Task.sleep(for: .milliseconds(200))
                }
            }
            let live = jsonObject(liveBody)
            let changes = (live["changes"] as? [[String: Any]] ?? []).compactMap { $0["what"] as? String }
            // On the demo feed every market has its upstream: each change names its market.
            #expect(changes.contains { $0.hasPrefix("stocks upstream authenticated") }, "the connection is among the recent changes: \(changes)")
            #expect(changes.contains { $0.hasPrefix("crypto upstream authenticated") }, "\(changes)")
            let markets = (live["markets"] as? [[String: Any]] ?? []).compactMap { $0["market"] as? String }
            #expect(markets == Market.trading.map(\.rawValue))
            let published = live["eventsPublished"] as? Int ?? 0
            let later = try await within(.seconds(10), "events published moving on") { () -> Int in
                while true {
                    let count = jsonObject(try await get(base + "/v1/status", key: "owner-secret").body)["eventsPublished"] as? Int ?? 0
                    if count > published { return count }
                    try await Task.sleep(for: .milliseconds(200))
                }
            }
            #expect(later > published)
        }
    }

    @Test func deliveryLatencyQuantilesComeFromTheWritesBetweenTwoReadings() {
        let tally = DeliveryTally()
        let before = tally.read()
        // 98 writes at about 100 µs, one at 5 ms, one at 50 ms.
        for _ in 0..<98 { tally.record(latencyNanoseconds: 100_000) }
        tally.record(latencyNanoseconds: 5_000_000)
        tally.record(latencyNanoseconds: 50_000_000)
        tally.add(delivered: 198)
        let after = tally.read()
        #expect(after.delivered - before.delivered == 198)
        let p50 = DeliveryTally.quantile(0.5, from: before, to: after)
        let p99 = DeliveryTally.quantile(0.99, from: before, to: after)
        // A bucket's upper bound: at most 19% above the value.
        #expect(p50.map { $0 >= 100e-6 && $0 < 100e-6 * 1.19 } == true, "p50 \(String(describing: p50))")
        #expect(p99.map { $0 >= 5e-3 && $0 < 5e-3 * 1.19 } == true, "p99 \(String(describing: p99))")
        #expect(DeliveryTally.quantile(0.5, from: after, to: after) == nil, "no writes, no latency")
    }
}
