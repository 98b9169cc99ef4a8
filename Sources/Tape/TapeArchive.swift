import AsyncSupport
import Dispatch
import MarketCore
import NIOCore
import Synchronization

/// A market's tape as the hub's archive (``EventArchive``): a resume from a position its memory no
/// longer holds is answered from the tape (the newest day file on a disk, or a cluster's stream), read
/// on a queue of its own (it waits on the disk or the network).
///
/// One pass from the block before the earliest position that says what was wanted: a topic's events
/// are whole from where its client stands (its own event, found on the tape) only if every market
/// sequence after it through its `until` is on the tape, in its epoch, with no loss, stop or hole
/// between, and the topic was received (wanted, by name or by its wildcard) all that time. A `_s`
/// position is found by reading back from `until`. At most ``blocksPerRead`` blocks a read. A disk's
/// tape is read from its newest day file, then one more day back at a time for the positions not
/// found. `Sendable`: each read opens the blocks anew.
public final class TapeArchive: EventArchive {
    public let market: String
    /// The blocks of an epoch as they are now (a disk's newest day file holds every epoch's; `nil`:
    /// no tape to read), given the blocks this read opened over one day fewer.
    private let open: @Sendable (_ epoch: String, _ days: Int, _ fewer: (any TapeBlocks)?) -> (any TapeBlocks)?
    private let queue: DispatchQueue
    /// What each event given must be (``EventCheck``): checked as it is taken for an answer, not as its
    /// block is decoded (a read decodes far more events than it gives).
    private let check: EventCheck?

    /// The day files of `market`'s tape under `directory`: the newest first, and one day further back
    /// at a time while a client's position is not found (within the read's budget). An event that does
    /// not pass `check` ends its topic's answer as a gap.
    public convenience init(directory: String, market: String, check: EventCheck) {
        self.init(market: market, check: check) { _, days, fewer in
            let files = TapeFile.days(directory: directory, market: market)
            guard files.count >= days else { return nil }
            let paths = files.suffix(days).map(\.path)
            // One more day: its file's index is read, the newer days' kept (each file scanned once a read).
            if let fewer = fewer as? TapeDays, fewer.paths == Array(paths.dropFirst()) { return try? TapeDays(paths[0], before: fewer) }
            return try? TapeDays(paths: paths)
        }
    }

    /// The blocks `open` gives for the epoch asked and the number of newest days (1, then more while
    /// a position is not found; `nil`: no more), opened again for each read; it is given what it gave
    /// for one day fewer in the same read.
    public init(
        market: String, check: EventCheck? = nil, open: @escaping @Sendable (_ epoch: String, _ days: Int, _ fewer: (any TapeBlocks)?) -> (any TapeBlocks)?
    ) {
        self.market = market
        self.check = check
        self.open = open
        queue = DispatchQueue(label: "relay.tape.archive.\(market)")
    }

    public func reading(_ requests: [ArchiveRequest], epoch: String, limit: Int) async -> (answers: [Topic: ArchiveAnswer], cost: Double) {
        // Reads wait in line (one at a time: the disk is one): past a few waiting, a resume is told
        // at once rather than wait behind them (a storm of resumes never queues without bound).
        guard waiting.add(1, ordering: .relaxed).newValue <= Self.readsWaiting else {
            waiting.subtract(1, ordering: .relaxed)
            return (ArchiveAnswer.notRead(requests, because: "the tape is busy with other resumes"), 0)
        }
        return await BlockingWork.run(on: queue) {
            defer { self.waiting.subtract(1, ordering: .relaxed) }
            var budget = Self.blocksPerRead
            let answers = self.read(requests, epoch: epoch, limit: limit, budget: &budget)
            return (answers, Double(Self.blocksPerRead - max(budget, 0)) / Double(Self.blocksPerRead))
        }
    }

    /// Reads of this market's tape in line at once, at most.
    public static let readsWaiting = 8
    private let waiting = Atomic<Int>(0)

    /// The most blocks one read decodes (256 KB of records each, a larger one counting as its size in
    /// them: about 2 GB), its searches included: a resume asking for more is a gap, so no client makes a
    /// read unbounded.
    public static let blocksPerRead = 8192

