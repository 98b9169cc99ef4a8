#if canImport(Glibc)
    import Glibc
#endif
import MarketCore

/// One market's tape for one UTC day: `<directory>/<market>/<yyyy-mm-dd>.tape`, blocks appended one
/// after another (``TapeBlockHeader``). Append-only: a block is written whole with one `write`, and
/// what a crash leaves half written after the last whole block (a torn tail) is found by its header's
/// check or length and cut the next time the file is opened for writing, never read as events.
public enum TapeFile {
    /// The file of `market`'s tape for the UTC day of `time` (nanoseconds).
    public static func path(directory: String, market: String, day: String) -> String {
        "\(directory)/\(market)/\(day).tape"
    }

    /// Makes `path` and every folder above it that is missing (`mkdir -p`).
    static func makeDirectories(_ path: String) throws {
        var prefix = path.hasPrefix("/") ? "" : "."
        for component in path.split(separator: "/") where !component.isEmpty {
            prefix += "/\(component)"
            if mkdir(prefix, 0o755) != 0, errno != EEXIST { throw TapeError.system("creating", prefix) }
        }
    }

    /// The markets with a folder under `directory`, by name.
    public static func markets(directory: String) -> [String] {
        guard let handle = opendir(directory) else { return [] }
        defer { closedir(handle) }
        var markets: [String] = []
        while let entry = readdir(handle) {
            let name = withUnsafeBytes(of: entry.pointee.d_name) { String(decoding: $0.prefix { $0 != 0 }, as: UTF8.self) }
            guard !name.hasPrefix("."), entry.pointee.d_type == UInt8(DT_DIR) else { continue }
            markets.append(name)
        }
        return markets.sorted()
    }

    /// The day files of `market`'s tape, oldest first, with the bytes each takes on the disk: regular
    /// files named for a day (``isTapeDay(_:)``; with `future`, any real day, a later one included).
    /// A sparse file counts the blocks it takes, not the size it claims.
    public static func days(directory: String, market: String, future: Bool = false) -> [DayFile] {
        let folder = "\(directory)/\(market)"
        guard let handle = opendir(folder) else { return [] }
        defer { closedir(handle) }
        var days: [DayFile] = []
        while let entry = readdir(handle) {
            let name = withUnsafeBytes(of: entry.pointee.d_name) { String(decoding: $0.prefix { $0 != 0 }, as: UTF8.self) }
            let day = String(name.prefix(10))
            guard name.hasSuffix(".tape"), name.count == 15, future ? midnight(of: day) != nil : isTapeDay(day) else { continue }
            let path = "\(folder)/\(name)"
            var info = stat()
            // (A link to a day file is one; a folder or a pipe, which `open` would wait on, is not.)
            guard stat(path, &info) == 0, info.st_mode & S_IFMT == S_IFREG else { continue }
            let (used, overflow) = Int64(info.st_blocks).multipliedReportingOverflow(by: 512)
            days.append((day, path, min(Int64(info.st_size), overflow ? .max : used)))
        }
        return days.sorted { $0.day < $1.day }
    }

    /// A day file: its day (`yyyy-mm-dd`), its path, the bytes it takes on the disk.
    public typealias DayFile = (day: String, path: String, bytes: Int64)

    /// The bytes of `days`, added up without overflow.
    static func total(_ days: [DayFile]) -> Int64 {
        days.reduce(Int64(0)) { sum, day in
            let (added, overflow) = sum.addingReportingOverflow(max(day.bytes, 0))
            return overflow ? .max : added
        }
    }

    /// Deletes `market`'s day files while there are more than `keepDays` days (today included) or they
    /// hold more than `maxBytes`: the oldest first, then those named for a day after tomorrow (a clock
    /// that was set ahead wrote them; no reader reads them); never `today`'s or tomorrow's. One that
    /// cannot be deleted is passed over and counted no more (else it would take every other day with
    /// it). The days deleted.
    @discardableResult
    public static func prune(directory: String, market: String, today: String, keepDays: Int, maxBytes: Int64) -> [String] {
        let days = days(directory: directory, market: market, future: true)
        let tomorrow = midnight(of: today).map { day(of: $0 + 86_400 * 1_000_000_000) } ?? today
        var total = total(days)
        var count = days.count
        var deleted: [String] = []
        for candidate in days.filter({ $0.day < today }) + days.filter({ $0.day > tomorrow }) {
            guard count > keepDays || total > maxBytes else { break }
            if unlink(candidate.path) == 0 { deleted.append(candidate.day) }
            total -= candidate.bytes
            count -= 1
        }
        return deleted
    }

