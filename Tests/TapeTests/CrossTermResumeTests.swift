import Foundation
import Synchronization
import MarketCore
import MarketDataHub
import NIOCore
import PolygonWire
import RelayTestSupport
import Testing

@testable import Tape

/// A cluster node's resume from the former leadership term, answered from a real tape file.
@Suite("A resume across leadership terms")
struct CrossTermResumeTests {
    static let start: Int64 = 1_795_185_000 * 1_000_000_000

    /// A tape directory holding term e1: AAPL's quotes 1…300.
    static func formerTermsTape() throws -> String {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("cross-term-\(UUID().uuidString)").path
        let writer = try TapeWriter(directory: directory, market: "stocks", blockBytes: 1024)
        try appendQuotes(to: writer, epoch: "e1", 1...300, at: start)
        try writer.flush()
        return directory
    }

    /// A tagged connection takes the newest market sequence among what it writes as where its client
    /// stands in the epoch it is in. A resume across terms sends the former term's events first: their
    /// positions (in their bytes) are that term's, and count none in this one. Taken for this term's,
    /// the former term's 300 would stand the client past everything this term has (5), and its next
    /// resume would be a `gap`.
    @Test func aFormerTermsEventsCountNoPositionInThisOne() async throws {
        let directory = try Self.formerTermsTape()
        defer { try? FileManager.default.removeItem(atPath: directory) }

        let hub = MarketDataHub(wire: .polygon, adoptsPositions: true)
        await hub.setArchive(TapeArchive(directory: directory, market: "stocks", check: stocksCheck))
        let aapl = try #require(Topic(parsing: "Q.AAPL"))
        // Another client holds AAPL throughout, so this term's is whole from its first.
        let holder = await hub.subscribe(to: [aapl])
        await hub.startEpoch("e1")
        await hub.startEpoch("e2")
        await hub.publish(Self.quotes(1...5, numbered: 300))

        let client = await hub.subscribe()
        let outcome = await hub.add([aapl], to: client.id, resuming: .marketSequence(epoch: "e1", 250, floors: [:]))
        #expect(outcome.epoch == "e2" && outcome.sequence == 5)
        let (deliveries, written) = await Self.queued(for: client)
        let former = written.compactMap { EventPosition.read(from: $0.bytes) }.filter { $0.market > 5 }
        #expect(former.count == 50, "the former term's events after 250 replayed, with their positions: \(former.count)")
        #expect(deliveries.map(\.lastSequence).max() == 5, "the newest position of this term among them: \(deliveries.map(\.lastSequence))")
        _ = holder
    }

    /// A second failover while the former term's tape is read: the term read is not the former one any
    /// more, and its events followed by this term's would skip the whole term between. Told `gap`.
    @Test func aTermThatEndsWhileTheTapeIsReadSkipsNoTerm() async throws {
        let directory = try Self.formerTermsTape()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let (hub, reading, gate) = await Self.gatedHub(on: directory)
        defer { gate.open() }
        let (aapl, holder) = try await Self.inSecondTerm(hub)
        let client = await hub.subscribe()
        async let answer = hub.add([aapl], to: client.id, resuming: .marketSequence(epoch: "e1", 250, floors: [:]))
        try #require(await Self.started(reading), "the former term's tape is read within 10 s")
        await hub.startEpoch("e3")
        gate.open()
        let outcome = await answer
        #expect(outcome.epoch == "e3" && outcome.gaps == [aapl], "\(outcome)")
        let (_, written) = await Self.queued(for: client)
        #expect(written.compactMap { EventPosition.read(from: $0.bytes) }.isEmpty, "none of e1's events")
        _ = holder
    }

    /// A term that begins while this term's tape is read for a resume: the tape's answer is of the term
    /// that ended, and the new term's memory would follow it by its own numbers. The memory answers
    /// alone (here: a client that names no epoch, whose positions are taken as this term's).
    @Test func aTermThatBeginsWhileThisTermsTapeIsReadMixesNoTerms() async throws {
        let directory = try Self.formerTermsTape()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let (hub, reading, gate) = await Self.gatedHub(on: directory, history: HistoryLimits(eventsPerTopic: 100))
        defer { gate.open() }
        // e1's quotes are numbered 1…300, e2's 1001…1210 (at positions 1…210).
        let (aapl, holder) = try await Self.inFirstTerm(hub)
        let client = await hub.subscribe()
        async let answer = hub.add([aapl], to: client.id, resuming: .positions(epoch: nil, [aapl: 150]))
        try #require(await Self.started(reading), "e1's tape is read within 10 s (its memory no longer holds 151)")
        await hub.startEpoch("e2")
        await hub.publish(Self.quotes(1...210, numbered: 1000))
        gate.open()
        let outcome = await answer
        #expect(outcome.epoch == "e2" && outcome.sequence == 210, "\(outcome)")
        let (_, written) = await Self.queued(for: client)
        let quoted = written.filter { $0.eventType == "Q" }
        #expect(!quoted.isEmpty, "e2's events after 150 are replayed")
        for event in quoted {
            let position = EventPosition.read(from: event.bytes)
            #expect(event.json.contains(#""n":\#(1000 + Int(position?.market ?? 0))"#), "an e2 event at its e2 position: \(event.json)")
        }
        _ = holder
    }

