import Foundation
import RelayCore
import Testing

/// Issue 11's first rule, over real sockets: with client keys configured, every HTTP route but
/// `/healthz` (and `/metrics` when public) refuses a request without an accepted key.
@Suite("Every route needs a client key", .timeLimit(.minutes(2)))
struct ClientKeyTests {
    static let routes: [(method: String, path: String, json: String?)] = [
        ("GET", "/v1/last/Q.AAPL", nil),
        ("GET", "/metrics", nil),
        ("GET", "/v1/portfolio", nil),
        ("GET", "/v1/portfolio/history", nil),
        ("GET", "/v1/holdings", nil),
        ("GET", "/v1/accounts", nil),
        ("POST", "/v1/accounts", #"{"name":"X","kind":"brokerage","createdAt":"2024-01-01T00:00:00Z"}"#),
        ("DELETE", "/v1/accounts/1", nil),
        ("POST", "/v1/accounts/1/transactions", #"{"date":"2024-01-02","kind":"buy","symbol":"AAPL","quantity":"1","price":"1"}"#),
        ("GET", "/v1/securities/AAPL", nil),
    ]

    func withKeyedRelay(metricsPublic: Bool = false, _ body: @Sendable (String) async throws -> Void) async throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("relay-keys-\(UUID().uuidString)").path
        defer { try? FileManager.default.removeItem(atPath: directory) }
        var settings = RelaySettings(
            listen: .init(host: "127.0.0.1", port: 0), clientKeys: ["dashboard-key", "strategy-key"], demoRate: 200,
            portfolio: .init(dataDirectory: directory))
        settings.metricsPublic = metricsPublic
        let relay = Relay(settings: settings, logger: testLogger)
        try await withServices([relay]) {
            let parts = try await within(.seconds(10), "the relay to start") { try await relay.ready() }
            try await body("http://127.0.0.1:\(parts.port)")
        }
    }

    @Test func everyRouteRefusesWithoutAKeyAndAnswersWithOne() async throws {
        try await withKeyedRelay { base in
            for route in Self.routes {
                let bare = try await httpSend(route.method, base + route.path, json: route.json)
                #expect(bare.status == 401, "\(route.method) \(route.path) without a key")
                #expect(jsonObject(bare.body)["error"] as? String != nil, "\(route.method) \(route.path): a JSON error")
                let wrong = try await httpSend(route.method, base + route.path, json: route.json, headers: ["Authorization": "Bearer nope"])
                #expect(wrong.status == 401, "\(route.method) \(route.path) with a wrong key")
                let bearer = try await httpSend(
                    route.method, base + route.path, json: route.json, headers: ["Authorization": "Bearer dashboard-key"])
                #expect(bearer.status != 401, "\(route.method) \(route.path) with a bearer key")
            }
            // Polygon's own form, the apiKey query parameter, works too.
            let query = try await httpSend("GET", base + "/v1/portfolio?apiKey=strategy-key")
            #expect(query.status == 200)
            // Health stays open for load balancers.
            #expect(try await httpGet(base + "/healthz").status != 401)
        }
    }

    @Test func publicMetricsNeedNoKeyButTheRestStillDoes() async throws {
        try await withKeyedRelay(metricsPublic: true) { base in
            let metrics = try await httpGet(base + "/metrics")
            let portfolio = try await httpGet(base + "/v1/portfolio")
            #expect(metrics.status == 200)
            #expect(portfolio.status == 401)
        }
    }

    @Test func thePortfolioStreamNeedsAKeyToo() async throws {
        try await withKeyedRelay { base in
            let ws = base.replacingOccurrences(of: "http://", with: "ws://")
            let refused = WSTestClient(url: ws + "/v1/portfolio/stream")
            await #expect(throws: (any Error).self) { _ = try await refused.nextFrame(timeout: .seconds(5)) }
            let admitted = WSTestClient(url: ws + "/v1/portfolio/stream?apiKey=dashboard-key")
            _ = try await admitted.nextFrame()
            await admitted.close()
        }
    }
}