    /// `yyyy-mm-dd` of the UTC day `time` (nanoseconds since 1970) falls in.
    public static func day(of time: Int64) -> String {
        var seconds = time_t(time / 1_000_000_000)
        var parts = tm()
        gmtime_r(&seconds, &parts)
        let year = Int(parts.tm_year) + 1900
        let month = Int(parts.tm_mon) + 1
        let day = Int(parts.tm_mday)
        return "\(year)-\(month < 10 ? "0" : "")\(month)-\(day < 10 ? "0" : "")\(day)"
    }

    /// `HH:MM:SS` (UTC) of `time` (nanoseconds since 1970) in its day.
    public static func clock(of time: Int64) -> String {
        let seconds = (time / 1_000_000_000) % 86_400
        func two(_ value: Int64) -> String { value < 10 ? "0\(value)" : "\(value)" }
        return "\(two(seconds / 3600)):\(two((seconds / 60) % 60)):\(two(seconds % 60))"
    }

    /// `HH:MM` or `HH:MM:SS` (one or two ASCII digits each) as seconds into a day, up to `24:00` (its
    /// end); `nil` for anything else.
    public static func seconds(ofClock text: String) -> Int? {
        let parts = text.split(separator: ":", omittingEmptySubsequences: false)
        guard (2...3).contains(parts.count), parts.allSatisfy({ (1...2).contains($0.count) && $0.allSatisfy { ("0"..."9").contains($0) } })
        else { return nil }
        let numbers = parts.compactMap { Int($0) }
        guard numbers.count == parts.count, numbers[0] <= 24, numbers.dropFirst().allSatisfy({ $0 < 60 }) else { return nil }
        let seconds = numbers[0] * 3600 + numbers[1] * 60 + (numbers.count == 3 ? numbers[2] : 0)
        return seconds <= 86_400 ? seconds : nil
    }

    /// Whether `day` (`yyyy-mm-dd`) is one a tape of this clock's can hold: a real day, and not past
    /// tomorrow (a file named for a later day was not written by this clock's recorder: left alone,
    /// never read as the newest day, never counted against the days kept, never pulled).
    public static func isTapeDay(_ day: String) -> Bool {
        midnight(of: day) != nil && day <= Self.day(of: WallClock.nowNanoseconds() + 86_400 * 1_000_000_000)
    }

    /// The start of the UTC day `yyyy-mm-dd` in nanoseconds since 1970; `nil` when it is not such a day.
    public static func midnight(of day: String) -> Int64? {
        let parts = day.split(separator: "-", omittingEmptySubsequences: false)
        guard parts.count == 3, parts[0].count == 4, parts[1].count == 2, parts[2].count == 2, let year = Int(parts[0]), let month = Int(parts[1]),
            // Nanoseconds since 1970 in an Int64 end in April 2262: a later day is no day of a tape (and
            // its midnight would not fit).
            let date = Int(parts[2]), (1970...2261).contains(year), (1...12).contains(month), (1...31).contains(date)
        else { return nil }
        var fields = tm()
        fields.tm_year = Int32(year - 1900)
        fields.tm_mon = Int32(month - 1)
        fields.tm_mday = Int32(date)
        let seconds = timegm(&fields)
        // 2026-02-31 would roll into March: not a day.
        guard seconds >= 0, Self.day(of: Int64(seconds) * 1_000_000_000) == day else { return nil }
        return Int64(seconds) * 1_000_000_000
    }
}

/// The one writer of a market's tape in a directory: an exclusive `flock` on `<market>/.lock`, held while
/// it lives. A second relay (or a second recorder in one process) pointed at the same directory and
/// market is refused instead of interleaving its blocks with the first's.
public final class TapeLock: Sendable {
    private let descriptor: Int32

    public init(directory: String, market: String) throws {
        let folder = "\(directory)/\(market)"
        try TapeFile.makeDirectories(folder)
        let path = "\(folder)/.lock"
        // Held in a local until it is locked: a throwing init whose properties are all set runs deinit,
        // which would close it a second time (by then perhaps another thread's descriptor).
        let opened = Glibc.open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0o644)
        guard opened >= 0 else { throw TapeError.system("opening", path) }
        guard flock(opened, LOCK_EX | LOCK_NB) == 0 else {
            close(opened)
            throw TapeError("the \(market) tape in \(directory) is being recorded by another relay (\(path) is locked)")
        }
        descriptor = opened
    }

    deinit {
        close(descriptor)
    }
}

