#if canImport(Glibc)
    import Glibc
#endif
import Dispatch
import Logging
import MarketCore
import Metrics
import Synchronization

/// Records one market's events on its tape, off the delivery path: the hub hands each published batch
/// to ``take(_:)`` (an ``EventTap``), which queues it and returns; a serial dispatch queue of the
/// recorder's own (not the Swift concurrency pool, since it blocks on the disk) wakes when a block's
/// worth waits or when the flush interval passes, gathers the records into blocks (``TapeWriter``) and
/// writes them, so a crash loses at most the records of the last interval.
///
/// Never slows or loses delivery: the queue is bounded in bytes (what waits, plus one batch being
/// written); past the bound, batches are not queued but counted, and the hole is recorded as a gap
/// with its window. A disk that fails (full, gone) pauses recording: what arrives meanwhile is dropped
/// and counted, a retry comes every few seconds, and when writing works again the window it missed
/// is recorded as a gap. Either way the hub never waits.
///
/// A market's tape in a directory has one recorder at a time (``TapeLock``): a second one is refused.
public final class TapeRecorder: EventTap {
    public struct Settings: Sendable {
        /// The tape's directory (each market in a folder of its own).
        public var directory: String
        /// The market's folder name.
        public var market: String
        /// A block's records before compression.
        public var blockBytes = 256 << 10
        /// The longest a record waits in memory before its block is written (what a crash can lose).
        public var flushInterval: Duration = .milliseconds(500)
        /// Bytes of events that may wait for the recorder; past it, batches are counted and dropped.
        public var queueBytes = 64 << 20
        /// How long recording stays paused after a write failed before it tries again.
        public var retryInterval: Duration = .seconds(5)
        /// Days kept (today's included); older day files are deleted, oldest first.
        public var retentionDays = 7
        /// Bytes this market's tape may hold; past them the oldest days go (never today's), and a block
        /// that would take today's file past them is not written (recording pauses until the next day).
        public var retentionBytes: Int64 = 20 << 30
        /// The vendor whose upstream the events come from (its ``WireVendor/name``), and the upstream's
        /// path when known: recorded on the tape, so a replay speaks the same protocol (`nil`: not told).
        public var vendor: String?
        public var upstreamPath: String?
        /// Where a pause and the recording going on again are told.
        public var logger = Logger(label: "relay.tape")

        public init(directory: String, market: String) {
            self.directory = directory
            self.market = market
        }
    }

    public let settings: Settings
    /// Held while the recorder lives: no other recorder writes this market's tape in this directory
    /// (`nil`: the blocks go elsewhere, a cluster's stream, whose writer is the lease's holder).
    private let lock: TapeLock?
    private struct Waiting {
        var batches: [Batch] = []
        var bytes = 0
        /// A drain is scheduled or running.
        var draining = false
        /// Batches not queued (the bound), as one window of wall-clock time, to record as a gap.
        var hole: (from: Int64, to: Int64)?
        var pausedBecause: String?
        /// A pause was logged, and its end not yet.
        var toldPaused = false
        /// Wanted-set marks since the last batch, coalesced (``WantedMarkRun``): not counted in
        /// `bytes`, which bound events only, so churn of the wanted set never pushes events off the tape.
        var run: WantedMarkRun?

        /// The run of marks goes into the batches, before whatever comes next.
        mutating func closeRun() {
            guard let closed = run else { return }
            run = nil
            let marks = closed.records()
            if !marks.isEmpty { batches.append(Batch(epoch: closed.epoch, marks: marks)) }
        }
    }

    private let waiting = Mutex(Waiting())
    private let writing: Mutex<Writing>
    private let work: DispatchQueue
    private let eventsRecorded = Atomic<Int>(0)
    private let blocksWritten = Atomic<Int>(0)
    private let bytesWritten = Atomic<Int>(0)
    private let eventsDropped = Atomic<Int>(0)
    private let metrics: Metrics

    private struct Metrics {
        let events: Counter
        let bytes: Counter
        let blocks: Counter
        let dropped: Counter
        let pauses: Counter
        let heldBytes: Gauge
        let heldDays: Gauge
        let heldSince: Gauge