    /// The memory lets go of more events while the tape is read (a read of a cluster's stream takes tens
    /// of ms, and a busy market lets an event go every few): what the memory held when the tape was asked
    /// is replayed from a copy, so the tape's answer and the memory's meet after one read, even where the
    /// tape ends before what the memory let go meanwhile (its last block not written yet).
    @Test func whatTheMemoryLetsGoWhileTheTapeIsReadIsStillReplayed() async throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("this-term-\(UUID().uuidString)").path
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let writer = try TapeWriter(directory: directory, market: "stocks", blockBytes: 1024)
        try appendQuotes(to: writer, epoch: "e1", 1...260, at: Self.start)
        try writer.flush()
        let (hub, reading, gate) = await Self.gatedHub(on: directory, history: HistoryLimits(eventsPerTopic: 50))
        defer { gate.open() }
        // The memory holds 251…300; the tape, 1…260.
        let (aapl, holder) = try await Self.inFirstTerm(hub)
        let client = await hub.subscribe()
        async let answer = hub.add([aapl], to: client.id, resuming: .positions(epoch: "e1", [aapl: 100]))
        try #require(await Self.started(reading), "the tape is read within 10 s (the memory no longer holds 101)")
        // Meanwhile the memory lets 251…280 go (past the tape's end).
        await hub.publish(Self.quotes(301...330, numbered: 0))
        gate.open()
        let outcome = await answer
        #expect(outcome.gaps.isEmpty && outcome.replayed == [aapl: 230], "\(outcome)")
        let (_, written) = await Self.queued(for: client)
        let positions = written.filter { $0.eventType == "Q" }.compactMap { EventPosition.read(from: $0.bytes)?.market }
        #expect(positions == Array(101...330), "the tape's 101…250, the memory's copy 251…300, then its 301…330: \(positions)")
        _ = holder
    }

    /// AAPL's quotes numbered `offset` past their positions (topic and market sequence alike).
    static func quotes(_ range: ClosedRange<Int>, numbered offset: Int) -> [MarketEvent] {
        let events = range.map { MarketEvent(eventType: "Q", ticker: "AAPL", bytes: ByteBuffer(bytes: aaplQuote(offset + $0))) }
        return EventPosition.stamp(events, range.map { EventPosition(topic: UInt64($0), market: UInt64($0)) })
    }

    /// A hub adopting positions whose archive is the tape in `directory` behind a gate: `reading` says
    /// a read started, and the reads go on once the gate opens.
    static func gatedHub(
        on directory: String, history: HistoryLimits = HistoryLimits()
    ) async -> (MarketDataHub, reading: AsyncStream<Void>, gate: ReadGate) {
        let (reading, readingStarted) = AsyncStream<Void>.makeStream()
        let gate = ReadGate()
        let hub = MarketDataHub(wire: .polygon, history: history, adoptsPositions: true)
        await hub.setArchive(GatedArchive(inner: TapeArchive(directory: directory, market: "stocks", check: stocksCheck), reading: readingStarted, gate: gate))
        return (hub, reading, gate)
    }

    /// One client key's connections have at most two tape reads under way at once: the key's next
    /// resume that would read is told `gap` at once, naming the bound, while another key's read goes
    /// on; once its reads are done, the key reads again.
    @Test func oneKeysConnectionsHoldAtMostTwoTapeReadsAtOnce() async throws {
        let directory = try Self.formerTermsTape()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let (hub, reading, gate) = await Self.gatedHub(on: directory)
        defer { gate.open() }
        let (aapl, holder) = try await Self.inSecondTerm(hub)
        await hub.publish(Self.quotes(1...5, numbered: 300))
        var clients: [HubSubscription] = []
        for owner in ["k", "k", "k", "other"] {
            let client = await hub.subscribe()
            await hub.setOwner(owner, for: client.id)
            clients.append(client)
        }
        let resume = HubResume.marketSequence(epoch: "e1", 250, floors: [:])
        let (firstID, secondID, otherID) = (clients[0].id, clients[1].id, clients[3].id)
        let first = Task { await hub.add([aapl], to: firstID, resuming: resume) }
        try #require(await Self.started(reading), "the first read starts within 10 s")
        let second = Task { await hub.add([aapl], to: secondID, resuming: resume) }
        try #require(await Self.started(reading), "the second read starts within 10 s")
        // The key's third: not read, answered at once.
        let thirdID = clients[2].id
        let third = try #require(await value(of: Task { await hub.add([aapl], to: thirdID, resuming: resume) }), "answered without a read")
        #expect(third.gaps == [aapl] && third.replayed.isEmpty, "\(third)")
        let (_, told) = await Self.queued(for: clients[2])
        #expect(told.contains { $0.json.contains("this key's connections have 2 tape reads under way (at most 2 at once)") }, "\(told.map(\.json))")
        let other = Task { await hub.add([aapl], to: otherID, resuming: resume) }
        try #require(await Self.started(reading), "another key's read is not held back")
        gate.open()
        for (name, resumed) in [("first", first), ("second", second), ("other key's", other)] {
            let outcome = await resumed.value
            // The former term's 50 after 250, then this term's 5 (the time between the terms is a gap).
            #expect(outcome.replayed == [aapl: 55], "the \(name) read is replayed: \(outcome)")
        }
        // Its reads done, the key reads again.
        await hub.remove([aapl], from: clients[2].id)
        let again = await hub.add([aapl], to: clients[2].id, resuming: resume)
        #expect(again.replayed == [aapl: 55], "\(again)")
        _ = holder
    }

    /// `hub` in term e1 with AAPL's quotes 1…300 published, AAPL held by another client throughout.
    static func inFirstTerm(_ hub: MarketDataHub) async throws -> (aapl: Topic, holder: HubSubscription) {
        let aapl = try #require(Topic(parsing: "Q.AAPL"))
        let holder = await hub.subscribe(to: [aapl])
        await hub.startEpoch("e1")
        await hub.publish(Self.quotes(1...300, numbered: 0))
        return (aapl, holder)
    }

    /// `hub` in term e2 after e1 (the former term, on the tape), AAPL held by another client throughout.
    static func inSecondTerm(_ hub: MarketDataHub) async throws -> (aapl: Topic, holder: HubSubscription) {
        let aapl = try #require(Topic(parsing: "Q.AAPL"))
        let holder = await hub.subscribe(to: [aapl])
        await hub.startEpoch("e1")
        await hub.startEpoch("e2")
        return (aapl, holder)
    }

    /// What is queued for `client` now: its deliveries, and their events one by one.
    static func queued(for client: HubSubscription) async -> ([HubDelivery], [MarketEvent]) {
        var reader = client.makeReader()
        var deliveries: [HubDelivery] = []
        #expect(await reader.nextDeliveries(into: &deliveries), "something is queued")
        var written: [MarketEvent] = []
        for delivery in deliveries { delivery.append(to: &written) }
        return (deliveries, written)
    }

    /// Whether the gated tape said a read started within 10 s.
    static func started(_ reading: AsyncStream<Void>) async -> Bool {
        await withTaskGroup(of: Bool.self) { group in
            group.addTask {
                var started = reading.makeAsyncIterator()
                return await started.next() != nil
            }
            group.addTask {
                try? await Task.sleep(for: .seconds(10))
                return false
            }
            let first = await group.next() ?? false
            group.cancelAll()
            return first
        }
    }
}

