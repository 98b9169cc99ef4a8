import DemoFeed
import Foundation
import NIOCore
import PolygonWire
import RelayComposition
import RelayConfiguration
import RelayServer
import Testing

/// One relay, every market: each at its own path with its own events, hub and upstream connection.
@Suite("Every market in one relay, over real sockets")
struct MultiMarketTests {
    /// A relay on the built-in demo feed, which then serves every market.
    func withDemoRelay(
        _ settings: RelaySettings = RelaySettings(listen: .init(host: "127.0.0.1", port: 0)),
        _ body: @Sendable (Relay.Components) async throws -> Void
    ) async throws {
        let relay = Relay(settings: settings, logger: testLogger)
        try await withServices([relay]) {
            let parts = try await within(.seconds(15), "the relay to start") { try await relay.ready() }
            // Every market's upstream authenticated before the test reads.
            for (market, upstream) in parts.upstreams {
                _ = try await waitFor(upstream.stateUpdates(), "the \(market) upstream to authenticate") { $0 == .authenticated }
            }
            try await body(parts)
        }
    }

    @Test func theDemoFeedServesEveryMarketEachAtItsOwnPath() async throws {
        try await withDemoRelay { parts in
            #expect(Set(parts.markets.keys) == Set(Market.trading))
            let cases: [(Market, String, String)] = [
                (.crypto, "XQ.X:BTC-USD,XT.BTC-USD", "X:BTC-USD"),
                (.forex, "C.C:EUR-USD", "C:EUR-USD"),
                (.options, "Q.O:SPY251219C00650000", "O:SPY251219C00650000"),
                (.indices, "V.I:SPX", "I:SPX"),
                (.futures, "T.ESZ5,Q.ESZ5", "ESZ5"),
                (.stocks, "Q.AAPL", "AAPL"),
            ]
            for (market, subscription, ticker) in cases {
                let client = try await WSTestClient.authenticated(url: "ws://127.0.0.1:\(parts.port)/\(market)")
                client.send(ClientAction(.subscribe, params: subscription))
                let ack = try await client.nextParsed()
                #expect(ack.statuses.first?.status == StatusMessage.Kind.success, "\(market): \(ack.statuses)")
                // Parsed as the relay's upstream parses them: routed in the market's topic form.
                let events = try FrameParser.parse(ByteBuffer(string: try await client.nextFrame(timeout: .seconds(10))), market: market).events
                #expect(!events.isEmpty)
                #expect(events.allSatisfy { $0.ticker == ticker && market.eventTypes.contains($0.eventType) }, "\(market): \(events)")
                await client.close()
            }
        }
    }

    @Test func aTopicOfAnotherMarketIsRefusedNamingIt() async throws {
        try await withDemoRelay { parts in
            let client = try await WSTestClient.authenticated(url: "ws://127.0.0.1:\(parts.port)/stocks")
            client.send(ClientAction(.subscribe, params: "XT.X:BTC-USD,T.X:ETH-USD,Q.AAPL"))
            let answer = try await client.nextParsed()
            let error = try #require(answer.statuses.first { $0.status == StatusMessage.Kind.error })
            #expect(error.message.contains("XT.X:BTC-USD (crypto topic: use /crypto)"), "\(error.message)")
            #expect(error.message.contains("T.X:ETH-USD (crypto ticker: use /crypto)"), "\(error.message)")
            #expect(answer.statuses.contains { $0.status == StatusMessage.Kind.success && $0.message.contains("Q.AAPL") })
            // The connection goes on.
            #expect(try await client.nextEvents(1).allSatisfy { $0.topic.description == "Q.AAPL" })
            await client.close()
        }
    }

    @Test func aPathWithNoMarketConfiguredAnswers404BeforeTheUpgrade() async throws {
        // A relay whose one upstream is a stocks feed: /crypto is not served.
        let feed = DemoFeed(configuration: .init(port: 0, apiKey: "k"), logger: testLogger)
        try await withServices([feed]) {
            let url = try await within(.seconds(10), "the feed to start") { try await feed.url() }
            var settings = RelaySettings(listen: .init(host: "127.0.0.1", port: 0), upstream: .init(url), upstreamKey: "k")
            settings.portfolio = nil
            let relay = Relay(settings: settings, logger: testLogger)
            try await withServices([relay]) {
                let parts = try await within(.seconds(15), "the relay to start") { try await relay.ready() }
                #expect(Array(parts.markets.keys) == [.stocks])
                let upstream = try #require(parts.upstream)
                _ = try await waitFor(upstream.stateUpdates(), "the upstream to authenticate") { $0 == .authenticated }
                let socket = try RawSocket(port: parts.port)
                #expect(throws: RawSocket.Failure.self) { try socket.upgrade(path: "/crypto") }
                let refused = try RawSocket(port: parts.port)
                _ = refused.send(RawSocket.upgradeRequest(path: "/crypto"))
                let head = String(decoding: refused.receive() ?? [], as: UTF8.self)
                #expect(head.hasPrefix("HTTP/1.1 404"), "\(head)")
                #expect(head.contains("the crypto market is not configured"), "\(head)")
                let health = try await httpGet("http://127.0.0.1:\(parts.port)/healthz/crypto")
                #expect(health.status == 404)
                let stocks = try await httpGet("http://127.0.0.1:\(parts.port)/healthz/stocks")
                #expect(stocks.status == 200, "\(stocks.body)")
            }
        }
    }

