#if canImport(Glibc)
    import Glibc
#endif
import AlpacaWire
import DemoFeed
import Foundation
import MarketCore
import RelayComposition
import RelayConfiguration
import Synchronization
import Testing
import Upstream

/// Alpaca's news stream through the whole relay: the demo feed in Alpaca's protocol on loopback as the
/// upstream (`/v1beta1/news`, its stories sent when the test says), real WebSocket clients and Alpaca's
/// SDKs downstream.
@Suite("Alpaca news end to end", .serialized, .timeLimit(.minutes(4)))
struct AlpacaNewsEndToEndTests {
    func withNewsRelay(
        snapshot: Bool = false, resumeMarginBytes: Int? = nil, adjust: (inout RelaySettings) -> Void = { _ in },
        _ body: (_ port: Int, _ feed: DemoFeed, _ upstream: UpstreamClient) async throws -> Void
    ) async throws {
        var feedConfiguration = DemoFeedConfiguration(port: 0, apiKey: "demo-key", eventsPerSecond: 100, seed: 7)
        feedConfiguration.alpaca = true
        feedConfiguration.markets = [.news]
        // No story of its own: each one is the test's.
        feedConfiguration.newsInterval = .seconds(3600)
        let feed = DemoFeed(configuration: feedConfiguration, logger: testLogger)
        try await withServices([feed]) {
            var settings = RelaySettings(
                listen: .init(host: "127.0.0.1", port: 0), upstreamKey: "demo-key", clientKeys: ["client-key"], upstreamTuning: fastUpstreamTuning())
            settings.vendors = Relay.vendors
            settings.upstreams = [try MarketUpstream(url: try await feed.url(for: .news), vendors: Relay.vendors)]
            settings.upstreamSecret = "demo-secret"
            settings.news.snapshot = snapshot
            if let resumeMarginBytes { settings.resume.marginBytes = resumeMarginBytes }
            settings.portfolio = nil
            settings.tape = nil
            adjust(&settings)
            let relay = Relay(settings: settings, logger: testLogger)
            try await withServices([relay]) {
                let parts = try await within(.seconds(10), "the relay to start") { try await relay.ready() }
                let upstream = try #require(parts.upstreams[.news])
                try await waitFor(upstream.stateUpdates(), "the upstream to authenticate") { $0 == .authenticated }
                try await body(parts.port, feed, upstream)
            }
        }
    }