/// Where a tape's blocks are stored, one whole block at a time, in order: a file per UTC day on a
/// local disk (``TapeDayFiles``), or a cluster's JetStream stream.
public protocol TapeBlockSink: AnyObject {
    /// Makes ready for the blocks of the UTC `day` (`yyyy-mm-dd`): a file per day opens the day's
    /// (cutting a torn tail); a stream has nothing to do.
    func begin(day: String) throws
    /// Stores one whole block (its header and frame), all of whose records are of `epoch` (`nil`:
    /// none told). Throws when it was not stored whole; its writer begins the day again before the next
    /// block.
    func write(_ block: [UInt8], epoch: String?) throws
}

/// What a tape holds: its bytes, its UTC days (`nil` where it has no days, a stream), and the receive
/// time of its oldest record (UTC ns; `nil` when empty).
public struct TapeHeld: Sendable, Equatable {
    public var bytes: Int64
    public var days: Int?
    public var since: Int64?
    /// `disk` or `jetstream`.
    public var store: String

    public init(bytes: Int64, days: Int?, since: Int64?, store: String) {
        self.bytes = bytes
        self.days = days
        self.since = since
        self.store = store
    }
}

/// A market's tape on a local disk: a file per UTC day (``TapeFile``), opened for appending; a torn
/// tail (a block half written when the process died) is cut when the day's file is opened.
///
/// Not `Sendable`: its writer's.
public final class TapeDayFiles: TapeBlockSink {
    public let directory: String
    public let market: String
    private var descriptor: Int32 = -1
    private var path = ""
    /// Where the next block goes in the open file.
    private var offset: Int64 = 0
    /// Bytes cut from the end of a file when it was opened (a torn tail), since these files were opened.
    public private(set) var tornBytesCut: Int64 = 0

    /// The most one day's file may hold (`nil`: no bound): a block that would pass it is refused, so a
    /// day busier than the whole tape's bound stops being recorded rather than outgrow the disk
    /// (retention deletes older days, never the one being written).
    public let maxDayBytes: Int64?
    private var day = ""

    public init(directory: String, market: String, maxDayBytes: Int64? = nil) {
        self.directory = directory
        self.market = market
        self.maxDayBytes = maxDayBytes
    }

    deinit {
        if descriptor >= 0 { close(descriptor) }
    }

    public func begin(day: String) throws {
        // Its file still open (a block was refused, not torn): nothing to read again.
        if descriptor >= 0, day == self.day { return }
        if descriptor >= 0 {
            close(descriptor)
            descriptor = -1
        }
        try TapeFile.makeDirectories("\(directory)/\(market)")
        self.day = day
        path = TapeFile.path(directory: directory, market: market, day: day)
        descriptor = Glibc.open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0o644)
        guard descriptor >= 0 else { throw TapeError.system("opening", path) }
        let length = Int64(lseek(descriptor, 0, SEEK_END))
        let end = TapeScan.blocks(descriptor: descriptor, length: length).blocks.last?.end ?? 0
        if end < length {
            guard ftruncate(descriptor, off_t(end)) == 0 else {
                let error = TapeError.system("cutting the torn tail of", path)
                close(descriptor)
                descriptor = -1
                throw error
            }
            tornBytesCut += length - end
        }
        offset = end
    }

    /// What `market`'s day files under `directory` hold now (those named for a day after tomorrow too).
    public static func held(directory: String, market: String) -> TapeHeld {
        let days = TapeFile.days(directory: directory, market: market, future: true)
        // The oldest day's first block, read alone (not the file's whole index: once a minute), looked
        // for in the file's first bytes only: a file of junk is not scanned to its end each time.
        let since = days.lazy.filter { TapeFile.isTapeDay($0.day) }.compactMap { day -> Int64? in
            let descriptor = Glibc.open(day.path, O_RDONLY | O_CLOEXEC)
            guard descriptor >= 0 else { return nil }
            defer { close(descriptor) }
            let length = Int64(lseek(descriptor, 0, SEEK_END))
            return TapeScan.firstBlock(descriptor: descriptor, length: length, within: Self.firstBlockWithin)?.header.firstTime
        }.first
        return TapeHeld(bytes: TapeFile.total(days), days: days.count, since: since, store: "disk")
    }

    /// How far into a day file its first block is looked for (past a damaged start) by ``held(directory:market:)``.
    static let firstBlockWithin: Int64 = 4 << 20

    public func write(_ block: [UInt8], epoch: String?) throws {
        guard descriptor >= 0 else { throw TapeError("no day file of the \(market) tape is open") }
        if let maxDayBytes, offset + Int64(block.count) > maxDayBytes {
            throw TapeDayFull(market: market, day: day, bytes: offset, bound: maxDayBytes)
        }
        let written = block.withUnsafeBytes { pwrite(descriptor, $0.baseAddress, $0.count, off_t(offset)) }
        guard written == block.count else {
            // A short write (a full disk): what was written is a torn tail, cut when the file is next
            // opened, which the writer's next block does.
            let error = TapeError.system("writing a block to", path)
            close(descriptor)
            descriptor = -1
            throw error
        }
        offset += Int64(block.count)
    }
}

