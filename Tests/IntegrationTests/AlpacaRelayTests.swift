import AlpacaWire
import DemoFeed
import Foundation
import PolygonWire
import RelayComposition
import RelayConfiguration
import Testing
import Upstream

/// The whole relay with an Alpaca upstream (the demo feed in Alpaca's protocol on loopback): one
/// upstream connection, Alpaca's SDKs downstream.
@Suite("Alpaca relay: one upstream connection for Alpaca's SDKs", .serialized, .enabled(if: alpacaSDKsAvailable, "scripts/test installs Alpaca's SDKs"))
struct AlpacaRelayTests {
    func withAlpacaRelay(
        maxConnectionsDelay: Duration = .milliseconds(1500), topicLimit: Int? = nil, market: Market = .stocks,
        _ body: (Relay.Components, DemoFeed) async throws -> Void
    ) async throws {
        var feedConfiguration = DemoFeedConfiguration(port: 0, apiKey: "alpaca-key", eventsPerSecond: 2000, tickInterval: .milliseconds(10), seed: 3)
        feedConfiguration.alpaca = true
        feedConfiguration.alpacaTopicLimit = topicLimit
        feedConfiguration.markets = [market]
        // Bars every second, so a client sees a few within its run.
        feedConfiguration.aggregateInterval = .seconds(1)
        let feed = DemoFeed(configuration: feedConfiguration, logger: testLogger)
        try await withServices([feed]) {
            var settings = RelaySettings(
                listen: .init(host: "127.0.0.1", port: 0), upstreamKey: "alpaca-key", clientKeys: ["client-key"],
                upstreamTuning: fastUpstreamTuning(maxConnectionsDelay: maxConnectionsDelay))
            settings.vendors = Relay.vendors
            settings.upstreams = [try MarketUpstream(url: try await feed.url(for: market), vendors: Relay.vendors)]
            settings.upstreamSecret = "alpaca-secret"
            settings.portfolio = nil
            #expect(settings.vendor(of: settings.upstreams[0]) == .alpaca, "Alpaca's path names the vendor")
            let relay = Relay(settings: settings, logger: testLogger)
            try await withServices([relay]) {
                let parts = try await within(.seconds(10), "the relay to start") { try await relay.ready() }
                try await waitFor(try #require(parts.upstreams[market]).stateUpdates(), "the upstream to authenticate") { $0 == .authenticated }
                try await body(parts, feed)
            }
        }
    }

    @Test func twoSDKClientsWithDifferentSymbolsShareOneUpstreamConnectionSubscribedToTheUnion() async throws {
        try await withAlpacaRelay { parts, feed in
            let python = try #require(alpacaPython)
            let script = AlpacaDownstreamTests.script
            async let apple = runPython(
                script, ["--sdk", "alpaca-py", "--port", "\(parts.port)", "--symbols", "AAPL", "--want", "2"], timeout: .seconds(60), python: python)
            async let microsoft = runPython(
                script, ["--sdk", "alpaca-trade-api", "--port", "\(parts.port)", "--symbols", "MSFT", "--want", "2"], timeout: .seconds(60),
                python: python)
            let (first, second) = try await (apple, microsoft)
            #expect(first.status == 0, "\(first.output.suffix(2000))")
            #expect(second.status == 0, "\(second.output.suffix(2000))")
            #expect(first.output.contains("\"symbol\": \"AAPL\"") && !first.output.contains("\"symbol\": \"MSFT\""))
            #expect(second.output.contains("\"symbol\": \"MSFT\"") && !second.output.contains("\"symbol\": \"AAPL\""))
            let snapshot = feed.monitor.snapshot
            #expect(snapshot.totalConnections == 1, "one upstream connection for both")
            let subscribed = Set(snapshot.topics(.subscribe))
            #expect(subscribed.isSuperset(of: ["t.AAPL", "q.AAPL", "b.AAPL", "t.MSFT", "q.MSFT", "b.MSFT"]), "\(subscribed)")
        }
    }

    @Test func anUpstreamAnswering406IsBackedOffWithoutAHotLoop() async throws {
        // The backoff waits 2 to 4 s here (the upper half of its bound, jittered): a second is well inside it.
        try await withAlpacaRelay(maxConnectionsDelay: .seconds(4)) { parts, feed in
            let upstream = try parts.upstreamClient
            #expect(feed.inject(.maxConnections) == 1)
            let state = try await waitFor(upstream.stateUpdates(), "the 406 to be taken as a connection limit") {
                if case .rejected = $0 { true } else { false }
            }
            #expect("\(state)".contains("406"), "\(state)")
            // Backed off as for Polygon's max_connections (from 15 s by default): no reconnect within a second.
            try await Task.sleep(for: .seconds(1))
            #expect(feed.monitor.snapshot.totalConnections == 1)
            let started = ContinuousClock.now
            try await waitFor(upstream.stateUpdates(), "the upstream back after its backoff", timeout: .seconds(15)) { $0 == .authenticated }
            print("406 test: back after \(ContinuousClock.now - started), connections \(feed.monitor.snapshot.totalConnections), state was \(state)")
        }
    }

    @Test func aSubscriptionTheUpstreamRefusesIsToldToItsClientsOnlyAndNotAskedAgainPerChange() async throws {
        // The account may hold 4 topics: a trades subscription is 3 there (trades, corrections, cancel errors).
        try await withAlpacaRelay(topicLimit: 4) { parts, _ in
            func client(_ subscribe: String) async throws -> WSTestClient {
                let client = WSTestClient(url: "ws://127.0.0.1:\(parts.port)/v2/iex")
                _ = try await client.nextFrame()
                client.send(#"{"action":"auth","key":"client-key","secret":"any"}"#)
                _ = try await client.nextFrame()
                client.send(subscribe)
                #expect(try await client.nextFrame().contains(#""T":"subscription""#))
                return client
            }
            /// Frames up to and including the first with a message of `type`.
            func until(_ client: WSTestClient, _ type: String, _ what: String) async throws -> [String] {
                var frames: [String] = []
                for _ in 0..<2_000 {
                    frames.append(try await client.nextFrame())
                    if frames[frames.count - 1].contains(#""T":"\#(type)""#) { return frames }
                }
                throw TimeoutError(description: "no \(type) frame: \(what)")
            }
            func next(_ client: WSTestClient, _ type: String, _ what: String) async throws -> String {
                try await until(client, type, what).last ?? ""
            }
            let apple = try await client(#"{"action":"subscribe","trades":["AAPL"]}"#)
            _ = try await next(apple, "t", "AAPL's trades")
            // Past the account's limit: the relay accepted it, the upstream refuses it with 405.
            let microsoft = try await client(#"{"action":"subscribe","trades":["MSFT"]}"#)
            let refusal = try await next(microsoft, "error", "the upstream's refusal")
            #expect(refusal.hasPrefix(#"[{"T":"error","code":405,"msg":"symbol limit exceeded: the upstream refused t.MSFT"#), "\(refusal)")
            // A later client of the same topic is told too: the upstream is not asked again for it.
            let later = try await client(#"{"action":"subscribe","trades":["MSFT"]}"#)
            let told = try await next(later, "error", "the refusal standing for a later client")
            #expect(told.hasPrefix(#"[{"T":"error","code":405,"msg":"symbol limit exceeded: the upstream refused t.MSFT"#), "\(told)")
            await later.close()
            // A later change of interest is asked for alone (with t.MSFT again it would be refused whole).
            let quotes = try await client(#"{"action":"subscribe","quotes":["AAPL"]}"#)
            #expect(try await next(quotes, "q", "AAPL's quotes").contains(#""S":"AAPL""#))
            // AAPL's trades go on (who is told is the hub's unit test).
            _ = try await next(apple, "t", "AAPL's trades after the refusal")
            #expect(try parts.upstreamClient.statistics.lastError?.contains("405") == true)
            await apple.close()
            await microsoft.close()
            await quotes.close()
        }
    }

    @Test func alpacaPysOptionStreamTakesOptionTradesAndQuotesThroughTheRelay() async throws {
        // Alpaca sends options in MessagePack only; the relay takes them so and serves them at the same path.
        try await withAlpacaRelay(market: .options) { parts, feed in
            #expect(try await feed.url(for: .options).hasSuffix("/v1beta1/indicative"))
            let python = try #require(alpacaPython)
            let contract = "SPY251219C00650000"
            let result = try await runPython(
                AlpacaDownstreamTests.script, ["--sdk", "alpaca-py", "--options", "indicative", "--port", "\(parts.port)", "--symbols", contract],
                timeout: .seconds(60), python: python)
            #expect(result.status == 0, "\(result.output.suffix(2000))")
            let got = AlpacaDownstreamTests.kinds(AlpacaDownstreamTests.lastJSON(result.output))
            #expect(got["trades"]?.first?["type"] as? String == "alpaca.data.models.trades.Trade", "\(got)")
            #expect(got["quotes"]?.first?["type"] as? String == "alpaca.data.models.quotes.Quote", "\(got)")
            #expect(got.values.joined().allSatisfy { $0["symbol"] as? String == contract })
            let subscribed = Set(feed.monitor.snapshot.topics(.subscribe))
            #expect(subscribed == ["t.\(contract)", "q.\(contract)"], "\(subscribed)")
        }
    }

    @Test func anAlpacaKeyIdIsNeverTheKeyOfAnotherVendorsRESTAPI() async throws {
        let alpaca = try await RelaySettings.resolve(
            vendors: Relay.vendors,
            commandLine: ["--upstream", "wss://stream.data.alpaca.markets/v2/sip", "--rest-url", "https://api.polygon.io"],
            environment: ["APCA_API_KEY_ID": "alpaca-id", "APCA_API_SECRET_KEY": "alpaca-secret"])
        #expect(alpaca.upstreamKey == "alpaca-id")
        #expect(Relay.restKey(alpaca, alpacaUpstream: true) == nil, "REST is off rather than sent the Alpaca key id")
        let given = try await RelaySettings.resolve(
            vendors: Relay.vendors,
            commandLine: ["--upstream", "wss://stream.data.alpaca.markets/v2/sip", "--rest-url", "https://api.polygon.io", "--rest-key", "polygon-key"],
            environment: ["APCA_API_KEY_ID": "alpaca-id", "APCA_API_SECRET_KEY": "alpaca-secret"])
        #expect(Relay.restKey(given, alpacaUpstream: true) == "polygon-key")
        let polygon = try await RelaySettings.resolve(
            vendors: Relay.vendors,
            commandLine: ["--upstream", "wss://socket.polygon.io/stocks"], environment: ["POLYGON_API_KEY": "pk"])
        #expect(Relay.restKey(polygon, alpacaUpstream: false) == "pk", "Polygon's upstream key is its REST key")
    }
}
