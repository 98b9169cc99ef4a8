import NIOCore
import Testing

@testable import PolygonWire

@Suite("Limits of one downstream connection")
struct SessionLimitsTests {
    func authenticated(_ limits: SessionLimits, entitlement: Entitlement = .everything) -> ServerSession {
        var session = ServerSession(limits: limits) { $0 == "k" ? ClientGrant(name: "k", entitlement: entitlement) : nil }
        _ = session.receive(ByteBuffer(string: #"{"action":"auth","params":"k"}"#))
        return session
    }

    func subscribe(_ params: String) -> ByteBuffer { ByteBuffer(string: ClientAction(.subscribe, params: params).json) }

    func messages(_ reaction: ServerSession.Reaction) throws -> [StatusMessage] {
        try reaction.frames.flatMap { try FrameParser.parse($0).statuses }
    }

    @Test func aMessageWithTooManyTopicsChangesNothing() throws {
        var session = authenticated(SessionLimits(topicsPerMessage: 3))
        let reaction = session.receive(subscribe("Q.A,Q.B,Q.C,Q.D"))
        #expect(reaction.added.isEmpty)
        #expect(try messages(reaction).map(\.status) == ["error"])
        #expect(try messages(reaction).first?.message.contains("too many topics") == true)
        #expect(session.receive(subscribe("Q.A,Q.B,Q.C")).added.count == 3)
    }

    @Test func aConnectionHoldsAtMostItsTopicLimit() throws {
        var session = authenticated(SessionLimits(topicsPerConnection: 2))
        let reaction = session.receive(subscribe("Q.A,Q.B,Q.C"))
        #expect(reaction.added == [Topic(eventType: "Q", ticker: "A")!, Topic(eventType: "Q", ticker: "B")!])
        #expect(try messages(reaction).contains { $0.status == "error" && $0.message.contains("topic limit") })
        // Unsubscribing makes room; resubscribing a held topic costs nothing.
        _ = session.receive(ByteBuffer(string: ClientAction(.unsubscribe, params: "Q.A").json))
        #expect(session.receive(subscribe("Q.B,Q.C")).added == [Topic(eventType: "Q", ticker: "C")!])
    }

    @Test func topicsAreCheckedAgainstTheMarketAndTheTickerRules() throws {
        var session = authenticated(SessionLimits(maxTickerLength: 8, eventTypes: Market.stocks.eventTypes))
        let reaction = session.receive(subscribe("Q.AAPL,XQ.BTC-USD,T.WAYTOOLONGTICKER,T.A$B,T.BRK.B,AM.*"))
        #expect(Set(reaction.added.map(\.description)) == ["Q.AAPL", "T.BRK.B", "AM.*"])
        let errors = try messages(reaction).filter { $0.status == "error" }.map(\.message)
        #expect(errors.count == 1, "one error status names every refused topic")
        #expect(errors.contains { $0.contains("XQ.BTC-USD") && $0.contains("unknown event type") })
        #expect(errors.contains { $0.contains("longer than 8") })
        #expect(errors.contains { $0.contains("T.A$B") })
    }

    @Test func aKeysPatternsForTheMarketAreReadInItsForm() throws {
        // The key file writes `crypto:XQ.BTC-USD`; on /crypto the topic is `XQ.X:BTC-USD`.
        let rights = Entitlement(patterns: [], marketPatterns: [.crypto: [Topic(parsing: "XQ.BTC-USD")!]])
        var session = ServerSession(limits: SessionLimits(), market: .crypto) { _ in ClientGrant(name: "k", entitlement: rights) }
        _ = session.receive(ByteBuffer(string: #"{"action":"auth","params":"k"}"#))
        let reaction = session.receive(subscribe("XQ.BTC-USD,XQ.ETH-USD,Q.AAPL"))
        #expect(reaction.added == [Topic(parsing: "XQ.X:BTC-USD")!], "the key's own pair, in the market's form")
        let errors = try messages(reaction).filter { $0.status == "error" }.map(\.message)
        #expect(errors.contains { $0.contains("XQ.X:ETH-USD") }, "a pair the key does not name is refused")
        #expect(errors.contains { $0.contains("stocks topic") }, "another market's type names its market")
    }

    @Test func messagesPastTheRateAreAnsweredAndDropped() throws {
        var session = authenticated(SessionLimits(messagesPerSecond: 5, messageBurst: 5))
        let start = ContinuousClock.now
        var dropped = 0
        for index in 0..<10 {
            let reaction = session.receive(subscribe("Q.S\(index)"), at: start)
            if reaction.added.isEmpty, try messages(reaction).first?.message.contains("rate limit") == true { dropped += 1 }
        }
        // Five tokens, less the one auth took; the six past them are told once (within the second).
        #expect(dropped == 1)
        // A second later five more tokens have come in.
        #expect(session.receive(subscribe("Q.LATER"), at: start + .seconds(1)).added.count == 1)
    }

    @Test func aClientSubscribingSymbolBySymbolAtStartIsNotThrottled() throws {
        var session = authenticated(SessionLimits())
        let start = ContinuousClock.now
        let added = (0..<300).reduce(0) { count, index in count + session.receive(subscribe("Q.S\(index)"), at: start).added.count }
        #expect(added == 300)
    }

    @Test func entitlementsRefuseTopicsOutsideTheKeyAndSubscribeTheRest() throws {
        var session = authenticated(SessionLimits(), entitlement: Entitlement(patterns: [.wildcard("Q"), Topic(eventType: "T", ticker: "AAPL")!]))
        let reaction = session.receive(subscribe("Q.MSFT,T.AAPL,T.MSFT,T.*,Q.*"))
        #expect(Set(reaction.added.map(\.description)) == ["Q.MSFT", "T.AAPL", "Q.*"])
        let refusal = try #require(try messages(reaction).first { $0.status == "error" })
        #expect(refusal.message.contains("T.MSFT") && refusal.message.contains("T.*"))
    }
}