/// A block refused because it would take its day's file past the tape's bound: recording waits for
/// the next UTC day.
public struct TapeDayFull: Error, CustomStringConvertible {
    public let market: String
    public let day: String
    public let bytes: Int64
    public let bound: Int64

    public var description: String {
        "the \(market) tape's file of \(day) holds \(bytes) bytes and one more block would pass the tape's bound "
            + "(tape.maxGB, \(bound) bytes): recording waits for the next UTC day"
    }
}

/// Appends records to a market's tape, a block at a time: records gather in memory until ``flush()``
/// (its owner calls it on a timer, the flush interval) or until a block's worth (`blockBytes` before
/// compression) is waiting; a record of the next UTC day begins the next day (its own file, on a disk).
///
/// Not `Sendable`: one owner, off the delivery path (the recorder).
public final class TapeWriter {
    /// Where the blocks go.
    public let sink: any TapeBlockSink
    private let blockBytes: Int
    private let compressor: ZstdCompressor
    /// The UTC day of the blocks being written.
    public private(set) var day: String?
    /// The receive times (UTC ns) of that day, once known.
    private var dayTimes: Range<Int64>?
    private static let nanosecondsPerDay: Int64 = 86_400 * 1_000_000_000
    private var pending: [UInt8] = []
    private var pendingRecords = 0
    private var pendingEvents = 0
    /// Events in blocks written, and events lost with a block that could not be written.
    public private(set) var eventsWritten = 0
    public private(set) var eventsLost = 0
    /// The earliest receive time in a block that could not be written (since ``takeLostFrom()``).
    private var lostFrom: Int64?
    /// The earliest time a record of the pending block speaks of (a gap's start is before the block's).
    private var pendingEarliest: Int64?

    /// Where the records lost with failed blocks began (they are a gap to record), once.
    public func takeLostFrom() -> Int64? {
        defer { lostFrom = nil }
        return lostFrom
    }
    private var first: (time: Int64, sequence: UInt64)?
    private var last: (time: Int64, sequence: UInt64) = (0, 0)
    /// Bytes cut from the end of a day file when it was opened (a torn tail), since this writer began.
    public var tornBytesCut: Int64 { (sink as? TapeDayFiles)?.tornBytesCut ?? 0 }
    /// Blocks written, and their bytes on disk (headers included).
    public private(set) var blocksWritten = 0
    public private(set) var bytesWritten: Int64 = 0

    /// A writer of `market`'s day files under `directory`.
    public convenience init(directory: String, market: String, blockBytes: Int = 256 << 10, level: Int32 = 1) throws {
        try self.init(sink: TapeDayFiles(directory: directory, market: market), blockBytes: blockBytes, level: level)
    }

    public init(sink: any TapeBlockSink, blockBytes: Int = 256 << 10, level: Int32 = 1) throws {
        self.sink = sink
        self.blockBytes = max(blockBytes, 1)
        compressor = try ZstdCompressor(level: level)
    }

    /// Adds `record` to the block being gathered (writing it first if the record is of another day, or
    /// the block is full).
    public func append(_ record: TapeRecord) throws {
        switch record {
        case .event(let event):
            try event.bytes.withUnsafeReadableBytes { bytes in
                try appendEvent(
                    receivedAt: event.receivedAt, sequence: event.sequence, topicSequence: event.topicSequence, eventType: event.eventType,
                    ticker: event.ticker, bytes: bytes)
            }
        case .gap(let from, let to):
            try appendOther(record, at: from, until: to)
        case .epoch(let epoch, let at):
            // A block holds one epoch's records (a stream files it under its epoch).
            if epoch != self.epoch {
                try flush()
                self.epoch = epoch
            }
            // A block's start tells its epoch by itself.
            if first == nil { _ = try starting(at: at, sequence: 0) } else { try appendOther(record, at: at, until: at) }
        case .source(let vendor, let path, let at):
            try appendOther(record, at: at, until: at)
            source = (vendor, path)
        case .wanted(_, _, let at):
            try appendOther(record, at: at, until: at)
            follow(record)
        case .holding(_, let at):
            try appendOther(record, at: at, until: at)
            (holdingWrittenAt, blocksSinceHolding) = (at, 0)
            follow(record)
        case .interrupted(let at), .stopped(let at):
            try appendOther(record, at: at, until: at)
        }
    }

