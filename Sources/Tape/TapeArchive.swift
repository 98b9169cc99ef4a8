import Dispatch
import MarketCore
import NIOCore

/// A market's tape as the hub's archive (``EventArchive``): a resume from a position its memory no
/// longer holds is answered from the day file, read on a queue of its own (it waits on the disk).
///
/// One pass from the block before the earliest position that says what was wanted, to `until`: a
/// topic's events are whole from where its client stands only if it was received all that time (wanted,
/// by name or by its wildcard, no loss, no hole in the recording, one epoch). A `_s` position is found
/// by reading back from `until`, at most ``topicSearchBlocks`` blocks. Only the newest day file is read
/// (a position from an earlier day is a gap). `Sendable`: names a folder; each read opens the file.
public final class TapeArchive: EventArchive {
    public let directory: String
    public let market: String
    private let queue: DispatchQueue
    /// How far back a `_s` position is looked for: blocks of up to 256 KB of records (about 1 GB).
    public static let topicSearchBlocks = 4096

    public init(directory: String, market: String) {
        self.directory = directory
        self.market = market
        queue = DispatchQueue(label: "relay.tape.archive.\(market)")
    }

    public func missed(_ requests: [ArchiveRequest], epoch: String, until: UInt64, limit: Int) async -> [Topic: ArchiveAnswer] {
        await withCheckedContinuation { continuation in
            queue.async { continuation.resume(returning: self.read(requests, epoch: epoch, until: until, limit: limit)) }
        }
    }

    /// What a topic's read found so far.
    private struct Reading {
        let topic: Topic
        /// The market sequence after which it wants events.
        let after: UInt64
        var active = false
        var events: [MarketEvent] = []
        var positions: [EventPosition] = []
        var answer: ArchiveAnswer?
    }

    func read(_ requests: [ArchiveRequest], epoch: String, until: UInt64, limit: Int) -> [Topic: ArchiveAnswer] {
        func gapAll(_ reason: String) -> [Topic: ArchiveAnswer] {
            Dictionary(requests.map { ($0.topic, ArchiveAnswer.gap(from: 0, through: 0, unit: "market_sequence", reason: reason)) }, uniquingKeysWith: { a, _ in a })
        }
        guard let newest = TapeFile.days(directory: directory, market: market).last, let reader = try? TapeReader(path: newest.path) else {
            return gapAll("not on the tape")
        }
        var answers: [Topic: ArchiveAnswer] = [:]
        var readings: [Reading] = []
        for request in requests where answers[request.topic] == nil {
            switch start(of: request, in: reader, until: until) {
            case .success(let after): readings.append(Reading(topic: request.topic, after: after))
            case .failure(let gap): answers[request.topic] = gap.answer
            }
        }
        guard let earliest = readings.map(\.after).min() else { return answers }
        let first = reader.holdingBlock(atOrBefore: reader.firstBlock(atOrAfterSequence: earliest + 1))
        var wanted = Set<String>()
        // A day file's first block without a holding record began its run: nothing was wanted before.
        var known = first == 0
        var ours = false
        var total = 0
        // Stops being whole: every active reading not yet answered.
        func breakActive(_ reason: String, only topic: Topic? = nil) {
            for index in readings.indices where readings[index].active && readings[index].answer == nil {
                if let topic, !Self.affects(topic, readings[index].topic) { continue }
                readings[index].answer = .gap(from: readings[index].after + 1, through: until, unit: "market_sequence", reason: reason)
            }
        }
        var reached = false
        scan: for index in first..<reader.blocks.count {
            guard let records = reader.records(inBlock: index) else {
                breakActive("a damaged block of the tape")
                continue
            }
            for record in records {
                switch record {
                case .epoch(let name, _):
                    ours = name == epoch
                    if !ours { breakActive("another epoch on the tape") }
                case .holding(let topics, _):
                    guard ours else { continue }
                    let now = Set(topics)
                    if known { for changed in now.symmetricDifference(wanted) { if let topic = Topic(parsing: changed) { breakActive("not received all the time", only: topic) } } }
                    wanted = now
                    known = true
                case .wanted(let name, let isWanted, _):
                    guard ours else { continue }
                    if isWanted { wanted.insert(name) } else { wanted.remove(name) }
                    if let topic = Topic(parsing: name) { breakActive("not received all the time", only: topic) }
                case .interrupted, .gap, .stopped:
                    guard ours else { continue }
                    breakActive("the upstream was lost or the relay was down meanwhile")
                    // The next run starts receiving nothing (its wanted records follow).
                    if case .stopped = record { (wanted, known) = ([], true) }
                case .source:
                    continue
                case .event(let event):
                    guard ours else { continue }
                    if event.sequence > until {
                        reached = true
                        break scan
                    }
                    for index in readings.indices where readings[index].answer == nil {
                        if !readings[index].active {
                            guard event.sequence > readings[index].after else { continue }
                            readings[index].active = true
                            guard known, Self.isWanted(readings[index].topic, in: wanted) else {
                                readings[index].answer = .gap(
                                    from: readings[index].after + 1, through: until, unit: "market_sequence",
                                    reason: "not all received by this relay (it was not subscribed to the topic)")
                                continue
                            }
                        }
                        let topic = readings[index].topic
                        guard topic.eventType == event.eventType, topic.isWildcard || topic.ticker == event.ticker else { continue }
                        guard total < limit else {
                            readings[index].answer = .tooMany
                            continue
                        }
                        total += 1
                        readings[index].events.append(
                            MarketEvent(eventType: event.eventType, ticker: event.ticker, bytes: ByteBuffer(bytes: event.bytes), sequence: event.sequence))
                        readings[index].positions.append(EventPosition(topic: event.topicSequence, market: event.sequence))
                    }
                    if event.sequence == until {
                        reached = true
                        break scan
                    }
                }
            }
        }
        for reading in readings {
            answers[reading.topic] =
                reading.answer
                ?? (reached || reading.after >= until
                    ? .events(reading.events, reading.positions)
                    : .gap(from: reading.after + 1, through: until, unit: "market_sequence", reason: "not on the tape yet"))
        }
        return answers
    }

