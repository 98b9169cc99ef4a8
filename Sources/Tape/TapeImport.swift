#if canImport(Glibc)
    import Glibc
#endif
import Foundation
import MarketCore

/// `relay tape import`: a day file from elsewhere (another relay's folder, a colleague's recording) into
/// a tape's folder, checked on its way in as `relay tape pull` checks a cluster's stream, so the folder
/// stays as trusted as its writers. Each block is copied whole only if every event in it checks, in the
/// protocol of the vendor the file's first `source` record names (``TapeReader/source()``), and it names
/// no other source; a block that does not read, or not so, is left out and told, and so is a block that
/// would begin a day without that source record (its file would name none). A day the folder has
/// already is left as it is unless `replace` says otherwise; each day is written to a file of its own
/// and renamed over the day's only when whole. Under the market's ``TapeLock``: not while a relay
/// records that market into the folder.
public enum TapeImport {
    public struct Outcome: Sendable, Equatable {
        /// The days written, and the blocks copied into them.
        public var days: [String] = []
        public var blocks = 0
        /// Blocks left out: damaged, holding an event that does not check, naming another source, or of
        /// no day a tape has; and why the first was (at most 200 bytes).
        public var refused = 0
        public var firstRefusal: String?
        /// Days the folder has already, left as they were (no `replace`).
        public var kept: [String] = []
    }

    /// - Parameter check: what an event must be, for a file whose `source` record names this vendor and
    ///   upstream path (`nil`: it names none).
    public static func copy(
        from path: String, market: String, into directory: String, replace: Bool,
        check: (_ source: (vendor: String, path: String?)?) -> EventCheck
    ) throws -> Outcome {
        let lock = try TapeLock(directory: directory, market: market)
        return try withExtendedLifetime(lock) {
            // The file is scanned once and each block read once: decoded, checked, and copied as read.
            let reader = try TapeReader(path: path)
            let source = reader.source()
            let decoder = try TapeBlockDecoder(check: check(source))
            var outcome = Outcome()
            func refuse(_ why: String) {
                outcome.refused += 1
                if outcome.firstRefusal == nil { outcome.firstRefusal = VisibleText.visible(why, limit: 200) }
            }
            let staged = TapeStagedDays(directory: directory, market: market, suffix: ".import")
            for index in 0..<reader.blockCount {
                guard let header = reader.header(ofBlock: index), let bytes = reader.bytes(ofBlock: index),
                    let records = bytes.withUnsafeBytes({ decoder.records(of: $0) })
                else {
                    refuse("block \(index) is damaged or holds an event that does not check")
                    continue
                }
                let named = records.compactMap { record -> (vendor: String, path: String?)? in
                    if case .source(let vendor, let path, _) = record { (vendor, path) } else { nil }
                }
                if let other = named.first(where: { $0.vendor != source?.vendor || $0.path != source?.path }) {
                    refuse("block \(index) names another source (\(other.vendor) \(other.path ?? "")) than the file's first")
                    continue
                }
                let day = TapeFile.day(of: header.firstTime)
                guard TapeFile.isTapeDay(day) else {
                    refuse("block \(index) begins on no day a tape has (\(day))")
                    continue
                }
                // A recording of the past: a day after today (UTC) would be the folder's newest, read
                // first by resumes and a restart, and written to by the recorder when it came.
                guard day <= TapeFile.day(of: WallClock.nowNanoseconds()) else {
                    refuse("block \(index) begins on \(day), after today (UTC)")
                    continue
                }
                // Each day written begins with the file's source record, so its replay speaks the protocol
                // its events were checked in (a day whose first block named none would be served in the
                // default vendor's).
                if !staged.has(day), source != nil, named.isEmpty {
                    refuse("block \(index) begins \(day) here without the file's source record (its replay would speak another protocol)")
                    continue
                }
                if !staged.has(day) {
                    if outcome.kept.contains(day) { continue }
                    if !replace, FileManager.default.fileExists(atPath: TapeFile.path(directory: directory, market: market, day: day)) {
                        outcome.kept.append(day)
                        continue
                    }
                }
                try staged.append(bytes, day: day, firstTime: header.firstTime)
                outcome.blocks += 1
            }
            outcome.days = try staged.commit().written
            return outcome
        }
    }
}