    /// Follows what `record` says is wanted without writing it (recording is paused: the window is
    /// told as a gap, and the next snapshot of the wanted set is still true).
    public func follow(_ record: TapeRecord) {
        switch record {
        case .wanted(let topic, let wanted, _):
            if wanted { holding.insert(topic) } else { holding.remove(topic) }
            tracksHolding = true
        case .holding(let topics, _):
            holding = Set(topics)
            tracksHolding = true
        default:
            break
        }
    }

    /// The topics the relay receives now (from the `.wanted` records appended): written whole at the
    /// start of a block every ``holdingInterval`` (and first in each day file), so a reader starting
    /// at that block knows them.
    public private(set) var holding: Set<String> = []
    private var holdingWrittenAt: Int64?
    /// Blocks written since the last holding record: one is written again before a reader walking back
    /// (at most ``mostBlocksBack``) could miss it, however fast blocks come.
    private var blocksSinceHolding = 0
    /// Whether this writer is told what is wanted (a hub's recording is, from its first subscribe): only
    /// then is the set written.
    private var tracksHolding = false
    /// How often the whole wanted set is written again (UTC ns): a restart reads back at most this far
    /// before the window it rebuilds.
    public static let holdingInterval: Int64 = 10_000_000_000
    /// The most blocks a reader decodes back from where it starts to find the wanted set: two holding
    /// intervals of blocks at a few hundred thousand events a second, whatever a header's times claim.
    public static let mostBlocksBack = 2_048

    /// The source of the events appended now (the last `.source` record): written again in each new
    /// day file, after the epoch.
    public private(set) var source: (vendor: String, path: String?)?

    /// The epoch of the events appended now (the last `.epoch` record): written again first in each
    /// new day file.
    public private(set) var epoch: String?

    /// A gap or an epoch: in the file of the day it ends in (a gap across midnight is today's news; it
    /// never reopens yesterday's file, which retention may have deleted).
    private func appendOther(_ record: TapeRecord, at time: Int64, until end: Int64) throws {
        if pending.count >= blockBytes { try flush() }
        let first = try starting(at: end, sequence: 0)
        pendingEarliest = min(pendingEarliest ?? time, time)
        RecordLayout.append(record, to: &pending, baseTime: first.time, baseSequence: first.sequence)
        pendingRecords += 1
        last.time = max(last.time, end)
    }

    /// An event's record, its bytes copied once from where they are (the recorder's way: no
    /// ``TapeEvent`` made per event).
    public func appendEvent(
        receivedAt: Int64, sequence: UInt64, topicSequence: UInt64 = 0, eventType: String, ticker: String, bytes: UnsafeRawBufferPointer
    ) throws {
        // A full block is written before the record joins the next: when that write fails, this record
        // is not in the lost block (its caller counts it as not appended, once).
        if pending.count >= blockBytes { try flush() }
        let first = try starting(at: receivedAt, sequence: sequence)
        RecordLayout.appendEvent(
            receivedAt: receivedAt, sequence: sequence, topicSequence: topicSequence, eventType: eventType, ticker: ticker, bytes: bytes,
            to: &pending, baseTime: first.time, baseSequence: first.sequence)
        pendingRecords += 1
        pendingEvents += 1
        last = (max(last.time, receivedAt), max(last.sequence, sequence))
    }

    /// The block's first time and sequence, once the file of `time`'s day is open. A new day file tells
    /// its epoch and source first; every block begins with its epoch, so a reader starting at any block
    /// (a restart's rebuild of its recent history) knows which epoch its positions count in.
    private func starting(at time: Int64, sequence: UInt64) throws -> (time: Int64, sequence: UInt64) {
        var newDay = false
        // The day's name is made (`gmtime_r` and a string) only when a record leaves the day's times.
        if day == nil || dayTimes?.contains(time) != true {
            let recordDay = TapeFile.day(of: time)
            if recordDay != day {
                try flush()
                day = nil
                try sink.begin(day: recordDay)
                day = recordDay
                newDay = true
            }
            // (Not for a time before 1970 or within a day of the last one Int64 holds: computed each time.)
            let midnight = time >= 0 && time <= .max - Self.nanosecondsPerDay ? time - time % Self.nanosecondsPerDay : nil
            dayTimes = midnight.map { $0..<($0 + Self.nanosecondsPerDay) }
        }
        if let first { return first }
        first = (time, sequence)
        last = (time, sequence)
        if let epoch {
            RecordLayout.append(.epoch(epoch, at: time), to: &pending, baseTime: time, baseSequence: sequence)
            pendingRecords += 1
        }
        if newDay, let source {
            RecordLayout.append(.source(vendor: source.vendor, path: source.path, at: time), to: &pending, baseTime: time, baseSequence: sequence)
            pendingRecords += 1
        }
        if tracksHolding,
            newDay || blocksSinceHolding >= Self.mostBlocksBack / 2 || holdingWrittenAt.map({ time - $0 >= Self.holdingInterval || time < $0 }) ?? true
        {
            RecordLayout.append(.holding(holding.sorted(), at: time), to: &pending, baseTime: time, baseSequence: sequence)
            pendingRecords += 1
            holdingWrittenAt = time
            blocksSinceHolding = 0
        }
        return (time, sequence)
    }

