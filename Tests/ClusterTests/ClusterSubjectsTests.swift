import Cluster
import PolygonWire
import Testing

@Suite struct ClusterSubjectsTests {
    let subjects: ClusterSubjects

    init() throws {
        subjects = try ClusterSubjects(cluster: "relay", market: "stocks")
    }

    @Test func plainTickerIsOneToken() {
        #expect(subjects.subject(for: Topic(eventType: "Q", ticker: "AAPL")!) == "relay.md.stocks.Q.AAPL")
    }

    @Test func wildcardTopicIsSubjectWildcard() {
        #expect(subjects.subject(for: .wildcard("T")) == "relay.md.stocks.T.*")
    }

    @Test(arguments: ["A=B", "X>Y*Z", "ÄÖ", "A,B", "A B"])
    func aTickerOutsideTheTickerRulesIsNoTopic(ticker: String) {
        #expect(Topic(eventType: "T", ticker: ticker) == nil)
    }

    @Test(arguments: ["BRK.B", "O:SPY241220P00720000", "EUR/USD", "I:SPX", "BTC-USD", "C:EUR-USD", "a_b"])
    func everyTickerRoundTripsThroughOneToken(ticker: String) throws {
        let topic = Topic(eventType: "T", ticker: ticker)!
        let subject = subjects.subject(for: topic)
        let tokens = subject.split(separator: ".")
        #expect(tokens.count == 5, "\(subject) must have exactly five tokens")
        let forbidden: Set<Character> = ["*", ">", ":", " "]
        let last = String(tokens[tokens.count - 1])
        #expect(!last.contains(where: { forbidden.contains($0) }))
        #expect(subjects.topic(fromSubject: subject) == topic)
    }

    @Test func foreignSubjectsAreNotTopics() {
        #expect(subjects.topic(fromSubject: "other.md.stocks.Q.AAPL") == nil)
        #expect(subjects.topic(fromSubject: "relay.md.stocks.Q") == nil)
        #expect(subjects.topic(fromSubject: "relay.md.stocks.Q.AB=Z1") == nil)
    }

    @Test func clusterNamesMustBePlainTokens() {
        #expect(throws: ClusterError.self) { try ClusterSubjects(cluster: "a.b", market: "stocks") }
        #expect(throws: ClusterError.self) { try ClusterSubjects(cluster: "", market: "stocks") }
        #expect(throws: ClusterError.self) { try ClusterSubjects(cluster: "ok", market: "st ocks") }
    }

    @Test func clustersSharingNATSUseSeparateNames() throws {
        let other = try ClusterSubjects(cluster: "blue", market: "stocks")
        #expect(other.leaseBucket != subjects.leaseBucket)
        #expect(other.subject(for: Topic(eventType: "Q", ticker: "AAPL")!) != subjects.subject(for: Topic(eventType: "Q", ticker: "AAPL")!))
    }

    @Test func serverListsParse() throws {
        #expect(try ClusterConfiguration.servers(from: "nats://a:4222, nats://b:4223") == ["nats://a:4222", "nats://b:4223"])
        #expect(throws: ClusterError.self) { try ClusterConfiguration.servers(from: "http://a:4222") }
        #expect(throws: ClusterError.self) { try ClusterConfiguration.servers(from: " , ") }
    }
}

@Suite struct InterestTableTests {
    let start = ContinuousClock.now

    @Test func unionOfNodesWithWildcardCoveringTickers() {
        var table = InterestTable(ttl: .seconds(3))
        table.update(node: "a", topics: [Topic(eventType: "Q", ticker: "AAPL")!, Topic(eventType: "T", ticker: "MSFT")!], at: start)
        table.update(node: "b", topics: [.wildcard("Q"), Topic(eventType: "T", ticker: "MSFT")!], at: start)
        #expect(table.union == [.wildcard("Q"), Topic(eventType: "T", ticker: "MSFT")!])
    }

