#if canImport(Glibc)
    import Glibc
#endif

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

    static func path(directory: String, market: String) -> String { "\(directory)/\(market)/reserved" }

    /// Writes `epoch` and `through`; `false` (and no file left, so no stale number is ever read) when it
    /// could not be written.
    static func write(directory: String, market: String, epoch: String, through: UInt64) -> Bool {
        let path = path(directory: directory, market: market)
        let temporary = path + ".new"
        let text = Array("\(epoch) \(through)\n".utf8)
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

    /// What was last reserved for `market`, if anything readable was.
    public static func read(directory: String, market: String) -> (epoch: String, through: UInt64)? {
        let descriptor = open(path(directory: directory, market: market), O_RDONLY | O_CLOEXEC)
        guard descriptor >= 0 else { return nil }
        defer { close(descriptor) }
        var buffer = [UInt8](repeating: 0, count: 128)
        let count = buffer.withUnsafeMutableBytes { Glibc.read(descriptor, $0.baseAddress, $0.count) }
        guard count > 0, count < buffer.count else { return nil }
        let fields = String(decoding: buffer[..<count], as: UTF8.self).split(whereSeparator: { $0 == " " || $0 == "\n" })
        guard fields.count == 2, let through = UInt64(fields[1]), !fields[0].isEmpty else { return nil }
        return (String(fields[0]), through)
    }
}