    /// Writes what was gathered as one block (nothing when nothing was).
    public func flush() throws {
        guard pendingRecords > 0, let first else { return }
        let frame = try pending.withUnsafeBytes { try compressor.compress($0) }
        let header = TapeBlockHeader(
            compressedLength: frame.count, uncompressedLength: pending.count, records: pendingRecords, firstTime: first.time,
            lastTime: last.time, firstSequence: first.sequence, lastSequence: last.sequence)
        let block = header.bytes + frame
        do {
            try sink.write(block, epoch: epoch)
        } catch {
            // Not stored whole (a full disk, a stream that did not acknowledge): the block's records are
            // lost (its owner records the gap from the earliest time they spoke of: a gap record's start),
            // and the next record begins its day again.
            let earliest = min(first.time, pendingEarliest ?? first.time)
            lostFrom = min(lostFrom ?? earliest, earliest)
            pendingEarliest = nil
            eventsLost += pendingEvents
            pending.removeAll(keepingCapacity: true)
            pendingRecords = 0
            pendingEvents = 0
            self.first = nil
            day = nil
            throw error
        }
        pendingEarliest = nil
        blocksWritten += 1
        blocksSinceHolding += 1
        bytesWritten += Int64(block.count)
        eventsWritten += pendingEvents
        pending.removeAll(keepingCapacity: true)
        pendingRecords = 0
        pendingEvents = 0
        self.first = nil
    }

    /// Records gathered and not yet written.
    public var unflushedRecords: Int { pendingRecords }
}

/// A tape's blocks in order, as a reader sees them: a day file (``TapeReader``) or a cluster's stream.
/// A block that cannot be had (damaged, or gone from a stream since) answers `nil`.
///
/// Not `Sendable`: one reader at a time.
public protocol TapeBlocks: AnyObject {
    /// How many blocks there are (some may answer `nil`).
    var blockCount: Int { get }
    /// What block `index` spans.
    func header(ofBlock index: Int) -> TapeBlockHeader?
    /// Block `index`'s records, `nil` when it does not check or cannot be had.
    func records(inBlock index: Int) -> [TapeRecord]?
}

extension TapeBlocks {
    /// The first block that may hold a record received at or after `time`: a binary search over the
    /// blocks' last times (records are in arrival order).
    public func firstBlock(atOrAfter time: Int64) -> Int {
        partition { $0.lastTime >= time }
    }

    /// The first block that may hold the event of market sequence `sequence` or a later one.
    public func firstBlock(atOrAfterSequence sequence: UInt64) -> Int {
        partition { $0.lastSequence >= sequence }
    }

    /// A block that cannot be had counts as before (a stream loses its oldest first).
    private func partition(_ isAtOrAfter: (TapeBlockHeader) -> Bool) -> Int {
        var low = 0
        var high = blockCount
        while low < high {
            let middle = low + (high - low) / 2
            if header(ofBlock: middle).map(isAtOrAfter) == true { high = middle } else { low = middle + 1 }
        }
        return low
    }
}

/// Consecutive day files read as one run of blocks (the oldest first): what a resume reaching back
/// past midnight reads. Not `Sendable`: its readers'.
public final class TapeDays: TapeBlocks {
    private let readers: [TapeReader]
    /// The index of each reader's first block.
    private let starts: [Int]
    public let blockCount: Int
    /// The day files, oldest first.
    public var paths: [String] { readers.map(\.path) }

    public convenience init(paths: [String]) throws {
        try self.init(readers: paths.map { try TapeReader(path: $0) })
    }

    /// The day file at `path` before the days of `later` (whose files are not read again).
    public convenience init(_ path: String, before later: TapeDays) throws {
        try self.init(readers: [TapeReader(path: path)] + later.readers)
    }

    private init(readers: [TapeReader]) {
        self.readers = readers
        var starts: [Int] = []
        var count = 0
        for reader in readers {
            starts.append(count)
            count += reader.blockCount
        }
        self.starts = starts
        blockCount = count
    }

