import Foundation
import MarketCore
import MarketDataHub
import NIOCore
import PolygonWire
import Testing

@testable import Tape
@testable import TapeReplay

/// A recorded day replayed as a market's source, on real tape files and a real hub: every recorded event
/// in order with its recorded bytes, the window kept, a slow reader never dropped at `max`, the tape's
/// gaps told as outages, the start and the end told as `replay` notices.
@Suite("Tape replay: a recorded day as a market's source", .timeLimit(.minutes(1)))
struct TapeReplayTests {
    /// Midnight UTC of the day the tapes are written for.
    static let day = "2026-11-20"
    static let midnight = TapeFile.midnight(of: day) ?? 0

    func withDirectory(_ body: (String) async throws -> Void) async throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("tape-replay-\(UUID().uuidString)").path
        defer { try? FileManager.default.removeItem(atPath: directory) }
        try await body(directory)
    }

    /// `count` events one millisecond apart from 09:30, trades of AAPL and quotes of MSFT in turn, each
    /// with its index in its bytes; `gapAfter` puts a 5-second gap record after that many.
    func writeTape(_ directory: String, count: Int, gapAfter: Int? = nil) throws {
        let writer = try TapeWriter(directory: directory, market: "stocks", blockBytes: 4096)
        let start = Self.midnight + 9 * 3_600_000_000_000 + 30 * 60_000_000_000
        try writer.append(.epoch("e1", at: start))
        try writer.append(.source(vendor: "polygon", path: "/stocks", at: start))
        var time = start
        for index in 0..<count {
            if index == gapAfter {
                try writer.append(.gap(from: time, to: time + 5_000_000_000))
                time += 5_000_000_000
            }
            time += 1_000_000
            let trade = index % 2 == 0
            let bytes = Array((trade ? #"{"ev":"T","sym":"AAPL","i":\#(index)}"# : #"{"ev":"Q","sym":"MSFT","i":\#(index)}"#).utf8)
            try writer.append(
                .event(TapeEvent(receivedAt: time, sequence: UInt64(index + 1), eventType: trade ? "T" : "Q", ticker: trade ? "AAPL" : "MSFT", bytes: bytes)))
        }
        try writer.flush()
    }

    /// A hub, its wanted set and a replay of `plan`'s day running; `body` gets the hub.
    func replaying(_ plan: ReplayPlan, _ body: (MarketDataHub) async throws -> Void) async throws {
        try await replaying(plan) { hub, _ in try await body(hub) }
    }

    func replaying(_ plan: ReplayPlan, _ body: (MarketDataHub, TapeSource) async throws -> Void) async throws {
        let interest = LocalInterest()
        let hub = MarketDataHub(wire: .polygon) { change in interest.apply(change) }
        let source = TapeSource(plan: plan, hub: hub, interest: interest, logger: .init(label: "test.replay"))
        let running = Task { try await source.run() }
        defer { running.cancel() }
        try await body(hub, source)
    }

    /// What a subscriber of `topics` reads until the replay's end notice: its events' `"i"` and the
    /// notices' `status`, in order. Reads slowly with `pause` between reads (a slow client).
    func read(_ hub: MarketDataHub, _ topics: [String], pause: Duration = .zero) async throws -> Reading {
        var reader = Reader(await hub.subscribe(to: Set(topics.compactMap { Topic(parsing: $0) })))
        return try await reader.untilEnd(pause: pause)
    }

    typealias Reading = (indices: [Int], statuses: [String], notices: [[String: Any]])

    /// A subscription read a replay pass at a time (what a read took past a pass's end is kept for the next).
    struct Reader {
        var reader: HubSubscription.Reader
        var left: [MarketEvent] = []

        init(_ subscription: HubSubscription) { reader = subscription.makeReader() }

        /// Until the next end notice.
        mutating func untilEnd(pause: Duration = .zero) async throws -> Reading {
            var reading: Reading = ([], [], [])
            let deadline = ContinuousClock.now + .seconds(30)
            while ContinuousClock.now < deadline {
                if left.isEmpty {
                    if pause > .zero { try await Task.sleep(for: pause) }
                    guard let batch = await reader.nextBatch() else { break }
                    left = batch
                }
                while !left.isEmpty {
                    let event = left.removeFirst()
                    let object = (try? JSONSerialization.jsonObject(with: Data(event.bytes.readableBytesView))) as? [String: Any] ?? [:]
                    if let index = object["i"] as? Int { reading.indices.append(index) }
                    guard let status = object["status"] as? String else { continue }
                    reading.statuses.append(status)
                    reading.notices.append(object)
                    if status == "replay", object["state"] as? String == "ended" { return reading }
                }
            }
            Issue.record("the replay did not end within 30 s: \(reading.indices.count) events, statuses \(reading.statuses)")
            return reading
        }
    }

    @Test func atMaxEverySubscribedEventComesInOrderAndASlowReaderLosesNone() async throws {
        try await withDirectory { directory in
            try writeTape(directory, count: 30_000)
            let plan = ReplayPlan(directory: directory, market: "stocks", day: Self.day, speed: .max)
            try await replaying(plan) { hub in
                // 15,000 trades at full speed into a reader that takes a batch every 100 ms: fifteen times
                // its 1,000-event buffer, paced by it, none dropped.
                let read = try await read(hub, ["T.AAPL"], pause: .milliseconds(100))
                #expect(read.indices == Array(stride(from: 0, to: 30_000, by: 2)), "every trade, in order, once (got \(read.indices.count))")
                #expect(!read.statuses.contains("lagging"), "nothing dropped: \(read.statuses)")
                #expect(read.statuses.first == "replay" && read.notices.first?["state"] as? String == "started", "told first: \(read.statuses)")
                #expect(read.notices.first?["day"] as? String == Self.day)
                #expect(read.notices.last?["events"] as? Int == 30_000, "the end tells what was replayed: \(read.notices.last ?? [:])")
                #expect(await hub.droppedTotal == 0)
            }
        }
    }

    @Test func aWindowReplaysOnlyItsEventsAndAGapIsToldAsAnOutage() async throws {
        try await withDirectory { directory in
            try writeTape(directory, count: 4_000, gapAfter: 1_000)
            // 09:30:00.5 to 09:30:07: events 500 … 999, the 5-second gap, then 1,000 up to 1,999's time.
            let from = try #require(ReplayPlan.time("09:30:00", on: Self.day)) + 500_000_000
            let to = try #require(ReplayPlan.time("09:30:07", on: Self.day))
            let plan = ReplayPlan(directory: directory, market: "stocks", day: Self.day, from: from, to: to, speed: .max)
            try await replaying(plan) { hub in
                let read = try await read(hub, ["T.*", "Q.*"])
                #expect(read.indices.first == 499, "the first event at or after the window's start: \(read.indices.prefix(3))")
                #expect(read.indices == Array(499..<2_000), "the window's events, in order (got \(read.indices.first ?? -1) … \(read.indices.last ?? -1))")
                #expect(read.statuses.contains("upstream_disconnected"), "the tape's gap is told: \(read.statuses)")
                #expect(read.statuses.contains("upstream_reconnected"), "and its end: \(read.statuses)")
            }
        }
    }

    /// A block dated a year after its file's day (written by hand): passed over, not waited for, at 1×.
    @Test func anEventDatedFarFromItsFilesDayIsPassedOverNotWaitedFor() async throws {
        final class Captured: TapeBlockSink {
            var bytes: [UInt8] = []
            func begin(day: String) throws {}
            func write(_ block: [UInt8], epoch: String?) throws { bytes += block }
        }
        try await withDirectory { directory in
            try writeTape(directory, count: 100)
            let sink = Captured()
            let writer = try TapeWriter(sink: sink)
            let ahead = Self.midnight + 365 * 86_400_000_000_000
            try writer.append(.epoch("e1", at: ahead))
            try writer.append(
                .event(TapeEvent(receivedAt: ahead, sequence: 101, eventType: "T", ticker: "AAPL", bytes: Array(#"{"ev":"T","sym":"AAPL","i":100}"#.utf8))))
            try writer.flush()
            let file = try FileHandle(forWritingTo: URL(fileURLWithPath: TapeFile.path(directory: directory, market: "stocks", day: Self.day)))
            try file.seekToEnd()
            try file.write(contentsOf: sink.bytes)
            try file.close()
            let plan = ReplayPlan(directory: directory, market: "stocks", day: Self.day, speed: .times(1))
            try await replaying(plan) { hub in
                let read = try await read(hub, ["T.AAPL"])
                #expect(read.indices == Array(stride(from: 0, to: 100, by: 2)), "the day's trades, not one dated a year on")
            }
        }
    }

    @Test func aLoopStartsAgainAtTheEnd() async throws {
        try await withDirectory { directory in
            try writeTape(directory, count: 100)
            let plan = ReplayPlan(directory: directory, market: "stocks", day: Self.day, speed: .max, loop: true)
            try await replaying(plan) { hub in
                var reader = Reader(await hub.subscribe(to: Set([Topic(parsing: "Q.MSFT")].compactMap { $0 })))
                let first = try await reader.untilEnd()
                #expect(first.indices == Array(stride(from: 1, to: 100, by: 2)))
                let ending = first.notices.last?["message"] as? String
                #expect(ending?.contains("starts again") == true, "\(first.notices)")
                // The same subscriber's stream goes on: the next pass, told again.
                let second = try await reader.untilEnd()
                #expect(second.indices == Array(stride(from: 1, to: 100, by: 2)), "the second pass, whole")
                #expect(second.statuses.first == "replay" && second.notices.first?["state"] as? String == "started")
            }
        }
    }

    @Test func aLoopOverAWindowWithNoEventsEndsAfterOnePass() async throws {
        try await withDirectory { directory in
            try writeTape(directory, count: 100)
            // The events are at 09:30; the window is an hour later.
            let from = try #require(ReplayPlan.time("10:30", on: Self.day))
            let plan = ReplayPlan(directory: directory, market: "stocks", day: Self.day, from: from, to: from + 60_000_000_000, speed: .max, loop: true)
            try await replaying(plan) { hub, source in
                let read = try await read(hub, ["Q.*"])
                #expect(read.indices.isEmpty && read.notices.last?["events"] as? Int == 0)
                let deadline = ContinuousClock.now + .seconds(10)
                while await source.report().upstream.state != "ended", ContinuousClock.now < deadline { try await Task.sleep(for: .milliseconds(10)) }
                #expect(await source.report().upstream.state == "ended", "one pass, then it ends instead of spinning")
            }
        }
    }

    @Test func aDamagedBlockIsSkippedAndCountedAndTheRestReplaysInOrder() async throws {
        try await withDirectory { directory in
            try writeTape(directory, count: 3_000)
            let path = TapeFile.path(directory: directory, market: "stocks", day: Self.day)
            let tape = try TapeReader(path: path)
            try #require(tape.blocks.count >= 5, "a tape of several blocks (\(tape.blocks.count))")
            // One flipped byte in the middle of a middle block's frame.
            let block = tape.blocks[tape.blocks.count / 2]
            let lost = (tape.records(inBlock: tape.blocks.count / 2) ?? []).filter { if case .event = $0 { true } else { false } }.count
            try #require(lost > 0)
            let handle = try #require(FileHandle(forUpdatingAtPath: path))
            let at = UInt64(block.offset) + UInt64(TapeBlockHeader.size) + UInt64(block.header.compressedLength / 2)
            try handle.seek(toOffset: at)
            let byte = try #require(try handle.read(upToCount: 1)?.first)
            try handle.seek(toOffset: at)
            try handle.write(contentsOf: [byte ^ 0xFF])
            try handle.close()
            let plan = ReplayPlan(directory: directory, market: "stocks", day: Self.day, speed: .max)
            try await replaying(plan) { hub, source in
                let read = try await read(hub, ["T.*", "Q.*"])
                #expect(read.indices.count == 3_000 - lost, "all but the damaged block's \(lost) events (got \(read.indices.count))")
                #expect(read.indices == read.indices.sorted() && read.indices.first == 0 && read.indices.last == 2_999, "the rest, in order")
                #expect(await source.report().upstream.malformedMessages == 1, "the skipped block is counted")
            }
        }
    }

    /// As recorded (30 s of events), or at `max` held by a reader that stopped reading: cancelled after
    /// its first events, a replay must neither run on nor hang.
    @Test(arguments: [ReplayPlan.Speed.times(1), .max])
    func aReplayStopsPromptlyWhenItsTaskIsCancelled(speed: ReplayPlan.Speed) async throws {
        try await withDirectory { directory in
            try writeTape(directory, count: 30_000)
            let interest = LocalInterest()
            let hub = MarketDataHub(wire: .polygon) { change in interest.apply(change) }
            let plan = ReplayPlan(directory: directory, market: "stocks", day: Self.day, speed: speed)
            let source = TapeSource(plan: plan, hub: hub, interest: interest, logger: .init(label: "test.replay"))
            var reader = await hub.subscribe(to: Set([Topic(parsing: "T.AAPL")].compactMap { $0 })).makeReader()
            let running = Task { try await source.run() }
            var indices = 0
            let started = ContinuousClock.now
            while indices < 10, ContinuousClock.now - started < .seconds(20), let batch = await reader.nextBatch() {
                indices += batch.filter { String(buffer: $0.bytes).contains(#""i":"#) }.count
            }
            try #require(indices >= 10, "the replay began")
            let cancelled = ContinuousClock.now
            running.cancel()
            _ = try? await running.value
            #expect(ContinuousClock.now - cancelled < .seconds(5), "the replay ran on for \(ContinuousClock.now - cancelled) after it was cancelled")
            #expect(await source.report().upstream.eventsReceived < 30_000, "it stopped before the end")
        }
    }

    @Test func aMissingDayIsToldToItsClients() async throws {
        try await withDirectory { directory in
            let plan = ReplayPlan(directory: directory, market: "stocks", day: Self.day, speed: .max)
            try await replaying(plan) { hub, source in
                var reader = await hub.subscribe(to: Set([Topic(parsing: "Q.*")].compactMap { $0 })).makeReader()
                let batch = try #require(await reader.nextBatch())
                let text = batch.map { String(buffer: $0.bytes) }.joined()
                #expect(text.contains(#""status":"replay""#) && text.contains(#""state":"failed""#), "\(text)")
                #expect(await source.report().healthy == false)
            }
        }
    }

    @Test func aFiniteSpeedKeepsTheRecordedSpacingScaled() {
        var pace = Pace(speed: .times(10))
        #expect(pace.wait(until: 1_000_000_000) == nil, "the first event is due at once")
        // One recorded second later, at ten times: due 100 ms after the first.
        let wait = pace.wait(until: 2_000_000_000)
        #expect(wait.map { $0 > .milliseconds(90) && $0 <= .milliseconds(100) } == true, "\(String(describing: wait))")
        #expect(pace.wait(until: 1_000_000_000) == nil, "an event recorded no later is due now")
        var slow = Pace(speed: .times(0.000001))
        _ = slow.wait(until: .min)
        #expect(slow.wait(until: .max).map { $0 <= .seconds(86_400) } == true, "any spacing and speed: at most a day, never a trap")
        var fast = Pace(speed: .max)
        #expect(fast.wait(until: 0) == nil && fast.wait(until: 60_000_000_000) == nil, "max never waits on the clock")
    }

    @Test func speedsDaysAndTimesAreReadStrictly() {
        #expect(ReplayPlan.Speed("1") == .times(1))
        #expect(ReplayPlan.Speed("10x") == .times(10))
        #expect(ReplayPlan.Speed("MAX") == .max)
        #expect(ReplayPlan.Speed("0.001") == .times(0.001))
        for bad in ["0", "-1", "fast", "inf", "nan", "", "0.0009", "1e-300"] { #expect(ReplayPlan.Speed(bad) == nil, "\(bad)") }
        #expect(ReplayPlan.time("09:30", on: Self.day) == Self.midnight + 34_200_000_000_000)
        #expect(ReplayPlan.time("24:00", on: Self.day) == Self.midnight + 86_400_000_000_000)
        for bad in ["9", "09:60", "25:00", "24:00:01", "a:b", "09:30:00:00"] { #expect(ReplayPlan.time(bad, on: Self.day) == nil, "\(bad)") }
        #expect(TapeFile.midnight(of: "2026-02-31") == nil, "not a day")
        #expect(TapeFile.midnight(of: "1970-01-01") == 0)
    }

    @Test func theTapeSaysWhichVendorItHolds() throws {
        try withDirectorySync { directory in
            try writeTape(directory, count: 10)
            let reader = try TapeReader(path: TapeFile.path(directory: directory, market: "stocks", day: Self.day))
            #expect(reader.source()?.vendor == "polygon")
            #expect(reader.source()?.path == "/stocks")
            // A new day file tells it again, after the epoch.
            let writer = try TapeWriter(directory: directory, market: "stocks")
            try writer.append(.epoch("e2", at: Self.midnight))
            try writer.append(.source(vendor: "alpaca", path: nil, at: Self.midnight))
            try writer.append(.event(TapeEvent(receivedAt: Self.midnight + 86_400_000_000_000, sequence: 1, eventType: "t", ticker: "X", bytes: [1])))
            try writer.flush()
            let next = try TapeReader(path: TapeFile.path(directory: directory, market: "stocks", day: "2026-11-21"))
            let kinds = next.records().map { record -> String in
                switch record {
                case .epoch: "epoch"
                case .source(let vendor, let path, _): "source \(vendor) \(path ?? "-")"
                case .event: "event"
                case .gap: "gap"
                case .wanted: "wanted"
                case .interrupted: "interrupted"
                case .stopped: "stopped"
                case .holding: "holding"
                }
            }
            #expect(kinds == ["epoch", "source alpaca -", "event"])
        }
    }

    func withDirectorySync(_ body: (String) throws -> Void) throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("tape-replay-\(UUID().uuidString)").path
        defer { try? FileManager.default.removeItem(atPath: directory) }
        try body(directory)
    }
}
