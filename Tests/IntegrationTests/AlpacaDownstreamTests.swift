import AlpacaWire
import Foundation
import MarketDataHub
import PolygonWire
import RelayServer
import Testing

/// The Python with Alpaca's SDKs (`.build/alpaca-venv`, made by scripts/test; or `RELAY_ALPACA_PYTHON`).
let alpacaPython: String? = {
    if let given = ProcessInfo.processInfo.environment["RELAY_ALPACA_PYTHON"] { return given }
    let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
    let venv = root.appendingPathComponent(".build/alpaca-venv/bin/python3").path
    return FileManager.default.isExecutableFile(atPath: venv) ? venv : nil
}()

/// Whether the Alpaca interop tests run: the SDKs are there, or the run demands them (scripts/test).
let alpacaSDKsAvailable = alpacaPython != nil || ProcessInfo.processInfo.environment["RELAY_REQUIRE_INTEROP"] == "1"

/// A feed that is always up: the test publishes into the hub itself.
struct TestFeed: FeedStatus {
    func report() async -> FeedReport { FeedReport(healthy: true, upstream: UpstreamReport(state: "authenticated", url: "test")) }
}

/// Alpaca's protocol served downstream, over real sockets, to Alpaca's official SDKs unmodified: the
/// relay's server with an Alpaca stock feed and crypto feed, each hub fed Alpaca events by the test.
@Suite("Alpaca downstream: Alpaca's SDKs against the relay", .serialized, .enabled(if: alpacaSDKsAvailable, "scripts/test installs Alpaca's SDKs"))
struct AlpacaDownstreamTests {
    static let script = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .appendingPathComponent("Interop/alpaca_sdk_client.py").path

    /// Runs `body` with a relay serving `/v2/iex` and `/v1beta3/crypto/us`, its hubs fed every 20 ms.
    func withAlpacaRelay(_ body: (Int) async throws -> Void) async throws {
        try await withAlpacaRelay { port, _ in try await body(port) }
    }

    /// The same, with the stock feed's hub (whose slow consumers meet `policy`).
    func withAlpacaRelay(
        policy: SlowConsumerPolicy = .drop, history: HistoryLimits? = nil, publishing: Bool = true, perAddress: Int? = nil,
        _ body: (Int, MarketDataHub) async throws -> Void
    ) async throws {
        let stocks = MarketDataHub(wire: .alpaca(.iex), policy: policy, snapshotless: AlpacaChannel.snapshotless, history: history)
        let crypto = MarketDataHub(wire: .alpaca(.crypto), history: nil)
        // Besides the plain key, one whose entitlement is AAPL's trades, quotes and bars only.
        let appleOnly = try ClientKey(name: "apple-only", secret: "apple-key", topics: ["t.AAPL", "q.AAPL", "b.AAPL"])
        let single = try ClientKey(name: "single", secret: "single-key", maxConnections: 1)
        var stamped = try ClientKey(name: "stamped", secret: "stamped-key")
        stamped.timestamps = true
        var configuration = RelayServerConfiguration(
            host: "127.0.0.1", port: 0,
            authentication: try ClientAuthentication.resolve(
                keys: ["client-key"], withRights: [appleOnly, single, stamped], listenHost: "127.0.0.1"))
        configuration.authTimeout = .seconds(5)
        if let perAddress { configuration.connectionLimits.perAddress = perAddress }
        let server = RelayServer(
            configuration: configuration,
            markets: [
                ServedMarket(market: .stocks, hub: stocks, feed: TestFeed()),
                ServedMarket(market: .crypto, hub: crypto, feed: TestFeed()),
            ], logger: testLogger)
        let publisher = Task {
            var id: Int64 = 0
            while publishing, !Task.isCancelled {
                id += 1
                let now = Int64(Date().timeIntervalSince1970 * 1e9)
                var events: [MarketEvent] = []
                for (index, symbol) in ["AAPL", "MSFT"].enumerated() {
                    let price = 100 + Double(index) * 50 + Double(id % 100) / 100
                    events.append(AlpacaEvents.trade(symbol, id: id, price: price, size: 100, nanoseconds: now))
                    events.append(AlpacaEvents.quote(symbol, bid: price - 0.01, ask: price + 0.01, size: 2, nanoseconds: now))
                    if id % 5 == 0 {
                        events.append(
                            AlpacaEvents.bar(symbol, open: price, high: price + 1, low: price - 1, close: price, volume: 1000, trades: 10, startNanoseconds: now))
                    }
                }
                await stocks.publish(events)
                var coins = [
                    AlpacaEvents.trade("BTC/USD", id: id, price: 60_000 + Double(id), size: 0.25, nanoseconds: now, crypto: true),
                    AlpacaEvents.quote("BTC/USD", bid: 59_999, ask: 60_001, size: 0.5, nanoseconds: now, crypto: true),
                ]
                if id % 5 == 0 {
                    coins.append(
                        AlpacaEvents.bar("BTC/USD", open: 60_000, high: 60_010, low: 59_990, close: 60_005, volume: 1.5, trades: 3, startNanoseconds: now))
                }
                await crypto.publish(coins)
                try? await Task.sleep(for: .milliseconds(20))
            }
        }
        defer { publisher.cancel() }
        try await withServices([server]) {
            try await body(try await server.listeningPort(), stocks)
        }
    }