        init(factory: any MetricsFactory) {
            events = Counter(label: "relay_tape_events_recorded_total", factory: factory)
            bytes = Counter(label: "relay_tape_bytes_written_total", factory: factory)
            blocks = Counter(label: "relay_tape_blocks_written_total", factory: factory)
            dropped = Counter(label: "relay_tape_events_dropped_total", factory: factory)
            pauses = Counter(label: "relay_tape_pauses_total", factory: factory)
            heldBytes = Gauge(label: "relay_tape_held_bytes", factory: factory)
            heldDays = Gauge(label: "relay_tape_held_days", factory: factory)
            heldSince = Gauge(label: "relay_tape_held_since_seconds", factory: factory)
        }
    }

    /// - Parameter metricsFactory: where its counters go (the relay's labels them with the market).
    public convenience init(settings: Settings, metricsFactory: any MetricsFactory = NOOPMetricsHandler.instance) throws {
        let (directory, market) = (settings.directory, settings.market)
        try self.init(
            settings: settings, lock: TapeLock(directory: directory, market: market), sink: TapeDayFiles(directory: directory, market: market, maxDayBytes: settings.retentionBytes),
            held: { TapeDayFiles.held(directory: directory, market: market) }, metricsFactory: metricsFactory)
    }

    /// A recorder whose blocks go to `sink` (a cluster's JetStream stream), not to day files: no lock,
    /// no position reservation or stop mark, no retention of its own (the sink's limits are), and
    /// `settings.directory` is not used. `held` says what the sink holds (asked once a minute, off the
    /// writer's lock).
    public convenience init(
        settings: Settings, sink: sending any TapeBlockSink, held: @escaping @Sendable () -> TapeHeld?,
        metricsFactory: any MetricsFactory = NOOPMetricsHandler.instance
    ) throws {
        try self.init(settings: settings, lock: nil, sink: sink, held: held, metricsFactory: metricsFactory)
    }

    private init(
        settings: Settings, lock: TapeLock?, sink: sending any TapeBlockSink, held: @escaping @Sendable () -> TapeHeld?, metricsFactory: any MetricsFactory
    ) throws {
        self.settings = settings
        self.lock = lock
        probe = held
        writing = Mutex(
            Writing(writer: try TapeWriter(sink: sink, blockBytes: settings.blockBytes), source: settings.vendor.map { ($0, settings.upstreamPath) }))
        work = DispatchQueue(label: "relay.tape.\(settings.market)")
        metrics = Metrics(factory: metricsFactory)
        scheduleFlush()
    }

    /// Whether the tape is day files in ``Settings/directory`` (a reservation, a stop mark and
    /// retention are this recorder's to keep).
    private var isLocal: Bool { lock != nil }

    /// The next flush, one interval from now, while the recorder lives.
    private func scheduleFlush() {
        work.asyncAfter(deadline: .now() + .milliseconds(Int(max(settings.flushInterval.milliseconds, 1)))) { [weak self] in
            guard let self else { return }
            self.writeAll(flushing: true)
            self.pruneIfDue()
            self.scheduleFlush()
        }
    }

    /// What the recorder has done, as `/healthz` shows it.
    public var report: TapeReport {
        var report = TapeReport(
            eventsRecorded: eventsRecorded.load(ordering: .relaxed), eventsDropped: eventsDropped.load(ordering: .relaxed),
            blocksWritten: blocksWritten.load(ordering: .relaxed), bytesWritten: bytesWritten.load(ordering: .relaxed),
            pausedBecause: waiting.withLock { $0.pausedBecause })
        if let held = held.withLock({ $0 }) {
            report.store = held.store
            report.heldBytes = held.bytes
            report.heldDays = held.days
            report.heldSince = held.since.map { $0 / 1_000_000 }
        }
        return report
    }

    /// What the tape held when last looked at (once a minute, with retention), and how to look.
    private let held = Mutex<TapeHeld?>(nil)
    private let probe: @Sendable () -> TapeHeld?

    /// The epoch and market sequence reserved on disk so far (``PositionReservation``), when a failed
    /// write may be tried again, and whether a stop mark may be beside the tape (the last run's, until
    /// this one gives its first position; this one's, once it stopped).
    private struct Reserved {
        var position: (epoch: String, through: UInt64)?
        var retryAt: ContinuousClock.Instant?
        var stopMarked = true
    }