    @Test func aKeyLimitedToStocksIsRefusedOnCryptoAsAnAuthFailure() async throws {
        var settings = RelaySettings(listen: .init(host: "127.0.0.1", port: 0))
        settings.clientKeyRights = [
            try ClientKey(name: "equities", secret: "stocks-only", markets: ["stocks"]),
            try ClientKey(name: "quotes", secret: "crypto-quotes", topics: ["crypto:XQ.*", "Q.AAPL"]),
        ]
        try await withDemoRelay(settings) { parts in
            let refused = WSTestClient(url: "ws://127.0.0.1:\(parts.port)/crypto")
            _ = try await refused.nextParsed()
            refused.send(ClientAction(.auth, params: "stocks-only"))
            let answer = try await refused.nextParsed()
            #expect(answer.statuses.first?.status == StatusMessage.Kind.authFailed)
            #expect(answer.statuses.first?.message.contains("may not use the crypto market") == true)
            #expect(try await refused.waitForClose() == 1008)
            // The same key is fine on stocks.
            let stocks = try await WSTestClient.authenticated(url: "ws://127.0.0.1:\(parts.port)/stocks", key: "stocks-only")
            await stocks.close()
            // Per-market patterns: XQ.* on crypto, and the unqualified Q.AAPL only where no market has its own.
            let crypto = try await WSTestClient.authenticated(url: "ws://127.0.0.1:\(parts.port)/crypto", key: "crypto-quotes")
            crypto.send(ClientAction(.subscribe, params: "XQ.X:ETH-USD,XT.X:ETH-USD"))
            let verdict = try await crypto.nextParsed()
            #expect(verdict.statuses.contains { $0.status == StatusMessage.Kind.success && $0.message.contains("XQ.X:ETH-USD") })
            #expect(verdict.statuses.contains { $0.status == StatusMessage.Kind.error && $0.message.contains("not authorized") })
            await crypto.close()
        }
    }

    @Test func oneMarketsUpstreamDropReachesOnlyThatMarketsSubscribers() async throws {
        try await withDemoRelay { parts in
            let feed = try #require(parts.demoFeed)
            let crypto = try await WSTestClient.authenticated(url: "ws://127.0.0.1:\(parts.port)/crypto")
            crypto.send(ClientAction(.subscribe, params: "XT.*,XQ.X:BTC-USD"))
            _ = try await crypto.nextParsed()
            let stocks = try await WSTestClient.authenticated(url: "ws://127.0.0.1:\(parts.port)/stocks")
            stocks.send(ClientAction(.subscribe, params: "Q.AAPL"))
            _ = try await stocks.nextParsed()
            _ = try await stocks.nextEvents(1)

            #expect(feed.inject(.drop, market: .crypto) == 1)
            // (The helper reads events by their wire field: `pair` BTC-USD.)
            try await expectOutageNotices(
                crypto, topics: Set(["XQ.BTC-USD"]).union(Set(DemoMarket.majors(of: .crypto).map { "XT.\($0.ticker.dropFirst(2))" })))
            // Stocks streamed on, with no notice at all.
            for _ in 0..<5 {
                let frame = try await stocks.nextParsed()
                #expect(frame.statuses.isEmpty, "stocks got \(frame.statuses)")
                #expect(frame.events.allSatisfy { $0.topic.description == "Q.AAPL" })
            }
            // Each market's upstream was asked for exactly its own union, the crypto one twice (after the drop).
            let actions = feed.monitor.snapshot.actions.filter { $0.kind == .subscribe }
            let byMarket = Dictionary(grouping: actions, by: \.market).mapValues { actions in
                Set(actions.flatMap { Topic.parseList($0.params).topics.map(\.description) })
            }
            #expect(byMarket[.crypto] == ["XT.*", "XQ.X:BTC-USD"])
            #expect(byMarket[.stocks] == ["Q.AAPL"])
            #expect(byMarket[.forex] == nil)
            await crypto.close()
            await stocks.close()
        }
    }

