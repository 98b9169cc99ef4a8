import Foundation
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
        await hub.setArchive(TapeArchive(directory: directory, market: "stocks"))
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
        let (hub, reading, opener) = await Self.gatedHub(on: directory)
        defer { opener.finish() }
        let aapl = try #require(Topic(parsing: "Q.AAPL"))
        let holder = await hub.subscribe(to: [aapl])
        await hub.startEpoch("e1")
        await hub.startEpoch("e2")
        let client = await hub.subscribe()
        async let answer = hub.add([aapl], to: client.id, resuming: .marketSequence(epoch: "e1", 250, floors: [:]))
        try #require(await Self.started(reading), "the former term's tape is read within 10 s")
        await hub.startEpoch("e3")
        opener.finish()
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
        let (hub, reading, opener) = await Self.gatedHub(on: directory, history: HistoryLimits(eventsPerTopic: 100))
        defer { opener.finish() }
        let aapl = try #require(Topic(parsing: "Q.AAPL"))
        let holder = await hub.subscribe(to: [aapl])
        // e1's quotes are numbered 1…300, e2's 1001…1210 (at positions 1…210).
        await hub.startEpoch("e1")
        await hub.publish(Self.quotes(1...300, numbered: 0))
        let client = await hub.subscribe()
        async let answer = hub.add([aapl], to: client.id, resuming: .positions(epoch: nil, [aapl: 150]))
        try #require(await Self.started(reading), "e1's tape is read within 10 s (its memory no longer holds 151)")
        await hub.startEpoch("e2")
        await hub.publish(Self.quotes(1...210, numbered: 1000))
        opener.finish()
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

    /// AAPL's quotes numbered `offset` past their positions (topic and market sequence alike).
    static func quotes(_ range: ClosedRange<Int>, numbered offset: Int) -> [MarketEvent] {
        let events = range.map { MarketEvent(eventType: "Q", ticker: "AAPL", bytes: ByteBuffer(bytes: aaplQuote(offset + $0))) }
        return EventPosition.stamp(events, range.map { EventPosition(topic: UInt64($0), market: UInt64($0)) })
    }

    /// A hub adopting positions whose archive is the tape in `directory` behind a gate: `reading` says
    /// a read started, and the read goes on once `opener` finishes.
    static func gatedHub(
        on directory: String, history: HistoryLimits = HistoryLimits()
    ) async -> (MarketDataHub, reading: AsyncStream<Void>, opener: AsyncStream<Void>.Continuation) {
        let (reading, readingStarted) = AsyncStream<Void>.makeStream()
        let (gate, opener) = AsyncStream<Void>.makeStream()
        let hub = MarketDataHub(wire: .polygon, history: history, adoptsPositions: true)
        await hub.setArchive(GatedArchive(inner: TapeArchive(directory: directory, market: "stocks"), reading: readingStarted, gate: gate))
        return (hub, reading, opener)
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
    let gate: AsyncStream<Void>

    init(inner: TapeArchive, reading: AsyncStream<Void>.Continuation, gate: AsyncStream<Void>) {
        self.inner = inner
        self.reading = reading
        self.gate = gate
    }

    func reading(_ requests: [ArchiveRequest], epoch: String, limit: Int) async -> (answers: [Topic: ArchiveAnswer], cost: Double) {
        reading.yield()
        for await _ in gate {}
        return await inner.reading(requests, epoch: epoch, limit: limit)
    }
}
