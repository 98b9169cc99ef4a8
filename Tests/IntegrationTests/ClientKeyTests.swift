import AsyncHTTPClient
import Foundation
import NIOSSL
import PolygonWire
import Portfolio
import RelayComposition
import RelayConfiguration
import RelayServer
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
        ("GET", "/v1/status", nil),
    ]

    func withKeyedRelay(metricsPublic: Bool = false, _ body: @Sendable (String) async throws -> Void) async throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("relay-keys-\(UUID().uuidString)").path
        defer { try? FileManager.default.removeItem(atPath: directory) }
        var settings = RelaySettings(
            listen: .init(host: "127.0.0.1", port: 0), clientKeys: ["dashboard-key", "strategy-key"], demoRate: 200,
            portfolio: .init(dataDirectory: directory))
        settings.metricsPublic = metricsPublic
        // Every route is asked with a wrong key in turn: answered without the guessers' delay.
        (settings.connectionLimits.failureDelay, settings.connectionLimits.maxFailureDelay) = (.milliseconds(1), .milliseconds(2))
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

    @Test func portfolioStreamsCountAgainstTheKeysConnectionLimit() async throws {
        try await withRightsRelay { port in
            // "two" may hold two WebSockets: portfolio streams and market connections together.
            var streams: [WSTestClient] = []
            for _ in 0..<2 {
                let stream = WSTestClient(url: "ws://127.0.0.1:\(port)/v1/portfolio/stream?apiKey=two-secret")
                _ = try await stream.nextFrame()
                streams.append(stream)
            }
            let third = WSTestClient(url: "ws://127.0.0.1:\(port)/v1/portfolio/stream?apiKey=two-secret")
            let refusal = try await third.nextFrame()
            #expect(refusal.contains("max_connections") && refusal.contains(#"for key \"two\""#), "\(refusal)")
            #expect(try await third.waitForClose() == 1008)
            let market = WSTestClient(url: "ws://127.0.0.1:\(port)/stocks")
            _ = try await market.nextParsed()
            market.send(ClientAction(.auth, params: "two-secret"))
            #expect(try await market.nextParsed().statuses.first?.status == StatusMessage.Kind.maxConnections)
            for client in streams { await client.close() }
        }
    }

    /// A key without a connection limit still holds only its share of push streams; the total holds
    /// whatever the keys; a closed stream's place is taken again.
    @Test func pushStreamsAreBoundedPerKeyAndInAll() async throws {
        var limits = RelayServerConfiguration.ConnectionLimits()
        (limits.pushStreamsPerKey, limits.pushStreams) = (2, 3)
        try await withRightsRelay(limits: limits) { port in
            @Sendable func open(_ key: String) -> WSTestClient { WSTestClient(url: "ws://127.0.0.1:\(port)/v1/portfolio/stream?apiKey=\(key)") }
            var streams: [WSTestClient] = []
            for _ in 0..<2 {
                let stream = open("reader-secret")
                _ = try await stream.nextFrame()
                streams.append(stream)
            }
            let third = open("reader-secret")
            let refusal = try await third.nextFrame()
            #expect(refusal.contains("max_connections") && refusal.contains("limits.pushStreamsPerKey"), "\(refusal)")
            #expect(try await third.waitForClose() == 1008)
            let writer = open("writer-secret")
            _ = try await writer.nextFrame()
            let past = open("writer-secret")
            let total = try await past.nextFrame()
            #expect(total.contains("limits.pushStreams)"), "the fourth in all: \(total)")
            #expect(try await past.waitForClose() == 1008)
            // A key of two connections refused a push stream keeps both for its market clients.
            let pushed = open("two-secret")
            #expect(try await pushed.nextFrame().contains("limits.pushStreams)"))
            #expect(try await pushed.waitForClose() == 1008)
            var markets: [WSTestClient] = []
            for _ in 0..<2 {
                let market = try await WSTestClient.authenticated(url: "ws://127.0.0.1:\(port)/stocks", key: "two-secret")
                markets.append(market)
            }
            for market in markets { await market.close() }
            await streams[0].close()
            try await eventually("a closed stream's place is taken again") {
                let again = open("reader-secret")
                let frame = try? await again.nextFrame(timeout: .seconds(2))
                await again.close()
                return frame.map { !$0.contains("max_connections") } ?? false
            }
            for client in [streams[1], writer] { await client.close() }
        }
    }

    func withRightsRelay(
        limits: RelayServerConfiguration.ConnectionLimits = .init(), _ body: @Sendable (_ port: Int) async throws -> Void
    ) async throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("relay-rights-\(UUID().uuidString)").path
        defer { try? FileManager.default.removeItem(atPath: directory) }
        var settings = RelaySettings(
            listen: .init(host: "127.0.0.1", port: 0), demoRate: 2000, portfolio: .init(dataDirectory: directory))
        settings.connectionLimits = limits
        settings.clientKeyRights = [
            try ClientKey(name: "quotes-only", secret: "quotes-secret", topics: ["Q.*"], portfolio: .none),
            try ClientKey(name: "five", secret: "five-secret", maxConnections: 5, portfolio: .none),
            try ClientKey(name: "two", secret: "two-secret", maxConnections: 2, portfolio: .read),
            try ClientKey(name: "reader", secret: ClientKeyTests.sha256Text("reader-secret"), portfolio: .read),
            try ClientKey(name: "writer", secret: "writer-secret", portfolio: .write),
        ]
        let relay = Relay(settings: settings, logger: testLogger)
        try await withServices([relay]) {
            let parts = try await within(.seconds(10), "the relay to start") { try await relay.ready() }
            try await body(parts.port)
        }
    }

    /// `sha256:<hex>` of a key, as a config file would hold it.
    static func sha256Text(_ key: String) -> String {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/env")
        process.arguments = ["sha256sum"]
        let input = Pipe()
        let output = Pipe()
        process.standardInput = input
        process.standardOutput = output
        try? process.run()
        input.fileHandleForWriting.write(Data(key.utf8))
        try? input.fileHandleForWriting.close()
        process.waitUntilExit()
        let text = String(decoding: output.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        return "sha256:" + (text.split(separator: " ").first.map(String.init) ?? "")
    }

    @Test func aKeyLimitedToQuotesGetsNoTrades() async throws {
        try await withRightsRelay { port in
            let client = try await WSTestClient.authenticated(url: "ws://127.0.0.1:\(port)/stocks", key: "quotes-secret")
            client.send(ClientAction(.subscribe, params: "Q.AAPL,T.AAPL,T.*"))
            let acks = try await client.nextParsed()
            #expect(acks.statuses.contains(StatusMessage(status: "success", message: "subscribed to: Q.AAPL")))
            let refusal = try #require(acks.statuses.first { $0.status == "error" })
            #expect(refusal.message.contains("T.AAPL") && refusal.message.contains("T.*") && refusal.message.contains("quotes-only"))
            #expect(!acks.statuses.contains { $0.message.contains("subscribed to: T.") })
            #expect(try await client.nextEvents(10).allSatisfy { $0.topic.description == "Q.AAPL" })
            // Nor over HTTP.
            let trade = try await httpSend("GET", "http://127.0.0.1:\(port)/v1/last/T.AAPL", headers: ["Authorization": "Bearer quotes-secret"])
            #expect(trade.status == 403)
            let quote = try await httpSend("GET", "http://127.0.0.1:\(port)/v1/last/Q.AAPL", headers: ["Authorization": "Bearer quotes-secret"])
            #expect(quote.status == 200)
            await client.close()
        }
    }

    @Test func theSixthConnectionOfAFiveConnectionKeyIsRefused() async throws {
        try await withRightsRelay { port in
            var clients: [WSTestClient] = []
            for _ in 0..<5 { clients.append(try await WSTestClient.authenticated(url: "ws://127.0.0.1:\(port)/stocks", key: "five-secret")) }
            let sixth = WSTestClient(url: "ws://127.0.0.1:\(port)/stocks")
            #expect(try await sixth.nextParsed().statuses == [.connected])
            sixth.send(ClientAction(.auth, params: "five-secret"))
            #expect(try await sixth.nextParsed().statuses.first?.status == StatusMessage.Kind.maxConnections)
            #expect(try await sixth.waitForClose() == 1008)
            // One leaves: the next may come in.
            await clients.removeLast().close()
            try await eventually("a place to free up") {
                guard let again = try? await WSTestClient.authenticated(url: "ws://127.0.0.1:\(port)/stocks", key: "five-secret") else {
                    return false
                }
                await again.close()
                return true
            }
            for client in clients { await client.close() }
        }
    }

    @Test func portfolioRightsHoldAndKeysMayBeStoredAsDigests() async throws {
        try await withRightsRelay { port in
            let base = "http://127.0.0.1:\(port)"
            let account = #"{"name":"X","kind":"brokerage","createdAt":"2024-01-01T00:00:00Z"}"#
            func send(_ method: String, _ path: String, key: String, json: String? = nil) async throws -> Int {
                try await httpSend(method, base + path, json: json, headers: ["Authorization": "Bearer \(key)"]).status
            }
            #expect(try await send("GET", "/v1/portfolio", key: "reader-secret") == 200, "a digest-stored key reads")
            let refused = try await httpSend("POST", base + "/v1/accounts", json: account, headers: ["Authorization": "Bearer reader-secret"])
            #expect(refused.status == 403)
            #expect((jsonObject(refused.body)["error"] as? String)?.contains("reader") == true)
            #expect(try await send("GET", "/v1/portfolio", key: "quotes-secret") == 403, "no portfolio right")
            #expect(try await send("POST", "/v1/accounts", key: "writer-secret", json: account) == 201)
            // Market data needs only a key.
            #expect(try await send("GET", "/v1/last/NOT-A-TOPIC", key: "quotes-secret") == 400)
        }
    }
}