    @Test func healthAndLastValuesArePerMarket() async throws {
        try await withDemoRelay { parts in
            let base = "http://127.0.0.1:\(parts.port)"
            let health = try await httpGet("\(base)/healthz")
            #expect(health.status == 200, "\(health.body)")
            let markets = jsonObject(health.body)["markets"] as? [String: Any]
            #expect(Set(markets?.keys.map { $0 } ?? []) == Set(Market.trading.map(\.rawValue)))
            #expect(try await httpGet("\(base)/healthz/forex").status == 200)

            let client = try await WSTestClient.authenticated(url: "ws://127.0.0.1:\(parts.port)/crypto")
            client.send(ClientAction(.subscribe, params: "XT.X:BTC-USD"))
            _ = try await client.nextEvents(1, timeout: .seconds(15))
            let last = try await httpGet("\(base)/v1/last/crypto/XT.BTC-USD")
            #expect(last.status == 200, "\(last.body)")
            #expect(last.body.contains(#""pair":"BTC-USD""#))
            // The old route means the first market (stocks), where a crypto topic is refused.
            #expect(try await httpGet("\(base)/v1/last/XT.X:BTC-USD").status == 400)
            let metrics = try await httpGet("\(base)/metrics")
            #expect(metrics.body.contains(#"relay_hub_events_published_total{market="crypto"}"#), "\(metrics.body.prefix(2000))")
            #expect(metrics.body.contains(#"relay_upstream_state{market="forex",state="authenticated"}"#))
            await client.close()
        }
    }

    @Test func polygonsOptionsCapIsAnsweredNeverASilentDrop() async throws {
        try await withDemoRelay { parts in
            let url = "ws://127.0.0.1:\(parts.port)/options"
            let contracts = (0..<1_001).map { String(format: "O:SPY251219C%08d", $0) }
            let first = try await WSTestClient.authenticated(url: url)
            // A thousand contracts' quotes (one message holds at most 1,000 topics), trades beside them uncapped.
            first.send(ClientAction(.subscribe, params: contracts.prefix(1_000).map { "Q.\($0)" }.joined(separator: ",")))
            let accepted = try await first.nextParsed()
            #expect(accepted.statuses.map(\.status) == [StatusMessage.Kind.success], "\(accepted.statuses)")
            first.send(ClientAction(.subscribe, params: "T.\(contracts[1_000])"))
            #expect(try await first.nextParsed().statuses.map(\.status) == [StatusMessage.Kind.success])
            // Another client's 1,001st contract: refused, naming the cap; a contract already held is fine.
            let second = try await WSTestClient.authenticated(url: url)
            second.send(ClientAction(.subscribe, params: "Q.\(contracts[1_000]),FMV.\(contracts[0]),Q.*"))
            let answer = try await second.nextParsed()
            let error = try #require(answer.statuses.first { $0.status == StatusMessage.Kind.error })
            #expect(error.message.contains("options cap"), "\(error.message)")
            #expect(error.message.contains("at most 1000"), "\(error.message)")
            #expect(error.message.contains("Q.\(contracts[1_000])") && error.message.contains("Q.*"), "\(error.message)")
            #expect(answer.statuses.contains { $0.status == StatusMessage.Kind.success && $0.message.contains("FMV.\(contracts[0])") })
            // The first client leaving frees its contracts for the next.
            await first.close()
            // (The server releases them when it sees the close: asked again until then, at most 5 s.)
            var freed = false
            let deadline = ContinuousClock.now + .seconds(5)
            while !freed, ContinuousClock.now < deadline {
                second.send(ClientAction(.subscribe, params: "Q.\(contracts[1_000])"))
                freed = try await second.nextParsed().statuses.first?.status == StatusMessage.Kind.success
            }
            #expect(freed, "the first client's contracts were not freed within 5 s")
            await second.close()
        }
    }

    @Test(.enabled(if: pythonClientAvailable, "python3 -m pip install -r Tests/Interop/requirements.txt"))
    func theOfficialPythonClientParsesEachMarketIntoItsOwnModels() async throws {
        try await withDemoRelay { parts in
            let cases: [(String, String, String)] = [
                ("crypto", "XT.X:BTC-USD,XQ.X:BTC-USD", "CryptoQuote"),
                ("forex", "C.C:EUR-USD", "ForexQuote"),
                ("options", "Q.O:SPY251219C00650000", "EquityQuote"),
                ("indices", "V.I:SPX", "IndexValue"),
            ]
            for (market, subscription, model) in cases {
                let result = try await runPythonClient([
                    "--port", "\(parts.port)", "--key", "py-key", "--market", market, "--subscribe", subscription, "--count", "5",
                ])
                #expect(result.status == 0, "\(market): \(result.output)")
                #expect(result.output.contains("\"\(model)\""), "\(market): \(result.output)")
            }
        }
    }
}