    /// A JSON client of the news stream, authenticated and subscribed to `symbols`.
    func newsClient(_ port: Int, key: String = "client-key", _ symbols: [String]) async throws -> WSTestClient {
        let client = WSTestClient(url: "ws://127.0.0.1:\(port)/v1beta1/news")
        #expect(try await client.nextFrame() == #"[{"T":"success","msg":"connected"}]"#)
        client.send(#"{"action":"auth","key":"\#(key)","secret":"any"}"#)
        #expect(try await client.nextFrame() == #"[{"T":"success","msg":"authenticated"}]"#)
        let list = symbols.map { "\"\($0)\"" }.joined(separator: ",")
        client.send(#"{"action":"subscribe","news":[\#(list)]}"#)
        let reply = try await client.nextFrame()
        #expect(reply.hasPrefix(#"[{"T":"subscription","news":["#), "\(reply.prefix(200))")
        return client
    }

    /// The next frame's elements.
    func elements(_ client: WSTestClient, timeout: Duration = .seconds(10)) async throws -> [[String: Any]] {
        let frame = try await client.nextFrame(timeout: timeout)
        return try JSONSerialization.jsonObject(with: Data(frame.utf8)) as? [[String: Any]] ?? []
    }

    /// News items until one with `id` (itself included), in order; relay notices are kept too.
    func items(_ client: WSTestClient, through id: Int64, timeout: Duration = .seconds(10)) async throws -> [[String: Any]] {
        var seen: [[String: Any]] = []
        let deadline = ContinuousClock.now + timeout
        while true {
            let frame = try await elements(client, timeout: deadline - .now)
            seen += frame
            if frame.contains(where: { ($0["id"] as? NSNumber)?.int64Value == id }) { return seen }
        }
    }

    /// The ids of the items among `elements`, probes left out.
    func ids(_ elements: [[String: Any]]) -> [Int64] {
        elements.filter { $0["headline"] as? String != "probe" }.compactMap { ($0["id"] as? NSNumber)?.int64Value }
    }

    /// Publishes probe stories naming `symbol` until `client` gets one: the relay's upstream holds it.
    func probe(_ feed: DemoFeed, _ client: WSTestClient, symbol: String) async throws {
        let deadline = ContinuousClock.now + .seconds(15)
        while ContinuousClock.now < deadline {
            let (id, connections) = feed.publishNews(symbols: [symbol], headline: "probe")
            if connections > 0 {
                _ = try await items(client, through: id, timeout: deadline - .now)
                return
            }
            try await Task.sleep(for: .milliseconds(50))
        }
        throw TimeoutError(description: "no upstream connection took \(symbol)'s news within 15 s")
    }

    @Test func eachClientGetsEachItemOnceIfItHoldsAnyOfItsSymbolsOrTheWildcard() async throws {
        try await withNewsRelay { port, feed, _ in
            let both = try await newsClient(port, ["AAPL", "TSLA"])
            let other = try await newsClient(port, ["MSFT"])
            let everything = try await newsClient(port, ["*"])
            // Each subscription has reached the upstream (probes go to `*` too, and are left out below).
            try await probe(feed, everything, symbol: "PROBE")
            try await probe(feed, both, symbol: "AAPL")
            try await probe(feed, both, symbol: "TSLA")
            try await probe(feed, other, symbol: "MSFT")
            let pair = feed.publishNews(symbols: ["AAPL", "TSLA"], headline: "Two companies").id
            let tesla = feed.publishNews(symbols: ["TSLA"]).id
            let microsoft = feed.publishNews(symbols: ["MSFT"]).id
            let global = feed.publishNews(symbols: [], headline: "The economy").id

            let onBoth = try await items(both, through: tesla)
            #expect(ids(onBoth) == [pair, tesla], "the pair's story once, then Tesla's: \(ids(onBoth))")
            let story = try #require(onBoth.first)
            #expect(story["T"] as? String == "n" && story["headline"] as? String == "Two companies")
            #expect(story["symbols"] as? [String] == ["AAPL", "TSLA"] && story["author"] as? String == "Demo Desk")
            let created = try #require(story["created_at"] as? String)
            #expect(created.hasSuffix("Z") && created.count >= 20, "RFC 3339 in JSON: \(created)")

            #expect(ids(try await items(other, through: microsoft)) == [microsoft], "nothing of AAPL or TSLA")
            let all = ids(try await items(everything, through: global))
            #expect(all == [pair, tesla, microsoft, global], "the wildcard: every story once, one naming no symbol too: \(all)")

            // The upstream was asked for the wildcard (it replaces the symbols), in Alpaca's own words.
            let asked = feed.monitor.snapshot.topics(.subscribe)
            #expect(asked.contains("n.*"), "\(asked)")
            await both.close()
            await other.close()
            await everything.close()
        }
    }

    /// A relay whose `/v1/last/news/n.AAPL` holds a story of `size` bytes, with the keep-alive
    /// `timeout`: `body` gets its port and the path.
    func withLargeStory(size: Int, timeout: Duration, _ body: (Int, String) async throws -> Void) async throws {
        // With the snapshot on, the hub keeps each symbol's last story (what `/v1/last` answers from).
        try await withNewsRelay(snapshot: true, adjust: {
            $0.news.maxBytes = 16 << 20
            $0.connectionLimits.keepAliveTimeout = timeout
        }) { port, feed, _ in
            let client = try await newsClient(port, ["AAPL"])
            try await probe(feed, client, symbol: "AAPL")
            let large = feed.publishNews(symbols: ["AAPL"], contentBytes: size).id
            _ = try await items(client, through: large, timeout: .seconds(20))
            try await body(port, "/v1/last/news/n.AAPL")
            await client.close()
        }
    }

    /// A story of 15 MiB asked for over HTTP by a client that never reads: the relay closes the
    /// connection within the keep-alive timeout of the client's last taking anything, rather than hold
    /// the answer and the request for as long as the socket stays open. A client that reads gets it
    /// whole.
    @Test func aClientThatStopsReadingALargeAnswerIsClosed() async throws {
        let size = 15 << 20
        try await withLargeStory(size: size, timeout: .seconds(1)) { port, path in
            let whole = try await httpGet("http://127.0.0.1:\(port)\(path)", key: "client-key")
            #expect(whole.status == 200 && whole.body.utf8.count > size, "a client that reads gets the whole story: \(whole.status), \(whole.body.utf8.count) bytes")

            let stalled = try RawSocket(port: port, receiveBuffer: 2048)
            stalled.send("GET \(path) HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer client-key\r\n\r\n")
            // Reads nothing for three timeouts (the time passing is what is tested), then all it can.
            try await Task.sleep(for: .seconds(3))
            stalled.setTimeout(.milliseconds(200))
            var received = 0
            var ended = false
            let deadline = ContinuousClock.now + .seconds(20)
            while ContinuousClock.now < deadline, !ended {
                if let bytes = stalled.receive(max: 1 << 20) {
                    received += bytes.count
                    ended = bytes.isEmpty
                } else if errno != EAGAIN, errno != EWOULDBLOCK, errno != EINTR {
                    ended = true
                }
            }
            #expect(ended && received < size / 2, "closed with what the sockets held (\(received) bytes), not the rest sent on")
        }
    }

    /// A client that reads a 15 MiB answer slowly (512 KiB a tenth of a second through a 2 KiB receive
    /// buffer: about three seconds, more than the 2 s keep-alive timeout) is not closed while it reads.
    @Test func aSlowReaderOfALargeAnswerIsNotClosedWhileItReads() async throws {
        let size = 15 << 20
        try await withLargeStory(size: size, timeout: .seconds(2)) { port, path in
            let slow = try RawSocket(port: port, receiveBuffer: 2048)
            let ask = "GET \(path) HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer client-key\r\n\r\n"
            slow.send(ask)
            slow.setTimeout(.milliseconds(200))
            var taken = 0
            var closed = false
            let until = ContinuousClock.now + .seconds(60)
            while taken <= size, !closed, ContinuousClock.now < until {
                var chunk = 0
                while chunk < 512 << 10, taken + chunk <= size, !closed, ContinuousClock.now < until {
                    if let bytes = slow.receive(max: 64 << 10) {
                        chunk += bytes.count
                        closed = bytes.isEmpty
                    } else if errno != EAGAIN, errno != EWOULDBLOCK, errno != EINTR {
                        closed = true
                    }
                }
                taken += chunk
                // The pace is what is tested.
                try await Task.sleep(for: .milliseconds(100))
            }
            #expect(taken > size && !closed, "a slow reader is not closed while it reads: \(taken) bytes, closed: \(closed)")
        }
    }

    @Test func aThreeMiBItemGoesThroughAndAFiveMiBOneIsRefusedAndToldWithNothingElseLost() async throws {
        try await withNewsRelay { port, feed, upstream in
            let client = try await newsClient(port, ["AAPL"])
            try await probe(feed, client, symbol: "AAPL")
            let large = feed.publishNews(symbols: ["AAPL"], contentBytes: 3 << 20).id
            let got = try await items(client, through: large, timeout: .seconds(20))
            let item = try #require(got.first { ($0["id"] as? NSNumber)?.int64Value == large })
            #expect((item["content"] as? String)?.utf8.count == 3 << 20, "the whole 3 MiB content")

            _ = feed.publishNews(symbols: ["AAPL"], contentBytes: 5 << 20)
            let after = feed.publishNews(symbols: ["AAPL"], headline: "After the large one").id
            let next = try await items(client, through: after, timeout: .seconds(20))
            let notice = try #require(next.first { $0["T"] as? String == "relay" }, "the client is told: \(next.map { $0["T"] ?? "" })")
            #expect(notice["status"] as? String == "lagging")
            let message = notice["msg"] as? String ?? ""
            #expect(message.contains("1 event was lost") && message.contains("over this market's limit of 4194304"), "\(message)")
            #expect(ids(next) == [after], "the item after it arrives: \(ids(next))")
            let statistics = upstream.statistics
            #expect(statistics.oversizedMessages == 1 && statistics.connectAttempts == 1, "counted, and the connection kept: \(statistics)")
            #expect(client.closeCode == nil)
            await client.close()

            // alpaca-py, with its WebSocket's message limit raised past 1 MiB, takes a 3 MiB story as its model.
            let publisher = Task {
                while !Task.isCancelled {
                    feed.publishNews(symbols: ["AAPL"], contentBytes: 3 << 20)
                    try? await Task.sleep(for: .milliseconds(300))
                }
            }
            defer { publisher.cancel() }
            let result = try await AlpacaDownstreamTests().run([
                "--sdk", "alpaca-py", "--news", "--port", "\(port)", "--symbols", "AAPL", "--want", "2", "--max-size", "\(8 << 20)",
            ])
            let news = AlpacaDownstreamTests.kinds(result)["news"] ?? []
            #expect(news.count >= 2, "\(result)")
            #expect(news.allSatisfy { $0["type"] as? String == "alpaca.data.models.news.News" && $0["content"] as? Int == 3 << 20 }, "\(news)")
        }
    }

    @Test func alpacaPyAndAlpacaTradeAPITakeItemsAsTheirModelsOnceEach() async throws {
        try await withNewsRelay { port, feed, _ in
            let publisher = Task {
                while !Task.isCancelled {
                    feed.publishNews(symbols: ["AAPL", "TSLA"], headline: "AAPL and TSLA")
                    try? await Task.sleep(for: .milliseconds(200))
                }
            }
            defer { publisher.cancel() }
            let py = AlpacaDownstreamTests.kinds(
                try await AlpacaDownstreamTests().run(["--sdk", "alpaca-py", "--news", "--port", "\(port)", "--symbols", "AAPL", "--want", "3"]))["news"] ?? []
            #expect(py.count >= 3 && py.allSatisfy { $0["type"] as? String == "alpaca.data.models.news.News" }, "\(py)")
            #expect(py.first?["symbols"] as? [String] == ["AAPL", "TSLA"] && py.first?["headline"] as? String == "AAPL and TSLA", "\(py)")
            // alpaca-trade-api calls a handler once per item it receives: two symbols held, each item once.
            let tradeAPI = AlpacaDownstreamTests.kinds(
                try await AlpacaDownstreamTests().run(["--sdk", "alpaca-trade-api", "--news", "--port", "\(port)", "--symbols", "AAPL,TSLA", "--want", "4"]))[
                    "news"] ?? []
            let received = tradeAPI.compactMap { $0["id"] as? Int }
            #expect(received.count >= 4 && Set(received).count == received.count, "each item once: \(received)")
            #expect(tradeAPI.allSatisfy { ($0["type"] as? String)?.hasSuffix("NewsV2") == true }, "\(tradeAPI)")
        }
    }

    /// A story the upstream sends again (the same id and `updated_at`) is not sent again, and the client
    /// turn that held only it still moves a tagged session's position: a resume does not replay it.
    @Test func aRepeatedStoryIsNeitherSentAgainNorReplayedToATaggedSessionsResume() async throws {
        // No margin: the session resumes exactly after what the client's TCP stack acknowledged.
        try await withNewsRelay(resumeMarginBytes: 0) { port, feed, _ in
            let got = try await storyThenResume(port, feed, session: "news") {
                let delivered = { @Sendable () async -> Double in
                    let body = (try? await httpGet("http://127.0.0.1:\(port)/metrics", key: "client-key").body) ?? ""
                    let series = #"relay_events_delivered_total{market="news"} "#
                    return body.split(separator: "\n").first { $0.hasPrefix(series) }.flatMap { $0.split(separator: " ").last }.flatMap { Double($0) } ?? 0
                }
                let before = await delivered()
                #expect(feed.publishLastNewsAgain() == 1)
                // The client's turn took the repeat (counted as delivered to it) and wrote nothing.
                try await eventually("the repeat to reach the client's turn") { await delivered() >= before + 1 }
            }
            #expect(ids(got.items) == [got.marker], "the resume replayed the repeat: \(ids(got.items)) (story \(got.story))")
        }
    }

    /// A resume sends again what the client may not have had (the margin before what its TCP stack
    /// acknowledged), but not a story the broken connection already sent: the news memory goes with
    /// the session.
    @Test func aTaggedSessionsResumeDoesNotSendAStoryTheBrokenConnectionSent() async throws {
        try await withNewsRelay { port, feed, _ in
            let got = try await storyThenResume(port, feed, session: "desk")
            #expect(ids(got.items) == [got.marker], "sent again after the resume: \(ids(got.items)) (story \(got.story))")
        }
    }

    /// A tagged session (`client-key#session`) of AAPL's news takes a story, `between` runs, the
    /// connection breaks and the session resumes; then a marker story. What the resumed connection got
    /// through the marker.
    func storyThenResume(
        _ port: Int, _ feed: DemoFeed, session: String, between: () async throws -> Void = {}
    ) async throws -> (story: Int64, marker: Int64, items: [[String: Any]]) {
        let first = try await newsClient(port, key: "client-key#\(session)", ["AAPL"])
        try await probe(feed, first, symbol: "AAPL")
        let story = feed.publishNews(symbols: ["AAPL"], headline: "Once").id
        _ = try await items(first, through: story)
        try await between()
        await first.close()
        let resumed = try await newsClient(port, key: "client-key#\(session)", ["AAPL"])
        let marker = feed.publishNews(symbols: ["AAPL"], headline: "marker").id
        let got = try await items(resumed, through: marker)
        await resumed.close()
        return (story, marker, got)
    }

    @Test func aSubscriptionGetsTheLastItemOnlyWhenTheRelayIsAskedTo() async throws {
        for snapshot in [false, true] {
            try await withNewsRelay(snapshot: snapshot) { port, feed, _ in
                let first = try await newsClient(port, ["AAPL"])
                try await probe(feed, first, symbol: "AAPL")
                let last = feed.publishNews(symbols: ["AAPL"], headline: "The last one").id
                _ = try await items(first, through: last)
                let late = try await newsClient(port, ["AAPL"])
                // Without the snapshot nothing comes until a story does; its subscription reaches the hub
                // after the reply, so stories go until it takes one. With it, the last story comes alone
                // (a story published meanwhile could be the last one by then).
                let publisher = Task {
                    while !Task.isCancelled && !snapshot {
                        feed.publishNews(symbols: ["AAPL"], headline: "The next one")
                        try? await Task.sleep(for: .milliseconds(50))
                    }
                }
                defer { publisher.cancel() }
                let firstTaken = try #require(try await elements(late).first)
                #expect(firstTaken["headline"] as? String == (snapshot ? "The last one" : "The next one"), "snapshot \(snapshot): \(firstTaken)")
                if snapshot { #expect((firstTaken["id"] as? NSNumber)?.int64Value == last) }
                await first.close()
                await late.close()
            }
        }
    }
}

/// News on a cluster: an item larger than a market event's 64 KiB crosses NATS (whose max_payload the
/// operator raises) to the clients of every node, once per client.
@Suite(
    "Cluster on NATS: Alpaca news", .serialized, .timeLimit(.minutes(3)),
    .enabled(if: ClusterHarness.enabled, "nats-server is not installed (scripts/test installs it)"))
struct AlpacaNewsClusterTests {
    @Test func anItemOfHalfAMebibyteReachesTheClientsOfEveryNode() async throws {
        let config = FileManager.default.temporaryDirectory.appendingPathComponent("nats-news-\(UInt32.random(in: 0...UInt32.max)).conf").path
        try "max_payload: 8MB\n".write(toFile: config, atomically: true, encoding: .utf8)
        defer { try? FileManager.default.removeItem(atPath: config) }
        try await ClusterHarness.with(nodes: 2, feedRate: 100, natsConfig: config, markets: [.news], alpaca: true) { cluster in
            _ = try await cluster.agreedLeader()
            let tests = AlpacaNewsEndToEndTests()
            var clients: [WSTestClient] = []
            for id in cluster.nodeIDs { clients.append(try await tests.newsClient(try cluster.port(id), key: "any-key", ["AAPL","TSLA"])) }
            for client in clients { try await tests.probe(cluster.feed, client, symbol: "AAPL") }
            let large = cluster.feed.publishNews(symbols: ["AAPL", "TSLA"], contentBytes: 512 << 10).id
            let marker = cluster.feed.publishNews(symbols: ["TSLA"], headline: "marker").id
            for client in clients {
                let got = try await tests.items(client, through: marker, timeout: .seconds(20))
                #expect(tests.ids(got) == [large, marker], "the large item once, then the marker: \(tests.ids(got))")
                let item = try #require(got.first { ($0["id"] as? NSNumber)?.int64Value == large })
                #expect((item["content"] as? String)?.utf8.count == 512 << 10)
                await client.close()
            }
        }
    }

    static func isTooLarge(_ element: [String: Any]) -> Bool {
        element["status"] as? String == "lagging" && (element["msg"] as? String)?.contains("too large for it or for NATS") == true
    }

    @Test func anItemNATSRefusesIsToldToTheClientsOfEveryNodeAndTheNextOneArrives() async throws {
        // nats-server's own max_payload (1 MB): a 2 MiB story cannot be published.
        try await ClusterHarness.with(nodes: 2, feedRate: 100, markets: [.news], alpaca: true) { cluster in
            _ = try await cluster.agreedLeader()
            let tests = AlpacaNewsEndToEndTests()
            var clients: [WSTestClient] = []
            for id in cluster.nodeIDs { clients.append(try await tests.newsClient(try cluster.port(id), key: "any-key", ["AAPL"])) }
            for client in clients { try await tests.probe(cluster.feed, client, symbol: "AAPL") }
            _ = cluster.feed.publishNews(symbols: ["AAPL"], contentBytes: 2 << 20)
            let marker = cluster.feed.publishNews(symbols: ["AAPL"], headline: "marker").id
            for client in clients {
                let got = try await tests.items(client, through: marker, timeout: .seconds(20))
                // Before the marker: the break in n.AAPL's run (a gap), or the leader's word already.
                let before = got.filter { $0["T"] as? String == "relay" }.compactMap { $0["status"] as? String }
                #expect(before.contains("gap") || before.contains("lagging"), "told before the marker: \(got.map { $0["T"] ?? "" })")
                #expect(tests.ids(got) == [marker], "\(tests.ids(got))")
                // The leader's word (why) comes on the control subject, which NATS does not order with
                // the events' subjects: before the marker or soon after it.
                var told = got
                let deadline = ContinuousClock.now + .seconds(10)
                while !told.contains(where: Self.isTooLarge), ContinuousClock.now < deadline {
                    told += try await tests.elements(client, timeout: deadline - .now)
                }
                #expect(told.contains(where: Self.isTooLarge), "told: \(told.filter { $0["T"] as? String == "relay" })")
                await client.close()
            }
        }
    }
}
