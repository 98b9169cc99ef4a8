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

    @Test func onlyBlocksWhoseEventsCheckAreImportedAndADayHereIsKeptUnlessReplaced() throws {
        let (elsewhere, here) = (scratchDirectory("import-from"), scratchDirectory("import-to"))
        defer { for directory in [elsewhere, here] { try? FileManager.default.removeItem(atPath: directory) } }
        let writer = try TapeWriter(directory: elsewhere, market: "stocks", blockBytes: 1 << 20)
        func block(_ records: [TapeRecord]) throws {
            for record in records { try writer.append(record) }
            try writer.flush()
        }
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
}