    /// Where a topic's read stands.
    private struct Reading {
        let topic: Topic
        /// Its topic's description and its type's wildcard's, as a tape's wanted records name them.
        private let name: String
        private let wildcard: String
        /// The market sequence after which it wants events, and through which.
        let after: UInt64
        let until: UInt64
        /// The last market sequence seen since `after` (`nil`: `after` not reached yet).
        var last: UInt64?
        var events: [MarketEvent] = []
        var positions: [EventPosition] = []
        var answer: ArchiveAnswer?
        /// Asked through the end of its epoch (``ArchiveRequest/epochEnd``).
        var throughEnd: Bool { until == ArchiveRequest.epochEnd }
        /// For a reading through the end: the time (UTC ns) of a loss, hole or stop seen since its last
        /// event (the epoch's end, unless an event of the epoch follows).
        var ending: Int64?

        init(topic: Topic, after: UInt64, until: UInt64) {
            self.topic = topic
            self.after = after
            self.until = until
            name = topic.description
            wildcard = Topic.wildcard(topic.eventType).description
        }

        /// Whether its topic is received while `wanted` is: by name, or by its type's wildcard.
        func isReceived(in wanted: Set<String>) -> Bool {
            wanted.contains(wildcard) || (!topic.isWildcard && wanted.contains(name))
        }

        func gap(_ reason: String) -> ArchiveAnswer {
            .gap(from: after &+ 1, through: throughEnd ? after &+ 1 : until, unit: "market_sequence", reason: reason)
        }

        /// Whole through the epoch's end, which the archive's record of it reached at `time` (UTC ns).
        func ended(at time: Int64) -> ArchiveAnswer { .throughEnd(events, positions, endedAt: time / 1_000_000) }
    }

    /// The reasons of a position not found: a read reaching one day further back may find it.
    static let notFound = "not on the tape (its position was not found)"
    static let noLongerOnTape = "no longer on the tape"

    func read(_ requests: [ArchiveRequest], epoch: String, limit: Int, budget: inout Int) -> [Topic: ArchiveAnswer] {
        var answers: [Topic: ArchiveAnswer] = [:]
        var asked = requests
        var days = 1
        var fewer: (any TapeBlocks)?
        // The newest day first; the requests whose position it does not hold, again over one more day.
        while !asked.isEmpty, budget > 0, let reader = open(epoch, days, fewer) {
            fewer = reader
            let found = read(asked, in: reader, epoch: epoch, limit: limit, budget: &budget)
            answers.merge(found) { _, new in new }
            asked = asked.filter { request in
                guard case .gap(_, _, _, let reason) = found[request.topic] else { return false }
                return reason == Self.notFound || reason == Self.noLongerOnTape
            }
            days += 1
        }
        for request in requests where answers[request.topic] == nil {
            answers[request.topic] = .gap(from: 0, through: 0, unit: "market_sequence", reason: "not on the tape")
        }
        return answers
    }

    private func read(_ requests: [ArchiveRequest], in reader: some TapeBlocks, epoch: String, limit: Int, budget: inout Int) -> [Topic: ArchiveAnswer] {
        var answers: [Topic: ArchiveAnswer] = [:]
        var readings: [Reading] = []
        for request in requests where answers[request.topic] == nil && !readings.contains(where: { $0.topic == request.topic }) {
            switch start(of: request, in: reader, epoch: epoch, budget: &budget) {
            case .success(let after): readings.append(Reading(topic: request.topic, after: after, until: request.until))
            case .failure(let gap): answers[request.topic] = gap.answer
            }
        }
        guard let earliest = readings.map(\.after).min() else { return answers }
        var first = reader.firstBlock(atOrAfterSequence: max(earliest, 1))
        if first >= reader.blockCount {
            // Past every event: from the last block that has any (blocks of marks only after it), so a
            // reading through the epoch's end sees where its record ends.
            first = reader.blockCount - 1
            while first > 0, budget > 0, reader.header(ofBlock: first).map({ $0.lastSequence == 0 }) ?? true {
                budget -= 1
                first -= 1
            }
        }
        // The walk back to the wanted set is charged as the read's blocks are.
        var walked = 0
        let from = reader.holdingBlock(atOrBefore: first, decoded: &walked)
        budget -= walked
        let end = scan(&readings, in: reader, from: from, epoch: epoch, limit: limit, budget: &budget)
        for index in readings.indices where readings[index].throughEnd && readings[index].answer == nil {
            // The archive's record of the epoch ends here: whole through it, or (the client stood past
            // it: its last events were never recorded) nothing more to give.
            guard let end, end.sequence > 0, readings[index].last != nil || readings[index].after >= end.sequence else { continue }
            readings[index].answer = readings[index].ended(at: end.time)
        }
        for reading in readings {
            answers[reading.topic] =
                reading.answer
                ?? (reading.last.map { $0 >= reading.until } == true || reading.after >= reading.until
                    ? .events(reading.events, reading.positions)
                    : reading.gap(reading.last == nil ? Self.notFound : "not all on the tape yet"))
        }
        return answers
    }