    private let reserved = Mutex(Reserved())

    public func take(_ events: [MarketEvent], positions: [EventPosition]?, epoch: String?) {
        if let epoch, let newest = positions?.last?.market ?? events.last?.sequence { reserve(through: newest, epoch: epoch) }
        var size = 0
        for event in events { size += event.bytes.readableBytes + 64 }
        queue(Batch(events: events, positions: positions, epoch: epoch), size: size)
    }

    /// Queued as a run of marks with no events between them, coalesced (``WantedMarkRun``), and never
    /// dropped: the tape's wanted set must stay true, or a reader would take a topic let go for one
    /// received. Bounded by the topics changed within a flush interval.
    public func wantedChanged(_ changes: [(topic: Topic, wanted: Bool)], epoch: String?) {
        guard !changes.isEmpty else { return }
        if !isLocal, let epoch, ended.withLock({ $0 == epoch }) { return }
        let now = WallClock.nowNanoseconds()
        waiting.withLock { waiting in
            if let run = waiting.run, run.epoch != epoch { waiting.closeRun() }
            if waiting.run == nil { waiting.run = WantedMarkRun(epoch: epoch) }
            for change in changes { waiting.run?.add(change.topic.description, wanted: change.wanted, at: now) }
        }
    }

    /// A run of `epoch` (a cluster leader's term) is over: everything queued for it is written now, and
    /// nothing of it after (a late mark, a gap of a pause): the next term's blocks, another node's
    /// perhaps, come after its last. Its readers take what follows its last record as not received.
    /// Waits for the sink.
    public func end(epoch: String) {
        ended.withLock { $0 = epoch }
        work.sync {
            writeAll(flushing: true)
            writing.withLock { $0.endEpoch(epoch) }
            waiting.withLock { $0.pausedBecause = nil }
        }
    }

    /// The epoch that ended last (``end(epoch:)``): what comes for it later is not written.
    private let ended = Mutex<String?>(nil)

    /// A new run of `epoch` (a cluster leader's term) begins, receiving `holding`: written first in
    /// the epoch, so a reader of its first block knows what was received.
    public func begin(epoch: String?, holding: [String]) {
        queue(Batch(epoch: epoch, marks: [.holding(holding.sorted(), at: WallClock.nowNanoseconds())]), size: 64 + 32 * holding.count)
    }

    public func interrupted(epoch: String?) {
        queue(Batch(epoch: epoch, marks: [.interrupted(at: WallClock.nowNanoseconds())]), size: 64)
    }

    /// Before the hub delivers a position past what is reserved, the next reservation is on disk (on
    /// the hub's executor, about once per ``PositionReservation/step`` events: one small write and a rename).
    private func reserve(through newest: UInt64, epoch: String) {
        guard isLocal else { return }
        reserved.withLock { reserved in
            if reserved.stopMarked {
                // A position given after a stop: that stop no longer says everything is on the tape.
                unlink(PositionReservation.stopMark(directory: settings.directory, market: settings.market))
                reserved.stopMarked = false
            }
            guard reserved.position.map({ $0.epoch != epoch || newest > $0.through }) ?? true else { return }
            if let retryAt = reserved.retryAt, ContinuousClock.now < retryAt { return }
            let through = min(newest, PositionReservation.largest) + PositionReservation.step
            // Not written: no file is left (a start after a crash begins a new epoch); tried again in 5 s.
            if PositionReservation.write(directory: settings.directory, market: settings.market, epoch: epoch, through: through) {
                reserved.position = (epoch, through)
                reserved.retryAt = nil
            } else {
                reserved.position = nil
                reserved.retryAt = .now + .seconds(5)
            }
        }
    }