@Suite("Named portfolio clients per key", .timeLimit(.minutes(2)))
struct NamedClientTests {
    @Test func oneKeysVaryingClientNamesCannotPushOutAnotherKeysClients() async throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("relay-named-\(UUID().uuidString)").path
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let settings = RelaySettings(
            listen: .init(host: "127.0.0.1", port: 0), clientKeys: ["noisy-key", "quiet-key"], demoRate: 100,
            portfolio: .init(dataDirectory: directory))
        let relay = Relay(settings: settings, logger: testLogger)
        try await withServices([relay]) {
            let parts = try await within(.seconds(10), "the relay to start") { try await relay.ready() }
            let browser = try #require(parts.securities)
            let base = "http://127.0.0.1:\(parts.port)"
            func ask(_ key: String, as name: String) async throws -> Int {
                try await httpSend("GET", base + "/v1/securities/AAPL", headers: ["Authorization": "Bearer \(key)", "X-Relay-Client": name])
                    .status
            }
            _ = try await ask("quiet-key", as: "desk")
            for index in 0..<(SecurityBrowser.maxNamedClients + 20) { _ = try await ask("noisy-key", as: "bot-\(index)") }
            #expect(await browser.knows(.named("key-2:desk")), "the other key's client is still known")
            #expect(await browser.clientCount <= SecurityBrowser.maxNamedClients + 1)
        }
    }

    @Test func withoutKeysNamesWithAColonAreBoundedToo() async throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("relay-named-\(UUID().uuidString)").path
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let settings = RelaySettings(
            listen: .init(host: "127.0.0.1", port: 0), clientKeys: [], demoRate: 100, portfolio: .init(dataDirectory: directory))
        let relay = Relay(settings: settings, logger: testLogger)
        try await withServices([relay]) {
            let parts = try await within(.seconds(10), "the relay to start") { try await relay.ready() }
            let browser = try #require(parts.securities)
            let base = "http://127.0.0.1:\(parts.port)"
            // Each name its own "scope" before the fix: "a0:x", "a1:x", … were never forgotten.
            for index in 0..<(SecurityBrowser.maxNamedClients + 40) {
                _ = try await httpSend("GET", base + "/v1/securities/AAPL", headers: ["X-Relay-Client": "a\(index):x"])
            }
            #expect(await browser.clientCount <= SecurityBrowser.maxNamedClients + 1)
        }
    }
}

