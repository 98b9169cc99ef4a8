import Foundation
import NIOCore
import Testing

@testable import Tape

/// Real files in a temporary directory: what is written reads back, a torn tail is cut at every byte
/// offset, a flipped byte loses its block and no other, a seek is a binary search, a day ends at UTC
/// midnight.
@Suite("Tape files: zstd blocks per market per UTC day")
struct TapeFileTests {
    /// 2026-11-20 14:30:00 UTC in nanoseconds.
    static let start: Int64 = 1_795_185_000 * 1_000_000_000

    func withDirectory(_ body: (String) throws -> Void) throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("tape-\(UUID().uuidString)").path
        defer { try? FileManager.default.removeItem(atPath: directory) }
        try body(directory)
    }

    /// Quotes of a few symbols, 1 ms apart, sequences from 1.
    func events(_ count: Int, from first: Int = 0, start: Int64 = TapeFileTests.start) -> [TapeRecord] {
        (first..<first + count).map { index in
            let symbol = ["AAPL", "MSFT", "NVDA"][index % 3]
            let json = #"{"ev":"Q","sym":"\#(symbol)","bp":\#(100 + index % 50).25,"ap":\#(100 + index % 50).27,"t":\#(start / 1_000_000 + Int64(index))}"#
            return .event(
                TapeEvent(
                    receivedAt: start + Int64(index) * 1_000_000, sequence: UInt64(index + 1), eventType: "Q", ticker: symbol,
                    bytes: Array(json.utf8)))
        }
    }

    /// `records` on the 2026-11-20 stocks tape in 1 KB blocks: its path, the records, the file's bytes
    /// and its blocks.
    func written(_ records: [TapeRecord], in directory: String) throws -> (String, [TapeRecord], Data, [TapeBlock]) {
        let path = TapeFile.path(directory: directory, market: "stocks", day: "2026-11-20")
        let writer = try TapeWriter(directory: directory, market: "stocks", blockBytes: 1024)
        for record in records { try writer.append(record) }
        try writer.flush()
        return (path, records, try Data(contentsOf: URL(fileURLWithPath: path)), try TapeReader(path: path).blocks)
    }

    @Test func whatIsWrittenReadsBackInOrderAcrossBlocks() throws {
        try withDirectory { directory in
            let writer = try TapeWriter(directory: directory, market: "stocks", blockBytes: 4096)
            var records = events(5_000)
            records.insert(.gap(from: Self.start + 2_500_000_000, to: Self.start + 2_600_000_000), at: 2_500)
            for record in records { try writer.append(record) }
            try writer.flush()
            #expect(writer.blocksWritten > 20, "small blocks: \(writer.blocksWritten)")
            let reader = try TapeReader(path: TapeFile.path(directory: directory, market: "stocks", day: "2026-11-20"))
            #expect(reader.blocks.count == writer.blocksWritten)
            #expect(reader.records() == records)
            #expect(reader.skippedBlocks.isEmpty && reader.damaged.isEmpty)
            let raw = records.reduce(0) { total, record in if case .event(let event) = record { total + event.bytes.readableBytes } else { total } }
            print("tape: \(records.count) records, \(raw) bytes of JSON in \(writer.bytesWritten) bytes on disk")
            #expect(writer.bytesWritten * 3 < raw, "compressed well below the JSON")
        }
    }

    @Test func aSeekFindsTheBlockOfATimeAndOfASequenceByBinarySearch() throws {
        try withDirectory { directory in
            let writer = try TapeWriter(directory: directory, market: "stocks", blockBytes: 2048)
            for record in events(3_000) { try writer.append(record) }
            try writer.flush()
            let reader = try TapeReader(path: TapeFile.path(directory: directory, market: "stocks", day: "2026-11-20"))
            for probe in [0, 1, 777, 1_500, 2_999] {
                let time = Self.start + Int64(probe) * 1_000_000
                let index = reader.firstBlock(atOrAfter: time)
                let block = reader.blocks[index]
                #expect(block.header.firstTime <= time && time <= block.header.lastTime, "event \(probe) is in block \(index)")
                #expect(index == 0 || reader.blocks[index - 1].header.lastTime < time)
                let bySequence = reader.firstBlock(atOrAfterSequence: UInt64(probe + 1))
                #expect(bySequence == index)
            }
            #expect(reader.firstBlock(atOrAfter: Self.start + 10_000_000_000) == reader.blocks.count, "past the end: none")
            let from = reader.records(from: Self.start + 1_234 * 1_000_000)
            // Compared unwrapped: Swift 6.3's `==` on an optional `TapeRecord` (an enum holding a
            // `ByteBuffer`) answers false for equal values in a debug build; the records' own `==` is right.
            #expect(!from.isEmpty && from[0] == events(1, from: 1_234)[0])
            #expect(from.count == 3_000 - 1_234)
        }
    }

    @Test func aTornTailIsCutAtEveryByteOffsetAndTheTapeGoesOn() throws {
        try withDirectory { directory in
            let (path, records, whole, blocks) = try written(events(60), in: directory)
            try #require(blocks.count >= 3)
            let last = try #require(blocks.last)
            let keptRecords = blocks.dropLast().reduce(0) { $0 + Int($1.header.records) }
            // Every length from the last block's start to one byte short of its end.
            for cut in Int(last.offset)..<Int(last.end) {
                try whole.prefix(cut).write(to: URL(fileURLWithPath: path))
                let torn = try TapeReader(path: path)
                #expect(torn.blocks.count == blocks.count - 1, "cut at \(cut)")
                #expect(torn.records().count == keptRecords)
                #expect(torn.damaged.isEmpty, "a torn tail is not damage")
            }
            // Opened for writing, the tail is cut and what comes next follows the whole blocks.
            let again = try TapeWriter(directory: directory, market: "stocks", blockBytes: 1024)
            let more = events(10, from: 60)
            for record in more { try again.append(record) }
            try again.flush()
            #expect(again.tornBytesCut == Int64(last.end - last.offset - 1))
            let reader = try TapeReader(path: path)
            #expect(reader.records() == Array(records.prefix(keptRecords)) + more)
        }
    }

    @Test func aFlippedByteLosesItsBlockAndNoOther() throws {
        try withDirectory { directory in
            let (path, _, whole, blocks) = try written(events(80), in: directory)
            try #require(blocks.count >= 4)
            let damagedBlock = blocks[2]
            let others = blocks.enumerated().filter { $0.offset != 2 }.reduce(0) { $0 + Int($1.element.header.records) }
            // In the frame: the zstd checksum finds it; the block is skipped and told.
            var flipped = whole
            flipped[Int(damagedBlock.offset) + TapeBlockHeader.size + 20] ^= 0x01
            try flipped.write(to: URL(fileURLWithPath: path))
            var reader = try TapeReader(path: path)
            #expect(reader.blocks.count == blocks.count)
            #expect(reader.records().count == others)
            #expect(reader.skippedBlocks == [2])
            // In the header: the scan finds the next block by its magic and check; the range is told.
            flipped = whole
            flipped[Int(damagedBlock.offset) + 30] ^= 0x10
            try flipped.write(to: URL(fileURLWithPath: path))
            reader = try TapeReader(path: path)
            #expect(reader.blocks.count == blocks.count - 1)
            #expect(reader.records().count == others)
            #expect(reader.damaged == [damagedBlock.offset..<damagedBlock.end])
            // A writer opening the file keeps the damage (it is not a tail) and appends after the last block.
            let writer2 = try TapeWriter(directory: directory, market: "stocks")
            try writer2.append(events(1, from: 80)[0])
            try writer2.flush()
            #expect(writer2.tornBytesCut == 0)
            #expect(try TapeReader(path: path).records().count == others + 1)
        }
    }

    @Test func aRecordOfTheNextUTCDayStartsTheNextDaysFile() throws {
        try withDirectory { directory in
            let midnight: Int64 = 1_795_219_200 * 1_000_000_000  // 2026-11-21 00:00:00 UTC
            let writer = try TapeWriter(directory: directory, market: "crypto")
            let before = events(3, start: midnight - 3_000_000)
            let after = events(3, from: 3, start: midnight - 3_000_000)
            for record in before + after { try writer.append(record) }
            try writer.flush()
            #expect(writer.day == "2026-11-21")
            let first = try TapeReader(path: TapeFile.path(directory: directory, market: "crypto", day: "2026-11-20"))
            let second = try TapeReader(path: TapeFile.path(directory: directory, market: "crypto", day: "2026-11-21"))
            #expect(first.records() == before)
            #expect(second.records() == after)
            // A day file tells its epoch before its events: the next day's starts with it again.
            let epochs = try TapeWriter(directory: directory, market: "options")
            try epochs.append(.epoch("e7", at: midnight - 5))
            for record in before + after { try epochs.append(record) }
            try epochs.flush()
            let secondDay = try TapeReader(path: TapeFile.path(directory: directory, market: "options", day: "2026-11-21")).records()
            #expect(secondDay.first == .epoch("e7", at: after[0].time))
            #expect(Array(secondDay.dropFirst()) == after)
            // A gap across midnight is the new day's news: it never reopens (or re-creates) the day before.
            let late = try TapeWriter(directory: directory, market: "futures")
            try late.append(after[0])
            try late.append(.gap(from: midnight - 60_000_000_000, to: midnight + 5_000_000))
            try late.flush()
            #expect(TapeFile.days(directory: directory, market: "futures").map(\.day) == ["2026-11-21"])
            #expect(try TapeReader(path: TapeFile.path(directory: directory, market: "futures", day: "2026-11-21")).records().count == 2)
            #expect(TapeFile.day(of: midnight - 1) == "2026-11-20")
            #expect(TapeFile.day(of: midnight) == "2026-11-21")
        }
    }

    /// The fuzz seed is written by a second implementation of the format (`Fuzz/make_tape_seed.py`:
    /// Python and the zstd command line): the reader takes it whole.
    @Test func aTapeWrittenByAnotherImplementationOfTheFormatReads() throws {
        let seed = URL(fileURLWithPath: #filePath).deletingLastPathComponent().appendingPathComponent("../../Fuzz/corpus/tape-three-blocks.tape")
        let reader = try TapeReader(path: seed.standardizedFileURL.path)
        #expect(reader.blocks.count == 3)
        let records = reader.records()
        #expect(records.count == 13)
        #expect(reader.skippedBlocks.isEmpty && reader.damaged.isEmpty)
        #expect(records.contains(.gap(from: Self.start + 1_005_000_000, to: Self.start + 1_006_000_000)))
        guard case .event(let first) = records.first else { return #expect(Bool(false), "an event first") }
        #expect(first.sequence == 1 && first.ticker == "AAPL" && first.receivedAt == Self.start)
        #expect(String(buffer: first.bytes).hasPrefix(#"{"ev":"Q","sym":"AAPL""#))
    }

    /// `count` days of 200 quotes each, a day apart, from 2026-11-20, on the stocks tape in `directory`.
    func writeDays(_ count: Int, in directory: String) throws {
        let writer = try TapeWriter(directory: directory, market: "stocks")
        for day in 0..<count {
            for record in events(200, from: day * 200, start: Self.start + Int64(day) * 86_400_000_000_000) { try writer.append(record) }
        }
        try writer.flush()
    }

    @Test func retentionDeletesTheOldestDaysPastTheCountOrTheBytesNeverToday() throws {
        try withDirectory { directory in
            try writeDays(5, in: directory)
            // Files not named for a day this clock's recorder could have written are neither read nor counted.
            for stray in ["2999-01-01.tape", "2026-02-31.tape", "abcd-ef-gh.tape"] {
                _ = FileManager.default.createFile(atPath: "\(directory)/stocks/\(stray)", contents: Data("x".utf8))
            }
            let all = TapeFile.days(directory: directory, market: "stocks")
            #expect(all.map(\.day) == ["2026-11-20", "2026-11-21", "2026-11-22", "2026-11-23", "2026-11-24"])
            #expect(TapeFile.prune(directory: directory, market: "stocks", today: "2026-11-24", keepDays: 3, maxBytes: .max) == ["2026-11-20", "2026-11-21"])
            // By bytes: what is left holds more than one day's worth, so all but today go.
            let oneDay = all[0].bytes
            #expect(TapeFile.prune(directory: directory, market: "stocks", today: "2026-11-24", keepDays: 30, maxBytes: oneDay + 1) == ["2026-11-22", "2026-11-23"])
            #expect(TapeFile.prune(directory: directory, market: "stocks", today: "2026-11-24", keepDays: 1, maxBytes: 0).isEmpty, "never today's")
            #expect(TapeFile.days(directory: directory, market: "stocks").map(\.day) == ["2026-11-24"])
        }
    }

    /// Whoever may write to the tape's folder: a file named for a day past tomorrow counts and goes after
    /// the past days, a folder named for a day is no day file (and stops nothing), a sparse file counts
    /// the blocks it takes, not the size it claims (else it would push every real day out, or overflow
    /// the sum).
    @Test func retentionCountsFutureDaysDeletesThemLastAndCountsDiskBlocksAndPassesOverWhatIsNoFile() throws {
        try withDirectory { directory in
            try writeDays(3, in: directory)
            let folder = "\(directory)/stocks"
            _ = FileManager.default.createFile(atPath: "\(folder)/2100-01-01.tape", contents: Data(repeating: 0, count: 10))
            try FileManager.default.createDirectory(atPath: "\(folder)/2026-01-01.tape", withIntermediateDirectories: false)
            for name in ["2026-01-02", "2026-01-03"] {
                let sparse = open("\(folder)/\(name).tape", O_CREAT | O_WRONLY | O_CLOEXEC, 0o644)
                try #require(sparse >= 0 && ftruncate(sparse, 1 << 40) == 0, "a sparse file of a terabyte")
                close(sparse)
            }
            #expect(TapeFile.days(directory: directory, market: "stocks").map(\.day) == ["2026-01-02", "2026-01-03", "2026-11-20", "2026-11-21", "2026-11-22"])
            let all = TapeFile.days(directory: directory, market: "stocks", future: true)
            #expect(all.map(\.day).last == "2100-01-01", "counted, though never read")
            #expect(all.prefix(2).allSatisfy { $0.bytes == 0 }, "a sparse file takes no block")
            // The real days' bytes: nothing to delete by bytes.
            #expect(TapeFile.prune(directory: directory, market: "stocks", today: "2026-11-22", keepDays: 30, maxBytes: TapeFile.total(all)).isEmpty)
            #expect(TapeFile.prune(directory: directory, market: "stocks", today: "2026-11-22", keepDays: 4, maxBytes: .max) == ["2026-01-02", "2026-01-03"])
            #expect(TapeFile.prune(directory: directory, market: "stocks", today: "2026-11-22", keepDays: 1, maxBytes: .max) == ["2026-11-20", "2026-11-21", "2100-01-01"])
            #expect(TapeFile.days(directory: directory, market: "stocks", future: true).map(\.day) == ["2026-11-22"])
            #expect(TapeFile.total([("a", "a", .max), ("b", "b", 1)]) == .max, "a sum past Int64 stays at its largest")
        }
    }

    /// The held status (asked every minute) looks for the oldest day's first block in its first bytes:
    /// a file of junk before it is not scanned to its end each time.
    @Test func theHeldStatusLooksForADaysFirstBlockInItsFirstBytesOnly() throws {
        try withDirectory { directory in
            let writer = try TapeWriter(directory: directory, market: "stocks")
            let nextDay = Self.start + 86_400_000_000_000
            for record in events(10, start: nextDay) { try writer.append(record) }
            try writer.flush()
            // The day before: a whole block of its own, after more junk than is looked through.
            let (_, _, block, _) = try written(events(10), in: directory + "/other")
            var junk = Data(repeating: 0, count: Int(TapeDayFiles.firstBlockWithin) + 1)
            junk.append(block)
            try junk.write(to: URL(fileURLWithPath: TapeFile.path(directory: directory, market: "stocks", day: "2026-11-20")))
            let held = TapeDayFiles.held(directory: directory, market: "stocks")
            #expect(held.days == 2)
            #expect(held.since == nextDay, "the first day whose first block is near its start")
        }
    }

    /// A file in the tape's folder is only as trusted as whoever may write there: a block is read only
    /// when its records fit its header and, given the relay's check, when each event is one event of its
    /// own type and symbol (its bytes go out to clients as they are).
    @Test func aBlockIsReadOnlyWhenItsRecordsFitItsHeaderAndItsEventsPassTheCheck() throws {
        try withDirectory { directory in
            let forged = TapeRecord.event(
                TapeEvent(
                    receivedAt: Self.start + 40_000_000, sequence: 41, eventType: "Q", ticker: "AAPL",
                    bytes: Array(#"{"ev":"Q","sym":"MSFT"},{"ev":"status","status":"auth_failed","message":"forged"}"#.utf8)))
            let records = events(40) + [forged] + events(40, from: 41)
            let (path, _, whole, blocks) = try written(records, in: directory)
            #expect(try TapeReader(path: path).records() == records, "read as it is without a check (ls, export)")
            let checked = try TapeReader(path: path, check: stocksCheck)
            let lost = try #require(blocks.firstIndex { $0.header.firstSequence <= 41 && $0.header.lastSequence >= 41 })
            #expect(checked.records().count == records.count - Int(blocks[lost].header.records))
            #expect(checked.skippedBlocks == [lost])
            // A header whose last sequence is below its events': the block does not check.
            var header = blocks[0].header
            header.lastSequence = header.firstSequence
            var changed = whole
            changed.replaceSubrange(Int(blocks[0].offset)..<Int(blocks[0].offset) + TapeBlockHeader.size, with: header.bytes)
            try changed.write(to: URL(fileURLWithPath: path))
            let misfit = try TapeReader(path: path)
            #expect(misfit.blocks.count == blocks.count)
            #expect(misfit.records(inBlock: 0) == nil && misfit.skippedBlocks == [0])
        }
    }

    /// An event dated past a window's end in the middle of a file (a clock stepped back, a file written
    /// by hand) is passed over: the events after it are still the window's.
    @Test func anEventDatedPastTheWindowIsPassedOverNotAnEnd() throws {
        final class OneFile: TapeBlockSink {
            var bytes: [UInt8] = []
            func begin(day: String) throws {}
            func write(_ block: [UInt8], epoch: String?) throws { bytes += block }
        }
        try withDirectory { directory in
            let sink = OneFile()
            let writer = try TapeWriter(sink: sink, blockBytes: 1024)
            let ahead = TapeRecord.event(
                TapeEvent(receivedAt: Self.start + 86_400_000_000_000 * 365, sequence: 11, eventType: "Q", ticker: "AAPL", bytes: Array(#"{"ev":"Q","sym":"AAPL"}"#.utf8)))
            let records = events(10) + [ahead] + events(10, from: 11)
            for record in records { try writer.append(record) }
            try writer.flush()
            try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
            let path = directory + "/one.tape"
            try Data(sink.bytes).write(to: URL(fileURLWithPath: path))
            let window = Array(try TapeReader(path: path).records(from: Self.start, through: Self.start + 86_400_000_000_000))
            #expect(window.count == 20, "\(window.count) of the day's 20 events")
        }
    }

    /// Retention never deletes the day being written, so that day's own file is bounded where it is
    /// written: a block that would take it past the bound is refused (its events lost and counted), the
    /// file stays open and whole, and the next day's file takes blocks again.
    @Test func aDaysFileStopsTakingBlocksAtTheBoundAndTheNextDayGoesOn() throws {
        try withDirectory { directory in
            let bound: Int64 = 4_000
            let writer = try TapeWriter(sink: TapeDayFiles(directory: directory, market: "stocks", maxDayBytes: bound), blockBytes: 512)
            var refused: (any Error)?
            for record in events(2_000) {
                do { try writer.append(record) } catch {
                    refused = error
                    break
                }
            }
            let error = try #require(refused, "a block past the bound is refused")
            #expect("\(error)".contains("tape.maxGB") && "\(error)".contains("2026-11-20"), "\(error)")
            let path = TapeFile.path(directory: directory, market: "stocks", day: "2026-11-20")
            let size = try #require(try FileManager.default.attributesOfItem(atPath: path)[.size] as? Int)
            #expect(size <= bound && size > bound / 2, "\(size) bytes")
            #expect(writer.eventsLost > 0)
            #expect(error is TapeDayFull)
            _ = writer.takeLostFrom()
            // Still refused that day (the file open, not read again), then the next day's file takes blocks.
            // A lost block with a gap in it is lost from the gap's start on.
            let gapFrom = Self.start + 100_000_000
            #expect(throws: TapeDayFull.self) {
                try writer.append(.gap(from: gapFrom, to: Self.start + 5_000_000_000))
                for record in events(50, from: 10_000) { try writer.append(record) }
                try writer.flush()
            }
            #expect(writer.takeLostFrom() == gapFrom)
            let nextDay = events(50, from: 0, start: Self.start + 86_400_000_000_000)
            for record in nextDay { try writer.append(record) }
            try writer.flush()
            #expect(try TapeReader(path: TapeFile.path(directory: directory, market: "stocks", day: "2026-11-21")).records() == nextDay)
            let first = try TapeReader(path: path)
            #expect(first.damaged.isEmpty && first.skippedBlocks.isEmpty && !first.records().isEmpty, "the bounded day reads whole")
            #expect(try FileManager.default.attributesOfItem(atPath: path)[.size] as? Int == size)
        }
    }

    @Test func recordLayoutTakesExtremeValuesAndRefusesTruncatedPayloads() {
        let records: [TapeRecord] = [
            .event(TapeEvent(receivedAt: .max, sequence: .max, eventType: "", ticker: "", bytes: [])),
            .event(TapeEvent(receivedAt: .min, sequence: 0, eventType: "XQ", ticker: "X:BTC-USD", bytes: Array(repeating: 0xFF, count: 300))),
            .gap(from: -5, to: 5),
        ]
        var payload: [UInt8] = []
        for record in records { RecordLayout.append(record, to: &payload, baseTime: 7, baseSequence: 9) }
        #expect(RecordLayout.records(in: payload, baseTime: 7, baseSequence: 9) == records)
        for length in 0..<payload.count {
            let parsed = RecordLayout.records(in: Array(payload.prefix(length)), baseTime: 7, baseSequence: 9)
            #expect(parsed == nil || parsed!.count < records.count, "a prefix of \(length) bytes is never read as all of it")
        }
    }

    /// However fast blocks come, the wanted set is written again before a reader walking back its
    /// bounded number of blocks could miss it.
    @Test func theWantedSetIsWrittenAgainWithinTheBlocksAReaderWalksBack() throws {
        try withDirectory { directory in
            let writer = try TapeWriter(directory: directory, market: "stocks", blockBytes: 64)
            try writer.append(.wanted(topic: "Q.AAPL", true, at: Self.start))
            // Three walks' worth of small blocks within one millisecond of each other: far inside the
            // holding interval.
            for record in events(TapeWriter.mostBlocksBack * 3, start: Self.start) {
                guard case .event(var event) = record else { continue }
                event.receivedAt = Self.start + Int64(event.sequence)
                try writer.append(.event(event))
            }
            try writer.flush()
            let reader = try TapeReader(path: TapeFile.path(directory: directory, market: "stocks", day: "2026-11-20"))
            try #require(reader.blockCount > TapeWriter.mostBlocksBack * 2)
            let holding = reader.blocks.indices.filter { index in
                (reader.records(inBlock: index) ?? []).contains { if case .holding = $0 { true } else { false } }
            }
            let widest = zip(holding, holding.dropFirst()).map { $1 - $0 }.max() ?? reader.blockCount
            #expect(widest <= TapeWriter.mostBlocksBack / 2 + 1, "blocks between holding records: \(widest)")
            #expect(reader.holdingBlock(atOrBefore: reader.blockCount - 1) != reader.blockCount - 1 || holding.last == reader.blockCount - 1)
        }
    }

    /// Blocks as a stream or a file holds them, headers given: what a reader walks back over.
    final class GivenBlocks: TapeBlocks {
        let headers: [TapeBlockHeader]
        var decoded: [Int] = []
        init(_ headers: [TapeBlockHeader]) { self.headers = headers }
        var blockCount: Int { headers.count }
        func header(ofBlock index: Int) -> TapeBlockHeader? { headers.indices.contains(index) ? headers[index] : nil }
        func records(inBlock index: Int) -> [TapeRecord]? {
            decoded.append(index)
            return [.interrupted(at: headers[index].firstTime)]
        }
    }

    /// What a header or a block claims is checked before it is believed: a crafted one costs what a
    /// real block can, never what it says.
    @Test func craftedHeadersAndRecordCountsAreRefusedBeforeTheyCostWhatTheyClaim() {
        func header(_ change: (inout TapeBlockHeader) -> Void) -> TapeBlockHeader? {
            var made = TapeBlockHeader(
                compressedLength: 100, uncompressedLength: 1000, records: 10, firstTime: Self.start, lastTime: Self.start + 5, firstSequence: 1,
                lastSequence: 10)
            change(&made)
            return made.bytes.withUnsafeBytes { TapeBlockHeader($0) }
        }
        #expect(header { _ in } != nil, "a writer's header reads")
        #expect(header { $0.firstTime = $0.lastTime + 1 } == nil, "a first time past the last")
        #expect(header { $0.firstSequence = 11 } == nil, "a first sequence past the last")
        #expect(header { $0.records = TapeBlockHeader.mostRecords + 1 } == nil, "more records than a block holds")
        #expect(header { $0.compressedLength = TapeBlockHeader.largestFrame + 1 } == nil, "a frame past zstd's bound for the largest block")
        // A block of nothing (an index entry per 64 bytes of file), or a frame far past its records' bound.
        #expect(header { $0.records = 0 } == nil && header { $0.uncompressedLength = 0 } == nil, "a block that holds nothing")
        #expect(header { $0.compressedLength = 8 } == nil, "a frame shorter than any zstd frame")
        #expect(header { $0.compressedLength = 1000 + 1000 >> 8 + (1 << 16) } != nil, "a frame within zstd's bound for its bytes")
        #expect(header { $0.compressedLength = 1000 + 1000 >> 8 + (1 << 16) + 1 } == nil, "a frame past zstd's bound for its bytes")
        // A payload of more records than its header says is refused as it is read, not once all are made.
        var payload: [UInt8] = []
        for index in 0..<100 { RecordLayout.append(.interrupted(at: Int64(index)), to: &payload, baseTime: 0, baseSequence: 0) }
        #expect(RecordLayout.records(in: ByteBuffer(bytes: payload), baseTime: 0, baseSequence: 0, most: 10) == nil)
        #expect(RecordLayout.records(in: ByteBuffer(bytes: payload), baseTime: 0, baseSequence: 0, most: 100)?.count == 100)
        // Names no longer than any the relay writes, and a block's holdings of at most 2²⁰ topics in
        // all (each a string, from as little as a byte): past either, the block is damage.
        func readable(_ records: [TapeRecord]) -> Bool {
            var payload: [UInt8] = []
            for record in records { RecordLayout.append(record, to: &payload, baseTime: 0, baseSequence: 0) }
            return RecordLayout.records(in: ByteBuffer(bytes: payload), baseTime: 0, baseSequence: 0) != nil
        }
        let longest = String(repeating: "A", count: RecordLayout.longestName)
        #expect(readable([.wanted(topic: longest, true, at: 1), .epoch(longest, at: 1), .source(vendor: "polygon", path: longest, at: 1)]))
        #expect(!readable([.wanted(topic: longest + "A", true, at: 1)]) && !readable([.epoch(longest + "A", at: 1)]))
        #expect(!readable([.source(vendor: "polygon", path: longest + "A", at: 1)]) && !readable([.holding([longest + "A"], at: 1)]))
        let half = Array(repeating: "", count: Int(RecordLayout.mostHoldingTopics / 2))
        #expect(readable([.holding(half, at: 1), .holding(half, at: 2)]))
        #expect(!readable([.holding(half, at: 1), .holding(half, at: 2), .holding([""], at: 3)]), "past the block's topics in all")
        // A time at the first Int64 holds is walked back from without overflowing; times that claim
        // every block is recent are walked back over a bounded number of blocks.
        let ancient = TapeBlockHeader(compressedLength: 1, uncompressedLength: 1, records: 1, firstTime: .min, lastTime: .min, firstSequence: 0, lastSequence: 0)
        #expect(GivenBlocks([ancient, ancient]).holdingBlock(atOrBefore: 1) == 1)
        let forever = TapeBlockHeader(compressedLength: 1, uncompressedLength: 1, records: 1, firstTime: 0, lastTime: .max, firstSequence: 0, lastSequence: 0)
        let blocks = GivenBlocks(Array(repeating: forever, count: TapeWriter.mostBlocksBack * 3))
        #expect(blocks.holdingBlock(atOrBefore: blocks.blockCount - 1) == blocks.blockCount - 1)
        #expect(blocks.decoded.count == TapeWriter.mostBlocksBack, "decoded \(blocks.decoded.count) blocks")
        // Blocks that each claim 64 MB of records (zeros compress to almost nothing) cost what they claim:
        // the walk decodes as much as 2,048 real blocks, not 2,048 of them.
        let bombs = GivenBlocks(
            Array(
                repeating: TapeBlockHeader(
                    compressedLength: 1, uncompressedLength: Int(TapeBlockHeader.largestBlock), records: 1, firstTime: 0, lastTime: .max,
                    firstSequence: 0, lastSequence: 0), count: 100))
        #expect(bombs.readCost(ofBlock: 0) == 256)
        let whole = TapeBlockHeader(compressedLength: 1, uncompressedLength: (256 << 10) + 900, records: 1, firstTime: 0, lastTime: 0, firstSequence: 0, lastSequence: 0)
        #expect(GivenBlocks([whole]).readCost(ofBlock: 0) == 1, "a writer's whole block, 256 KB and its last record")
        _ = bombs.holdingBlock(atOrBefore: bombs.blockCount - 1)
        #expect(bombs.decoded.count == 8, "decoded \(bombs.decoded.count) blocks of 64 MB")
    }

    /// A block is read where it lies (a decompressed block's buffer): events' bytes are slices of it at
    /// their place in what is readable, wherever that starts, and the header's count of records is only
    /// room made, never trusted past the bytes.
    @Test func recordsAreReadInPlaceFromABufferThatDoesNotStartAtItsStorage() throws {
        let records: [TapeRecord] = [
            .event(TapeEvent(receivedAt: 100, sequence: 10, eventType: "Q", ticker: "AAPL", bytes: Array(#"{"ev":"Q","sym":"AAPL"}"#.utf8))),
            .epoch("e1", at: 101),
            .event(TapeEvent(receivedAt: 102, sequence: 11, topicSequence: 4, eventType: "T", ticker: "MSFT", bytes: Array(#"{"ev":"T","sym":"MSFT"}"#.utf8))),
        ]
        var payload: [UInt8] = []
        for record in records { RecordLayout.append(record, to: &payload, baseTime: 100, baseSequence: 10) }
        var block = ByteBuffer(bytes: Array(repeating: 0xEE, count: 37) + payload)
        block.moveReaderIndex(forwardBy: 37)
        let read = try #require(RecordLayout.records(in: block, baseTime: 100, baseSequence: 10, expected: Int.max))
        #expect(read == records)
        guard case .event(let first) = read.first else { throw TapeError("the first record is not an event") }
        #expect(String(buffer: first.bytes) == #"{"ev":"Q","sym":"AAPL"}"#)
        #expect(RecordLayout.records(in: block, baseTime: 100, baseSequence: 10, expected: -1) == records)
    }
}