    /// Queues a batch of `size` bytes for the writer, or counts it dropped (its hole a gap to record).
    private func queue(_ batch: Batch, size: Int) {
        // What comes for an epoch already ended (a mark queued as its term closed) is not the tape's.
        // (Only a stream's recorder ends epochs: a disk's takes no lock for it on the hub's path.)
        if !isLocal, let epoch = batch.epoch, ended.withLock({ $0 == epoch }) { return }
        let events = batch.events
        enum Taken { case queued, queuedFirst, dropped }
        let taken = waiting.withLock { waiting -> Taken in
            // What was wanted and lost is never dropped for the bound (a few bytes each): the tape's
            // wanted set must stay true, or a reader would take a topic let go for one received.
            let marksOnly = batch.events.isEmpty && !batch.marks.isEmpty
            // Wanted marks before this batch go first, as they came.
            if marksOnly || waiting.bytes + size <= settings.queueBytes && waiting.pausedBecause == nil { waiting.closeRun() }
            guard marksOnly || (waiting.bytes + size <= settings.queueBytes && waiting.pausedBecause == nil) else {
                let now = WallClock.nowNanoseconds()
                waiting.hole = (waiting.hole?.from ?? now, now)
                return .dropped
            }
            waiting.batches.append(batch)
            waiting.bytes += size
            // The writer wakes for a block's worth (or at the flush interval), not for every batch:
            // at 1,000 batches a second that was 1,000 thread wake-ups.
            if waiting.draining || waiting.bytes < settings.blockBytes { return .queued }
            waiting.draining = true
            return .queuedFirst
        }
        switch taken {
        case .queued: break
        case .queuedFirst: work.async { self.writeAll(flushing: false) }
        case .dropped: dropped(events.count)
        }
    }

    private func dropped(_ count: Int) {
        eventsDropped.add(count, ordering: .relaxed)
        metrics.dropped.increment(by: count)
    }

    /// Writes everything recorded so far (the flush interval's job; also at shutdown). Waits for the disk.
    public func flush() {
        work.sync { writeAll(flushing: true) }
    }

    /// The relay stops: everything queued is written, then, when every position the hub gave is on the
    /// tape (nothing was dropped since the recorder began, the disk is not failing), a `stopped` record
    /// and its mark beside the tape (``PositionReservation/stopMark(directory:market:)``): the next start
    /// goes on in the same epoch with numbers going on by one (``TapeTail``). Otherwise it goes on past
    /// the reservation. A position given after the stop removes the mark.
    public func stop() {
        guard isLocal else {
            flush()
            return
        }
        let epoch = reserved.withLock { $0.position?.epoch }
        work.sync {
            writeAll(flushing: false)
            guard eventsDropped.load(ordering: .relaxed) == 0, waiting.withLock({ $0.pausedBecause == nil }) else { return }
            write([Batch(marks: [.stopped(at: WallClock.nowNanoseconds())])], hole: nil, flush: true)
        }
        guard let epoch, eventsDropped.load(ordering: .relaxed) == 0, waiting.withLock({ $0.pausedBecause == nil }) else { return }
        if PositionReservation.replace(PositionReservation.stopMark(directory: settings.directory, market: settings.market), with: "\(epoch)\n") {
            reserved.withLock { $0.stopMarked = true }
        }
    }

    /// Records `record` in order with the batches (a restart's down window, as a gap).
    public func note(_ record: TapeRecord) {
        queue(Batch(marks: [record]), size: 64)
    }

    /// When retention was last applied.
    private let prunedAt = Mutex<ContinuousClock.Instant?>(nil)

    /// Once a minute, on `work`: the oldest days past the retention go (a disk's tape), then what the
    /// tape holds is looked at.
    private func pruneIfDue() {
        // Every minute; a disk's every second while it holds nothing yet (so "held since" shows soon).
        let empty = isLocal && held.withLock { $0?.since == nil }
        let due = prunedAt.withLock { last in
            guard last.map({ ContinuousClock.now - $0 >= .seconds(empty ? 1 : 60) }) ?? true else { return false }
            last = .now
            return true
        }
        guard due else { return }
        if isLocal {
            TapeFile.prune(
                directory: settings.directory, market: settings.market, today: TapeFile.day(of: WallClock.nowNanoseconds()),
                keepDays: max(settings.retentionDays, 1), maxBytes: settings.retentionBytes)
        }
        let now = probe()
        held.withLock { $0 = now }
        guard let now else { return }
        metrics.heldBytes.record(now.bytes)
        if let days = now.days { metrics.heldDays.record(days) }
        if let since = now.since { metrics.heldSince.record(Double(since) / 1e9) }
    }

