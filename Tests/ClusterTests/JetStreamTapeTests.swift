import AlpacaWire
import CoreMetrics
import Foundation
import Logging
import MarketCore
import NIOCore
import PolygonWire
import RelayBench
import RelayTestSupport
import Tape
import Testing

@testable import Cluster

/// The cluster's tape on a real nats-server with JetStream: blocks written through the leader's sink,
/// read back by term (its subject) as the archive reads them.
@Suite(
    "Cluster tape: a JetStream stream read by term", .serialized, .timeLimit(.minutes(2)),
    .enabled(
        if: NATSServerProcess.binary != nil || ProcessInfo.processInfo.environment["RELAY_REQUIRE_NATS"] == "1",
        "nats-server is not installed (scripts/test installs it)"))
struct JetStreamTapeTests {
    static let start: Int64 = 1_795_185_000 * 1_000_000_000

    /// A stream of a new cluster on a fresh server; the server is given to `body` to stop.
    func withStream(_ body: (JetStreamTape, NATSServerProcess) async throws -> Void) async throws {
        try await withStream { tape, nats, _, _ in try await body(tape, nats) }
    }

    /// The same, with the server's URL and the cluster's name.
    func withStream(_ body: (JetStreamTape, NATSServerProcess, _ url: String, _ cluster: String) async throws -> Void) async throws {
        let nats = try NATSServerProcess()
        let url = try await nats.start()
        let connection = try await connectedNATS(url, name: "tape-test")
        let cluster = "t\(UInt32.random(in: 0...UInt32.max))"
        let tape = JetStreamTape(subjects: try ClusterSubjects(cluster: cluster, market: "stocks"), settings: ClusterTapeSettings())
        tape.use(connection)
        do {
            try await body(tape, nats, url, cluster)
        } catch {
            await connection.close()
            await nats.stop()
            throw error
        }
        await connection.close()
        await nats.stop()
    }

    /// AAPL quotes `sequences` of `epoch` (topic and market sequence alike), 1 ms apart from `at`, in
    /// blocks of about 16, through the leader's sink.
    func record(_ tape: JetStreamTape, epoch: String, _ sequences: ClosedRange<Int>, at time: Int64) throws {
        let writer = try TapeWriter(sink: JetStreamTapeSink(tape: tape), blockBytes: 1024)
        try appendQuotes(to: writer, epoch: epoch, sequences, at: time)
        try writer.flush()
    }

    func archive(_ tape: JetStreamTape) -> TapeArchive {
        let check = TapeEventCheck(
            check: EventCheck(market: .stocks, wire: .polygon, maxBytes: ClusterChecks.maxEventBytes),
            metrics: ClusterMetrics(factory: NOOPMetricsHandler.instance), logger: Logger(label: "tape-test"))
        return TapeArchive(market: "stocks") { epoch, days, _ in days == 1 ? JetStreamTapeBlocks(tape: tape, epoch: epoch, check: check) : nil }
    }

