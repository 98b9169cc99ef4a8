import Logging
import MarketDataHub
import MetricsTestKit
import NIOCore
import PolygonWire
import Testing

@testable import Cluster

private func trade(_ ticker: String, _ q: Int) -> MarketEvent {
    MarketEvent(eventType: "T", ticker: ticker, bytes: ByteBuffer(string: #"{"ev":"T","sym":"\#(ticker)","p":1,"s":1,"t":1,"q":\#(q)}"#))
}

private func topic(_ text: String) -> Topic { Topic(parsing: text)! }

/// The cluster's gap-fill messages: what a node asks, what the leader answers, and the leader's merge.
@Suite("Cluster gap fill: messages and the leader's merge")
struct FillWireTests {
    static let check = EventCheck(market: .stocks, wire: .polygon, maxBytes: ClusterChecks.maxEventBytes)
    let rules = SessionLimits(eventTypes: Market.stocks.eventTypes)

    @Test func anAskReadsBackWithItsTopicsHoldersAndLastEvents() throws {
        let ask = FillWire.Ask(
            node: "node one", generation: 3, from: 1_700_000_000_000, through: 1_700_000_004_000,
            topics: [
                GapFillRequest.Held(topic: topic("T.BRK.B"), holders: 2, lastBefore: trade("BRK.B", 7)),
                GapFillRequest.Held(topic: topic("Q.MSFT"), holders: 1, lastBefore: nil),
            ])
        let read = try #require(FillWire.ask(ask).withUnsafeBytes { FillWire.readAsk($0, check: Self.check, rules: rules) })
        #expect(read.id == "node=20one/3" && read.node == "node one" && read.from == 1_700_000_000_000 && read.through == 1_700_000_004_000)
        #expect(read.topics.map(\.topic) == [topic("T.BRK.B"), topic("Q.MSFT")] && read.topics.map(\.holders) == [2, 1])
        #expect(PolygonWireProtocol().orderValue(.sequence, of: try #require(read.topics[0].lastBefore)) == 7 && read.topics[1].lastBefore == nil)
    }

    @Test func recoveredEventsTravelInMessagesUnderNATSsLimitAndReadBackWhole() throws {
        let events = (1...20_000).map { trade("AAPL", $0) }
        let messages = FillWire.events(topic("T.AAPL"), order: .sequence, events)
        #expect(messages.count > 1 && messages.allSatisfy { $0.count <= FillWire.maxMessageBytes })
        var back: [MarketEvent] = []
        for message in messages {
            let (readTopic, order, part) = try #require(message.withUnsafeBytes { FillWire.readEvents($0, check: Self.check) })
            #expect(readTopic == topic("T.AAPL") && order == .sequence)
            #expect(message.withUnsafeBytes { FillWire.eventsTopic($0) } == topic("T.AAPL"), "the topic read from the first line alone")
            back += part
        }
        #expect(back.compactMap { PolygonWireProtocol().orderValue(.sequence, of: $0) } == Array(1...20_000))
    }

    @Test func aFillsEndNamesTheAsksItAnswered() throws {
        var summary = GapFillSummary(from: 10, through: 20)
        summary.recovered[topic("T.AAPL")] = 5
        summary.missing[topic("Q.MSFT")] = "REST 503 after 15 (Unix ms)\nthe rest is missing"
        let (end, answered) = try #require(
            FillWire.end(.filled(summary), from: 10, through: 20, answering: ["n1/2", "n2/7"]).withUnsafeBytes { FillWire.readEnd($0) })
        #expect(answered == ["n1/2", "n2/7"])
        guard case .filled(let read) = end else {
            Issue.record("not filled: \(end)")
            return
        }
        #expect(read.from == 10 && read.through == 20 && read.recovered == [topic("T.AAPL"): 5])
        #expect(read.missing == [topic("Q.MSFT"): "REST 503 after 15 (Unix ms)the rest is missing"])
        // A reason too long for the message's room leaves the topics after it theirs.
        var crowded = GapFillSummary(from: 10, through: 20)
        crowded.missing[topic("Q.AAPL")] = String(repeating: "x", count: FillWire.maxMessageBytes)
        crowded.missing[topic("Q.MSFT")] = "REST 503"
        let (crowdedEnd, _) = try #require(
            FillWire.end(.filled(crowded), from: 10, through: 20, answering: ["n1/3"]).withUnsafeBytes { FillWire.readEnd($0) })
        guard case .filled(let crowdedRead) = crowdedEnd else {
            Issue.record("not filled: \(crowdedEnd)")
            return
        }
        #expect(crowdedRead.missing[topic("Q.MSFT")] == "REST 503")
        let skipped = FillWire.end(.skipped, from: 1, through: 2, answering: ["n1/1"]).withUnsafeBytes { FillWire.readEnd($0) }
        guard case .skipped = skipped?.end else {
            Issue.record("not skipped")
            return
        }
    }

    @Test func malformedMessagesReadAsNothing() {
        let good = FillWire.ask(
            FillWire.Ask(node: "n", generation: 1, from: 1_700_000_000_000, through: 1_700_000_001_000, topics: [GapFillRequest.Held(topic: topic("T.AAPL"), holders: 1, lastBefore: trade("AAPL", 1))]))
        let bad: [[UInt8]] = [
            [], Array("A n 1 2\n".utf8), Array("A n x 1 2\n".utf8), Array("A n 1 5 2\n".utf8),
            Array(good.dropLast()), Array("A n 1 1700000000000 1700000001000\nT * 1 0\n".utf8), Array("A n 1 1700000000000 1700000001000\nT AAPL 1 999\n{}".utf8),
            Array("A n 1 1700000000000 1700000001000\nT AAPL 1 2\n{}".utf8),
            // Windows no node could have seen, and holders past any node's.
            Array("A n 1 -9223372036854775808 9223372036854775807\n".utf8), Array("A n 1 1000 2000\n".utf8),
            Array("A n 1 1700000000000 1700000001000\nT AAPL 99999999999 0\n".utf8),
            // An event of another topic than its message names.
            Array("A n 1 1700000000000 1700000001000\nT MSFT 1 \(trade("AAPL", 1).bytes.readableBytes)\n".utf8) + Array(trade("AAPL", 1).bytes.readableBytesView),
        ]
        for message in bad {
            #expect(message.withUnsafeBytes { FillWire.readAsk($0, check: Self.check, rules: rules) } == nil, "\(String(decoding: message, as: UTF8.self))")
        }
        for message in [Array("E q T AAPL\n5\n{}".utf8), Array("E z T AAPL\n".utf8), Array("E q T AAPL\n-1\n".utf8)] {
            #expect(message.withUnsafeBytes { FillWire.readEvents($0, check: Self.check) } == nil)
        }
        for message in [Array("S done 1 2 n/1\n".utf8), Array("S filled 1 2 n/1\nR T AAPL x\n".utf8), Array("S filled 1 2 n/1\nX T AAPL 1\n".utf8)] {
            #expect(message.withUnsafeBytes { FillWire.readEnd($0) } == nil)
        }
    }

    @Test func theLeaderFillsEachTopicOnceFromTheEarliestLastEventAnyNodeHadForTheUnionWindow() throws {
        let asks = [
            FillWire.Ask(node: "n1", generation: 1, from: 100, through: 900, topics: [
                GapFillRequest.Held(topic: topic("T.AAPL"), holders: 1, lastBefore: trade("AAPL", 12)),
                GapFillRequest.Held(topic: topic("T.MSFT"), holders: 3, lastBefore: trade("MSFT", 4)),
            ]),
            FillWire.Ask(node: "n2", generation: 5, from: 50, through: 800, topics: [
                GapFillRequest.Held(topic: topic("T.AAPL"), holders: 4, lastBefore: trade("AAPL", 9)),
                GapFillRequest.Held(topic: topic("T.MSFT"), holders: 1, lastBefore: nil),
            ]),
        ]
        let request = ClusterGapFill.merge(asks, generation: 2, wire: PolygonWireProtocol())
        #expect(request.from == 50 && request.through == 900 && request.generation == 2)
        #expect(request.topics.map(\.topic) == [topic("T.AAPL"), topic("T.MSFT")], "most held first")
        #expect(request.topics.map(\.holders) == [5, 4])
        #expect(request.topics[0].lastBefore.flatMap { PolygonWireProtocol().orderValue(.sequence, of: $0) } == 9)
        #expect(request.topics[1].lastBefore == nil, "a node that had none: from the window's start")
    }

    // MARK: hostile input (issue 11)

    let maxWindow = Duration.seconds(900)
    let now = WallClock.nowMilliseconds()

    func ask(_ node: String, from: Int64, through: Int64, _ topics: String...) -> FillWire.Ask {
        FillWire.Ask(
            node: node, generation: 1, from: from, through: through,
            topics: topics.map { GapFillRequest.Held(topic: topic($0), holders: 1, lastBefore: nil) })
    }

    @Test func anAskReachingFurtherBackThanTheFillCoversIsNotFilled() {
        // 2000-01-01: plausible to the reader, yet merged it would widen every fill past what is filled.
        let ancient = ask("x", from: 946_684_800_000, through: now, "T.AAPL")
        #expect(ancient.withBytes { FillWire.readAsk($0, check: Self.check, rules: rules) } != nil)
        #expect(!FillWire.fillable(ancient, maxWindow: maxWindow, now: now))
        // A short window long ago, a window longer than the fill covers, one ending in the future.
        #expect(!FillWire.fillable(ask("x", from: 946_684_800_000, through: 946_684_810_000, "T.AAPL"), maxWindow: maxWindow, now: now))
        #expect(!FillWire.fillable(ask("x", from: now - 901_000, through: now, "T.AAPL"), maxWindow: maxWindow, now: now))
        #expect(!FillWire.fillable(ask("x", from: now - 1_000, through: now + 3_600_000, "T.AAPL"), maxWindow: maxWindow, now: now))
        // What a node asks after an outage: filled, give or take a clock's skew.
        #expect(FillWire.fillable(ask("n1", from: now - 30_000, through: now - 200, "T.AAPL"), maxWindow: maxWindow, now: now))
        #expect(FillWire.fillable(ask("n1", from: now - 899_000, through: now, "T.AAPL"), maxWindow: maxWindow, now: now))
        #expect(FillWire.fillable(ask("n1", from: now - 10_000, through: now + 5_000, "T.AAPL"), maxWindow: maxWindow, now: now))
    }

    @Test func asksWhoseUnionIsLongerThanTheFillCoversAreFilledInTurns() {
        let asks = [
            ask("n1", from: now - 880_000, through: now - 870_000, "T.AAPL"),
            ask("n2", from: now - 20_000, through: now - 1_000, "T.MSFT"),
            ask("n3", from: now - 40_000, through: now, "T.AAPL"),
        ]
        let (first, later) = ClusterGapFill.batch(asks, maxWindow: .seconds(60))
        #expect(first.map(\.node) == ["n3", "n2"], "the newest first, as long as the union fits")
        #expect(later.map(\.node) == ["n1"])
        let request = ClusterGapFill.merge(first, generation: 1, wire: PolygonWireProtocol())
        #expect(request.through - request.from <= 60_000)
        #expect(ClusterGapFill.batch(later, maxWindow: .seconds(60)).now.map(\.node) == ["n1"], "each ask alone is filled")
        // Within the window: one fill for all.
        #expect(ClusterGapFill.batch(asks, maxWindow: maxWindow).later.isEmpty)
    }

    /// An ask is anyone's who may publish on NATS, and each topic it names costs REST requests: the
    /// leader fills only the topics the cluster's interest names, by name or by their wildcard.
    @Test func theLeaderFillsOnlyTopicsTheClustersInterestNames() {
        let metrics = TestMetrics()
        let asks = [ask("n1", from: now - 5_000, through: now, "T.AAPL", "T.MADEUP", "Q.MSFT"), ask("forged", from: now - 5_000, through: now, "T.NOBODY")]
        let (kept, unwanted) = ClusterGapFill.wanted(
            asks, in: [topic("T.AAPL"), topic("Q.*")], metrics: ClusterMetrics(factory: metrics), logger: Logger(label: "fill"))
        #expect(kept.map { $0.topics.map(\.topic) } == [[topic("T.AAPL"), topic("Q.MSFT")], []], "an ask with none left is still answered")
        #expect(unwanted == [topic("T.MADEUP"), topic("T.NOBODY")], "told missing in the fill's end")
        #expect(metrics.counterTotal(label: "relay_cluster_rejected_total", dimensions: [("kind", "fill_ask")]) == 1)
        #expect(ClusterGapFill.merge(kept, generation: 1, wire: PolygonWireProtocol()).topics.count == 2)
    }

    @Test func aNodeTakesRecoveredEventsOnlyOfTopicsAnAskNamed() {
        let asked = AskedTopics()
        let start = ContinuousClock.now
        asked.note([topic("T.AAPL"), topic("Q.MSFT")], at: start)
        #expect(asked.contains(topic("T.AAPL"), at: start + .seconds(1)))
        #expect(!asked.contains(topic("T.NVDA"), at: start + .seconds(1)), "nobody asked for it")
        #expect(!asked.contains(topic("Q.MSFT"), at: start + AskedTopics.lifetime), "asked too long ago")
        // A flood of asks keeps the most recent topics, never more than the cap.
        let flood = (0..<(AskedTopics.maxTopics + 10)).map { Topic(eventType: "T", ticker: "Z\($0)")! }
        asked.note(flood, at: start + .seconds(2))
        asked.note([topic("T.NVDA")], at: start + .seconds(3))
        #expect(asked.contains(topic("T.NVDA"), at: start + .seconds(4)))
        // Past the cap the list is trimmed to nine tenths in one go: the next 10,000 new topics are
        // taken without another trim (each had sorted the whole list), the oldest let go first.
        #expect(asked.count == AskedTopics.keptAfterTrim + 1, "the flood trimmed to nine tenths, then T.NVDA")
        #expect(!asked.contains(topic("T.AAPL"), at: start + .seconds(4)), "the oldest went first")
        let more = (1..<(AskedTopics.maxTopics - AskedTopics.keptAfterTrim)).map { Topic(eventType: "T", ticker: "Y\($0)")! }
        for (index, topic) in more.enumerated() { asked.note([topic], at: start + .seconds(5) + .milliseconds(index)) }
        #expect(asked.count == AskedTopics.maxTopics, "no trim until the cap is passed again")
        #expect(asked.contains(topic("T.NVDA"), at: start + .seconds(60)))
    }

    @Test func whyATopicWasNotFilledIsShownBoundedAndPrintable() throws {
        let hostile = "M T AAPL " + String(repeating: "\u{1B}[31mred\u{7}", count: 300) + "\n"
        let message = Array("S filled 1 2 n/1\n".utf8) + Array(hostile.utf8)
        let (end, _) = try #require(message.withUnsafeBytes { FillWire.readEnd($0) })
        guard case .filled(let summary) = end, let reason = summary.missing[topic("T.AAPL")] else {
            Issue.record("not read: \(end)")
            return
        }
        #expect(reason.utf8.count <= ClusterText.maxBytes)
        #expect(reason.unicodeScalars.allSatisfy { VisibleText.isVisible($0) }, "\(reason.debugDescription)")
        #expect(reason.hasPrefix("[31mred [31mred"))
    }
}