/// The real tape behind a gate: a read says it started, then waits until the test opens the gate.
private final class GatedArchive: EventArchive {
    let inner: TapeArchive
    let reading: AsyncStream<Void>.Continuation
    let gate: ReadGate

    init(inner: TapeArchive, reading: AsyncStream<Void>.Continuation, gate: ReadGate) {
        self.inner = inner
        self.reading = reading
        self.gate = gate
    }

    func reading(_ requests: [ArchiveRequest], epoch: String, limit: Int) async -> (answers: [Topic: ArchiveAnswer], cost: Double) {
        reading.yield()
        await gate.passed()
        return await inner.reading(requests, epoch: epoch, limit: limit)
    }
}

/// Holds any number of reads until it opens (from anywhere, a `defer` included); open, it holds none.
final class ReadGate: Sendable {
    private let state = Mutex<(isOpen: Bool, waiting: [CheckedContinuation<Void, Never>])>((false, []))

    func passed() async {
        await withCheckedContinuation { continuation in
            let held = state.withLock { state in
                if !state.isOpen { state.waiting.append(continuation) }
                return !state.isOpen
            }
            if !held { continuation.resume() }
        }
    }

    func open() {
        let waiting = state.withLock { state in
            state.isOpen = true
            defer { state.waiting = [] }
            return state.waiting
        }
        for continuation in waiting { continuation.resume() }
    }
}