    /// The reader holding block `index`, and the block's index in it.
    private func locate(_ index: Int) -> (TapeReader, Int)? {
        guard index >= 0, index < blockCount else { return nil }
        var low = 0
        var high = starts.count - 1
        while low < high {
            let middle = (low + high + 1) / 2
            if starts[middle] <= index { low = middle } else { high = middle - 1 }
        }
        return (readers[low], index - starts[low])
    }

    public func header(ofBlock index: Int) -> TapeBlockHeader? {
        locate(index).flatMap { $0.0.header(ofBlock: $0.1) }
    }

    public func records(inBlock index: Int) -> [TapeRecord]? {
        locate(index).flatMap { $0.0.records(inBlock: $0.1) }
    }
}

/// Decodes blocks held whole in memory (a stream's messages): each block is its header and its frame.
/// A block whose records do not fit its header, or (given a check) holds an event the relay would not
/// take from its upstream, does not check: a file in the tape's folder is only as trusted as whoever
/// may write there.
/// Not `Sendable`: a decompression context.
public final class TapeBlockDecoder {
    private let decompressor: ZstdDecompressor
    /// What each event must be to be read (`nil`: its bytes are not looked at).
    let check: EventCheck?
    /// Why the last block the check refused was, in at most 200 bytes of visible text, and how many it refused.
    public private(set) var lastRefusal: String?
    public private(set) var refusals = 0

    public init(check: EventCheck? = nil) throws {
        decompressor = try ZstdDecompressor()
        self.check = check
    }

    /// The header of the block in `bytes`, `nil` when it does not check or the frame is not all there.
    public static func header(of bytes: UnsafeRawBufferPointer) -> TapeBlockHeader? {
        guard let header = TapeBlockHeader(bytes), bytes.count == TapeBlockHeader.size + Int(header.compressedLength) else { return nil }
        return header
    }

    /// The records of the block in `bytes`, `nil` when it does not check.
    public func records(of bytes: UnsafeRawBufferPointer) -> [TapeRecord]? {
        guard let header = Self.header(of: bytes) else { return nil }
        return records(header: header, frame: UnsafeRawBufferPointer(rebasing: bytes[TapeBlockHeader.size...]))
    }

    func records(header: TapeBlockHeader, frame: UnsafeRawBufferPointer) -> [TapeRecord]? {
        guard let payload = try? decompressor.decompress(frame, expected: Int(header.uncompressedLength)),
            let records = RecordLayout.records(
                in: payload, baseTime: header.firstTime, baseSequence: header.firstSequence, expected: Int(header.records),
                most: Int(header.records)),
            records.count == Int(header.records), Self.fit(records, header)
        else { return nil }
        if let problem = check?.problem(in: records) {
            lastRefusal = VisibleText.visible(problem, limit: 200)
            refusals += 1
            return nil
        }
        return records
    }

    /// Whether every event is within what its block's header says (the writer writes no other): received
    /// by its last time, positioned at most its last sequence, its topic's position a plausible one. A
    /// position past them read back at a restart would be carried into the run's live positions.
    static func fit(_ records: [TapeRecord], _ header: TapeBlockHeader) -> Bool {
        for case .event(let event) in records
        where event.receivedAt > header.lastTime || event.sequence > header.lastSequence || event.topicSequence > EventPosition.maxSequence {
            return false
        }
        return true
    }
}

/// Reads one day file of a tape: its index (the block headers) at open, then records block by block.
/// A block whose frame does not check (a flipped byte) is skipped and counted; the rest reads. What
/// follows the last whole block (a torn tail, or a block being written now) is not read.
///
/// Not `Sendable`: one reader per replay or export.
public final class TapeReader: TapeBlocks {
    public let path: String
    private let descriptor: Int32
    private let decoder: TapeBlockDecoder
    /// The file's whole blocks, in order.
    public private(set) var blocks: [TapeBlock]
    /// Blocks that could not be read (their frame or records did not check), by index.
    public private(set) var skippedBlocks: [Int] = []
    private var skipped: Set<Int> = []
    /// Byte ranges between blocks that are not blocks (a damaged header: its block is lost).
    public private(set) var damaged: [Range<Int64>] = []

    /// - Parameter check: what each event must be to be read (``TapeBlockDecoder``); `nil`: a tool's read
    ///   (`relay tape ls`, an export) that shows what is there.
    public init(path: String, check: EventCheck? = nil) throws {
        self.path = path
        decoder = try TapeBlockDecoder(check: check)
        descriptor = Glibc.open(path, O_RDONLY | O_CLOEXEC)
        guard descriptor >= 0 else { throw TapeError.system("opening", path) }
        let found = TapeScan.blocks(descriptor: descriptor, length: Int64(lseek(descriptor, 0, SEEK_END)))
        blocks = found.blocks
        damaged = found.damaged
    }