    /// One pass from `first`: each reading starts at its own event (`after`), then takes every market
    /// sequence in turn (a hole, a loss, a stop, another epoch, a damaged block or its topic not received
    /// makes it a gap) until its `until` (``Pass``).
    /// Returns where the epoch's record ended (its last record's time and last market sequence) when
    /// the pass reached the end (another epoch, or the last block); `nil` when it stopped before.
    @discardableResult
    private func scan(
        _ readings: inout [Reading], in reader: some TapeBlocks, from first: Int, epoch: String, limit: Int, budget: inout Int
    ) -> (time: Int64, sequence: UInt64)? {
        // What was received is known from a holding record (a day file's first block without one began
        // its run: nothing).
        var pass = Pass(readings: readings, known: first == 0, limit: limit, check: check)
        defer { readings = pass.finished() }
        var ours = false
        // The time of the epoch's last record seen.
        var lastTime: Int64 = 0
        for index in first..<reader.blockCount {
            guard pass.readings.contains(where: { $0.answer == nil }) else { return nil }
            guard budget > 0 else {
                pass.answerOpen { $0.gap("too far back to read at once") }
                return nil
            }
            budget -= reader.readCost(ofBlock: index)
            guard let records = reader.records(inBlock: index) else {
                pass.breakUnderWay("a damaged block of the tape")
                continue
            }
            for record in records {
                switch record {
                case .epoch(let name, let at):
                    if ours, name != epoch {
                        // A former epoch's record ends where another begins.
                        if pass.readings.contains(where: \.throughEnd) { return (lastTime, pass.lastSeen) }
                        pass.breakUnderWay("another epoch on the tape")
                    }
                    ours = name == epoch
                    if ours { lastTime = max(lastTime, at) }
                case .holding(let topics, _):
                    guard ours else { continue }
                    pass.holding(Set(topics))
                case .wanted(let name, let isWanted, _):
                    guard ours else { continue }
                    // A topic that stops being received, even for a moment, may have missed events.
                    pass.wanted(name, isWanted)
                case .interrupted, .gap, .stopped:
                    guard ours else { continue }
                    lastTime = max(lastTime, record.time)
                    pass.lost(at: record.time, stopped: { if case .stopped = record { true } else { false } }())
                case .source:
                    continue
                case .event(let event):
                    guard ours, event.isPositioned else { continue }
                    lastTime = max(lastTime, event.receivedAt)
                    pass.take(event)
                }
            }
        }
        return (lastTime, pass.lastSeen)
    }

    /// One pass's readings, which of them are under way (their own event seen), and how an event finds
    /// the few it concerns: every reading under way has seen the same market sequences (the pass's
    /// ``lastSeen``), so a hole is found once, and an event of one topic is looked up by its topic.
    /// An event costs the readings of its topic, not a look at every reading: a resume of a thousand
    /// topics over millions of events costs about what one topic's does.
    private struct Pass {
        var readings: [Reading]
        /// The topics received (their descriptions), and whether that is known yet.
        private var wanted = Set<String>()
        private var known: Bool
        private let limit: Int
        private let check: EventCheck?
        /// Events taken for every answer together.
        private var total = 0
        /// The last market sequence of the epoch seen, and whether a loss, a hole or a stop came since:
        /// each takes a number of its own that no event has (a client may stand at it).
        private(set) var lastSeen: UInt64 = 0
        private var skipped = false
        /// Readings not under way yet, by the market sequence after which they want events.
        private var waiting: [UInt64: [Int]] = [:]
        /// Readings under way (some answered since: passed over), and by topic (a wildcard's under it).
        private var underWay: [Int] = []
        private var byTopic: [Topic: [Int]] = [:]
        /// The smallest `until` of the readings under way (past it, one is whole).
        private var nextUntil = UInt64.max
        /// Readings under way whose topic was not received when they started: a gap at the next event.
        private var unreceived: [Int] = []
        /// Whether a reading under way has an ``Reading/ending``.
        private var ending = false