    /// Whether a change to `changed` (a ticker or a wildcard) touches what `topic` receives.
    static func affects(_ changed: Topic, _ topic: Topic) -> Bool {
        changed.eventType == topic.eventType && (changed.isWildcard || topic.isWildcard || changed.ticker == topic.ticker)
    }

    /// Whether `topic` was received: by name, or by its type's wildcard.
    static func isWanted(_ topic: Topic, in wanted: Set<String>) -> Bool {
        wanted.contains(Topic.wildcard(topic.eventType).description) || (!topic.isWildcard && wanted.contains(topic.description))
    }

    private struct Gap: Error {
        let answer: ArchiveAnswer
    }

    /// The market sequence after which a request wants events.
    private func start(of request: ArchiveRequest, in reader: TapeReader, until: UInt64) -> Result<UInt64, Gap> {
        switch request.since {
        case .market(let position):
            return .success(position)
        case .time(let milliseconds):
            let (time, overflow) = milliseconds.multipliedReportingOverflow(by: 1_000_000)
            guard !overflow else { return .failure(Gap(answer: .gap(from: 0, through: 0, unit: "unix_ms", reason: "not a time on the tape"))) }
            for index in reader.firstBlock(atOrAfter: time)..<reader.blocks.count {
                for record in reader.records(inBlock: index) ?? [] {
                    if case .event(let event) = record, event.receivedAt >= time { return .success(event.sequence - 1) }
                }
            }
            return .success(until)
        case .topic(let position):
            let topic = request.topic
            guard !topic.isWildcard else { return .success(position) }
            guard position > 0 else { return .success(0) }
            var index = min(reader.firstBlock(atOrAfterSequence: until), reader.blocks.count - 1)
            var looked = 0
            while index >= 0, looked < Self.topicSearchBlocks {
                let events = (reader.records(inBlock: index) ?? []).compactMap { record -> TapeEvent? in
                    if case .event(let event) = record, event.eventType == topic.eventType, event.ticker == topic.ticker { event } else { nil }
                }
                if let found = events.first(where: { $0.topicSequence == position }) { return .success(found.sequence) }
                if let oldest = events.first, oldest.topicSequence < position {
                    return .failure(Gap(answer: .gap(from: position, through: position, unit: "topic_sequence", reason: "not on the tape")))
                }
                index -= 1
                looked += 1
            }
            return .failure(Gap(answer: .gap(from: 1, through: position, unit: "topic_sequence", reason: "no longer on the tape")))
        }
    }
}

extension TapeReader {
    /// The nearest block at or before `index` that says what was wanted (a `holding` record), at most
    /// two holding intervals before it; `index` itself when none is found.
    public func holdingBlock(atOrBefore index: Int) -> Int {
        guard !blocks.isEmpty else { return 0 }
        let target = min(max(index, 0), blocks.count - 1)
        let floor = blocks[target].header.firstTime - 2 * TapeWriter.holdingInterval
        var start = target
        while start >= 0 {
            if (records(inBlock: start) ?? []).contains(where: { if case .holding = $0 { true } else { false } }) { return start }
            guard start > 0, blocks[start - 1].header.lastTime >= floor else { break }
            start -= 1
        }
        return target
    }
}
