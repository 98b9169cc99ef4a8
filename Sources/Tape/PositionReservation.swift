#if canImport(Glibc)
    import Glibc
#endif

import MarketCore

/// How far a market's positions may have been given, on disk before they are: the recorder writes a
/// number ``step`` ahead of the newest position each time the hub's positions pass the last one
/// written (about once per million events), before the hub delivers the events that carry them. A
/// start after a crash (kill -9: the last flush interval's events never reached the tape, but their
/// positions reached clients) goes on past that number, so no position is ever given to two events.
///
/// `<directory>/<market>/reserved`: one line, `<epoch> <market sequence>`, replaced whole (a rename).
public enum PositionReservation {
    /// How far ahead each reservation goes.
    public static let step: UInt64 = 1 << 20

    /// The largest number a reservation may name: past it positions would not be plausible (a damaged
    /// or hostile file is not gone on from).
    public static let largest = EventPosition.maxSequence - step

    static func path(directory: String, market: String) -> String { "\(directory)/\(market)/reserved" }

    /// The mark of a clean stop in `epoch` (`<market>/stopped`), removed as soon as the relay gives a
    /// position after it: a tape whose last record is its stop, with this mark beside it, lost nothing.
    static func stopMark(directory: String, market: String) -> String { "\(directory)/\(market)/stopped" }

    /// Writes `epoch` and `through`; `false` (and no file left, so no stale number is ever read) when it
    /// could not be written.
    static func write(directory: String, market: String, epoch: String, through: UInt64) -> Bool {
        replace(path(directory: directory, market: market), with: "\(epoch) \(through)\n")
    }

    /// Replaces the file at `path` whole with `text` (a rename); `false`, and no file left, when it could not.
    static func replace(_ path: String, with text: String) -> Bool {
        let temporary = path + ".new"
        let text = Array(text.utf8)
        let descriptor = open(temporary, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o644)
        guard descriptor >= 0 else {
            unlink(path)
            return false
        }
        let written = text.withUnsafeBytes { Glibc.write(descriptor, $0.baseAddress, $0.count) }
        close(descriptor)
        guard written == text.count, rename(temporary, path) == 0 else {
            unlink(temporary)
            unlink(path)
            return false
        }
        return true
    }

    /// What was last reserved for `market`, if anything readable and plausible was.
    public static func read(directory: String, market: String) -> (epoch: String, through: UInt64)? {
        guard let fields = fields(of: path(directory: directory, market: market)), fields.count == 2, let through = UInt64(fields[1]),
            through <= largest
        else { return nil }
        return (fields[0], through)
    }

    /// The epoch of the clean stop marked for `market`, if one is.
    static func stoppedEpoch(directory: String, market: String) -> String? {
        guard let fields = fields(of: stopMark(directory: directory, market: market)), fields.count == 1 else { return nil }
        return fields[0]
    }

    /// A small file's words (at most 127 bytes), if it reads.
    private static func fields(of path: String) -> [String]? {
        let descriptor = open(path, O_RDONLY | O_CLOEXEC)
        guard descriptor >= 0 else { return nil }
        defer { close(descriptor) }
        var buffer = [UInt8](repeating: 0, count: 128)
        let count = buffer.withUnsafeMutableBytes { Glibc.read(descriptor, $0.baseAddress, $0.count) }
        guard count > 0, count < buffer.count else { return nil }
        let fields = String(decoding: buffer[..<count], as: UTF8.self).split(whereSeparator: { $0 == " " || $0 == "\n" }).map(String.init)
        return fields.allSatisfy { !$0.isEmpty } ? fields : nil
    }
}