    deinit {
        close(descriptor)
    }

    /// Looks again for blocks written since (a day still being recorded).
    public func refresh() {
        let found = TapeScan.blocks(descriptor: descriptor, length: Int64(lseek(descriptor, 0, SEEK_END)))
        blocks = found.blocks
        damaged = found.damaged
    }

    public var blockCount: Int { blocks.count }

    public func header(ofBlock index: Int) -> TapeBlockHeader? {
        blocks.indices.contains(index) ? blocks[index].header : nil
    }

    /// The records of block `index`; `nil` (and the block noted in ``skippedBlocks``) when it does not check.
    public func records(inBlock index: Int) -> [TapeRecord]? {
        guard blocks.indices.contains(index) else { return nil }
        let block = blocks[index]
        var frame = [UInt8](repeating: 0, count: Int(block.header.compressedLength))
        let read = frame.withUnsafeMutableBytes { pread(descriptor, $0.baseAddress, $0.count, off_t(block.offset) + off_t(TapeBlockHeader.size)) }
        guard read == frame.count, let records = frame.withUnsafeBytes({ decoder.records(header: block.header, frame: $0) }) else {
            if skipped.insert(index).inserted { skippedBlocks.append(index) }
            return nil
        }
        return records
    }

    /// Block `index` as it lies in the file, its header and its frame (`nil`: it could not be read).
    public func bytes(ofBlock index: Int) -> [UInt8]? {
        guard blocks.indices.contains(index) else { return nil }
        let block = blocks[index]
        var bytes = [UInt8](repeating: 0, count: Int(block.end - block.offset))
        let read = bytes.withUnsafeMutableBytes { pread(descriptor, $0.baseAddress, $0.count, off_t(block.offset)) }
        return read == bytes.count ? bytes : nil
    }

    /// The vendor and upstream path the day's events came from: its first `source` record (written in
    /// its first block; the first few are looked at). `nil`: none recorded.
    public func source() -> (vendor: String, path: String?)? {
        for index in blocks.indices.prefix(4) {
            for record in records(inBlock: index) ?? [] {
                if case .source(let vendor, let path, _) = record { return (vendor, path) }
            }
        }
        return nil
    }

    /// Every readable record from the first received at or after `time`, in order (blocks that do not
    /// check are skipped).
    public func records(from time: Int64 = .min) -> [TapeRecord] { Array(records(from: time, through: .max)) }

    /// The records of the window `from...through` (UTC ns), in order, a block decoded at a time as they
    /// are read: events received in it, gaps overlapping it, other records made in it. The first block
    /// is found by binary search; the blocks after it are read while they begin within the window (the
    /// headers of the rest are looked at). Blocks that do not check are skipped (``skippedBlocks``).
    public func records(from: Int64, through: Int64) -> Window { Window(reader: self, from: from, through: through) }

    /// What ``records(from:through:)`` reads. Not `Sendable`: its reader's.
    public struct Window: Sequence, IteratorProtocol {
        let reader: TapeReader
        let from: Int64
        let through: Int64
        private var block: Int
        private var records: IndexingIterator<[TapeRecord]>?
        /// The records' bytes of the blocks decoded so far (an event read holds its whole block's).
        public private(set) var decodedBytes = 0

        /// Blocks of its reader skipped so far (damaged), by index.
        public var skippedBlocks: [Int] { reader.skippedBlocks }

        init(reader: TapeReader, from: Int64, through: Int64) {
            self.reader = reader
            self.from = from
            self.through = through
            block = reader.firstBlock(atOrAfter: from)
        }

        public mutating func next() -> TapeRecord? {
            while true {
                if let record = records?.next() {
                    switch record {
                    case .event(let event):
                        // Passed over, not an end: one dated far ahead (a clock stepped back, a file
                        // written by hand) would else cut off every event after it.
                        guard event.receivedAt >= from, event.receivedAt <= through else { continue }
                    case .gap(let start, let end):
                        guard end >= from, start <= through else { continue }
                    default:
                        guard record.time >= from, record.time <= through else { continue }
                    }
                    return record
                }
                guard block < reader.blocks.count else { return nil }
                block += 1
                // A block that begins past the window is passed over undecoded, not an end: blocks are in
                // arrival order, but one may be dated far ahead.
                guard reader.blocks[block - 1].header.firstTime <= through else { continue }
                decodedBytes += Int(reader.blocks[block - 1].header.uncompressedLength)
                records = (reader.records(inBlock: block - 1) ?? []).makeIterator()
            }
        }
    }
}