    /// A block whose events are not each one event of their topic (whoever may publish on the tape's
    /// subject could write one) is read as damaged: a reading across it is a gap, never its events.
    @Test func aBlockWithAnEventThatDoesNotCheckIsAGap() async throws {
        try await withStream { tape, _ in
            try record(tape, epoch: "e1", 1...20, at: Self.start)
            let writer = try TapeWriter(sink: JetStreamTapeSink(tape: tape), blockBytes: 1 << 20)
            try writer.append(.epoch("e1", at: Self.start))
            let forged = ByteBuffer(string: #"{"ev":"T","sym":"MSFT","p":1,"forged":1}"#)
            try writer.append(
                .event(TapeEvent(receivedAt: Self.start + 21_000_000, sequence: 21, topicSequence: 21, eventType: "Q", ticker: "AAPL", bytes: forged)))
            try writer.flush()
            let apple = try #require(Topic(parsing: "Q.AAPL"))
            let answers = await archive(tape).missed([ArchiveRequest(topic: apple, since: .topic(10), until: ArchiveRequest.epochEnd)], epoch: "e1", limit: 1_000)
            if case .gap = answers[apple] {} else { Issue.record("across a forged block: a gap, not \(String(describing: answers[apple]))") }
            let before = await archive(tape).missed([ArchiveRequest(topic: apple, since: .topic(5), until: 15)], epoch: "e1", limit: 1_000)
            guard case .events(_, let positions) = before[apple] else {
                Issue.record("before the forged block: whole, not \(String(describing: before[apple]))")
                return
            }
            #expect(positions.map(\.topic) == Array(6...15))
        }
    }

    /// `relay tape pull` is where the stream's blocks enter a tape's folder: a block holding an event
    /// that does not check, or naming a vendor of another protocol than its day's, is left out and
    /// told; every other block is written, so the folder reads whole under the check. A day whose first
    /// block named its vendor and was left out is left out whole (its file would name none). What a pull
    /// cut short by a kill left half written is swept.
    @Test func aPullLeavesOutBlocksThatDoNotCheck() async throws {
        try await withStream { tape, _, url, cluster in try await pullLeavesOutBlocksThatDoNotCheck(tape, url: url, cluster: cluster) }
    }

    /// The pull test's body, on the stream `tape` of `cluster` at `url`.
    func pullLeavesOutBlocksThatDoNotCheck(_ tape: JetStreamTape, url: String, cluster: String) async throws {
        let directory = scratchDirectory("pull-check")
        defer { try? FileManager.default.removeItem(atPath: directory) }
        // Blocks a leader writes now (a pull refuses one that began an hour before the oldest NATS stored).
        let start = WallClock.nowNanoseconds() - 1_800_000_000_000
        try FileManager.default.createDirectory(atPath: directory + "/stocks", withIntermediateDirectories: true)
        let (stale, other) = (directory + "/stocks/2026-01-02.tape.pull", directory + "/stocks/notes.pull")
        for path in [stale, other] { #expect(FileManager.default.createFile(atPath: path, contents: Data(count: 4096))) }
        func block(_ records: [TapeRecord]) throws {
            let writer = try TapeWriter(sink: JetStreamTapeSink(tape: tape), blockBytes: 1 << 20)
            for record in records { try writer.append(record) }
            try writer.flush()
        }
        func quote(_ index: Int) -> TapeRecord {
            .event(
                TapeEvent(
                    receivedAt: start + Int64(index) * 1_000_000, sequence: UInt64(index), topicSequence: UInt64(index), eventType: "Q",
                    ticker: "AAPL", bytes: aaplQuote(index)))
        }
        try block([.epoch("e1", at: start), .source(vendor: "polygon", path: "/stocks", at: start)] + (1...20).map(quote))
        let forged = ByteBuffer(string: #"{"ev":"T","sym":"MSFT","p":1,"forged":1}"#)
        try block([
            .epoch("e1", at: start),
            .event(TapeEvent(receivedAt: start + 21_000_000, sequence: 21, topicSequence: 21, eventType: "Q", ticker: "AAPL", bytes: forged)),
        ])
        try block([.epoch("e1", at: start), .source(vendor: "alpaca", path: "/v2/iex", at: start)] + (30...35).map(quote))
        try block([.epoch("e1", at: start)] + (40...50).map(quote))
        // A writer names its source once a day: a block naming five is none of a writer's.
        try block([.epoch("e1", at: start)] + (0..<5).map { .source(vendor: "polygon", path: "/p\($0)", at: start) } + [quote(55)])
        // The next day: its first block names the vendor and holds a forged event; then good quotes.
        let nextDay = start + 86_400_000_000_000
        try block([
            .epoch("e1", at: nextDay), .source(vendor: "polygon", path: "/stocks", at: nextDay),
            .event(TapeEvent(receivedAt: nextDay, sequence: 60, topicSequence: 60, eventType: "Q", ticker: "AAPL", bytes: forged)),
        ])
        try block([.epoch("e1", at: nextDay)] + (61...70).map { index in
            .event(TapeEvent(receivedAt: nextDay + Int64(index), sequence: UInt64(index), topicSequence: UInt64(index), eventType: "Q", ticker: "AAPL", bytes: aaplQuote(index)))
        })
        let check: @Sendable ((vendor: String, path: String?)?) -> EventCheck = { source in
            let vendor = source?.vendor == "alpaca" ? WireVendor.alpaca : WireVendor.polygon
            return EventCheck(market: .stocks, wire: vendor.wireProtocol(market: .stocks, path: source?.path), maxBytes: 64 << 10)
        }
        let outcome = try await ClusterTapePull.pull(
            servers: [url], cluster: cluster, market: "stocks", directory: directory, check: check, logger: Logger(label: "pull-test"))
        #expect(outcome.refused == 5 && outcome.blocks == 2 && outcome.days.count == 1, "\(outcome)")
        #expect(outcome.firstRefusal?.contains("MSFT") == true || outcome.firstRefusal?.contains("sym") == true, "\(String(describing: outcome.firstRefusal))")
        let day = try #require(TapeFile.days(directory: directory, market: "stocks").last, "a day file was pulled")
        let reader = try TapeReader(path: day.path, check: check(nil))
        let pulled = reader.records().compactMap { record -> UInt64? in if case .event(let event) = record { event.topicSequence } else { nil } }
        #expect(pulled == (1...20).map(UInt64.init) + (40...50).map(UInt64.init))
        #expect(reader.skippedBlocks.isEmpty, "the pulled day reads whole under the check")
        #expect(!FileManager.default.fileExists(atPath: stale), "a day half pulled before is swept")
        #expect(FileManager.default.fileExists(atPath: other), "a file of another name is left")
    }

    /// A block on the tape's subject that says it began long before the oldest block NATS stored (a
    /// publisher's, not a leader's) is refused by a pull: it cannot replace a day kept here that the
    /// stream no longer holds with itself.
    @Test func aPullRefusesABlockOlderThanTheStreamAndKeepsTheDayHere() async throws {
        try await withStream { tape, _, url, cluster in
            let directory = scratchDirectory("pull-old")
            defer { try? FileManager.default.removeItem(atPath: directory) }
            let local = try TapeWriter(directory: directory, market: "stocks", blockBytes: 1024)
            try appendQuotes(to: local, epoch: "old", 1...50, at: Self.start)
            try local.flush()
            let day = TapeFile.day(of: Self.start)
            let path = TapeFile.path(directory: directory, market: "stocks", day: day)
            let before = try Data(contentsOf: URL(fileURLWithPath: path))
            let now = WallClock.nowNanoseconds() - 60_000_000_000
            try record(tape, epoch: "e1", 1...20, at: now)
            let midnight = try #require(TapeFile.midnight(of: day))
            let forger = try TapeWriter(sink: JetStreamTapeSink(tape: tape), blockBytes: 1 << 20)
            try forger.append(.epoch("e1", at: midnight))
            try forger.append(.event(TapeEvent(receivedAt: midnight, sequence: 1, topicSequence: 1, eventType: "Q", ticker: "AAPL", bytes: aaplQuote(1))))
            try forger.flush()
            let outcome = try await ClusterTapePull.pull(
                servers: [url], cluster: cluster, market: "stocks", directory: directory,
                check: { _ in EventCheck(market: .stocks, wire: .polygon, maxBytes: 64 << 10) }, logger: Logger(label: "pull-test"))
            #expect(outcome.refused == 1 && outcome.firstRefusal?.contains(day) == true, "\(outcome)")
            #expect(outcome.days == [TapeFile.day(of: now)], "\(outcome)")
            #expect(try Data(contentsOf: URL(fileURLWithPath: path)) == before, "the day kept here is as it was")
        }
    }

    /// A term's blocks are found by its subject, among another term's; a late block of a term written
    /// after the next term's began makes a reading across the other term's blocks a gap, never a
    /// partial answer.
    @Test func aTermIsReadByItsSubjectAndAnotherTermsBlocksInsideItsRunAreAGap() async throws {
        try await withStream { tape, _ in
            try record(tape, epoch: "e1", 1...100, at: Self.start)
            try record(tape, epoch: "e2", 1...50, at: Self.start + 1_000_000_000)
            // A late block of e1, after e2's (a leader that lost its lease while another led).
            try record(tape, epoch: "e1", 101...120, at: Self.start)
            let archive = archive(tape)
            let apple = try #require(Topic(parsing: "Q.AAPL"))
            let early = await archive.missed([ArchiveRequest(topic: apple, since: .topic(10), until: 60)], epoch: "e1", limit: 1_000)
            guard case .events(_, let positions) = early[apple] else {
                Issue.record("e1 before e2's blocks: whole, not \(String(describing: early[apple]))")
                return
            }
            #expect(positions.map(\.topic) == Array(11...60))
            let across = await archive.missed([ArchiveRequest(topic: apple, since: .topic(90), until: ArchiveRequest.epochEnd)], epoch: "e1", limit: 1_000)
            if case .gap = across[apple] {} else { Issue.record("across e2's blocks inside e1's run: a gap, not \(String(describing: across[apple]))") }
            let second = await archive.missed([ArchiveRequest(topic: apple, since: .topic(10), until: 40)], epoch: "e2", limit: 1_000)
            guard case .events(_, let secondPositions) = second[apple] else {
                Issue.record("e2 on its own: whole, not \(String(describing: second[apple]))")
                return
            }
            #expect(secondPositions.map(\.topic) == Array(11...40))
            let unknown = await archive.missed([ArchiveRequest(topic: apple, since: .topic(10), until: 40)], epoch: "nosuch", limit: 1_000)
            if case .gap = unknown[apple] {} else { Issue.record("an epoch with no blocks: a gap") }
        }
    }

    /// NATS gone: a read ends at once with a gap (it never waits on every block).
    @Test func aReadEndsPromptlyWhenNATSIsGone() async throws {
        try await withStream { tape, nats in
            try record(tape, epoch: "e1", 1...200, at: Self.start)
            await nats.stop()
            let apple = try #require(Topic(parsing: "Q.AAPL"))
            let began = ContinuousClock.now
            let answers = await archive(tape).missed([ArchiveRequest(topic: apple, since: .topic(10), until: 150)], epoch: "e1", limit: 1_000)
            if case .gap = answers[apple] {} else { Issue.record("NATS gone: a gap, not \(String(describing: answers[apple]))") }
            #expect(ContinuousClock.now - began < .seconds(15), "the read ended within its bound")
        }
    }
}