        init(readings: [Reading], known: Bool, limit: Int, check: EventCheck?) {
            self.readings = readings
            self.known = known
            self.limit = limit
            self.check = check
            for index in readings.indices where readings[index].answer == nil && readings[index].last == nil {
                waiting[readings[index].after, default: []].append(index)
            }
        }

        static let lost = "the upstream was lost or the relay was down meanwhile"
        static let notReceived = "not received all the time (nobody held it for a while)"
        static let notSubscribed = "not all received by this relay (it was not subscribed to the topic)"

        /// The readings, each under way with the last market sequence seen.
        func finished() -> [Reading] {
            var readings = readings
            for index in underWay where readings[index].answer == nil { readings[index].last = lastSeen }
            return readings
        }

        /// Answers every open reading with `answer`.
        mutating func answerOpen(_ answer: (Reading) -> ArchiveAnswer) {
            for index in readings.indices where readings[index].answer == nil { readings[index].answer = answer(readings[index]) }
        }

        /// Ends every reading under way as a gap for `reason`, but those `stillReceived` and (with
        /// `sparingThroughEnd`) those through the epoch's end.
        mutating func breakUnderWay(_ reason: String, unless stillReceived: ((Reading) -> Bool)? = nil, sparingThroughEnd: Bool = false) {
            var open: [Int] = []
            for index in underWay where readings[index].answer == nil {
                if stillReceived?(readings[index]) == true || (sparingThroughEnd && readings[index].throughEnd) {
                    open.append(index)
                } else {
                    readings[index].answer = readings[index].gap(reason)
                }
            }
            // The answered are passed over from now on.
            underWay = open
        }

        /// What is received is now `wanted` (a holding record).
        mutating func holding(_ wanted: Set<String>) {
            self.wanted = wanted
            known = true
            recheck()
        }

        /// A topic (its description) is received from now on, or no longer.
        mutating func wanted(_ name: String, _ isWanted: Bool) {
            if isWanted { wanted.insert(name) } else { wanted.remove(name) }
            recheck()
        }

        /// A reading under way whose topic is not received now ends as a gap.
        private mutating func recheck() {
            let wanted = self.wanted
            breakUnderWay(Self.notReceived, unless: { $0.isReceived(in: wanted) })
            // The rest are received, once what is received is known.
            if known { unreceived.removeAll() }
        }

        /// A loss, hole or stop at `time`: readings under way end as a gap, but those through the end,
        /// whose record may end here (a gap when an event of the epoch follows).
        mutating func lost(at time: Int64, stopped: Bool) {
            skipped = true
            for index in underWay where readings[index].throughEnd && readings[index].answer == nil && readings[index].ending == nil {
                readings[index].ending = time
                ending = true
            }
            breakUnderWay(Self.lost, sparingThroughEnd: true)
            // The next run starts receiving nothing (its wanted records follow).
            if stopped { (wanted, known) = ([], true) }
        }

        /// The epoch's next positioned event.
        mutating func take(_ event: TapeEvent) {
            defer { (lastSeen, skipped) = (event.sequence, false) }
            // The epoch went on after a loss: a reading through its end missed what the loss took.
            if ending {
                for index in underWay where readings[index].ending != nil && readings[index].answer == nil {
                    readings[index].answer = readings[index].gap(Self.lost)
                }
                ending = false
            }
            if !underWay.isEmpty { advance(to: event) }
            start(at: event)
        }

