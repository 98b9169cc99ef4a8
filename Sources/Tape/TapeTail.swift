import MarketCore
import NIOCore

/// The end of a market's tape as its next start needs it (a ``PriorRun``): when the newest day file
/// ends with a clean stop and its mark (or, after a crash, its epoch reserved positions ahead:
/// ``PositionReservation``),
/// the epoch and last market sequence of that run, when it stopped, and the
/// blocks from which its recent history is read back (the last `maxAge` before the stop and at most
/// `maxBytes` of records, from the nearest block before that which says what was wanted).
///
/// `Sendable`: names a file and where to start in it; ``read(_:)`` opens it again.
public struct TapeTail: PriorRun {
    public let path: String
    public let epoch: String
    public let lastMarketSequence: UInt64
    public let stoppedAt: Int64
    public let clean: Bool
    /// The first block read back, and the receive time (UTC ns) from which events are kept.
    let firstBlock: Int
    let keepFrom: Int64
    /// What each event read back must be (a block holding one that is not is an interruption).
    let check: EventCheck

    /// Why a tape gives no run to go on from (told in the log at start).
    public struct NotResumable: Error, CustomStringConvertible {
        public let description: String
    }

    /// The newest day of `market`'s tape under `directory`, if its last record is a clean stop or its
    /// last epoch reserved its positions.
    /// - Parameters:
    ///   - maxAge: how long before the stop events are read back (the history's age bound).
    ///   - maxBytes: at most this many bytes of records (before compression) are read back.
    ///   - check: what each event read back must be (``TapeBlockDecoder``).
    public static func read(directory: String, market: String, maxAge: Duration, maxBytes: Int, check: EventCheck) throws(NotResumable) -> TapeTail {
        guard let newest = TapeFile.days(directory: directory, market: market).last else {
            throw NotResumable(description: "nothing recorded yet")
        }
        let reader: TapeReader
        do { reader = try TapeReader(path: newest.path, check: check) } catch { throw NotResumable(description: "\(error)") }
        guard let last = reader.blocks.indices.last else { throw NotResumable(description: "\(newest.path) holds no block") }
        guard let records = reader.records(inBlock: last) else { throw NotResumable(description: "the last block of \(newest.path) does not read") }
        // Every block begins with its epoch: the last one named in the last block is the run's.
        var epoch: String?
        for record in records { if case .epoch(let name, _) = record { epoch = name } }
        guard let epoch else { throw NotResumable(description: "its last run recorded no events") }
        // Past every market sequence the file's blocks hold (an older epoch's too: going past is safe).
        var lastSequence = reader.blocks.map(\.header.lastSequence).max() ?? 0
        guard lastSequence <= PositionReservation.largest else {
            throw NotResumable(description: "its market sequences are past what a position may carry")
        }
        let stopped: Int64
        let clean: Bool
        if case .stopped(let at) = records.last, PositionReservation.stoppedEpoch(directory: directory, market: market) == epoch {
            (stopped, clean) = (at, true)
        } else {
            // A crash: what it gave may pass what it recorded, but not what it reserved.
            guard let reserved = PositionReservation.read(directory: directory, market: market), reserved.epoch == epoch else {
                throw NotResumable(description: "the last run did not stop cleanly and reserved no positions in its epoch")
            }
            lastSequence = max(lastSequence, reserved.through)
            (stopped, clean) = (reader.blocks[last].header.lastTime, false)
        }
        // The window: the last `maxAge`, at most `maxBytes`, back to a block that says what was wanted.
        let (age, overflow) = maxAge.milliseconds.multipliedReportingOverflow(by: 1_000_000)
        let keepFrom = overflow ? Int64.min : stopped &- age
        var first = reader.firstBlock(atOrAfter: keepFrom)
        var bytes = 0
        var byBytes = reader.blocks.count
        while byBytes > 0, bytes + Int(reader.blocks[byBytes - 1].header.uncompressedLength) <= maxBytes {
            byBytes -= 1
            bytes += Int(reader.blocks[byBytes].header.uncompressedLength)
        }
        first = min(max(first, byBytes), last)
        let start = reader.holdingBlock(atOrBefore: first)
        return TapeTail(
            path: newest.path, epoch: epoch, lastMarketSequence: lastSequence, stoppedAt: stopped / 1_000_000, clean: clean, firstBlock: start,
            keepFrom: keepFrom, check: check)
    }

    /// The records from ``firstBlock`` to the end, as steps: the epoch's events (from ``keepFrom``), the
    /// wanted set and its changes, losses and holes as interruptions. A block that does not check is an
    /// interruption too.
    public func steps() -> Steps { Steps(tail: self) }

    /// Reads a block at a time as its steps are asked for. Not `Sendable`: its reader's.
    public struct Steps: IteratorProtocol {
        let tail: TapeTail
        private let reader: TapeReader?
        private var block: Int
        private var ready: [PriorRunStep] = []
        private var readyIndex = 0
        /// Whether the records read now are of the run's epoch (an older run's earlier in the file are not).
        private var ours = false

        init(tail: TapeTail) {
            self.tail = tail
            reader = try? TapeReader(path: tail.path, check: tail.check)
            block = tail.firstBlock
        }

        public mutating func next() -> PriorRunStep? {
            while readyIndex == ready.count {
                guard let reader, block < reader.blocks.count else { return nil }
                ready = steps(ofBlock: block, in: reader)
                readyIndex = 0
                block += 1
            }
            defer { readyIndex += 1 }
            return ready[readyIndex]
        }

        private mutating func steps(ofBlock index: Int, in reader: TapeReader) -> [PriorRunStep] {
            guard let records = reader.records(inBlock: index) else {
                return ours ? [.interrupted(at: reader.blocks[index].header.firstTime / 1_000_000)] : []
            }
            var steps: [PriorRunStep] = []
            var events: [MarketEvent] = []
            var positions: [EventPosition] = []
            var arrivals: [Int64] = []
            func flush() {
                guard !events.isEmpty else { return }
                steps.append(.events(events, positions, arrivedAt: arrivals))
                events = []
                positions = []
                arrivals = []
            }
            for record in records {
                switch record {
                case .epoch(let name, _):
                    ours = name == tail.epoch
                case .event(let event):
                    guard ours, event.receivedAt >= tail.keepFrom, event.topicSequence > 0,
                        let topic = Topic(eventType: event.eventType, ticker: event.ticker), !topic.isWildcard
                    else { continue }
                    events.append(event.marketEvent)
                    positions.append(event.position)
                    arrivals.append(event.receivedAt / 1_000_000)
                case .wanted(let name, let wanted, let at):
                    guard ours, let topic = Topic(parsing: name) else { continue }
                    flush()
                    steps.append(.wanted(topic, wanted, at: at / 1_000_000))
                case .holding(let names, let at):
                    guard ours else { continue }
                    flush()
                    steps.append(.holding(names.compactMap { Topic(parsing: $0) }, at: at / 1_000_000))
                case .interrupted(let at), .gap(let at, _):
                    guard ours else { continue }
                    flush()
                    steps.append(.interrupted(at: at / 1_000_000))
                case .stopped(let at):
                    // The next run starts receiving nothing (its wanted records follow).
                    guard ours else { continue }
                    flush()
                    steps.append(.holding([], at: at / 1_000_000))
                case .source:
                    continue
                }
            }
            flush()
            return steps
        }
    }
}