    @Test func aSilentNodeIsForgottenAndNamedWhenItsTopicsLeaveTheUnion() {
        var table = InterestTable(ttl: .seconds(3))
        let msft = Topic(eventType: "T", ticker: "MSFT")!
        let aapl = Topic(eventType: "T", ticker: "AAPL")!
        table.update(node: "stalled", topics: [msft, aapl], at: start)
        table.update(node: "shares", topics: [aapl], at: start)
        table.update(node: "idle", topics: [], at: start)
        table.update(node: "shares", topics: [aapl], at: start + .seconds(2))
        let expired = table.expireNodes(at: start + .seconds(3))
        // "stalled" took T.MSFT with it (its clients may have missed events); "idle" wanted nothing.
        #expect(expired.changed && expired.nodes == ["stalled"])
        #expect(table.union == [aapl])
    }

    @Test func aTopicStaysWhileAnyNodeWantsIt() {
        var table = InterestTable(ttl: .seconds(3))
        let msft = Topic(eventType: "T", ticker: "MSFT")!
        table.update(node: "a", topics: [msft], at: start)
        table.update(node: "b", topics: [msft], at: start)
        #expect(table.update(node: "a", topics: [], at: start).changed == false)
        #expect(table.union == [msft])
        #expect(table.update(node: "b", topics: [], at: start).changed == true)
        #expect(table.union.isEmpty)
    }

    @Test func theUnionKeptAsNodesChangeIsTheUnionComputedAfresh() {
        // Random sets of a few tickers and wildcards across four nodes, changed 2,000 times: after each
        // change the kept union is what a walk over every node's set gives, and "changed" says so.
        var generator = SystemRandomNumberGenerator()
        let pool: [Topic] = ["Q", "T", "AM"].flatMap { type in
            [Topic.wildcard(type)] + (0..<6).map { Topic(eventType: type, ticker: "S\($0)")! }
        }
        var table = InterestTable(ttl: .seconds(3))
        var sets: [String: Set<Topic>] = [:]
        func fresh() -> Set<Topic> {
            let all = sets.values.reduce(into: Set<Topic>()) { $0.formUnion($1) }
            let wild = Set(all.filter(\.isWildcard).map(\.eventType))
            return all.filter { $0.isWildcard || !wild.contains($0.eventType) }
        }
        for _ in 0..<2_000 {
            let node = "n\(Int.random(in: 0..<4, using: &generator))"
            let topics = Set(pool.filter { _ in Int.random(in: 0..<4, using: &generator) == 0 })
            let before = fresh()
            sets[node] = topics
            let changed = table.update(node: node, topics: topics, at: start).changed
            #expect(table.union == fresh())
            #expect(changed == (before != fresh()))
        }
    }

    func trades(_ tickers: String...) -> Set<Topic> { Set(tickers.compactMap { Topic(eventType: "T", ticker: $0) }) }

