import DemoFeed
import Foundation
import PolygonWire
import RelayComposition
import RelayConfiguration
import RelayServer
import Testing

/// Derived bars through the whole relay: the demo feed on loopback as the upstream, real WebSocket
/// clients downstream. A client that holds a symbol's trades and its 2-second bars can check each bar
/// against the trades it saw; the upstream is asked for the trades, never for the derived topic;
/// Polygon's Python client and alpaca-py take the bars as their own models.
@Suite("Derived bars end to end", .serialized, .timeLimit(.minutes(3)))
struct DerivedBarsEndToEndTests {
    func withRelay(alpaca: Bool = false, _ body: (_ port: Int, _ feed: DemoFeed) async throws -> Void) async throws {
        var feedConfiguration = DemoFeedConfiguration(port: 0, apiKey: "demo-key", eventsPerSecond: 1000, tickInterval: .milliseconds(10), seed: 7)
        feedConfiguration.alpaca = alpaca
        feedConfiguration.markets = [.stocks]
        let feed = DemoFeed(configuration: feedConfiguration, logger: testLogger)
        try await withServices([feed]) {
            var tuning = fastUpstreamTuning()
            tuning.barGrace = .milliseconds(300)
            var settings = RelaySettings(
                listen: .init(host: "127.0.0.1", port: 0), upstreamKey: "demo-key", clientKeys: ["client-key"], upstreamTuning: tuning)
            // A key with the vendor's bars and no trades: a derived bar (one trade's, at @1t) is not its to take.
            settings.clientKeyRights = [try ClientKey(name: "bars-only", secret: "bars-key", topics: ["AM.*", "A.*", "b.*"])]
            settings.vendors = Relay.vendors
            settings.upstreams = [try MarketUpstream(url: try await feed.url(for: .stocks), vendors: Relay.vendors)]
            if alpaca { settings.upstreamSecret = "demo-secret" }
            settings.portfolio = nil
            let relay = Relay(settings: settings, logger: testLogger)
            try await withServices([relay]) {
                let parts = try await within(.seconds(10), "the relay to start") { try await relay.ready() }
                try await waitFor(try #require(parts.upstreams[.stocks]).stateUpdates(), "the upstream to authenticate") { $0 == .authenticated }
                try await body(parts.port, feed)
            }
        }
    }

    struct SeenTrade {
        let time: Int64
        let price: Double
        let size: Double
    }

    @Test func eachBarEqualsTheTradesOfItsWindowAndTheUpstreamIsAskedForTradesOnly() async throws {
        try await withRelay { port, feed in
            let started = WallClock.nowMilliseconds()
            let client = try await WSTestClient.authenticated(url: "ws://127.0.0.1:\(port)/stocks")
            client.send(#"{"action":"subscribe","params":"T.AAPL,AM.AAPL@2s"}"#)
            var trades: [SeenTrade] = []
            var bars: [[String: Any]] = []
            let deadline = ContinuousClock.now + .seconds(40)
            while bars.count < 5, ContinuousClock.now < deadline {
                let frame = try await client.nextFrame()
                for object in try JSONSerialization.jsonObject(with: Data(frame.utf8)) as? [[String: Any]] ?? [] {
                    switch object["ev"] as? String {
                    case "T":
                        if let time = object["t"] as? Int64, let price = object["p"] as? Double, let size = object["s"] as? Double {
                            trades.append(SeenTrade(time: time, price: price, size: size))
                        }
                    case "AM": bars.append(object)
                    default: break
                    }
                }
            }
            #expect(bars.count >= 5, "five bars within 40 s: \(bars.count)")
            #expect(bars.allSatisfy { $0["sym"] as? String == "AAPL@2s" })
            // The first bar may have begun before this client's trades did: the later ones are whole.
            for bar in bars.dropFirst() {
                let start = try #require(bar["s"] as? Int64)
                let end = try #require(bar["e"] as? Int64)
                #expect(end - start == 2000 && start % 2000 == 0, "a window of 2 s on the clock: \(bar)")
                let inside = trades.filter { $0.time >= start && $0.time < end }
                guard let first = inside.first, let last = inside.last else {
                    Issue.record("a bar with no trade in its window: \(bar)")
                    continue
                }
                #expect(bar["o"] as? Double == first.price && bar["c"] as? Double == last.price, "\(bar)")
                #expect(bar["h"] as? Double == inside.map(\.price).max() && bar["l"] as? Double == inside.map(\.price).min(), "\(bar)")
                #expect(bar["v"] as? Double == inside.map(\.size).reduce(0, +) && bar["n"] as? Int == inside.count, "\(bar)")
            }
            let subscribed = Set(feed.monitor.snapshot.topics(.subscribe))
            #expect(subscribed.contains("T.AAPL") && !subscribed.contains { $0.contains("@") }, "\(subscribed)")
            // A size that is none, a trade topic with a size, another market's symbol, a ninth size of one
            // symbol: each a clear error; the connection lives.
            client.send(#"{"action":"subscribe","params":"AM.AAPL@7x,T.MSFT@5m,AM.X:BTC-USD@1m"}"#)
            let error = try await client.waitForStatus("error")
            let message = error.fields["message"] as? String ?? ""
            #expect(message.contains("AM.AAPL@7x") && message.contains("T.MSFT@5m") && message.contains("AM.X:BTC-USD@1m"), "\(message)")
            client.send(#"{"action":"subscribe","params":"AM.MSFT@1s,AM.MSFT@2s,AM.MSFT@3s,AM.MSFT@4s,AM.MSFT@5s,AM.MSFT@6s,AM.MSFT@7s,AM.MSFT@8s,AM.MSFT@9s"}"#)
            let ninth = try await client.waitForStatus("error")
            #expect((ninth.fields["message"] as? String)?.contains("AM.MSFT@9s (a connection holds at most 8 bar sizes of one symbol") == true, "\(ninth.fields)")
            // A wildcard of the vendor's bars does not take the relay's, and does not stop them being built.
            let wild = try await WSTestClient.authenticated(url: "ws://127.0.0.1:\(port)/stocks")
            wild.send(#"{"action":"subscribe","params":"AM.*"}"#)
            _ = try await wild.waitForStatus("success")
            var more = 0
            while more < 2 {
                let frame = try await client.nextFrame()
                more += frame.components(separatedBy: #""sym":"AAPL@2s""#).count - 1
            }
            wild.send(#"{"action":"unsubscribe","params":"AM.*"}"#)
            var wildFrames: [String] = []
            while let frame = try? await wild.nextFrame(timeout: .milliseconds(300)) { wildFrames.append(frame) }
            #expect(!wildFrames.joined().contains("@"), "the wildcard got a derived bar: \(wildFrames.joined().prefix(300))")
            await wild.close()
            await client.close()
            // The key without trades may not take a bar built from them.
            let barsOnly = try await WSTestClient.authenticated(url: "ws://127.0.0.1:\(port)/stocks", key: "bars-key")
            barsOnly.send(#"{"action":"subscribe","params":"AM.AAPL@1t"}"#)
            let refused = try await barsOnly.waitForStatus("error")
            #expect((refused.fields["message"] as? String)?.contains("AM.AAPL@1t") == true, "\(refused.fields)")
            // Nor by the wildcard's resume (its replay, or the last values after a gap), nor as a last value.
            barsOnly.send(#"{"action":"subscribe","params":"AM.*","sinceTime":\#(started)}"#)
            let resumed = try await barsOnly.waitForStatus(StatusMessage.Kind.resumed, timeout: .seconds(30))
            let derived = resumed.eventsBefore.filter { $0.ticker.contains("@") }.map(\.ticker)
            #expect(derived.isEmpty, "a wildcard's resume replayed derived bars: \(Set(derived))")
            await barsOnly.close()
            let last = try await httpGet("http://127.0.0.1:\(port)/v1/last/AM.AAPL@2s", key: "bars-key")
            #expect(last.status == 403 && last.body.contains("T.AAPL"), "\(last)")
            #expect(try await httpGet("http://127.0.0.1:\(port)/v1/last/AM.AAPL@2s", key: "client-key").status == 200)
        }
    }

    /// A trade stamped in 1970, or 59 minutes ago, right after the bars were reset (a malformed
    /// message): not counted (from before the reset), so no window opens that long ago and no
    /// zero-volume bar is made for every second since.
    @Test func aTradeStampedLongAgoOpensNoWindowThenAndFloodsNothing() async throws {
        try await withRelay { port, feed in
            let client = try await WSTestClient.authenticated(url: "ws://127.0.0.1:\(port)/stocks")
            client.send(#"{"action":"subscribe","params":"AM.AAPL@1sz"}"#)
            _ = try await client.waitForStatus("success")
            // Its first whole bar, then a reset and the ancient trade.
            var bars = 0
            while bars < 1 {
                bars += try await client.nextFrame().components(separatedBy: #""ev":"AM""#).count - 1
            }
            #expect(feed.inject(.malformed) == 1)
            #expect(feed.inject(.ancient) == 1)
            #expect(feed.inject(.malformed) == 1)
            #expect(feed.inject(.stale) == 1)
            let hourAgo = Int64(Date().timeIntervalSince1970 * 1000) - 60_000
            var starts: [Int64] = []
            let until = ContinuousClock.now + .seconds(3)
            while ContinuousClock.now < until, let frame = try? await client.nextFrame(timeout: until - .now) {
                for event in try JSONSerialization.jsonObject(with: Data(frame.utf8)) as? [[String: Any]] ?? [] where event["ev"] as? String == "AM" {
                    starts.append((event["s"] as? NSNumber)?.int64Value ?? 0)
                }
            }
            #expect(!starts.isEmpty, "bars go on")
            #expect(starts.allSatisfy { $0 > hourAgo }, "\(starts.filter { $0 <= hourAgo }.count) bars of long ago")
            #expect(starts.count < 20, "\(starts.count) bars in 3 s")
            await client.close()
        }
    }

    @Test(.enabled(if: pythonClientAvailable, "python3 -m pip install -r Tests/Interop/requirements.txt"))
    func polygonsPythonClientTakesThemAsEquityAggs() async throws {
        try await withRelay { port, _ in
            let result = try await runPythonClient(["--port", "\(port)", "--key", "client-key", "--subscribe", "AM.AAPL@1s", "--count", "3"])
            #expect(result.status == 0, "\(result.output)")
            #expect(result.output.contains(#""topics": ["AM.AAPL@1s"]"#), "\(result.output)")
        }
    }

    @Test(.enabled(if: alpacaSDKsAvailable, "scripts/test installs Alpaca's SDKs"))
    func alpacaPyTakesThemAsBars() async throws {
        try await withRelay(alpaca: true) { port, feed in
            let python = try #require(alpacaPython)
            let result = try await runPython(
                AlpacaDownstreamTests.script, ["--sdk", "alpaca-py", "--bars-only", "--port", "\(port)", "--symbols", "AAPL@1s", "--want", "3"],
                timeout: .seconds(60), python: python)
            #expect(result.status == 0, "\(result.output.suffix(2000))")
            let bars = AlpacaDownstreamTests.kinds(AlpacaDownstreamTests.lastJSON(result.output))["bars"] ?? []
            #expect(bars.count >= 3 && bars.allSatisfy { $0["type"] as? String == "alpaca.data.models.bars.Bar" && $0["symbol"] as? String == "AAPL@1s" }, "\(bars)")
            let subscribed = Set(feed.monitor.snapshot.topics(.subscribe))
            #expect(subscribed.contains("t.AAPL") && !subscribed.contains { $0.contains("@") }, "\(subscribed)")
        }
    }
}

/// On a cluster the leader builds each derived bar once, from its upstream's trades, and publishes it:
/// clients on every node get the same bar at the same position.
@Suite(
    "Derived bars on a cluster", .serialized, .timeLimit(.minutes(3)),
    .enabled(if: ClusterHarness.enabled, "nats-server is not installed (scripts/test installs it)"))
struct DerivedBarsClusterTests {
    /// The next `count` derived bars a client reads, keyed by their start.
    func bars(_ client: WSTestClient, count: Int) async throws -> [Int64: [String: Any]] {
        var bars: [Int64: [String: Any]] = [:]
        let deadline = ContinuousClock.now + .seconds(40)
        while bars.count < count, ContinuousClock.now < deadline {
            let frame = try await client.nextFrame()
            for object in try JSONSerialization.jsonObject(with: Data(frame.utf8)) as? [[String: Any]] ?? [] where object["ev"] as? String == "AM" {
                if let start = object["s"] as? Int64 { bars[start] = object }
            }
        }
        return bars
    }

    @Test func everyNodeSendsTheLeadersBarsAtTheSamePositions() async throws {
        try await ClusterHarness.with(nodes: 2, feedRate: 2000) { cluster in
            let leader = try await cluster.agreedLeader()
            let follower = try #require(cluster.nodeIDs.first { $0 != leader })
            let onLeader = try await WSTestClient.authenticated(url: try cluster.url(leader))
            let onFollower = try await WSTestClient.authenticated(url: try cluster.url(follower))
            onLeader.send(#"{"action":"subscribe","params":"AM.AAPL@1s"}"#)
            onFollower.send(#"{"action":"subscribe","params":"AM.AAPL@1s"}"#)
            let leaderBars = try await bars(onLeader, count: 6)
            let followerBars = try await bars(onFollower, count: 6)
            let common = Set(leaderBars.keys).intersection(followerBars.keys)
            #expect(common.count >= 3, "both saw the same bars: \(leaderBars.keys.sorted()) and \(followerBars.keys.sorted())")
            for start in common {
                let a = try #require(leaderBars[start])
                let b = try #require(followerBars[start])
                #expect(NSDictionary(dictionary: a).isEqual(to: b), "the same bar, fields and positions: \(a) and \(b)")
                #expect(a["sym"] as? String == "AAPL@1s" && a["_s"] != nil, "\(a)")
            }
            let subscribed = Set(cluster.feed.monitor.snapshot.topics(.subscribe))
            #expect(subscribed.contains("T.AAPL") && !subscribed.contains { $0.contains("@") }, "\(subscribed)")
            await onLeader.close()
            await onFollower.close()
        }
    }
}