        /// The readings under way meet `event`: a hole ends them all, a reading past its `until` is
        /// whole, one not received is a gap, and the event is kept by the readings of its topic.
        private mutating func advance(to event: TapeEvent) {
            guard event.sequence == lastSeen &+ 1 else {
                breakUnderWay("not all on the tape (market sequences \(lastSeen &+ 1)…\(event.sequence &- 1) are not)")
                (underWay, byTopic, unreceived, nextUntil) = ([], [:], [], .max)
                return
            }
            if event.sequence > nextUntil {
                // Every number through its `until` was on the tape: whole.
                var kept: [Int] = []
                nextUntil = .max
                for index in underWay where readings[index].answer == nil {
                    if readings[index].until < event.sequence {
                        readings[index].answer = .events(readings[index].events, readings[index].positions)
                    } else {
                        kept.append(index)
                        nextUntil = min(nextUntil, readings[index].until)
                    }
                }
                underWay = kept
            }
            for index in unreceived where readings[index].answer == nil {
                readings[index].answer = readings[index].gap(Self.notSubscribed)
            }
            unreceived.removeAll()
            // Its topic's reading and its type's wildcard's (one each at most: a read asks for a topic
            // once), in the order they were asked, as the limit of events goes to the first.
            var concerned = byTopic[Topic(checkedEventType: event.eventType, ticker: event.ticker)] ?? []
            let wildcardTopic = Topic.wildcard(event.eventType)
            // (A derived bar is no wildcard's: ``Topic/matches(eventType:ticker:)``.)
            if event.ticker != Topic.wildcardTicker, wildcardTopic.matches(eventType: event.eventType, ticker: event.ticker), let wildcard = byTopic[wildcardTopic] {
                concerned = (concerned + wildcard).sorted()
            }
            for index in concerned where readings[index].answer == nil { keep(event, in: index) }
        }

        /// Readings that start at `event`: at their own event (the reading starts after it), or at the
        /// epoch's first event or the first after the number a loss or a restart took, where the client
        /// stood (taken like any other).
        private mutating func start(at event: TapeEvent) {
            if let own = waiting.removeValue(forKey: event.sequence) {
                for index in own where readings[index].answer == nil {
                    if !begin(index) { unreceived.append(index) }
                }
            }
            let before = event.sequence &- 1
            guard let next = waiting[before], before == 0 || (skipped && lastSeen < before) else { return }
            waiting[before] = nil
            for index in next where readings[index].answer == nil {
                let received = begin(index)
                if readings[index].until < event.sequence {
                    readings[index].answer = .events([], [])
                } else if !received {
                    readings[index].answer = readings[index].gap(Self.notSubscribed)
                } else if readings[index].topic.matches(eventType: event.eventType, ticker: event.ticker) {
                    keep(event, in: index)
                }
            }
        }

        /// A reading is under way; whether its topic is received now.
        private mutating func begin(_ index: Int) -> Bool {
            readings[index].last = readings[index].after
            underWay.append(index)
            byTopic[readings[index].topic, default: []].append(index)
            nextUntil = min(nextUntil, readings[index].until)
            return known && readings[index].isReceived(in: wanted)
        }

        /// Keeps `event` in a reading's answer.
        private mutating func keep(_ event: TapeEvent, in index: Int) {
            guard total < limit else {
                readings[index].answer = .tooMany
                return
            }
            if let check, check.problem(of: event) != nil {
                readings[index].answer = readings[index].gap("an event on the tape that the relay would not take from its upstream")
                return
            }
            total += 1
            // Its own bytes: a slice would keep its whole block (256 KiB) for as long as the answer is
            // gathered, for every block a sparse topic has an event in.
            readings[index].events.append(event.marketEvent.compacted())
            readings[index].positions.append(event.position)
        }
    }

    private struct Gap: Error {
        let answer: ArchiveAnswer
    }