    @Test func theUnionHoldsAtMostItsBoundAndNamesANodesTopicsPastItOncePerSet() {
        var table = InterestTable(ttl: .seconds(3), maxTopics: 3)
        #expect(table.update(node: "a", topics: trades("A", "B"), at: start) == .init(changed: true))
        // B is wanted already and C fits; D and E do not (the first in order fit first).
        #expect(table.update(node: "b", topics: trades("B", "C", "D", "E"), at: start) == .init(changed: true, refused: trades("D", "E")))
        #expect(table.union == trades("A", "B", "C"))
        // The same set again is not refused again (a node repeats its set every second).
        #expect(table.update(node: "b", topics: trades("B", "C", "D", "E"), at: start) == .init(changed: false))
        // Room made by another node: the waiting topics get in at the node's next publish, in order.
        #expect(table.update(node: "a", topics: trades("B"), at: start) == .init(changed: true))
        #expect(table.update(node: "b", topics: trades("B", "C", "D", "E"), at: start) == .init(changed: true))
        #expect(table.union == trades("B", "C", "D"))
        // A changed set is asked anew; of what does not fit, only what was not named yet is named.
        #expect(table.update(node: "b", topics: trades("B", "C", "D", "E", "F"), at: start) == .init(changed: false, refused: trades("F")))
        // The topics it let go make room for its new ones in the same set (B stays: "a" wants it).
        #expect(table.update(node: "b", topics: trades("D", "E", "F"), at: start) == .init(changed: true))
        #expect(table.union == trades("B", "D", "E"))
        // A topic that left the set and comes back past the bound is named again.
        #expect(table.update(node: "b", topics: trades("D", "E"), at: start) == .init(changed: false))
        #expect(table.update(node: "a", topics: trades("G"), at: start) == .init(changed: true))
        #expect(table.update(node: "b", topics: trades("D", "E", "F"), at: start) == .init(changed: false, refused: trades("F")))
        // A new leader names them all again at the nodes' next publish.
        table.nameRefusalsAgain()
        #expect(table.update(node: "b", topics: trades("D", "E", "F"), at: start) == .init(changed: false, refused: trades("F")))
        #expect(table.update(node: "b", topics: trades("D", "E", "F"), at: start) == .init(changed: false))
    }

    @Test func aTickerAWildcardCoversCountsTowardTheBound() {
        var table = InterestTable(ttl: .seconds(3), maxTopics: 2)
        table.update(node: "a", topics: [.wildcard("Q")], at: start)
        let apple = Topic(eventType: "Q", ticker: "AAPL")!
        let change = table.update(node: "b", topics: [apple, Topic(eventType: "T", ticker: "MSFT")!], at: start)
        #expect(change == .init(changed: false, refused: trades("MSFT")))
        #expect(table.union == [.wildcard("Q")])
        // The wildcard gone, the ticker it covered is asked for by itself.
        table.update(node: "a", topics: [], at: start)
        #expect(table.union == [apple])
    }

    @Test func aNodeForgottenMakesRoomForTheTopicsThatWaited() {
        var table = InterestTable(ttl: .seconds(3), maxTopics: 2)
        table.update(node: "gone", topics: trades("A", "B"), at: start)
        #expect(table.update(node: "b", topics: trades("C"), at: start).refused == trades("C"))
        table.update(node: "b", topics: trades("C"), at: start + .seconds(2))
        #expect(table.expireNodes(at: start + .seconds(3)).nodes == ["gone"])
        #expect(table.update(node: "b", topics: trades("C"), at: start + .seconds(3)) == .init(changed: true))
        #expect(table.union == trades("C"))
    }

    @Test func aBoundedUnionNeverPassesItsBoundAndHoldsOnlyWantedTopics() {
        var generator = SystemRandomNumberGenerator()
        let pool: [Topic] = ["Q", "T", "AM"].flatMap { type in
            [Topic.wildcard(type)] + (0..<6).map { Topic(eventType: type, ticker: "S\($0)")! }
        }
        var table = InterestTable(ttl: .seconds(3), maxTopics: 8)
        var sets: [String: Set<Topic>] = [:]
        for _ in 0..<2_000 {
            let node = "n\(Int.random(in: 0..<4, using: &generator))"
            let topics = Set(pool.filter { _ in Int.random(in: 0..<3, using: &generator) == 0 })
            sets[node] = topics
            let change = table.update(node: node, topics: topics, at: start)
            let wanted = sets.values.reduce(into: Set<Topic>()) { $0.formUnion($1) }
            #expect(table.union.count <= 8)
            #expect(table.union.isSubset(of: wanted))
            #expect(change.refused.isSubset(of: topics) && change.refused.isDisjoint(with: table.union))
        }
    }

