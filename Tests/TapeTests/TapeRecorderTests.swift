import Foundation
import MarketCore
import MarketDataHub
import NIOCore
import PolygonWire
import RelayTestSupport
import Testing

@testable import Tape

/// The recorder on real files: what the hub hands it is on the tape within a flush interval, in order,
/// with wall-clock receive times; a disk that fails pauses it (told, counted) and the window it
/// missed is on the tape as a gap once it records again.
@Suite("Tape recorder: the hub's events to disk, off the delivery path")
struct TapeRecorderTests {
    func withDirectory(_ body: (String) async throws -> Void) async throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("tape-\(UUID().uuidString)").path
        defer { try? FileManager.default.removeItem(atPath: directory) }
        try await body(directory)
    }

    func quotes(_ count: Int, from first: Int) -> [MarketEvent] {
        (first..<first + count).map { index in
            MarketEvent(
                eventType: "Q", ticker: "AAPL", bytes: ByteBuffer(string: #"{"ev":"Q","sym":"AAPL","bp":\#(index)}"#),
                receivedAt: MonotonicClock.nanoseconds(), sequence: UInt64(index))
        }
    }

    func todaysTape(_ directory: String) -> String {
        TapeFile.path(directory: directory, market: "stocks", day: TapeFile.day(of: WallClock.nowNanoseconds()))
    }

    @Test func whatTheHubHandsItIsOnTheTapeWithinAFlushInterval() async throws {
        try await withDirectory { directory in
            var settings = TapeRecorder.Settings(directory: directory, market: "stocks")
            settings.flushInterval = .milliseconds(100)
            let recorder = try TapeRecorder(settings: settings)
            let before = WallClock.nowNanoseconds()
            let batches = [quotes(3, from: 1), quotes(500, from: 4), quotes(1, from: 504)]
            for batch in batches { recorder.take(batch, epoch: "e1") }
            // No flush asked: the interval writes the block.
            try await eventually("a block on disk") { recorder.report.blocksWritten > 0 && recorder.report.eventsRecorded == 504 }
            let records = try TapeReader(path: todaysTape(directory)).records()
            let events = records.compactMap { record -> TapeEvent? in if case .event(let event) = record { event } else { nil } }
            #expect(events.map(\.sequence) == Array(1...504).map(UInt64.init))
            #expect(events.last?.bytes == ByteBuffer(string: #"{"ev":"Q","sym":"AAPL","bp":504}"#))
            #expect(events.allSatisfy { $0.eventType == "Q" && $0.ticker == "AAPL" })
            #expect(records.first.map { if case .epoch("e1", _) = $0 { true } else { false } } == true, "the epoch before the events")
            #expect(records.count == events.count + 1, "told once, while it does not change")
            let after = WallClock.nowNanoseconds()
            #expect(events.allSatisfy { $0.receivedAt >= before - 50_000_000 && $0.receivedAt <= after }, "wall-clock receive times")
            #expect(recorder.report.eventsDropped == 0 && recorder.report.pausedBecause == nil)
        }
    }

    /// A real hub recording through its tap: the events as received (the bytes without the positions the
    /// hub writes into what it sends) with both their positions, and in order with them what decides
    /// whether they are whole: the topics it began and stopped receiving, and an upstream loss.
    @Test func theHubsPositionsWantedSetAndLossesAreOnTheTapeInOrder() async throws {
        try await withDirectory { directory in
            let recorder = try TapeRecorder(settings: TapeRecorder.Settings(directory: directory, market: "stocks"))
            let hub = MarketDataHub(wire: .polygon, tap: recorder)
            let apple = try #require(Topic(parsing: "Q.AAPL"))
            let subscription = await hub.subscribe(to: [apple])
            await hub.publish(quotes(3, from: 1).map { MarketEvent(eventType: $0.eventType, ticker: $0.ticker, bytes: $0.bytes) })
            await hub.upstreamLost(reason: "test")
            await hub.publish(quotes(2, from: 4).map { MarketEvent(eventType: $0.eventType, ticker: $0.ticker, bytes: $0.bytes) })
            await hub.remove([apple], from: subscription.id)
            recorder.flush()
            let records = try TapeReader(path: todaysTape(directory)).records()
            let shown = records.map { record -> String in
                switch record {
                case .event(let event): "event \(event.topicSequence)/\(event.sequence) \(String(buffer: event.bytes))"
                case .wanted(let topic, let wanted, _): "\(wanted ? "wanted" : "unwanted") \(topic)"
                case .interrupted: "interrupted"
                case .epoch: "epoch"
                case .gap: "gap"
                case .source: "source"
                case .stopped: "stopped"
                case .holding(let topics, _): "holding \(topics.joined(separator: ","))"
                }
            }
            #expect(
                shown == [
                    "epoch", "wanted Q.AAPL",
                    #"event 1/1 {"ev":"Q","sym":"AAPL","bp":1}"#, #"event 2/2 {"ev":"Q","sym":"AAPL","bp":2}"#, #"event 3/3 {"ev":"Q","sym":"AAPL","bp":3}"#,
                    "interrupted",
                    // The loss took market sequence 4 of its own.
                    #"event 4/5 {"ev":"Q","sym":"AAPL","bp":4}"#, #"event 5/6 {"ev":"Q","sym":"AAPL","bp":5}"#,
                    "unwanted Q.AAPL",
                ], "\(shown)")
            withExtendedLifetime(subscription) {}
        }
    }

    /// Gap fill's recovered events get positions from the hub like live ones: they are on the tape too
    /// (a restart that did not know them would give their numbers again).
    @Test func recoveredEventsAreOnTheTapeWithTheirPositions() async throws {
        func trade(_ q: Int) -> MarketEvent {
            MarketEvent(eventType: "T", ticker: "AAPL", bytes: ByteBuffer(string: #"{"ev":"T","sym":"AAPL","p":1,"q":\#(q)}"#))
        }
        try await withDirectory { directory in
            let recorder = try TapeRecorder(settings: TapeRecorder.Settings(directory: directory, market: "stocks"))
            let hub = MarketDataHub(wire: .polygon, tap: recorder)
            await hub.setRecoveryHandler { _ in }
            let apple = try #require(Topic(parsing: "T.AAPL"))
            let subscription = await hub.subscribe(to: [apple])
            await hub.publish([trade(10)])
            await hub.upstreamLost(reason: "test")
            await hub.publish([trade(15)])
            let recovered = await hub.deliverRecovered(apple, (11...16).map(trade), order: .sequence)
            #expect(recovered == 4)
            recorder.flush()
            let events = try TapeReader(path: todaysTape(directory)).records().compactMap { record -> TapeEvent? in
                if case .event(let event) = record { event } else { nil }
            }
            #expect(events.count == 6, "the two live trades and the four recovered")
            let sequences = events.map(\.sequence)
            #expect(Set(sequences).count == sequences.count, "no position twice: \(sequences)")
            #expect((await hub.position.sequence) == sequences.max(), "the hub's newest position is on the tape")
            withExtendedLifetime(subscription) {}
        }
    }

    @Test func aSecondRecorderOfTheSameMarketAndDirectoryIsRefused() async throws {
        try await withDirectory { directory in
            let first = try TapeRecorder(settings: .init(directory: directory, market: "stocks"))
            #expect(throws: TapeError.self) { try TapeRecorder(settings: .init(directory: directory, market: "stocks")) }
            // Another market beside it is another tape.
            _ = try TapeRecorder(settings: .init(directory: directory, market: "crypto"))
            withExtendedLifetime(first) {}
            // Once the first is gone, its market can be recorded again.
        }
        try await withDirectory { directory in
            do { _ = try TapeRecorder(settings: .init(directory: directory, market: "stocks")) }
            _ = try TapeRecorder(settings: .init(directory: directory, market: "stocks"))
        }
    }

    /// What the tape holds is looked at while it holds nothing every flush, then once a minute: its
    /// bytes, its days and its oldest record's time, in the report (`/healthz`, the dashboard).
    @Test func whatTheTapeHoldsIsReported() async throws {
        try await withDirectory { directory in
            var settings = TapeRecorder.Settings(directory: directory, market: "stocks")
            settings.flushInterval = .milliseconds(20)
            let recorder = try TapeRecorder(settings: settings)
            let before = WallClock.nowNanoseconds() / 1_000_000
            recorder.take(quotes(20, from: 1), epoch: "e1")
            recorder.flush()
            try await eventually("the report to say what the tape holds") { recorder.report.heldSince != nil }
            let report = recorder.report
            #expect(report.store == "disk")
            #expect(report.heldDays == 1)
            let size = TapeFile.days(directory: directory, market: "stocks").reduce(Int64(0)) { $0 + $1.bytes }
            #expect(report.heldBytes == size && size > 0)
            #expect((report.heldSince ?? 0) >= before - 1_000 && (report.heldSince ?? 0) <= WallClock.nowNanoseconds() / 1_000_000)
        }
    }

    @Test func itMakesEveryMissingFolderOfItsDirectory() async throws {
        try await withDirectory { directory in
            let nested = "\(directory)/data/tape"
            let recorder = try TapeRecorder(settings: .init(directory: nested, market: "stocks"))
            recorder.take(quotes(2, from: 1), epoch: "e1")
            recorder.flush()
            #expect(try TapeReader(path: todaysTape(nested)).records().filter { if case .event = $0 { true } else { false } }.count == 2)
        }
    }

    @Test func aQueueFullOfBytesDropsAndCountsAndTheHoleIsAGap() async throws {
        try await withDirectory { directory in
            var settings = TapeRecorder.Settings(directory: directory, market: "stocks")
            settings.queueBytes = 1  // nothing fits: every batch is a hole
            let recorder = try TapeRecorder(settings: settings)
            recorder.take(quotes(10, from: 1), epoch: "e1")
            recorder.take(quotes(5, from: 11), epoch: "e1")
            #expect(recorder.report.eventsDropped == 15)
            recorder.flush()
            let records = try TapeReader(path: todaysTape(directory)).records()
            #expect(records.count == 1)
            guard case .gap(let from, let to) = records.first else { return #expect(Bool(false), "a gap") }
            #expect(from <= to && to <= WallClock.nowNanoseconds())
        }
    }

    /// A client churning made-up topics makes the hub's wanted set change again and again: the marks
    /// never count against the events' bound (no event is pushed off the tape for them), and a run of
    /// them is kept as what it says: a topic taken and dropped leaves nothing, one dropped and taken
    /// again leaves both, in order.
    @Test func wantedSetChurnPushesNoEventOffTheTapeAndLeavesOnlyWhatItSays() async throws {
        try await withDirectory { directory in
            var settings = TapeRecorder.Settings(directory: directory, market: "stocks")
            settings.queueBytes = 64 << 10
            settings.flushInterval = .seconds(60)
            let recorder = try TapeRecorder(settings: settings)
            let apple = try #require(Topic(parsing: "Q.AAPL"))
            recorder.wantedChanged([(apple, true)], epoch: "e1")
            recorder.take(quotes(1, from: 1), epoch: "e1")
            recorder.wantedChanged([(apple, false)], epoch: "e1")
            for round in 0..<10 {
                let junk = (0..<1000).compactMap { Topic(parsing: "Q.JUNK\(round * 1000 + $0)") }
                recorder.wantedChanged(junk.map { ($0, true) }, epoch: "e1")
                recorder.wantedChanged(junk.map { ($0, false) }, epoch: "e1")
            }
            recorder.wantedChanged([(apple, true)], epoch: "e1")
            recorder.take(quotes(10, from: 2), epoch: "e1")
            #expect(recorder.report.eventsDropped == 0, "20,000 marks of 64 bytes were counted against a 64 KiB bound")
            recorder.flush()
            let shown = try TapeReader(path: todaysTape(directory)).records().compactMap { record -> String? in
                switch record {
                case .event(let event): "event \(event.sequence)"
                case .wanted(let topic, let wanted, _): "\(wanted ? "+" : "-")\(topic)"
                default: nil
                }
            }
            #expect(shown == ["+Q.AAPL", "event 1", "-Q.AAPL", "+Q.AAPL"] + (2...11).map { "event \($0)" }, "\(shown.prefix(20))")
        }
    }

    /// A day busier than the tape's whole bound: recording pauses at the bound (told, logged, counted)
    /// rather than let the file being written outgrow the disk.
    @Test func todaysFileAtTheTapesBoundPausesRecording() async throws {
        try await withDirectory { directory in
            var settings = TapeRecorder.Settings(directory: directory, market: "stocks")
            settings.flushInterval = .milliseconds(20)
            settings.blockBytes = 1_024
            settings.retentionBytes = 8_000
            settings.retryInterval = .milliseconds(20)
            let recorder = try TapeRecorder(settings: settings)
            var next = 1
            try await eventually("recording to pause at the bound") {
                recorder.take(quotes(100, from: next), epoch: "e1")
                next += 100
                return recorder.report.pausedBecause != nil
            }
            #expect(recorder.report.pausedBecause?.contains("tape.maxGB") == true, "\(recorder.report.pausedBecause ?? "")")
            // Not tried again that day (the retry interval passes many times over): still paused, nothing written.
            for _ in 0..<5 {
                try await Task.sleep(for: .milliseconds(60))
                recorder.take(quotes(100, from: next), epoch: "e1")
                next += 100
                recorder.flush()
                #expect(recorder.report.pausedBecause != nil, "paused until the next UTC day")
            }
            recorder.take(quotes(100, from: next), epoch: "e1")
            recorder.flush()
            let size = try #require(try FileManager.default.attributesOfItem(atPath: todaysTape(directory))[.size] as? Int)
            #expect(size <= 8_000, "\(size) bytes")
            #expect(recorder.report.eventsDropped >= 100 && recorder.report.eventsRecorded > 0)
            #expect(recorder.report.eventsRecorded + recorder.report.eventsDropped == next + 99)
        }
    }

    /// The day's file is `/dev/full` at first (every write fails with ENOSPC): recording pauses, says
    /// why, drops and counts; once the file is an ordinary one again, the next retry records the window
    /// it missed as one gap, then the events.
    @Test func aFullDiskPausesRecordingAndTheMissedWindowBecomesAGap() async throws {
        try await withDirectory { directory in
            try FileManager.default.createDirectory(atPath: "\(directory)/stocks", withIntermediateDirectories: true)
            let path = todaysTape(directory)
            try FileManager.default.createSymbolicLink(atPath: path, withDestinationPath: "/dev/full")
            var settings = TapeRecorder.Settings(directory: directory, market: "stocks")
            settings.flushInterval = .milliseconds(20)
            settings.retryInterval = .milliseconds(100)
            let recorder = try TapeRecorder(settings: settings)
            let started = WallClock.nowNanoseconds()
            recorder.take(quotes(10, from: 1), epoch: "e1")
            try await eventually("recording to pause") { recorder.report.pausedBecause != nil }
            #expect(recorder.report.pausedBecause?.contains("space") == true, "\(recorder.report.pausedBecause ?? "")")
            recorder.take(quotes(5, from: 11), epoch: "e1")
            #expect(recorder.report.eventsDropped >= 10)
            try FileManager.default.removeItem(atPath: path)
            try await eventually("recording again") { recorder.report.pausedBecause == nil }
            recorder.take(quotes(3, from: 16), epoch: "e1")
            recorder.flush()
            let records = try TapeReader(path: path).records()
            // The file tells its epoch first, then the window recording missed, then what came after.
            guard case .epoch("e1", _) = records.first else { return #expect(Bool(false), "the epoch first: \(records)") }
            guard case .gap(let from, let to) = records.dropFirst().first else { return #expect(Bool(false), "then the missed window: \(records)") }
            #expect(from >= started - 1_000_000_000 && to > from)
            let sequences = records.compactMap { record -> UInt64? in if case .event(let event) = record { event.sequence } else { nil } }
            #expect(sequences == [16, 17, 18], "what came while paused is not on the tape; what came after is")
            #expect(recorder.report.eventsDropped == 15)
        }
    }
}
