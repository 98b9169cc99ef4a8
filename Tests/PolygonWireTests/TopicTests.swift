import Testing

@testable import PolygonWire

@Suite("Topics and client actions")
struct TopicTests {
    @Test func paramsAreSplitAndTrimmed() {
        let (topics, invalid) = Topic.parseList(" AM.AAPL, AM.MSFT ,,T.BRK.B,Q.*, bad ,.X,Y.")
        #expect(topics.map(\.description) == ["AM.AAPL", "AM.MSFT", "T.BRK.B", "Q.*"])
        #expect(invalid == ["bad", ".X", "Y."])
        #expect(topics[2].ticker == "BRK.B")
        #expect(topics[3].isWildcard)
        // A ticker names something: dots, dashes or slashes alone (`..` would step up a vendor's path) do not.
        let (none, refused) = Topic.parseList("T..., T.., Q.-, Q./, T.X:., T.@")
        #expect(none.map(\.description) == ["T.X:."] && refused == ["T...", "T..", "Q.-", "Q./", "T.@"], "\(none) \(refused)")
        #expect(Topic(eventType: "T", ticker: "..") == nil && Topic(eventType: "T", ticker: "A..") != nil)
    }

    @Test func wildcardMatchesEveryTickerOfItsTypeOnly() {
        let wildcard = Topic.wildcard("Q")
        #expect(wildcard.matches(eventType: "Q", ticker: "ANY"))
        #expect(!wildcard.matches(eventType: "T", ticker: "ANY"))
    }

    @Test func clientActionsDecodeAndEncode() throws {
        #expect(try ClientAction.decode(#"{"action":"auth","params":"k"}"#) == ClientAction(.auth, params: "k"))
        #expect(try ClientAction.decode(#"{"action":"Subscribe","params":"Q.A"}"#).kind == .subscribe)
        let action = ClientAction(.auth, params: #"we"ird\key"#)
        #expect(try ClientAction.decode(action.json) == action)
    }

    @Test(arguments: ["", "[]", "{}", #"{"params":"x"}"#, #"{"action":"dance","params":"x"}"#, #"{"action":5}"#, "not json"])
    func badClientMessagesNameTheProblem(text: String) {
        #expect(throws: ClientAction.DecodingError.self) { try ClientAction.decode(text) }
    }
}
