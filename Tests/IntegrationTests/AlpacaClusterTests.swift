import Foundation
import PolygonWire
import Testing

/// An Alpaca feed on a cluster: one lease, one upstream connection, Alpaca's clients on every node.
@Suite(
    "Cluster on NATS: an Alpaca feed", .serialized, .timeLimit(.minutes(3)),
    .enabled(if: ClusterHarness.enabled, "nats-server is not installed (scripts/test installs it)"))
struct AlpacaClusterTests {
    /// A JSON client of Alpaca's protocol on `url`, authenticated and subscribed to AAPL's trades.
    func alpacaClient(_ url: String) async throws -> WSTestClient {
        let client = WSTestClient(url: url)
        _ = try await client.nextFrame()
        client.send(#"{"action":"auth","key":"any-key","secret":"x"}"#)
        #expect(try await client.nextFrame().contains("authenticated"))
        client.send(#"{"action":"subscribe","trades":["AAPL"]}"#)
        #expect(try await client.nextFrame().contains(#""T":"subscription""#))
        return client
    }

    /// Reads until a frame holds `text`, or fails after `timeout`.
    func read(_ client: WSTestClient, until text: String, timeout: Duration = .seconds(20)) async throws {
        let deadline = ContinuousClock.now + timeout
        while true {
            let frame = try await client.nextFrame(timeout: deadline - .now)
            if frame.contains(text) { return }
        }
    }

    @Test func anAlpacaFeedHasOneLeaseAndItsClientsOnEveryNodeSurviveAFailover() async throws {
        try await ClusterHarness.with(nodes: 2, feedRate: 2000, alpaca: true) { cluster in
            let leader = try await cluster.agreedLeader()
            let survivor = try #require(cluster.nodeIDs.first { $0 != leader })
            var clients: [String: WSTestClient] = [:]
            for id in cluster.nodeIDs {
                let client = try await alpacaClient("ws://127.0.0.1:\(try cluster.port(id))/v2/iex")
                try await read(client, until: #"{"T":"t","S":"AAPL""#)
                clients[id] = client
            }
            #expect(cluster.feed.monitor.snapshot.totalConnections == 1, "one upstream connection for the cluster")
            let health = try await cluster.health(survivor).body
            #expect((health["vendor"] as? String) == "alpaca", "\(health)")

            try await cluster.kill(leader)
            let client = try #require(clients[survivor])
            try await read(client, until: #""T":"relay","status":"upstream_disconnected""#)
            try await read(client, until: #"{"T":"t","S":"AAPL""#, timeout: .seconds(30))
            #expect(try await cluster.agreedLeader(among: [survivor]) == survivor)
            #expect(cluster.feed.monitor.snapshot.maxOpenConnections == 1, "two upstream connections existed at once")
            #expect(client.closeCode == nil)
            await client.close()
        }
    }

    @Test func aSubscriptionTheLeadersUpstreamRefusesIsToldToTheClientsOfEveryNode() async throws {
        // The account may hold 4 topics: AAPL's trades take 3 (with corrections and cancel errors).
        try await ClusterHarness.with(nodes: 2, feedRate: 2000, alpaca: true, alpacaTopicLimit: 4) { cluster in
            let leader = try await cluster.agreedLeader()
            let other = try #require(cluster.nodeIDs.first { $0 != leader })
            let url = "ws://127.0.0.1:\(try cluster.port(other))/v2/iex"
            let apple = try await alpacaClient(url)
            try await read(apple, until: #"{"T":"t","S":"AAPL""#)
            // On the node that does not lead: the leader's upstream refuses MSFT, and the refusal comes over NATS.
            let microsoft = WSTestClient(url: url)
            _ = try await microsoft.nextFrame()
            microsoft.send(#"{"action":"auth","key":"any-key","secret":"x"}"#)
            _ = try await microsoft.nextFrame()
            microsoft.send(#"{"action":"subscribe","trades":["MSFT"]}"#)
            try await read(microsoft, until: #"{"T":"error","code":405,"msg":"symbol limit exceeded: the upstream refused t.MSFT"#)
            try await read(apple, until: #"{"T":"t","S":"AAPL""#)
            await apple.close()
            await microsoft.close()
        }
    }

    /// A node whose clients take a crypto order book after the vendor's whole book went by (another
    /// node's client asked first) takes the leader's whole book from the last-value store, brought up to
    /// date by position: its client's first message is the whole book, equal to the feed's own.
    @Test func aNodeThatJoinsAnOrderBookLateServesItWholeFromTheLeadersBook() async throws {
        try await ClusterHarness.with(nodes: 2, feedRate: 400, markets: [.crypto], alpaca: true) { cluster in
            let (first, second) = (cluster.nodeIDs[0], cluster.nodeIDs[1])
            let truth = OrderBookTests.Truth(
                try await BookStream(url: try await cluster.feed.url(for: .crypto), key: ClusterHarness.upstreamKey, symbol: "BTC/USD"))
            let early = try await BookStream(url: "ws://127.0.0.1:\(try cluster.port(first))/v1beta3/crypto/us", key: "any-key", symbol: "BTC/USD")
            let vendors = try await early.next()
            #expect(vendors["r"] as? Bool == true, "the vendor's whole book first: \(vendors)")
            // Changes go by before the other node's client asks.
            for _ in 0..<5 { _ = try await early.next() }
            for join in 0..<3 {
                let late = try await BookStream(url: "ws://127.0.0.1:\(try cluster.port(second))/v1beta3/crypto/us", key: "any-key", symbol: "BTC/USD")
                let whole = try await late.next()
                #expect(whole["r"] as? Bool == true, "join \(join): the whole book first, no change to a book it lacks: \(whole)")
                var book = ClientBook()
                book.apply(whole)
                let time = try #require(whole["t"] as? String)
                print("order book join \(join) on \(second): whole at \(time), the feed's book at \(truth.at ?? "none")")
                let expected = try await truth.through(time)
                #expect(book == expected, "join \(join) at \(time): \(book) against the feed's \(expected)")
                for _ in 0..<3 {
                    let change = try await late.next()
                    book.apply(change)
                    #expect(book == (try await truth.through(try #require(change["t"] as? String))), "join \(join): a change after it")
                }
                await late.close()
            }
            await early.close()
            await truth.stream.close()
        }
    }
}
