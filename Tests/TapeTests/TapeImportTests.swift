import Foundation
import MarketCore
import RelayTestSupport
import Testing

@testable import Tape

/// `relay tape import`: a day file from elsewhere enters a tape's folder checked, block by block, and a
/// day the folder has is kept unless it is to be replaced.
@Suite("Tape import: day files from elsewhere, checked on their way in")
struct TapeImportTests {
    static let start: Int64 = 1_795_185_000 * 1_000_000_000

    func quote(_ index: Int, bytes: String? = nil) -> TapeRecord {
        .event(
            TapeEvent(
                receivedAt: Self.start + Int64(index) * 1_000_000, sequence: UInt64(index), topicSequence: UInt64(index), eventType: "Q", ticker: "AAPL",
                bytes: Array((bytes ?? #"{"ev":"Q","sym":"AAPL","n":\#(index)}"#).utf8)))
    }

    /// Writes each call's records as one block of the stocks tape under `directory`.
    func blockWriter(in directory: String) throws -> ([TapeRecord]) throws -> Void {
        let writer = try TapeWriter(directory: directory, market: "stocks", blockBytes: 1 << 20)
        return { records in
            for record in records { try writer.append(record) }
            try writer.flush()
        }
    }

    @Test func onlyBlocksWhoseEventsCheckAreImportedAndADayHereIsKeptUnlessReplaced() throws {
        let (elsewhere, here) = (scratchDirectory("import-from"), scratchDirectory("import-to"))
        defer { for directory in [elsewhere, here] { try? FileManager.default.removeItem(atPath: directory) } }
        let block = try blockWriter(in: elsewhere)
        try block([.epoch("e1", at: Self.start), .source(vendor: "polygon", path: "/stocks", at: Self.start)] + (1...10).map { quote($0) })
        // Another symbol's event under AAPL's quote: what a replay would serve as AAPL's.
        try block([.epoch("e1", at: Self.start), quote(11, bytes: #"{"ev":"T","sym":"MSFT","p":1},{"ev":"status","status":"forged"}"#)])
        try block([.epoch("e1", at: Self.start), .source(vendor: "alpaca", path: "/v2/iex", at: Self.start)] + (12...13).map { quote($0) })
        try block([.epoch("e1", at: Self.start)] + (14...20).map { quote($0) })
        let file = try #require(TapeFile.days(directory: elsewhere, market: "stocks").last).path

        let outcome = try TapeImport.copy(from: file, market: "stocks", into: here, replace: false) { _ in stocksCheck }
        #expect(outcome.blocks == 2 && outcome.refused == 2 && outcome.days == [TapeFile.day(of: Self.start)], "\(outcome)")
        #expect(outcome.firstRefusal?.contains("does not check") == true, "\(String(describing: outcome.firstRefusal))")
        let imported = try #require(TapeFile.days(directory: here, market: "stocks").last)
        let reader = try TapeReader(path: imported.path, check: stocksCheck)
        let sequences = reader.records().compactMap { record -> UInt64? in if case .event(let event) = record { event.sequence } else { nil } }
        #expect(sequences == (1...10).map(UInt64.init) + (14...20).map(UInt64.init))
        #expect(reader.skippedBlocks.isEmpty, "the imported day reads whole under the check")

        // Again: the day here is kept; with replace, written anew.
        let before = try Data(contentsOf: URL(fileURLWithPath: imported.path))
        try Data("not a tape".utf8).write(to: URL(fileURLWithPath: imported.path))
        let again = try TapeImport.copy(from: file, market: "stocks", into: here, replace: false) { _ in stocksCheck }
        #expect(again.kept == [imported.day] && again.days.isEmpty && again.blocks == 0, "\(again)")
        #expect(try Data(contentsOf: URL(fileURLWithPath: imported.path)) == Data("not a tape".utf8), "kept as it was")
        let replaced = try TapeImport.copy(from: file, market: "stocks", into: here, replace: true) { _ in stocksCheck }
        #expect(replaced.days == [imported.day] && replaced.blocks == 2)
        #expect(try Data(contentsOf: URL(fileURLWithPath: imported.path)) == before)
        #expect(try FileManager.default.contentsOfDirectory(atPath: here + "/stocks").filter { $0.hasSuffix(".import") }.isEmpty, "no partial left")
    }

    /// A recording is of the past: a block dated tomorrow (a day a tape may hold, its clock ahead) would
    /// be the folder's newest day, read first by a resume and a restart, so it is not imported.
    @Test func aDayAfterTodayIsNotImported() throws {
        let (elsewhere, here) = (scratchDirectory("import-late-from"), scratchDirectory("import-late-to"))
        defer { for directory in [elsewhere, here] { try? FileManager.default.removeItem(atPath: directory) } }
        let block = try blockWriter(in: elsewhere)
        let tomorrow = WallClock.nowNanoseconds() + 86_400_000_000_000
        try block([
            .epoch("e1", at: tomorrow), .source(vendor: "polygon", path: "/stocks", at: tomorrow),
            .event(TapeEvent(receivedAt: tomorrow, sequence: 1, topicSequence: 1, eventType: "Q", ticker: "AAPL", bytes: Array(#"{"ev":"Q","sym":"AAPL"}"#.utf8))),
        ])
        let file = try #require(TapeFile.days(directory: elsewhere, market: "stocks").last).path
        let outcome = try TapeImport.copy(from: file, market: "stocks", into: here, replace: false) { _ in stocksCheck }
        #expect(outcome.blocks == 0 && outcome.refused == 1 && outcome.days.isEmpty, "\(outcome)")
        #expect(outcome.firstRefusal?.contains("after today") == true, "\(String(describing: outcome.firstRefusal))")
    }

    /// A day is written only from a block that names the file's source: when the block that names it
    /// does not check, the day's other blocks (checked in that source's protocol) are not written to a
    /// file that names none (replayed in the default vendor's).
    @Test func aDayIsWrittenOnlyFromABlockNamingTheFilesSource() throws {
        let (elsewhere, here) = (scratchDirectory("import-src-from"), scratchDirectory("import-src-to"))
        defer { for directory in [elsewhere, here] { try? FileManager.default.removeItem(atPath: directory) } }
        let block = try blockWriter(in: elsewhere)
        // The source's block holds an event that does not check; then good blocks; then the next day's.
        try block([.epoch("e1", at: Self.start), .source(vendor: "polygon", path: "/stocks", at: Self.start), quote(1, bytes: #"{"ev":"T","sym":"MSFT"}"#)])
        try block([.epoch("e1", at: Self.start)] + (2...5).map { quote($0) })
        let nextDay = Self.start + 86_400_000_000_000
        try block([
            .epoch("e1", at: nextDay),
            .event(TapeEvent(receivedAt: nextDay, sequence: 6, topicSequence: 6, eventType: "Q", ticker: "AAPL", bytes: Array(#"{"ev":"Q","sym":"AAPL"}"#.utf8))),
        ])
        // One file of both days' blocks (blocks stand alone: day files end to end are one tape file).
        let file = elsewhere + "/both.tape"
        let days = TapeFile.days(directory: elsewhere, market: "stocks")
        #expect(days.count == 2)
        try days.reduce(Data()) { $0 + (try Data(contentsOf: URL(fileURLWithPath: $1.path))) }.write(to: URL(fileURLWithPath: file))
        let outcome = try TapeImport.copy(from: file, market: "stocks", into: here, replace: false) { _ in stocksCheck }
        // The first day's blocks are left out; the next day's file begins (as its writer began it) with the source.
        let next = TapeFile.day(of: nextDay)
        #expect(outcome.blocks == 1 && outcome.refused == 2 && outcome.days == [next], "\(outcome)")
        #expect(outcome.firstRefusal?.contains("does not check") == true)
        let written = try #require(TapeFile.days(directory: here, market: "stocks").last)
        let named = try TapeReader(path: written.path).source()
        #expect(written.day == next && named?.vendor == "polygon")
    }
}