    func run(_ arguments: [String]) async throws -> [String: Any] {
        let python = try #require(alpacaPython, "python3 -m venv .build/alpaca-venv && .build/alpaca-venv/bin/pip install -r Tests/Interop/alpaca-requirements.txt")
        let result = try await runPython(Self.script, arguments, timeout: .seconds(60), python: python)
        #expect(result.status == 0, "\(result.output.suffix(3000))")
        return Self.lastJSON(result.output)
    }

    /// The script's result: its last line that is a JSON object.
    static func lastJSON(_ output: String) -> [String: Any] {
        let line = output.split(separator: "\n").last { $0.hasPrefix("{") }.map(String.init) ?? "{}"
        return (try? JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any]) ?? [:]
    }

    static func kinds(_ result: [String: Any]) -> [String: [[String: Any]]] {
        (result["got"] as? [String: [[String: Any]]]) ?? [:]
    }

    @Test func alpacaPysStreamsTakeTradesQuotesAndBarsAsTheirModels() async throws {
        try await withAlpacaRelay { port in
            let stocks = Self.kinds(try await run(["--sdk", "alpaca-py", "--port", "\(port)", "--symbols", "AAPL"]))
            #expect(stocks["trades"]?.first?["type"] as? String == "alpaca.data.models.trades.Trade", "\(stocks)")
            #expect(stocks["quotes"]?.first?["type"] as? String == "alpaca.data.models.quotes.Quote", "\(stocks)")
            #expect(stocks["bars"]?.first?["type"] as? String == "alpaca.data.models.bars.Bar", "\(stocks)")
            #expect(stocks.values.joined().allSatisfy { $0["symbol"] as? String == "AAPL" }, "only what it asked for")
            let crypto = Self.kinds(try await run(["--sdk", "alpaca-py", "--crypto", "--port", "\(port)", "--symbols", "BTC/USD"]))
            #expect(crypto["trades"]?.first?["type"] as? String == "alpaca.data.models.trades.Trade", "\(crypto)")
            #expect((crypto["trades"]?.first?["price"] as? Double ?? 0) > 60_000)
            let raw = Self.kinds(try await run(["--sdk", "alpaca-py", "--raw", "--port", "\(port)", "--symbols", "MSFT"]))
            #expect(raw["trades"]?.first?["type"] as? String == "dict" && raw["trades"]?.first?["symbol"] as? String == "MSFT", "\(raw)")
        }
    }

    @Test func aStampedKeyGetsReceiveAndSendTimesInBothCodecsAndTheSDKsStillTakeTheirModels() async throws {
        try await withAlpacaRelay { port in
            let started = Int64(Date().timeIntervalSince1970 * 1e9)
            let client = WSTestClient(url: "ws://127.0.0.1:\(port)/v2/iex")
            _ = try await client.nextFrame()
            client.send(#"{"action":"auth","key":"stamped-key","secret":"any"}"#)
            #expect(try await client.nextFrame() == #"[{"T":"success","msg":"authenticated"}]"#)
            client.send(#"{"action":"subscribe","trades":["AAPL"],"quotes":["MSFT"]}"#)
            #expect(try await client.nextFrame().contains(#""T":"subscription""#))
            var seen = 0
            while seen < 20 {
                let events = try JSONSerialization.jsonObject(with: Data(try await client.nextFrame().utf8)) as? [[String: Any]] ?? []
                for event in events {
                    let received = try #require(event["_r"] as? Int64, "\(event)")
                    let sent = try #require(event["_o"] as? Int64, "\(event)")
                    #expect(received >= started - 1_000_000_000 && received <= sent && sent <= Int64(Date().timeIntervalSince1970 * 1e9), "\(event)")
                    #expect(event["T"] as? String == "t" || event["T"] as? String == "q", "\(event)")
                }
                seen += events.count
            }
            await client.close()
            // MessagePack: alpaca-py's raw data shows the two map entries; its models take them in stride.
            let raw = Self.kinds(try await run(["--sdk", "alpaca-py", "--raw", "--key", "stamped-key", "--port", "\(port)", "--symbols", "MSFT"]))
            let fields = raw["trades"]?.first?["fields"] as? [String] ?? []
            #expect(fields.contains("_r") && fields.contains("_o") && fields.contains("p"), "\(raw)")
            let models = Self.kinds(try await run(["--sdk", "alpaca-py", "--key", "stamped-key", "--port", "\(port)", "--symbols", "AAPL"]))
            #expect(models["trades"]?.first?["type"] as? String == "alpaca.data.models.trades.Trade", "\(models)")
            #expect(models["bars"]?.first?["type"] as? String == "alpaca.data.models.bars.Bar", "\(models)")
            let plain = Self.kinds(try await run(["--sdk", "alpaca-py", "--raw", "--port", "\(port)", "--symbols", "MSFT"]))
            let plainFields = (plain["trades"]?.first?["fields"] as? [String]) ?? []
            #expect(!plainFields.isEmpty && !plainFields.contains("_r"), "\(plain)")
        }
    }

    @Test func alpacaTradeAPIsStreamTakesThemToo() async throws {
        try await withAlpacaRelay { port in
            let stocks = Self.kinds(try await run(["--sdk", "alpaca-trade-api", "--port", "\(port)", "--symbols", "AAPL"]))
            #expect(stocks["trades"]?.first?["type"] as? String == "alpaca_trade_api.entity.Trade", "\(stocks)")
            #expect(stocks["trades"]?.first?["symbol"] as? String == "AAPL", "\(stocks)")
            let crypto = Self.kinds(try await run(["--sdk", "alpaca-trade-api", "--crypto", "--port", "\(port)", "--symbols", "BTC/USD"]))
            #expect((crypto["trades"]?.count ?? 0) >= 3, "\(crypto)")
        }
    }

    @Test func aPlainWebSocketClientSpeaksAlpacasJSONAndGetsTheRelaysNoticesAsTheirOwnType() async throws {
        try await withAlpacaRelay { port, hub in
            let client = WSTestClient(url: "ws://127.0.0.1:\(port)/v2/iex")
            #expect(try await client.nextFrame() == #"[{"T":"success","msg":"connected"}]"#)
            client.send(#"{"action":"auth","key":"client-key","secret":"any"}"#)
            #expect(try await client.nextFrame() == #"[{"T":"success","msg":"authenticated"}]"#)
            client.send(#"{"action":"subscribe","trades":["AAPL"]}"#)
            let subscription = try await client.nextFrame()
            #expect(subscription.hasPrefix(#"[{"T":"subscription","trades":["AAPL"],"quotes":[],"bars":[]"#), "\(subscription)")
            let trades = try JSONSerialization.jsonObject(with: Data(try await client.nextFrame().utf8)) as? [[String: Any]] ?? []
            let trade = try #require(trades.first)
            #expect(trade["T"] as? String == "t" && trade["S"] as? String == "AAPL" && trade["p"] is Double)
            let time = try #require(trade["t"] as? String)
            #expect(time.hasSuffix("Z") && time.count >= 20, "an RFC 3339 time: \(time)")
            // A MessagePack client (alpaca-py) of the same symbol meanwhile gets its own form of the same
            // publishes, and this client still its JSON (the JSON is made once per event and shared).
            let models = Self.kinds(try await run(["--sdk", "alpaca-py", "--port", "\(port)", "--symbols", "AAPL"]))
            #expect(models["trades"]?.first?["type"] as? String == "alpaca.data.models.trades.Trade", "\(models)")
            for _ in 0..<3 {
                let frame = try await client.nextFrame()
                let events = try JSONSerialization.jsonObject(with: Data(frame.utf8)) as? [[String: Any]] ?? []
                #expect(!events.isEmpty && events.allSatisfy { $0["T"] as? String == "t" && $0["S"] as? String == "AAPL" }, "\(frame.prefix(300))")
            }
            await hub.upstreamLost(reason: "a test")
            var notice: [String: Any]?
            for _ in 0..<1000 where notice == nil {
                let frame = try JSONSerialization.jsonObject(with: Data(try await client.nextFrame().utf8)) as? [[String: Any]] ?? []
                if let relay = frame.first(where: { $0["T"] as? String == "relay" }) {
                    #expect(frame.count == 1, "alone in its frame")
                    notice = relay
                }
            }
            #expect(notice?["status"] as? String == StatusMessage.Kind.upstreamDisconnected, "\(String(describing: notice))")
            #expect((notice?["msg"] as? String)?.contains("a test") == true)
            client.send(#"{"action":"subscribe","orderbooks":["AAPL"]}"#)
            var refused = ""
            repeat { refused = try await client.nextFrame() } while !refused.contains(#""T":"error""#)
            #expect(refused == #"[{"T":"error","code":410,"msg":"invalid subscribe action for this feed"}]"#)
            await client.close()
            // /healthz and /metrics name the vendor.
            let health = try await httpGet("http://127.0.0.1:\(port)/healthz")
            #expect(health.body.contains(#""vendor":"alpaca""#) && health.body.contains(#""paths":["\/v2\/iex"]"#), "\(health.body.prefix(600))")
            let metrics = try await httpGet("http://127.0.0.1:\(port)/metrics", key: "client-key")
            #expect(metrics.body.contains(#"relay_market_info{market="stocks",vendor="alpaca"} 1"#), "\(metrics.body.prefix(300))")
        }
    }

    @Test func aSubscriptionGetsItsSymbolsLastEventsAtOnceInEachCodec() async throws {
        try await withAlpacaRelay(publishing: false) { port, hub in
            let now = Int64(Date().timeIntervalSince1970 * 1e9)
            await hub.publish([
                AlpacaEvents.trade("AAPL", id: 7, price: 187.25, size: 100, nanoseconds: now),
                AlpacaEvents.quote("AAPL", bid: 187.2, ask: 187.3, size: 2, nanoseconds: now),
                AlpacaEvents.bar("AAPL", open: 187, high: 188, low: 186, close: 187.25, volume: 1000, trades: 10, startNanoseconds: now),
                // A correction is a one-off event: never a snapshot.
                AlpacaEvents.event(
                    "c", "AAPL", [("T", .string("c")), ("S", .string("AAPL")), ("oi", .int(6)), ("ci", .int(7)), ("t", AlpacaEvents.time(nanoseconds: now))]),
            ])
            let client = WSTestClient(url: "ws://127.0.0.1:\(port)/v2/iex")
            _ = try await client.nextFrame()
            client.send(#"{"action":"auth","key":"client-key","secret":"any"}"#)
            _ = try await client.nextFrame()
            client.send(#"{"action":"subscribe","trades":["AAPL"]}"#)
            #expect(try await client.nextFrame().contains(#""T":"subscription""#))
            // Nothing more is published: the trade is the snapshot, right after the subscription, and
            // the correction (its topic comes with the trades) is not one.
            let snapshot = try JSONSerialization.jsonObject(with: Data(try await client.nextFrame().utf8)) as? [[String: Any]] ?? []
            #expect(snapshot.count == 1 && snapshot.first?["i"] as? Int == 7 && snapshot.first?["p"] as? Double == 187.25, "\(snapshot)")
            client.send(#"{"action":"subscribe","quotes":["AAPL"]}"#)
            #expect(try await client.nextFrame().contains(#""T":"subscription""#))
            let quote = try await client.nextFrame()
            #expect(quote.hasPrefix(#"[{"T":"q","S":"AAPL""#), "the quote's snapshot next, no correction before it: \(quote)")
            await client.close()
            // /v1/last speaks Alpaca's topics and JSON on an Alpaca market.
            let last = try await httpGet("http://127.0.0.1:\(port)/v1/last/stocks/t.AAPL", key: "client-key")
            #expect(last.status == 200 && last.body.contains(#""T":"t","S":"AAPL","i":7"#) && last.body.contains(#""p":187.25"#), "\(last.body)")
            let polygonTopic = try await httpGet("http://127.0.0.1:\(port)/v1/last/stocks/T.AAPL", key: "client-key")
            #expect(polygonTopic.status == 400 && polygonTopic.body.contains("t.AAPL"), "\(polygonTopic.body)")
            // No longer a symbol than a subscription may name: refused, nothing looked up.
            let long = try await httpGet("http://127.0.0.1:\(port)/v1/last/stocks/t.\(String(repeating: "A", count: 100))", key: "client-key")
            #expect(long.status == 400 && long.body.contains("longer than 40"), "\(long.body)")
            // An SDK takes each last value as its model (one trade, quote and bar, and nothing else came).
            let models = Self.kinds(try await run(["--sdk", "alpaca-py", "--port", "\(port)", "--symbols", "AAPL", "--want", "1"]))
            #expect(models["trades"]?.first?["price"] as? Double == 187.25, "\(models)")
            #expect(models["quotes"]?.first?["type"] as? String == "alpaca.data.models.quotes.Quote", "\(models)")
            #expect(models["bars"]?.first?["type"] as? String == "alpaca.data.models.bars.Bar", "\(models)")
        }
    }

    @Test func connectionLimitsAreAnsweredWithAlpacas406InTheConnectionsCodec() async throws {
        try await withAlpacaRelay(publishing: false, perAddress: 2) { port, _ in
            // A key over its limit: 406 after its auth, then the close.
            let first = WSTestClient(url: "ws://127.0.0.1:\(port)/v2/iex")
            _ = try await first.nextFrame()
            first.send(#"{"action":"auth","key":"single-key","secret":"x"}"#)
            #expect(try await first.nextFrame() == #"[{"T":"success","msg":"authenticated"}]"#)
            let second = WSTestClient(url: "ws://127.0.0.1:\(port)/v2/iex")
            _ = try await second.nextFrame()
            second.send(#"{"action":"auth","key":"single-key","secret":"x"}"#)
            let limited = try await second.nextFrame()
            #expect(limited.hasPrefix(#"[{"T":"error","code":406,"msg":"connection limit exceeded: Maximum number of websocket connections exceeded for key \"single\" (1)."#), "\(limited)")
            #expect(try await second.waitForClose() == 1008)
            // The address over its limit (two, the first client still open): refused at the upgrade,
            // as Alpaca's own connected and 406.
            let holder = WSTestClient(url: "ws://127.0.0.1:\(port)/v2/iex")
            _ = try await holder.nextFrame()
            let third = WSTestClient(url: "ws://127.0.0.1:\(port)/v2/iex")
            #expect(try await third.nextFrame() == #"[{"T":"success","msg":"connected"}]"#)
            let refused = try await third.nextFrame()
            #expect(refused.hasPrefix(#"[{"T":"error","code":406,"msg":"connection limit exceeded: Maximum number of websocket connections exceeded (2 per address)"#), "\(refused)")
            #expect(try await third.waitForClose() == 1008)
            await first.close()
            await holder.close()
        }
    }

    /// The sign-in deadline (5 s here): a client that never authenticates is told Alpaca's 404 and closed;
    /// one that authenticated in time is not, and later ones get their own full 5 s.
    @Test func aClientThatNeverAuthenticatesGets404ThenTheClose() async throws {
        try await withAlpacaRelay(publishing: false) { port, _ in
            let silent = WSTestClient(url: "ws://127.0.0.1:\(port)/v2/iex")
            _ = try await silent.nextFrame()
            let started = ContinuousClock.now
            let signedIn = WSTestClient(url: "ws://127.0.0.1:\(port)/v2/iex")
            _ = try await signedIn.nextFrame()
            signedIn.send(#"{"action":"auth","key":"client-key","secret":"x"}"#)
            #expect(try await signedIn.nextFrame() == #"[{"T":"success","msg":"authenticated"}]"#)
            #expect(try await silent.nextFrame(timeout: .seconds(10)) == #"[{"T":"error","code":404,"msg":"auth timeout"}]"#)
            #expect(try await silent.waitForClose() == 1008)
            #expect(ContinuousClock.now - started >= .seconds(4), "not before its deadline")
            // The one that signed in is served still.
            signedIn.send(#"{"action":"subscribe","trades":["AAPL"]}"#)
            #expect(try await signedIn.nextFrame().contains(#""T":"subscription""#))
            await signedIn.close()
        }
    }

    @Test func anOutageNoticeGoesPastTheSDKsWithoutAWord() async throws {
        try await withAlpacaRelay { port, hub in
            let outage = Task {
                try? await Task.sleep(for: .milliseconds(800))
                await hub.upstreamLost(reason: "a test")
            }
            defer { outage.cancel() }
            let python = try #require(alpacaPython)
            let result = try await runPython(Self.script, ["--sdk", "alpaca-py", "--port", "\(port)", "--want", "25"], timeout: .seconds(60), python: python)
            #expect(result.status == 0, "events went on after the notice: \(result.output.suffix(2000))")
            #expect(!result.output.contains("ERROR") && !result.output.contains("Traceback"), "\(result.output.suffix(2000))")
        }
    }

    @Test func aWrongKeyFailsTheSDKsAuthAndItsRetriesDoNotLockTheAddressOut() async throws {
        try await withAlpacaRelay { port in
            let python = try #require(alpacaPython)
            let refused = try await runPython(
                Self.script, ["--sdk", "alpaca-py", "--port", "\(port)", "--key", "wrong", "--seconds", "3"], timeout: .seconds(30), python: python)
            #expect(refused.status != 0)
            #expect(refused.output.contains("auth failed"), "\(refused.output.suffix(2000))")
            // alpaca-trade-api retries every 10 ms without closing its sockets.
            let storm = try await runPython(
                Self.script, ["--sdk", "alpaca-trade-api", "--port", "\(port)", "--key", "wrong", "--seconds", "3"], timeout: .seconds(30),
                python: python)
            #expect(storm.status != 0 && storm.output.contains("auth failed"), "\(storm.output.suffix(2000))")
            // The address is not locked out: the right key is served at once afterwards.
            let served = Self.kinds(try await run(["--sdk", "alpaca-py", "--port", "\(port)"]))
            #expect((served["trades"]?.count ?? 0) >= 3)
        }
    }

    @Test func aClientTooSlowForTheDisconnectPolicyGets407ThenTheClose() async throws {
        try await withAlpacaRelay(policy: .disconnect) { port, hub in
            let client = WSTestClient(url: "ws://127.0.0.1:\(port)/v2/iex")
            _ = try await client.nextFrame()
            client.send(#"{"action":"auth","key":"client-key","secret":"any"}"#)
            _ = try await client.nextFrame()
            client.send(#"{"action":"subscribe","quotes":["*"]}"#)
            _ = try await client.nextFrame()
            client.pause()
            // Far more than the socket holds and the buffer's 1,000 events on top.
            let now = Int64(Date().timeIntervalSince1970 * 1e9)
            for round in 0..<60 {
                await hub.publish((0..<1_000).map { AlpacaEvents.quote("Z\(round)", bid: 1, ask: 2, size: Double($0), nanoseconds: now) })
            }
            client.resume()
            var last = ""
            while let frame = try? await client.nextFrame(timeout: .seconds(10)) { last = frame }
            #expect(last == #"[{"T":"error","code":407,"msg":"slow client: this connection's buffer of 1000 events was full"}]"#, "\(last.prefix(300))")
            #expect(client.closeCode == 1013)
        }
    }

    @Test func aKeyWithoutTheSymbolGets409AndNothingOfIt() async throws {
        try await withAlpacaRelay { port in
            let python = try #require(alpacaPython)
            // alpaca-py logs the error (as for Alpaca's own 409) and gets nothing of MSFT.
            let refused = try await runPython(
                Self.script, ["--sdk", "alpaca-py", "--port", "\(port)", "--key", "apple-key", "--symbols", "MSFT", "--seconds", "4"],
                timeout: .seconds(40), python: python)
            #expect(refused.status != 0 && refused.output.contains("insufficient subscription (409)"), "\(refused.output.suffix(2000))")
            #expect(!refused.output.contains("\"symbol\": \"MSFT\""))
            let allowed = Self.kinds(try await run(["--sdk", "alpaca-py", "--port", "\(port)", "--key", "apple-key", "--symbols", "AAPL"]))
            #expect((allowed["trades"]?.count ?? 0) >= 3, "the same key on its own symbol")
        }
    }

    /// A symbol the session subscribed after its first resumes whole too. The session's position may be
    /// before that subscribe (the client acknowledged nothing past the margin since), and the relay
    /// holds the symbol's history whole only from its subscribe (it was received before, for nobody):
    /// the symbol resumes from where it was added.
    @Test func aSymbolSubscribedLaterInATaggedSessionResumesWhole() async throws {
        try await withAlpacaRelay(history: HistoryLimits()) { port, _ in
            func connect(_ symbols: String) async throws -> WSTestClient {
                let client = WSTestClient(url: "ws://127.0.0.1:\(port)/v2/iex")
                _ = try await client.nextFrame()
                client.send(#"{"action":"auth","key":"client-key#later","secret":"any"}"#)
                #expect(try await client.nextFrame().contains("authenticated"))
                client.send(#"{"action":"subscribe","trades":[\#(symbols)]}"#)
                return client
            }
            /// The `_s` of `symbol`'s trades until `count` are seen, and every relay status on the way.
            func positions(_ client: WSTestClient, _ symbol: String, count: Int) async throws -> (seen: [Int64], statuses: [String]) {
                var seen: [Int64] = []
                var statuses: [String] = []
                while seen.count < count {
                    let frame = try JSONSerialization.jsonObject(with: Data(try await client.nextFrame().utf8)) as? [[String: Any]] ?? []
                    seen += frame.filter { $0["T"] as? String == "t" && $0["S"] as? String == symbol }.compactMap { ($0["_s"] as? NSNumber)?.int64Value }
                    statuses += frame.filter { $0["T"] as? String == "relay" }.compactMap { $0["status"] as? String }
                }
                return (seen, statuses)
            }
            let first = try await connect(#""AAPL""#)
            _ = try await positions(first, "AAPL", count: 3)
            first.send(#"{"action":"subscribe","trades":["MSFT"]}"#)
            let before = try await positions(first, "MSFT", count: 5).seen
            await first.close()
            // Trades go on while nobody holds the session.
            try await Task.sleep(for: .milliseconds(300))
            let second = try await connect(#""AAPL","MSFT""#)
            let (after, statuses) = try await positions(second, "MSFT", count: 20)
            await second.close()
            #expect(!statuses.contains("gap"), "MSFT resumed whole: \(statuses)")
            let last = try #require(before.max())
            #expect(try #require(after.first) <= last + 1, "resumed at or before where it broke: \(before.suffix(3)) then \(after.prefix(3))")
            let all = Set(before + after)
            #expect(all == Set((before.min() ?? 0)...(after.max() ?? 0)), "no position missing across the break")
        }
    }

    @Test func aTaggedSessionResumesWhereItBrokeWithContiguousPositions() async throws {
        try await withAlpacaRelay(history: HistoryLimits()) { port, _ in
            func connect() async throws -> WSTestClient {
                let client = WSTestClient(url: "ws://127.0.0.1:\(port)/v2/iex")
                _ = try await client.nextFrame()
                client.send(#"{"action":"auth","key":"client-key#desk","secret":"any"}"#)
                #expect(try await client.nextFrame().contains("authenticated"))
                client.send(#"{"action":"subscribe","trades":["AAPL"]}"#)
                return client
            }
            func positions(_ client: WSTestClient, count: Int) async throws -> [Int64] {
                var seen: [Int64] = []
                while seen.count < count {
                    let frame = try JSONSerialization.jsonObject(with: Data(try await client.nextFrame().utf8)) as? [[String: Any]] ?? []
                    seen += frame.filter { $0["T"] as? String == "t" }.compactMap { ($0["_s"] as? NSNumber)?.int64Value }
                }
                return seen
            }
            let first = try await connect()
            let before = try await positions(first, count: 10)
            await first.close()
            // Trades go on while nobody holds the session.
            try await Task.sleep(for: .milliseconds(300))
            let second = try await connect()
            let after = try await positions(second, count: 30)
            await second.close()
            let last = try #require(before.max())
            #expect(try #require(after.first) <= last + 1, "resumed at or before where it broke: \(before.suffix(3)) then \(after.prefix(3))")
            let all = Set(before + after)
            #expect(all == Set((before.min() ?? 0)...(after.max() ?? 0)), "no position missing across the break")
        }
    }
}