    @Test func aSilentNodeStopsCountingAfterItsTTL() {
        var table = InterestTable(ttl: .seconds(3))
        table.update(node: "a", topics: [Topic(eventType: "Q", ticker: "A")!], at: start)
        table.update(node: "b", topics: [Topic(eventType: "Q", ticker: "B")!], at: start + .seconds(2))
        #expect(table.expire(at: start + .seconds(2)) == false)
        #expect(table.expire(at: start + .seconds(3)) == true)
        #expect(table.union == [Topic(eventType: "Q", ticker: "B")!])
        #expect(table.liveNodes == ["b"])
    }

    @Test func wireFormRoundTrips() {
        let topics: Set<Topic> = [.wildcard("XQ"), Topic(eventType: "T", ticker: "BRK.B")!, Topic(eventType: "C", ticker: "EUR/USD")!]
        #expect(InterestTable.decode(InterestTable.encode(topics)) == topics)
        #expect(InterestTable.decode("").isEmpty)
    }
}

@Suite("Cluster control messages")
struct ClusterControlTests {
    func read(_ text: String) -> ClusterControl? { try? ClusterControl.read(text).get() }

    @Test func aRefusalGoesOverNATSAsTextAndOnlyAWellFormedOneIsRead() throws {
        let topics = Set(["t.MSFT", "q.BTC/USD"].compactMap { Topic(parsing: $0) })
        let control = ClusterControl.refused(topics: topics, code: 405, reason: "symbol limit exceeded")
        #expect(control.messages == ["refused:405 q.BTC/USD,t.MSFT symbol limit exceeded"])
        #expect(read(control.messages[0]) == control)
        // Many topics go as several messages, each within the bound.
        let many = Set((0..<1_200).compactMap { Topic(eventType: "t", ticker: "S\($0)") })
        let split = ClusterControl.refused(topics: many, code: 405, reason: "limit").messages
        var back = Set<Topic>()
        for message in split {
            guard case .refused(let topics, 405, "limit") = read(message) else { Issue.record("\(message.prefix(60))"); continue }
            back.formUnion(topics)
        }
        #expect(split.count == 3 && back == many)
        // Hostile or broken ones are refused, not read as anything else.
        for bad in [
            "refused:200 t.MSFT ok", "refused:405  reason", "refused:405 t.MSFT", "refused:x t.MSFT r", "refused:405 not-a-topic r",
            "refused:405 t.MSFT " + String(repeating: "r", count: 201),
            "refused:405 " + (0..<501).map { "t.S\($0)" }.joined(separator: ",") + " r",
        ] {
            #expect(read(bad) == nil, "\(bad.prefix(60))")
        }
    }

    @Test func everyKindReadsBackAsWritten() {
        for control in [
            ClusterControl.epoch("k2x9q0a1b2c3"), .upstreamDown(reason: "the cluster leader n1 is shutting down; another node takes over"),
            .loss(count: 17), .forgotten(node: "node one.a"),
        ] {
            #expect(control.messages.count == 1 && read(control.messages[0]) == control, "\(control.messages)")
        }
    }

    @Test func eachKindsFieldsAreCheckedWhole() {
        for bad in [
            "epoch:", "epoch:has.dot", "epoch:" + String(repeating: "a", count: 33), "epoch:sp ace", "loss:0", "loss:-3", "loss:many",
            "loss:1000000001", "forgotten:", "forgotten:bad=zz",
        ] {
            #expect(read(bad) == nil, "\(bad)")
        }
    }

    /// The release before this codec wrote an outage notice as bare text: it still reads as one (a
    /// cluster is upgraded a node at a time), printable and bounded like every reason clients see.
    @Test func bareTextIsAnOutageNoticeShownPrintable() {
        #expect(read("upstream connection lost (socket closed)") == .upstreamDown(reason: "upstream connection lost (socket closed)"))
        #expect(read("the cluster leader n2 closed its upstream: the lease could not be renewed") != nil)
        guard case .upstreamDown(let reason) = read("down:" + String(repeating: "x\u{7}", count: 5_000)) else {
            Issue.record("a long down reads, cut")
            return
        }
        #expect(reason.utf8.count <= 200 && !reason.contains("\u{7}"))
    }
}