    /// The market sequence after which a request wants events: its own, the last event of its epoch
    /// before its time, or (a `_s`) its event's, found by reading back from its `until`.
    private func start(of request: ArchiveRequest, in reader: some TapeBlocks, epoch: String, budget: inout Int) -> Result<UInt64, Gap> {
        switch request.since {
        case .market(let position):
            // A position the relay never gives (past ``EventPosition/maxSequence``) is on no tape.
            guard position <= EventPosition.maxSequence else {
                return .failure(Gap(answer: .gap(from: 0, through: 0, unit: "market_sequence", reason: "not a position on the tape")))
            }
            return .success(position)
        case .time(let milliseconds):
            let (time, overflow) = milliseconds.multipliedReportingOverflow(by: 1_000_000)
            guard !overflow else { return .failure(Gap(answer: .gap(from: 0, through: 0, unit: "unix_ms", reason: "not a time on the tape"))) }
            var index = reader.firstBlock(atOrAfter: time)
            while index < reader.blockCount, budget > 0 {
                budget -= reader.readCost(ofBlock: index)
                for event in Self.events(inBlock: index, of: reader, epoch: epoch) where event.receivedAt >= time { return .success(event.sequence - 1) }
                index += 1
            }
            return .success(request.until)
        case .topic(let position):
            let topic = request.topic
            guard !topic.isWildcard else { return .success(position) }
            guard position > 0 else { return .success(0) }
            var index = min(reader.firstBlock(atOrAfterSequence: request.until), reader.blockCount - 1)
            while index >= 0, budget > 0 {
                budget -= reader.readCost(ofBlock: index)
                let events = Self.events(inBlock: index, of: reader, epoch: epoch).filter { $0.eventType == topic.eventType && $0.ticker == topic.ticker }
                if let found = events.first(where: { $0.topicSequence == position }) { return .success(found.sequence) }
                if let oldest = events.first, oldest.topicSequence < position {
                    return .failure(Gap(answer: .gap(from: position, through: position, unit: "topic_sequence", reason: "not on the tape")))
                }
                index -= 1
            }
            return .failure(Gap(answer: .gap(from: 1, through: position, unit: "topic_sequence", reason: Self.noLongerOnTape)))
        }
    }

    /// A block's events of `epoch` that have positions (a block begins with its epoch).
    private static func events(inBlock index: Int, of reader: some TapeBlocks, epoch: String) -> [TapeEvent] {
        var ours = false
        var events: [TapeEvent] = []
        for record in reader.records(inBlock: index) ?? [] {
            switch record {
            case .epoch(let name, _): ours = name == epoch
            case .event(let event) where ours && event.isPositioned: events.append(event)
            default: continue
            }
        }
        return events
    }
}

extension TapeEvent {
    /// As the hub takes it (its own bytes, type, symbol and market sequence), and its positions.
    var marketEvent: MarketEvent {
        MarketEvent(eventType: eventType, ticker: ticker, bytes: bytes, sequence: sequence)
    }

    var position: EventPosition { EventPosition(topic: topicSequence, market: sequence) }

    /// It has a market sequence the relay could have given (1 through ``EventPosition/maxSequence``): a
    /// tape's event past it (a damaged or crafted block) is read as one without a position.
    var isPositioned: Bool { (1...EventPosition.maxSequence).contains(sequence) }
}

extension TapeBlocks {
    /// What decoding block `index` costs, in blocks of 256 KB of records (the writer's: a whole block
    /// holds 256 KB to 512 KB; a header may claim up to 64 MB, a block of zeros that compresses to almost
    /// nothing).
    func readCost(ofBlock index: Int) -> Int {
        header(ofBlock: index).map { max(1, Int(max($0.uncompressedLength, $0.compressedLength) >> 18)) } ?? 1
    }

    /// The nearest block at or before `index` that says what was wanted (a `holding` record), at most
    /// two holding intervals and ``mostBlocksBack`` blocks (of 256 KB of records: ``readCost(ofBlock:)``)
    /// before it; `index` itself when none is found.
    public func holdingBlock(atOrBefore index: Int) -> Int {
        var decoded = 0
        return holdingBlock(atOrBefore: index, decoded: &decoded)
    }

    /// ``holdingBlock(atOrBefore:)``, adding the blocks it decoded to `decoded`.
    public func holdingBlock(atOrBefore index: Int, decoded: inout Int) -> Int {
        guard blockCount > 0 else { return 0 }
        let target = min(max(index, 0), blockCount - 1)
        // (A header's time is read from a file: a time near the first Int64 holds goes back no further.)
        guard let floor = header(ofBlock: target).map({ $0.firstTime.subtractingReportingOverflow(2 * TapeWriter.holdingInterval) })
        else { return target }
        var start = target
        var cost = 0
        while start >= 0, cost < TapeWriter.mostBlocksBack {
            let blockCost = readCost(ofBlock: start)
            cost += blockCost
            decoded += blockCost
            if (records(inBlock: start) ?? []).contains(where: { if case .holding = $0 { true } else { false } }) { return start }
            guard start > 0, !floor.overflow, let before = header(ofBlock: start - 1), before.lastTime >= floor.partialValue else { break }
            start -= 1
        }
        return target
    }
}
