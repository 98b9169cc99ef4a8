import PolygonWire
import Testing

@Suite("Client side of the protocol")
struct ClientSessionTests {
    func topics(_ list: String...) -> Set<Topic> { Set(list.compactMap { Topic(parsing: $0) }) }

    @Test func connectedIsAnsweredWithAuth() {
        var session = ClientSession(apiKey: "k\"ey")
        let reaction = session.receive(.connected)
        #expect(reaction.event == .connected)
        #expect(reaction.send == [#"{"action":"auth","params":"k\"ey"}"#])
        #expect(!session.isAuthenticated)
    }

    @Test func wantedTopicsWaitForAuthThenAreSubscribedInOneMessage() {
        var session = ClientSession(apiKey: "k")
        #expect(session.setWanted(topics("Q.AAPL", "T.*")) == [])
        let reaction = session.receive(.authSuccess)
        #expect(reaction.event == .authenticated)
        #expect(reaction.send == [#"{"action":"subscribe","params":"Q.AAPL,T.*"}"#])
        #expect(session.subscribed == topics("Q.AAPL", "T.*"))
    }

    @Test func changesWhileAuthenticatedSubscribeBeforeTheyUnsubscribe() {
        var session = ClientSession(apiKey: "k")
        _ = session.setWanted(topics("Q.AAPL", "Q.MSFT"))
        _ = session.receive(.authSuccess)
        let messages = session.setWanted(topics("Q.*"))
        #expect(messages == [#"{"action":"subscribe","params":"Q.*"}"#, #"{"action":"unsubscribe","params":"Q.AAPL,Q.MSFT"}"#])
        #expect(session.setWanted(topics("Q.*")) == [], "no change, no message")
    }

    @Test func aLostConnectionForgetsTheServersSubscriptionsButNotTheWantedSet() {
        var session = ClientSession(apiKey: "k")
        _ = session.setWanted(topics("Q.AAPL"))
        _ = session.receive(.authSuccess)
        session.connectionEnded()
        #expect(!session.isAuthenticated)
        #expect(session.subscribed.isEmpty)
        #expect(session.setWanted(topics("Q.AAPL", "T.A")) == [], "nothing is sent while not authenticated")
        #expect(session.receive(.authSuccess).send == [#"{"action":"subscribe","params":"Q.AAPL,T.A"}"#])
    }

    @Test func refusalsCloseTheConnection() {
        var session = ClientSession(apiKey: "k")
        let failed = session.receive(.authFailed)
        #expect(failed.event == .authFailed("authentication failed"))
        #expect(failed.close)
        let full = session.receive(StatusMessage(status: "max_connections", message: "Maximum number of websocket connections exceeded."))
        #expect(full.event == .maxConnections("Maximum number of websocket connections exceeded."))
        #expect(full.close)
        #expect(!session.receive(.error("not authorized")).close)
        #expect(session.receive(StatusMessage(status: "weird", message: "x")).event == .other(status: "weird", message: "x"))
    }

    @Test func largeSetsAreSplitUnderTheParamsLimit() {
        var session = ClientSession(apiKey: "k")
        let many = Set((0..<3000).map { Topic(eventType: "Q", ticker: "TICK\($0)")! })
        _ = session.setWanted(many)
        let messages = session.receive(.authSuccess).send
        #expect(messages.count > 1)
        for message in messages {
            let action = try? ClientAction.decode(message)
            #expect((action?.params.utf8.count ?? .max) <= ClientSession.maxParamsBytes)
        }
        let sent = messages.compactMap { try? ClientAction.decode($0) }.flatMap { Topic.parseList($0.params).topics }
        #expect(Set(sent) == many)
    }

    /// Short topics: the params limit would allow over a thousand in one message, which a server taking
    /// at most 1,000 (the relay's own) refuses whole.
    @Test func noMessageCarriesMoreThanAThousandTopics() {
        var session = ClientSession(apiKey: "k")
        let many = Set((0..<2500).map { Topic(eventType: "T", ticker: "S\($0)")! })
        _ = session.setWanted(many)
        let messages = session.receive(.authSuccess).send.compactMap { try? ClientAction.decode($0) }
        #expect(messages.allSatisfy { Topic.parseList($0.params).topics.count <= ClientSession.maxTopicsPerMessage })
        #expect(Set(messages.flatMap { Topic.parseList($0.params).topics }) == many)
    }
}