    /// On `work`: takes what waits and writes it, until nothing waits.
    private func writeAll(flushing: Bool) {
        while true {
            let taken = waiting.withLock { waiting -> (batches: [Batch], hole: (from: Int64, to: Int64)?)? in
                waiting.closeRun()
                guard !waiting.batches.isEmpty || waiting.hole != nil else {
                    waiting.draining = false
                    return nil
                }
                defer {
                    waiting.batches = []
                    waiting.bytes = 0
                    waiting.hole = nil
                }
                return (waiting.batches, waiting.hole)
            }
            guard let taken else { break }
            write(taken.batches, hole: taken.hole)
        }
        if flushing { write([], hole: nil, flush: true) }
    }

    private func write(_ batches: [Batch], hole: (from: Int64, to: Int64)?, flush: Bool = false) {
        let outcome = writing.withLock { $0.write(batches, hole: hole, flush: flush, retryAfter: settings.retryInterval) }
        eventsRecorded.add(outcome.events, ordering: .relaxed)
        metrics.events.increment(by: outcome.events)
        if outcome.dropped > 0 { dropped(outcome.dropped) }
        if outcome.blocks > 0 {
            blocksWritten.add(outcome.blocks, ordering: .relaxed)
            bytesWritten.add(outcome.bytes, ordering: .relaxed)
            metrics.blocks.increment(by: outcome.blocks)
            metrics.bytes.increment(by: outcome.bytes)
        }
        if outcome.paused { metrics.pauses.increment() }
        // Told once a pause, and once it goes on: when a block is stored again (a retry's records are
        // taken before their block is written, and the write may fail again).
        let told = waiting.withLock { waiting -> (paused: Bool, goesOn: Bool) in
            waiting.pausedBecause = outcome.pausedBecause
            if outcome.pausedBecause != nil, !waiting.toldPaused {
                waiting.toldPaused = true
                return (true, false)
            }
            if outcome.pausedBecause == nil, outcome.blocks > 0, waiting.toldPaused {
                waiting.toldPaused = false
                return (false, true)
            }
            return (false, false)
        }
        if told.paused, let reason = outcome.pausedBecause {
            settings.logger.warning("recording the \(settings.market) tape paused; events are dropped and counted until it goes on: \(reason)")
        } else if told.goesOn {
            settings.logger.notice("recording the \(settings.market) tape goes on; the window it missed is on the tape as a gap")
        }
    }
}

/// A batch the hub published, its events' positions (`nil`: each event's own market sequence), and the
/// epoch they count in; or what the hub told between batches (its wanted set's changes, a lost upstream),
/// as the records to write.
private struct Batch {
    var events: [MarketEvent] = []
    var positions: [EventPosition]?
    var epoch: String?
    var marks: [TapeRecord] = []
}

/// The recorder's side that touches the disk: its writer, and whether writing is paused. Only the
/// recorder's dispatch queue uses it (behind a `Mutex`, so it is `Sendable` without a promise).
private struct Writing {
    let writer: TapeWriter
    /// The vendor and upstream path to record, once, before the first events.
    let source: (vendor: String, path: String?)?
    /// Recording stopped at this wall-clock time because of `reason`; tried again after `retryAt`.
    var paused: (since: Int64, reason: String, retryAt: ContinuousClock.Instant)?
    /// The epoch last ended (``TapeRecorder/end(epoch:)``): a gap is never written under it.
    var endedEpoch: String?

    /// `epoch`'s run is over: a pause or hole of it is not written (its readers take what follows its
    /// last record as not received).
    mutating func endEpoch(_ epoch: String) {
        endedEpoch = epoch
        paused = nil
    }

    struct Outcome {
        var events = 0
        var dropped = 0
        var blocks = 0
        var bytes = 0
        var paused = false
        var pausedBecause: String?
    }

