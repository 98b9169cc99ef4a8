#if canImport(Glibc)
    import Glibc
#endif

/// Day files written beside the day's file in a tape's folder (`<day>.tape<suffix>`), block by block in
/// the order given, and renamed over it only once whole: what `relay tape pull` and `relay tape import`
/// write. One thread's (not `Sendable`); whatever is not committed is removed by ``discard()``.
public final class TapeStagedDays {
    private let directory: String
    private let market: String
    private let suffix: String
    /// Each day's file being written, and the first time of its first block.
    private var files: [String: (descriptor: Int32, partial: String, first: Int64)] = [:]
    private var order: [String] = []

    public init(directory: String, market: String, suffix: String) {
        self.directory = directory
        self.market = market
        self.suffix = suffix
    }

    deinit {
        discard()
    }

    /// Where `day` is written before it is renamed over the day's file.
    public static func partialPath(directory: String, market: String, day: String, suffix: String) -> String {
        TapeFile.path(directory: directory, market: market, day: day) + suffix
    }

    /// Whether a block of `day` was written.
    public func has(_ day: String) -> Bool { files[day] != nil }

    /// Appends a whole block (`bytes`, its header and frame) to `day`'s file, made at its first block
    /// (`firstTime`: that block's). A failed write removes every file written (nothing is replaced).
    public func append(_ bytes: [UInt8], day: String, firstTime: Int64) throws {
        if files[day] == nil {
            let partial = Self.partialPath(directory: directory, market: market, day: day, suffix: suffix)
            let descriptor = Glibc.open(partial, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o644)
            guard descriptor >= 0 else {
                discard()
                throw TapeError("could not write \(partial)")
            }
            files[day] = (descriptor, partial, firstTime)
            order.append(day)
        }
        guard let file = files[day], bytes.withUnsafeBytes({ write(file.descriptor, $0.baseAddress, $0.count) }) == bytes.count else {
            discard()
            throw TapeError("could not write the \(day) tape of \(market)")
        }
    }

    /// Renames each day's file over the day's, in the order they began, but those `keeps` says the
    /// folder's own file is kept for (given the day and the first time written): their files are removed.
    /// Returns the days written and those kept.
    public func commit(keeping keeps: (_ day: String, _ first: Int64) -> Bool = { _, _ in false }) throws -> (written: [String], kept: [String]) {
        var (written, kept): ([String], [String]) = ([], [])
        for day in order {
            guard let file = files.removeValue(forKey: day) else { continue }
            let complete = fsync(file.descriptor) == 0
            close(file.descriptor)
            let path = TapeFile.path(directory: directory, market: market, day: day)
            if keeps(day, file.first) {
                unlink(file.partial)
                kept.append(day)
                continue
            }
            guard complete, rename(file.partial, path) == 0 else {
                unlink(file.partial)
                discard()
                throw TapeError("could not write \(path)")
            }
            written.append(day)
        }
        order = []
        return (written, kept)
    }

    /// Removes every file not committed.
    public func discard() {
        for file in files.values {
            close(file.descriptor)
            unlink(file.partial)
        }
        files = [:]
        order = []
    }
}
