import Foundation
import MarketCore
import RelayTestSupport
import Testing

@testable import Tape

/// The tape as the hub's archive, on a real file: a resume's events from a position, whole only while
/// the topic was received, found by market sequence, by time and by topic sequence.
@Suite("Tape archive: resumes from positions older than memory")
struct TapeArchiveTests {
    static let start: Int64 = 1_795_185_000 * 1_000_000_000

    /// 300 events 1 ms apart in 1 KB blocks: AAPL quotes (held by name), MSFT and NVDA trades (held by
    /// `T.*`), MSFT quotes (not held: none is recorded, but a resume of them is a gap); the upstream is
    /// lost after event 200.
    func tape(in directory: String, leaving missing: Set<Int> = [], from firstIndex: Int = 1) throws -> [TapeEvent] {
        let writer = try TapeWriter(directory: directory, market: "stocks", blockBytes: 1024)
        try writer.append(.epoch("e1", at: Self.start))
        try writer.append(.wanted(topic: "Q.AAPL", true, at: Self.start))
        try writer.append(.wanted(topic: "T.*", true, at: Self.start))
        var events: [TapeEvent] = []
        var topicSequences: [String: UInt64] = [:]
        for index in firstIndex...300 {
            let (type, symbol) = [("Q", "AAPL"), ("T", "MSFT"), ("T", "NVDA")][index % 3]
            let topicSequence = (topicSequences["\(type).\(symbol)"] ?? 0) + 1
            topicSequences["\(type).\(symbol)"] = topicSequence
            let event = TapeEvent(
                receivedAt: Self.start + Int64(index) * 1_000_000, sequence: UInt64(index), topicSequence: topicSequence, eventType: type,
                ticker: symbol, bytes: Array(#"{"ev":"\#(type)","sym":"\#(symbol)","n":\#(index)}"#.utf8))
            guard !missing.contains(index) else { continue }
            try writer.append(.event(event))
            events.append(event)
            if index == 200 { try writer.append(.interrupted(at: event.receivedAt)) }
        }
        try writer.flush()
        return events
    }

    func withTape(leaving missing: Set<Int> = [], from first: Int = 1, _ body: (TapeArchive, [TapeEvent]) async throws -> Void) async throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("tape-archive-\(UUID().uuidString)").path
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let events = try tape(in: directory, leaving: missing, from: first)
        try await body(TapeArchive(directory: directory, market: "stocks", check: stocksCheck), events)
    }

    func sequences(_ answer: ArchiveAnswer?) -> [UInt64]? {
        guard case .events(_, let positions) = answer else { return nil }
        return positions.map(\.market)
    }

    @Test func aTopicReceivedAllAlongResumesByMarketSequenceTimeOrTopicSequence() async throws {
        try await withTape { archive, events in
            let apple = try #require(Topic(parsing: "Q.AAPL"))
            let expected = events.filter { $0.ticker == "AAPL" && $0.sequence > 51 && $0.sequence <= 150 }.map(\.sequence)
            let byMarket = await archive.missed([ArchiveRequest(topic: apple, since: .market(51), until: 150)], epoch: "e1", limit: 1_000)
            #expect(sequences(byMarket[apple]) == expected)
            // AAPL's quote at market sequence 51 is its 17th.
            let seventeenth = try #require(events.first { $0.sequence == 51 })
            #expect(seventeenth.ticker == "AAPL")
            let byTopic = await archive.missed(
                [ArchiveRequest(topic: apple, since: .topic(seventeenth.topicSequence), until: 150)], epoch: "e1", limit: 1_000)
            #expect(sequences(byTopic[apple]) == expected)
            let byTime = await archive.missed(
                [ArchiveRequest(topic: apple, since: .time((seventeenth.receivedAt + 1_000_000) / 1_000_000), until: 150)], epoch: "e1", limit: 1_000)
            #expect(sequences(byTime[apple]) == expected, "from the first event at or after the time")
            if case .events(let bytes, let positions) = byMarket[apple] {
                #expect(positions.map(\.topic) == Array(18...UInt64(17 + positions.count)), "topic sequences contiguous")
                #expect(bytes.first?.json.contains(#""n":54"#) == true, "the upstream's own bytes")
            }
        }
    }

    @Test func aWildcardGetsItsTypesEventsAndALossOrATopicNotHeldIsAGap() async throws {
        try await withTape { archive, events in
            let trades = try #require(Topic(parsing: "T.*"))
            let answers = await archive.missed([ArchiveRequest(topic: trades, since: .market(10), until: 100)], epoch: "e1", limit: 1_000)
            #expect(sequences(answers[trades]) == events.filter { $0.eventType == "T" && $0.sequence > 10 && $0.sequence <= 100 }.map(\.sequence))
            // Across the loss after event 200: a gap.
            let lost = await archive.missed([ArchiveRequest(topic: trades, since: .market(150), until: 250)], epoch: "e1", limit: 1_000)
            guard case .gap(let from, let through, _, _) = lost[trades] else {
                Issue.record("a gap across the loss: \(String(describing: lost[trades]))")
                return
            }
            #expect(from == 151 && through == 250)
            // MSFT quotes were never held; another epoch's positions are not these.
            let quotes = try #require(Topic(parsing: "Q.MSFT"))
            let notHeld = await archive.missed([ArchiveRequest(topic: quotes, since: .market(10), until: 100)], epoch: "e1", limit: 1_000)
            if case .gap = notHeld[quotes] {} else { Issue.record("not held: a gap, not \(String(describing: notHeld[quotes]))") }
            let otherEpoch = await archive.missed([ArchiveRequest(topic: trades, since: .market(10), until: 100)], epoch: "e2", limit: 1_000)
            if case .events = otherEpoch[trades] { Issue.record("another epoch's positions are not answered") }
            // Past the limit: too many, none returned.
            let bounded = await archive.missed([ArchiveRequest(topic: trades, since: .market(10), until: 100)], epoch: "e1", limit: 5)
            if case .tooMany = bounded[trades] {} else { Issue.record("past the limit: \(String(describing: bounded[trades]))") }
        }
    }

    /// A market sequence missing from the tape (a batch the recorder could not keep, events it was not
    /// handed) is a gap, as is a position the tape does not hold (older than its first day).
    @Test func aHoleInTheNumbersOrAPositionNotOnTheTapeIsAGap() async throws {
        try await withTape(leaving: [120]) { archive, _ in
            let trades = try #require(Topic(parsing: "T.*"))
            let across = await archive.missed([ArchiveRequest(topic: trades, since: .market(100), until: 150)], epoch: "e1", limit: 1_000)
            guard case .gap(_, _, _, let reason) = across[trades] else {
                Issue.record("a hole is a gap: \(String(describing: across[trades]))")
                return
            }
            #expect(reason.contains("120"), "\(reason)")
            let before = await archive.missed([ArchiveRequest(topic: trades, since: .market(100), until: 118)], epoch: "e1", limit: 1_000)
            if case .events = before[trades] {} else { Issue.record("before the hole: whole, not \(String(describing: before[trades]))") }
        }
        try await withTape(from: 50) { archive, _ in
            let trades = try #require(Topic(parsing: "T.*"))
            let earlier = await archive.missed([ArchiveRequest(topic: trades, since: .market(10), until: 100)], epoch: "e1", limit: 1_000)
            if case .gap = earlier[trades] {} else { Issue.record("a position the file does not hold: \(String(describing: earlier[trades]))") }
        }
    }

    /// A read is charged by the blocks it decoded (its walk back to the wanted set included).
    /// A read of many topics finds each one's events by its topic and every hole once (not by a look at
    /// every topic for every event): each topic's answer is what a read of it alone gives, across holes,
    /// losses, wanted changes, wildcards and reads through the epoch's end.
    @Test func aReadOfManyTopicsAnswersEachAsAReadOfItAlone() async throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("tape-many-\(UUID().uuidString)").path
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let writer = try TapeWriter(directory: directory, market: "stocks", blockBytes: 2048)
        let symbols = ["AAPL", "MSFT", "NVDA", "AMZN", "META", "TSLA"]
        try writer.append(.epoch("e1", at: Self.start))
        try writer.append(.holding(["T.*"] + symbols.prefix(4).map { "Q.\($0)" }, at: Self.start))
        var topicSequences: [String: UInt64] = [:]
        for index in 1...900 {
            let time = Self.start + Int64(index) * 1_000_000
            // MSFT's quotes are not received for a while; TSLA's from 300 on; a loss after 600; 450 is missing.
            if index == 200 { try writer.append(.wanted(topic: "Q.MSFT", false, at: time)) }
            if index == 260 { try writer.append(.wanted(topic: "Q.MSFT", true, at: time)) }
            if index == 300 { try writer.append(.wanted(topic: "Q.TSLA", true, at: time)) }
            if index == 601 { try writer.append(.interrupted(at: time)) }
            let (type, symbol) = (index % 4 == 0 ? "T" : "Q", symbols[(index * 7) % symbols.count])
            let topicSequence = (topicSequences["\(type).\(symbol)"] ?? 0) + 1
            topicSequences["\(type).\(symbol)"] = topicSequence
            guard index != 450 else { continue }
            try writer.append(
                .event(
                    TapeEvent(
                        receivedAt: time, sequence: UInt64(index), topicSequence: topicSequence, eventType: type, ticker: symbol,
                        bytes: Array(#"{"ev":"\#(type)","sym":"\#(symbol)","n":\#(index)}"#.utf8))))
        }
        try writer.flush()
        let archive = TapeArchive(directory: directory, market: "stocks", check: stocksCheck)
        let topics = (symbols.map { "Q.\($0)" } + symbols.map { "T.\($0)" } + ["T.*", "Q.*"]).compactMap { Topic(parsing: $0) }
        func text(_ answer: ArchiveAnswer?) -> String {
            switch answer {
            case .events(let events, let positions): "events \(positions.map(\.market)) \(events.map { String(buffer: $0.bytes) })"
            default: String(describing: answer)
            }
        }
        var compared = 0
        for (after, until) in [(UInt64(10), UInt64(180)), (100, 400), (250, 700), (500, ArchiveRequest.epochEnd), (620, ArchiveRequest.epochEnd), (0, 120)] {
            let requests = topics.map { ArchiveRequest(topic: $0, since: .market(after), until: until) }
            let together = await archive.missed(requests, epoch: "e1", limit: 100_000)
            for request in requests {
                let alone = await archive.missed([request], epoch: "e1", limit: 100_000)
                #expect(text(together[request.topic]) == text(alone[request.topic]), "\(request.topic) from \(after) through \(until)")
                compared += 1
            }
        }
        #expect(compared == 84)
    }

    /// An event a topic's reading and its type's wildcard's both take goes to the one asked first when
    /// only one more may be given; an event recorded under the wildcard ticker itself is taken once.
    @Test func theLimitGoesToTheTopicAskedFirstAndAnEventIsTakenOnce() async throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("tape-order-\(UUID().uuidString)").path
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let writer = try TapeWriter(directory: directory, market: "stocks", blockBytes: 1024)
        try writer.append(.epoch("e1", at: Self.start))
        try writer.append(.holding(["T.*"], at: Self.start))
        for (index, ticker) in [(1, "AAPL"), (2, "AAPL"), (3, "*")] {
            try writer.append(
                .event(
                    TapeEvent(
                        receivedAt: Self.start + Int64(index), sequence: UInt64(index), topicSequence: UInt64(index), eventType: "T", ticker: ticker,
                        bytes: Array(#"{"ev":"T","sym":"\#(ticker)","n":\#(index)}"#.utf8))))
        }
        try writer.flush()
        let (wildcard, apple) = (try #require(Topic(parsing: "T.*")), try #require(Topic(parsing: "T.AAPL")))
        let archive = TapeArchive(directory: directory, market: "stocks", check: stocksCheck)
        for (first, second) in [(wildcard, apple), (apple, wildcard)] {
            let answers = await archive.missed(
                [ArchiveRequest(topic: first, since: .market(1), until: 2), ArchiveRequest(topic: second, since: .market(1), until: 2)], epoch: "e1", limit: 1)
            #expect(sequences(answers[first]) == [2], "\(first) asked first: \(String(describing: answers[first]))")
            if case .tooMany = answers[second] {} else { Issue.record("\(second) asked second: \(String(describing: answers[second]))") }
        }
        // Unchecked (an archive given no check), the event under `T.*` itself is the wildcard's once.
        let unchecked = TapeArchive(market: "stocks") { _, days, _ in
            days == 1 ? TapeFile.days(directory: directory, market: "stocks").last.flatMap { try? TapeDays(paths: [$0.path]) } : nil
        }
        let once = await unchecked.missed([ArchiveRequest(topic: wildcard, since: .market(2), until: 3)], epoch: "e1", limit: 10)
        #expect(sequences(once[wildcard]) == [3], "\(String(describing: once[wildcard]))")
    }

    @Test func aReadCostsTheShareOfItsBudgetItsBlocksTook() async throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("tape-archive-\(UUID().uuidString)").path
        defer { try? FileManager.default.removeItem(atPath: directory) }
        _ = try tape(in: directory)
        let archive = TapeArchive(directory: directory, market: "stocks", check: stocksCheck)
        do {
            let trades = try #require(Topic(parsing: "T.*"))
            let far = await archive.reading([ArchiveRequest(topic: trades, since: .market(1), until: 200)], epoch: "e1", limit: 1_000)
            let near = await archive.reading([ArchiveRequest(topic: trades, since: .market(190), until: 200)], epoch: "e1", limit: 1_000)
            // The nearer position walks back further, to the tape's one wanted set (its second block):
            // charged like the blocks it scans, so it costs more here.
            #expect(near.cost > far.cost && far.cost > 0, "from 1: \(far.cost), from 190: \(near.cost)")
            let blocks = try TapeDays(paths: TapeFile.days(directory: directory, market: "stocks").map(\.path)).blockCount
            #expect(near.cost * Double(TapeArchive.blocksPerRead) <= Double(2 * blocks), "at most the walk back and the scan over every block")
        }
    }

    /// A position past any the relay gives is a gap at once, never arithmetic on it.
    @Test func aPositionTheRelayNeverGivesIsAGapNotARead() async throws {
        try await withTape { archive, _ in
            let apple = try #require(Topic(parsing: "Q.AAPL"))
            for until in [ArchiveRequest.epochEnd, 150] {
                let answer = await archive.missed([ArchiveRequest(topic: apple, since: .market(.max), until: until)], epoch: "e1", limit: 1_000)
                guard case .gap(_, _, _, let reason) = answer[apple] else { return #expect(Bool(false), "\(String(describing: answer[apple]))") }
                #expect(reason == "not a position on the tape")
            }
        }
    }

    /// A run recorded without positions (history off) leaves events of market sequence 0 on the tape: a
    /// time resume passes over them (it once took `0 - 1`, and stopped the relay).
    @Test func eventsWithoutPositionsArePassedOver() async throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("tape-archive-\(UUID().uuidString)").path
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let writer = try TapeWriter(directory: directory, market: "stocks", blockBytes: 1024)
        try writer.append(.epoch("e1", at: Self.start))
        try writer.append(.event(TapeEvent(receivedAt: Self.start + 1_000_000, sequence: 0, eventType: "T", ticker: "A", bytes: [0x7B, 0x7D])))
        try writer.flush()
        let archive = TapeArchive(directory: directory, market: "stocks", check: stocksCheck)
        let trades = try #require(Topic(parsing: "T.*"))
        let answers = await archive.missed([ArchiveRequest(topic: trades, since: .time(Self.start / 1_000_000), until: 10)], epoch: "e1", limit: 100)
        #expect(answers[trades] != nil)
    }

    /// A former epoch read through its end (a cluster's term after a failover): whole from the client's
    /// position when nothing of the epoch follows its last loss, with the time its record ends; a loss
    /// the epoch went on after is a gap; a position past what was recorded gets nothing, and the end.
    @Test func aFormerEpochIsReadThroughItsEnd() async throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("tape-archive-\(UUID().uuidString)").path
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let writer = try TapeWriter(directory: directory, market: "stocks", blockBytes: 1024)
        try appendQuotes(to: writer, epoch: "e1", 1...100, at: Self.start)
        // The term ends (its leader's last mark), then the next term's epoch begins.
        let end = Self.start + 101 * 1_000_000
        try writer.append(.interrupted(at: end))
        try writer.append(.epoch("e2", at: end + 5_000_000_000))
        try writer.append(.holding(["Q.AAPL"], at: end + 5_000_000_000))
        try writer.flush()
        let archive = TapeArchive(directory: directory, market: "stocks", check: stocksCheck)
        let apple = try #require(Topic(parsing: "Q.AAPL"))
        let answers = await archive.missed([ArchiveRequest(topic: apple, since: .topic(60), until: ArchiveRequest.epochEnd)], epoch: "e1", limit: 1_000)
        guard case .throughEnd(_, let positions, let endedAt) = answers[apple] else {
            Issue.record("whole through the end: \(String(describing: answers[apple]))")
            return
        }
        #expect(positions.map(\.topic) == Array(61...100))
        #expect(endedAt == end / 1_000_000, "the record of e1 ends at its last mark")
        // Asked from past what was recorded: nothing more, and where the record ends.
        let past = await archive.missed([ArchiveRequest(topic: apple, since: .market(105), until: ArchiveRequest.epochEnd)], epoch: "e1", limit: 1_000)
        guard case .throughEnd(let none, _, _) = past[apple] else {
            Issue.record("a position past the recording: \(String(describing: past[apple]))")
            return
        }
        #expect(none.isEmpty)
        // The same tape with a loss in the middle of e1: reading through it is a gap.
        try await withTape { archive, _ in
            let lost = await archive.missed([ArchiveRequest(topic: apple, since: .market(150), until: ArchiveRequest.epochEnd)], epoch: "e1", limit: 1_000)
            guard case .gap = lost[apple] else {
                Issue.record("events of e1 after its loss: a gap, not \(String(describing: lost[apple]))")
                return
            }
        }
    }

    /// A resume from before midnight UTC reads yesterday's day file too: the newest day first, then one
    /// more while the position is not found.
    @Test func aPositionFromYesterdaysFileResumesAcrossMidnight() async throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("tape-archive-\(UUID().uuidString)").path
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let midnight = try #require(TapeFile.midnight(of: "2026-11-28"))
        let writer = try TapeWriter(directory: directory, market: "stocks", blockBytes: 1024)
        let first = midnight - 150_000_000
        try appendQuotes(to: writer, epoch: "e1", 1...300, at: first)
        try writer.flush()
        #expect(TapeFile.days(directory: directory, market: "stocks").map(\.day) == ["2026-11-27", "2026-11-28"])
        let archive = TapeArchive(directory: directory, market: "stocks", check: stocksCheck)
        let apple = try #require(Topic(parsing: "Q.AAPL"))
        let answers = await archive.missed([ArchiveRequest(topic: apple, since: .topic(40), until: 280)], epoch: "e1", limit: 1_000)
        guard case .events(_, let positions) = answers[apple] else {
            Issue.record("whole across midnight: \(String(describing: answers[apple]))")
            return
        }
        #expect(positions.map(\.topic) == Array(41...280))
        let byTime = await archive.missed([ArchiveRequest(topic: apple, since: .time((first + 100_000_000) / 1_000_000), until: 280)], epoch: "e1", limit: 1_000)
        guard case .events(_, let fromTime) = byTime[apple] else {
            Issue.record("by time, across midnight: \(String(describing: byTime[apple]))")
            return
        }
        #expect(fromTime.first?.topic == 100)
    }
}