extension FillWire.Ask {
    func withBytes<T>(_ body: (UnsafeRawBufferPointer) -> T) -> T { FillWire.ask(self).withUnsafeBytes(body) }
}

/// The leader's queue of fill asks: bounded whoever publishes them.
@Suite("Cluster gap fill: the leader's asks")
struct AskInboxTests {
    @Test func theLeaderKeepsOneAskPerNodeTheLatestAndAnswersSkippedPastItsCap() {
        let inbox = AskInbox()
        _ = inbox.open()
        func asking(_ node: String, _ generation: Int) -> FillWire.Ask {
            FillWire.Ask(node: node, generation: generation, from: 1_700_000_000_000, through: 1_700_000_001_000, topics: [])
        }
        // A generation far ahead (forged, or of the node's run before a restart) is replaced by the
        // node's next ask, whatever its number.
        inbox.add(asking("a", 999_999_999))
        inbox.add(asking("a", 2))
        inbox.add(asking("a", 3))
        for index in 0..<(AskInbox.maxAsks + 10) { inbox.add(asking("n\(index)", 1)) }
        let taken = inbox.take()
        #expect(taken.count == AskInbox.maxAsks)
        #expect(taken.filter { $0.node == "a" }.map(\.generation) == [3], "a node's latest ask stands for its earlier ones")
        #expect(inbox.takeRefused().count == 11, "the nodes past the cap are answered skipped")
    }
}
