import DemoFeed
import Foundation
import PolygonWire
import RelayComposition
import RelayConfiguration
import Testing

@Suite("Limits hold and the relay keeps serving", .timeLimit(.minutes(2)))
struct LimitsTests {
    @Test func aBurstOfJunkTopicsNeverReachesTheUpstream() async throws {
        try await withRelay { parts, feed, url in
            let honest = try await subscribedClient(url, "Q.AAPL")
            let abuser = try await WSTestClient.authenticated(url: url)
            // 50,000 made-up topics in one message: refused whole.
            abuser.send(ClientAction(.subscribe, params: (0..<50_000).map { "Q.FAKE\($0)" }.joined(separator: ",")))
            let burst = try await abuser.waitForStatus("error")
            #expect((burst.fields["message"] as? String)?.contains("too many topics") == true)
            // Topics of no such event type, or not tickers at all: refused one by one.
            abuser.send(ClientAction(.subscribe, params: "ZZ.AAPL,Q.<script>,Q.\(String(repeating: "X", count: 100))"))
            _ = try await abuser.waitForStatus("error")
            // The honest client is still served; the upstream was asked for nothing made up.
            #expect(try await honest.nextEvents(3).allSatisfy { $0.topic.description == "Q.AAPL" })
            let asked = feed.monitor.snapshot.topics(.subscribe)
            #expect(!asked.contains { $0.hasPrefix("Q.FAKE") || $0.hasPrefix("ZZ.") || $0.contains("<") })
            #expect(try parts.upstreamClient.subscribedTopics == topics("Q.AAPL"))
            await abuser.close()
            await honest.close()
        }
    }

    /// A client taking and dropping a wildcard as fast as it may: the upstream is asked for it once,
    /// and told to drop it once, when the linger after the last drop ends.
    @Test func aWildcardTakenAndDroppedAgainAndAgainReachesTheUpstreamOnce() async throws {
        try await withRelay { parts, feed, url in
            let toggler = try await WSTestClient.authenticated(url: url)
            for _ in 0..<30 {
                toggler.send(ClientAction(.subscribe, params: "T.*"))
                _ = try await toggler.waitForStatus("success")
                toggler.send(ClientAction(.unsubscribe, params: "T.*"))
                _ = try await toggler.waitForStatus("success")
            }
            try await eventually("the upstream to be asked for T.*", timeout: .seconds(10)) {
                feed.monitor.snapshot.topics(.subscribe).contains("T.*")
            }
            let asked = feed.monitor.snapshot.topics(.subscribe).filter { $0 == "T.*" }.count
            #expect(asked == 1, "T.* asked for \(asked) times")
            #expect(!feed.monitor.snapshot.topics(.unsubscribe).contains("T.*"), "dropped within the linger")
            try await eventually("the upstream to be told to drop T.* after the linger", timeout: .seconds(20)) {
                feed.monitor.snapshot.topics(.unsubscribe).contains("T.*")
            }
            #expect(try parts.upstreamClient.subscribedTopics.isEmpty)
            await toggler.close()
        }
    }

    @Test func aReconnectStormMakesAHandfulOfUpstreamMessages() async throws {
        try await withRelay { parts, feed, url in
            let before = feed.monitor.snapshot.actions.filter { $0.kind == .subscribe }.count
            var clients: [WSTestClient] = []
            for index in 0..<200 {
                let client = WSTestClient(url: url)
                client.send(ClientAction(.auth, params: "client-key"))
                client.send(ClientAction(.subscribe, params: "Q.STORM\(index)"))
                clients.append(client)
            }
            try await eventually("the upstream to carry all 200 topics", timeout: .seconds(20)) {
                (try? parts.upstreamClient.subscribedTopics.count) == 200
            }
            let messages = feed.monitor.snapshot.actions.filter { $0.kind == .subscribe }.count - before
            #expect(messages <= 20, "\(messages) subscribe messages for 200 clients")
            for client in clients { await client.close() }
        }
    }

    func withLimitedRelay(_ limits: (inout RelaySettings) -> Void, _ body: @Sendable (String) async throws -> Void) async throws {
        var settings = RelaySettings(listen: .init(host: "127.0.0.1", port: 0), clientKeys: ["client-key"], demoRate: 500)
        limits(&settings)
        let relay = Relay(settings: settings, logger: testLogger)
        try await withServices([relay]) {
            let parts = try await within(.seconds(10), "the relay to start") { try await relay.ready() }
            try await body("ws://127.0.0.1:\(parts.port)/stocks")
        }
    }

    @Test func connectionsPastThePerAddressLimitAreRefusedAndTheOthersServed() async throws {
        try await withLimitedRelay({ $0.connectionLimits.perAddress = 3 }) { url in
            var clients: [WSTestClient] = []
            for _ in 0..<3 { clients.append(try await subscribedClient(url, "Q.AAPL")) }
            let fourth = WSTestClient(url: url)
            #expect(try await fourth.nextParsed().statuses == [.connected])
            let refused = try await fourth.nextParsed().statuses.first
            #expect(refused?.status == StatusMessage.Kind.maxConnections)
            #expect(refused?.message.contains("per address") == true)
            #expect(try await fourth.waitForClose() == 1008)
            #expect(try await clients[0].nextEvents(2).count >= 2, "the admitted clients are still served")
            for client in clients { await client.close() }
        }
    }

    @Test func wrongKeysSlowTheirAnswersButTheRightKeyGetsInAtOnce() async throws {
        try await withLimitedRelay({
            $0.connectionLimits.failureDelay = .milliseconds(400)
            $0.connectionLimits.maxFailureDelay = .seconds(5)
        }) { url in
            // Four wrong keys in a row from this address: the first answered at once, then 0.4, 0.8, 1.6 s.
            var answeredAfter: [Duration] = []
            for _ in 0..<4 {
                let guesser = WSTestClient(url: url)
                _ = try await guesser.nextParsed()
                let start = ContinuousClock.now
                guesser.send(ClientAction(.auth, params: "guess"))
                #expect(try await guesser.nextParsed().statuses == [.authFailed])
                answeredAfter.append(.now - start)
                #expect(try await guesser.waitForClose() == 1008)
            }
            #expect(answeredAfter[3] >= .milliseconds(1500), "the fourth failure was answered after \(answeredAfter[3])")
            // Meanwhile, and right after, the right key from the same address is let in and served.
            let start = ContinuousClock.now
            let client = try await subscribedClient(url, "Q.AAPL")
            #expect(.now - start < .seconds(3), "the right key waited \(ContinuousClock.now - start)")
            #expect(try await client.nextEvents(1).count >= 1, "a frame may carry several events")
            await client.close()
        }
    }
}