    mutating func write(_ batches: [Batch], hole: (from: Int64, to: Int64)?, flush: Bool, retryAfter: Duration) -> Outcome {
        var outcome = Outcome()
        let count = batches.reduce(0) { $0 + $1.events.count }
        let now = WallClock.nowNanoseconds()
        if let paused {
            guard ContinuousClock.now >= paused.retryAt else {
                outcome.dropped = count
                outcome.pausedBecause = paused.reason
                // Not written, but what is wanted is still followed: the tape's next snapshot of it is true.
                for batch in batches { for mark in batch.marks { writer.follow(mark) } }
                // A hole that began before the pause widens the window the resumed recording tells.
                if let hole, hole.from < paused.since { self.paused?.since = hole.from }
                return outcome
            }
        }
        let before = (writer.blocksWritten, writer.bytesWritten, writer.eventsWritten, writer.eventsLost)
        let wasPaused = paused
        var appended = 0
        do {
            // The window recording missed (paused, or batches past the queue's bound), as one gap, in
            // the epoch of what is written next (never under an epoch whose blocks another writer may
            // have followed since).
            let missed = [paused.map { ($0.since, now) }, hole].compactMap { $0 }
            var gap: TapeRecord?
            if let from = missed.map(\.0).min(), let to = missed.map(\.1).max() { gap = .gap(from: from, to: to) }
            if gap != nil, batches.isEmpty, endedEpoch != nil, writer.epoch == endedEpoch {
                // Nothing to write it with: it waits for the next batch.
                outcome.pausedBecause = paused?.reason
                if let hole { self.paused = (min(paused?.since ?? hole.from, hole.from), paused?.reason ?? "events were not recorded", paused?.retryAt ?? .now) }
                return outcome
            }
            if batches.isEmpty, let gap { try writer.append(gap) }
            self.paused = nil
            // Receive times are monotonic; the tape keeps wall-clock time.
            let offset = now - Int64(MonotonicClock.nanoseconds())
            for (number, batch) in batches.enumerated() {
                if let epoch = batch.epoch, epoch != writer.epoch { try writer.append(.epoch(epoch, at: now)) }
                if number == 0, let gap { try writer.append(gap) }
                if let source, writer.source == nil { try writer.append(.source(vendor: source.vendor, path: source.path, at: now)) }
                for mark in batch.marks { try writer.append(mark) }
                for (index, event) in batch.events.enumerated() {
                    let receivedAt = event.receivedAt == 0 ? now : Int64(event.receivedAt) + offset
                    let position = batch.positions?[index]
                    try event.bytes.withUnsafeReadableBytes { bytes in
                        try writer.appendEvent(
                            receivedAt: receivedAt, sequence: position?.market ?? event.sequence, topicSequence: position?.topic ?? 0,
                            eventType: event.eventType, ticker: event.ticker, bytes: bytes)
                    }
                    appended += 1
                }
            }
            if flush { try writer.flush() }
        } catch {
            // What the batches said is wanted is still followed (applied again in order: the same end).
            for batch in batches { for mark in batch.marks { writer.follow(mark) } }
            // Paused since the first failure (a retry that fails keeps the window's start), or since the
            // first record of a block lost, or of a hole taken with this batch, if earlier.
            outcome.paused = wasPaused == nil
            let since = [wasPaused?.since, writer.takeLostFrom(), hole?.from, now].compactMap { $0 }.min() ?? now
            // A day's file at the tape's bound takes nothing more that day: tried again after its end.
            let retryAt = ContinuousClock.now + ((error as? TapeDayFull).flatMap { Self.untilTheDayAfter($0.day, now: now) } ?? retryAfter)
            self.paused = (since, "\(error)", retryAt)
            outcome.pausedBecause = "\(error)"
        }
        // Recorded: events in blocks on disk; dropped: those never appended, and those of a block lost.
        outcome.events = writer.eventsWritten - before.2
        outcome.dropped = (count - appended) + (writer.eventsLost - before.3)
        outcome.blocks = writer.blocksWritten - before.0
        outcome.bytes = Int(writer.bytesWritten - before.1)
        return outcome
    }

    /// From `now` (UTC ns) to a second past the end of the UTC day `day` (`nil`: it has ended, or is
    /// not a day).
    static func untilTheDayAfter(_ day: String, now: Int64) -> Duration? {
        guard let midnight = TapeFile.midnight(of: day) else { return nil }
        let end = midnight + 86_400_000_000_000
        return end > now ? .nanoseconds(end - now) + .seconds(1) : nil
    }
}
