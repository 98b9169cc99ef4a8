/// What one day file of a tape holds, read whole (each block decompressed once, nothing kept):
/// what `relay tape ls` prints.
public struct TapeDaySummary: Sendable, Equatable {
    public var market: String
    public var day: String
    public var bytes: Int64
    public var blocks: Int
    public var events: Int
    /// Gaps recorded (windows the relay did not record) and the time they span, in nanoseconds.
    public var gaps: Int
    public var gapNanoseconds: Int64
    /// The first and last receive time on it (UTC ns), `nil` when it holds nothing readable.
    public var first: Int64?
    public var last: Int64?
    /// The epochs its events are positioned in, in order (a restart of the relay begins one).
    public var epochs: [String] = []
    /// The vendor whose events the day holds (its first `source` record; `nil`: none recorded).
    public var vendor: String?
    /// Blocks that did not check, and byte ranges between blocks that are not blocks.
    public var skippedBlocks: Int
    public var damagedBytes: Int64

    /// Reads the day file of `market` at `path`.
    public init(market: String, day: String, path: String) throws {
        let reader = try TapeReader(path: path)
        self.market = market
        self.day = day
        bytes = reader.blocks.last?.end ?? 0
        blocks = reader.blocks.count
        events = 0
        gaps = 0
        gapNanoseconds = 0
        for index in reader.blocks.indices {
            guard let records = reader.records(inBlock: index) else { continue }
            for record in records {
                switch record {
                case .event(let event):
                    events += 1
                    first = min(first ?? event.receivedAt, event.receivedAt)
                    last = max(last ?? event.receivedAt, event.receivedAt)
                case .gap(let from, let to):
                    gaps += 1
                    // Values read from a file: never trap on them.
                    gapNanoseconds = gapNanoseconds &+ max(to &- from, 0)
                case .epoch(let epoch, _):
                    if epochs.last != epoch { epochs.append(epoch) }
                case .source(let vendor, _, _):
                    if self.vendor == nil { self.vendor = vendor }
                case .wanted, .interrupted, .stopped, .holding:
                    break
                }
            }
        }
        skippedBlocks = reader.skippedBlocks.count
        damagedBytes = reader.damaged.reduce(0) { $0 + ($1.upperBound - $1.lowerBound) }
    }

    /// Every day of every market under `directory`, markets by name, days oldest first.
    public static func all(directory: String) throws -> [TapeDaySummary] {
        var summaries: [TapeDaySummary] = []
        for market in TapeFile.markets(directory: directory) {
            for day in TapeFile.days(directory: directory, market: market) {
                summaries.append(try TapeDaySummary(market: market, day: day.day, path: day.path))
            }
        }
        return summaries
    }
}
