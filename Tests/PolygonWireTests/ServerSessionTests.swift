import NIOCore
import Testing

@testable import PolygonWire

@Suite("Server side of the protocol")
struct ServerSessionTests {
    func session() -> ServerSession { ServerSession { $0 == "good" } }

    func statuses(_ reaction: ServerSession.Reaction) throws -> [[StatusMessage]] {
        try reaction.frames.map { try FrameParser.parse($0).statuses }
    }

    @Test func authReplyIsAFrameOfItsOwn() throws {
        var s = session()
        let reaction = s.receive(ByteBuffer(string: #"{"action":"auth","params":"good"}"#))
        #expect(try statuses(reaction) == [[.authSuccess]])
        #expect(s.isAuthenticated)
    }

    @Test func wrongKeyIsRefusedAndClosed() throws {
        var s = session()
        let reaction = s.receive(ByteBuffer(string: #"{"action":"auth","params":"bad"}"#))
        #expect(try statuses(reaction) == [[.authFailed]])
        #expect(reaction.close)
        #expect(!s.isAuthenticated)
    }

    @Test func subscribingBeforeAuthIsAnErrorNotAChange() throws {
        var s = session()
        let reaction = s.receive(ByteBuffer(string: #"{"action":"subscribe","params":"Q.A"}"#))
        #expect(reaction.added.isEmpty)
        #expect(try statuses(reaction).first?.first?.status == "error")
    }

    @Test func pipelinedAuthThenSubscribeIsHandledInOrder() throws {
        var s = session()
        _ = s.receive(ByteBuffer(string: #"{"action":"auth","params":"good"}"#))
        let reaction = s.receive(ByteBuffer(string: #"{"action":"subscribe","params":" Q.A , T.* "}"#))
        #expect(reaction.added.map(\.description) == ["Q.A", "T.*"])
        #expect(
            try statuses(reaction) == [
                [StatusMessage(status: "success", message: "subscribed to 2 topics: Q.A,T.*")]
            ])
    }

    @Test func aRepeatedSubscribeChangesNothingAndIsNotAnswered() {
        var s = session()
        _ = s.receive(ByteBuffer(string: #"{"action":"auth","params":"good"}"#))
        _ = s.receive(ByteBuffer(string: #"{"action":"subscribe","params":"Q.A"}"#))
        let again = s.receive(ByteBuffer(string: #"{"action":"subscribe","params":"Q.A"}"#))
        #expect(again.added.isEmpty)
        #expect(again.frames.isEmpty)
    }

    @Test func unsubscribingWhatWasNeverSubscribedIsNotAnswered() throws {
        var s = session()
        _ = s.receive(ByteBuffer(string: #"{"action":"auth","params":"good"}"#))
        let reaction = s.receive(ByteBuffer(string: #"{"action":"unsubscribe","params":"Q.NEVER"}"#))
        #expect(reaction.removed.isEmpty)
        #expect(reaction.frames.isEmpty)
    }

    @Test func aSecondAuthIsRefusedAndTheFirstGrantKept() throws {
        var s = ServerSession { $0 == "one" ? ClientGrant(name: "one") : $0 == "two" ? ClientGrant(name: "two") : nil }
        _ = s.receive(ByteBuffer(string: #"{"action":"auth","params":"one"}"#))
        let again = s.receive(ByteBuffer(string: #"{"action":"auth","params":"two"}"#))
        #expect(!again.close)
        #expect(try statuses(again).first?.first?.status == "error")
        #expect(s.grant?.name == "one")
    }

    @Test func malformedMessagesAreAnsweredWithAnErrorAndChangeNothing() throws {
        var s = session()
        _ = s.receive(ByteBuffer(string: #"{"action":"auth","params":"good"}"#))
        for text in ["{", #"{"action":"x"}"#, #"{"action":"subscribe","params":"nodot"}"#, #"{"action":"subscribe","params":""}"#] {
            let reaction = s.receive(ByteBuffer(string: text))
            #expect(!reaction.close)
            #expect(reaction.added.isEmpty)
            #expect(try statuses(reaction).flatMap { $0 }.allSatisfy { $0.status == "error" })
        }
        #expect(s.isAuthenticated)
    }

    @Test func aHugeMessageIsAnsweredWithOneSmallFrame() throws {
        // Limits raised past the 40,000 topics (the relay's defaults would refuse such a message).
        var s = ServerSession(limits: SessionLimits(topicsPerMessage: 50_000, topicsPerConnection: 50_000)) {
            $0 == "good" ? ClientGrant(name: "good") : nil
        }
        _ = s.receive(ByteBuffer(string: #"{"action":"auth","params":"good"}"#))
        let params = (0..<40_000).map { "Q.TICKER\($0)" }.joined(separator: ",") + ",Q.BAD$1,Q.BAD$2"
        let reaction = s.receive(ByteBuffer(string: #"{"action":"subscribe","params":"\#(params)"}"#))
        #expect(reaction.frames.count == 1)
        #expect(reaction.frames.allSatisfy { $0.readableBytes < 2_000 })
        #expect(reaction.added.count == 40_000)
        let answer = try statuses(reaction)[0]
        #expect(answer.map(\.status) == ["success", "error"])
        #expect(answer[0].message.hasSuffix("and 39990 more"))
        #expect(answer[1].message.contains("Q.BAD$1,Q.BAD$2"))
    }

    /// The derived-topic bounds hold within one message as across messages: of 1,010 bars of distinct
    /// symbols beside 10 held, 990 more are taken; of nine sizes of one symbol, eight.
    @Test func derivedTopicBoundsHoldWithinOneMessage() throws {
        var s = ServerSession(limits: SessionLimits(topicsPerMessage: 5_000, topicsPerConnection: 5_000)) { _ in ClientGrant(name: "k") }
        _ = s.receive(ByteBuffer(string: #"{"action":"auth","params":"k"}"#))
        let held = (0..<10).map { "AM.H\($0)@5m" }.joined(separator: ",")
        #expect(s.receive(ByteBuffer(string: #"{"action":"subscribe","params":"\#(held)"}"#)).added.count == 10)
        let many = (0..<1_010).map { "AM.S\($0)@5m" }.joined(separator: ",") + ",Q.PLAIN"
        let reaction = s.receive(ByteBuffer(string: #"{"action":"subscribe","params":"\#(many)"}"#))
        #expect(reaction.added.count == 991, "990 bars and the plain quote")
        #expect(try statuses(reaction).flatMap { $0 }.contains { $0.message.contains("at most 1000 derived topics") })
        var fresh = ServerSession(limits: SessionLimits()) { _ in ClientGrant(name: "k") }
        _ = fresh.receive(ByteBuffer(string: #"{"action":"auth","params":"k"}"#))
        let sizes = (1...9).map { "AM.MSFT@\($0)m" }.joined(separator: ",")
        let nine = fresh.receive(ByteBuffer(string: #"{"action":"subscribe","params":"\#(sizes)"}"#))
        #expect(nine.added.count == 8)
        #expect(try statuses(nine).flatMap { $0 }.contains { $0.message.contains("at most 8 bar sizes of one symbol") })
    }
}