@Suite("TLS downstream", .timeLimit(.minutes(1)))
struct DownstreamTLSTests {
    @Test func httpsAndWSSShareThePortAndPlainHTTPIsNotServed() async throws {
        var settings = RelaySettings(listen: .init(host: "127.0.0.1", port: 0), clientKeys: ["tls-key"])
        let certificate = try fixture("test-server.pem")
        settings.tls = .init(certificatePath: certificate, privateKeyPath: try fixture("test-server.key"))
        let relay = Relay(settings: settings, logger: testLogger)
        try await withServices([relay]) {
            let parts = try await within(.seconds(10), "the relay to start") { try await relay.ready() }
            var tls = TLSConfiguration.makeClientConfiguration()
            tls.trustRoots = .file(certificate)
            let client = HTTPClient(eventLoopGroupProvider: .singleton, configuration: .init(tlsConfiguration: tls))
            do {
                var request = HTTPClientRequest(url: "https://127.0.0.1:\(parts.port)/v1/last/Q.AAPL")
                request.headers.add(name: "Authorization", value: "Bearer tls-key")
                let keyed = try await client.execute(request, timeout: .seconds(10))
                #expect(keyed.status.code != 401, "https answers a keyed request")
                let health = try await client.execute(HTTPClientRequest(url: "https://127.0.0.1:\(parts.port)/healthz"), timeout: .seconds(10))
                #expect([200, 503].contains(health.status.code))
                // The same port does not speak plain HTTP.
                await #expect(throws: (any Error).self) {
                    _ = try await HTTPClient.shared.execute(
                        HTTPClientRequest(url: "http://127.0.0.1:\(parts.port)/healthz"), timeout: .seconds(5))
                }
            } catch {
                try await client.shutdown()
                throw error
            }
            try await client.shutdown()
        }
    }

    @Test func tlsSettingsNeedBothFilesAndReadableOnes() async throws {
        await #expect(throws: RelaySettings.InvalidSetting.self) {
            try await RelaySettings.resolve(vendors: Relay.vendors, commandLine: ["--tls-cert", try fixture("test-server.pem")], environment: [:])
        }
        await #expect(throws: RelaySettings.InvalidSetting.self) {
            try await RelaySettings.resolve(vendors: Relay.vendors, commandLine: ["--tls-cert", "/nonexistent.pem", "--tls-key", "/nonexistent.key"], environment: [:])
        }
        let settings = try await RelaySettings.resolve(
            vendors: Relay.vendors,
            commandLine: ["--tls-cert", try fixture("test-server.pem"), "--tls-key", try fixture("test-server.key")], environment: [:])
        #expect(settings.tls != nil)
    }
}
