import AsyncSupport
import Logging
import MarketCore
import Metrics
import MarketDataHub
import NIOCore
import ServiceLifecycle
import Synchronization
import Tape

/// What to replay of one market: a recorded UTC day, a window of it, how fast, and whether again.
/// Value type, `Sendable`.
public struct ReplayPlan: Sendable, Equatable {
    /// How fast the recorded time passes.
    public enum Speed: Sendable, Equatable, CustomStringConvertible {
        /// The recorded spacing divided by this (1: as it happened).
        case times(Double)
        /// As fast as the slowest reader takes it, starting once there is a reader.
        case max

        /// `1`, `10`, `0.5` (0.001 to 1,000,000) or `max`; `nil` for anything else.
        public init?(_ text: String) {
            if text.lowercased() == "max" {
                self = .max
                return
            }
            guard let factor = Double(text.hasSuffix("x") ? String(text.dropLast()) : text), factor.isFinite, factor >= 0.001, factor <= 1_000_000
            else { return nil }
            self = .times(factor)
        }

        public var description: String {
            switch self {
            case .max: "max"
            case .times(let factor): factor == factor.rounded() ? "\(Int(factor))x" : "\(factor)x"
            }
        }
    }

    /// The tape's directory, and the market's folder in it.
    public var directory: String
    public var market: String
    /// The UTC day, `yyyy-mm-dd`.
    public var day: String
    /// The window, as UTC nanoseconds of receive time (`nil`: the day's start, its end).
    public var from: Int64?
    public var to: Int64?
    public var speed: Speed
    /// Start again at the end (an off-hours test stream).
    public var loop: Bool

    public init(directory: String, market: String, day: String, from: Int64? = nil, to: Int64? = nil, speed: Speed = .times(1), loop: Bool = false) {
        self.directory = directory
        self.market = market
        self.day = day
        self.from = from
        self.to = to
        self.speed = speed
        self.loop = loop
    }

    /// The day file it reads.
    public var path: String { TapeFile.path(directory: directory, market: market, day: day) }

    /// A time of `day` (`HH:MM` or `HH:MM:SS`, UTC) as UTC nanoseconds; `nil` when either does not read.
    public static func time(_ clock: String, on day: String) -> Int64? {
        guard let seconds = TapeFile.seconds(ofClock: clock), let midnight = TapeFile.midnight(of: day) else { return nil }
        return midnight + Int64(seconds) * 1_000_000_000
    }
}

/// A recorded day of a market replayed as its source (``MarketSource``): the tape's events go into the
/// hub through the same inbox a live upstream's do, in their recorded order and with their recorded
/// bytes (so the vendor's own time fields are the recorded ones), and each client's subscription
/// filters them as it would live ones. Subscribers are told what is replayed: a `replay` notice at the
/// start (the day, the window, the speed) and at the end.
///
/// At a finite speed the recorded spacing is kept, scaled. At `max` the replay waits for its first
/// reader, then goes as fast as its slowest reader takes events: it hands a batch over only while every
/// subscriber's unread events, with the batches on their way, stay under the fill at which it would be
/// warned of as falling behind, so none is ever dropped. A gap in the tape (the relay was down, or recording
/// paused) is told as the upstream being away for that window. A block that does not check (its frame,
/// or its records against its header) is skipped and counted. Its events are served as they were
/// recorded, not parsed again: what is in the tape's folder was checked on its way in (the recorder
/// takes what its upstream let through; `relay tape pull` checks each event of the cluster's stream),
/// and the folder is as trusted as its writers (docs/tape.md).
///
/// `Sendable`; a `Service`.
public final class TapeSource: MarketSource {
    private let plan: ReplayPlan
    private let hub: MarketDataHub
    private let interest: LocalInterest
    private let logger: Logger
    private let inbox: SourceInbox
    private let progress = Mutex(Progress())

    private struct Progress {
        var state = "waiting"
        var events = 0
        var passes = 0
        var skippedBlocks = 0
        var lastError: String?
        var lastEventAt: ContinuousClock.Instant?
    }

    /// Events handed to the hub at a time (at most).
    static let batchSize = 256
    /// Room kept at `max` for the notices a pass sends unpaced (its start, a gap's two, its end).
    static let noticeRoom = 8

    /// Passes begun, and events handed to the hub (`relay_tape_replays_total`, `relay_tape_replay_events_total`).
    private let passesStarted: Counter
    private let eventsReplayed: Counter

    public init(
        plan: ReplayPlan, hub: MarketDataHub, interest: LocalInterest, logger: Logger,
        metricsFactory: any MetricsFactory = NOOPMetricsHandler.instance
    ) {
        passesStarted = Counter(label: "relay_tape_replays_total", factory: metricsFactory)
        eventsReplayed = Counter(label: "relay_tape_replay_events_total", factory: metricsFactory)
        self.plan = plan
        self.hub = hub
        self.interest = interest
        self.logger = logger
        inbox = SourceInbox.source(capacity: 65_536)
    }

    public func run() async throws {
        let hub = self.hub
        let inbox = self.inbox
        await withTaskGroup(of: Void.self) { group in
            group.addTask { await HubPump.run(inbox, into: hub, lossReason: "the relay fell behind the replay") }
            group.addTask {
                await cancelWhenGracefulShutdown { await self.replay() }
                inbox.finish()
            }
            // After the last pass the source idles (its clients stay) until the relay stops.
            group.addTask { try? await gracefulShutdown() }
            await group.waitForAll()
        }
    }

    public func report() async -> FeedReport {
        let progress = progress.withLock { $0 }
        let upstream = UpstreamReport(
            state: progress.state, detail: description, url: "tape:\(plan.path)",
            lastMessageAgeMs: progress.lastEventAt.map { (ContinuousClock.now - $0).milliseconds }, messagesReceived: progress.events,
            eventsReceived: progress.events, malformedMessages: progress.skippedBlocks, lastError: progress.lastError)
        return FeedReport(healthy: progress.lastError == nil, upstream: upstream)
    }

    /// `stocks 2026-11-20 09:30:00–10:00:00 at 10x`.
    private var description: String {
        let window = plan.from == nil && plan.to == nil ? "" : " \(Self.clock(plan.from) ?? "00:00:00")–\(Self.clock(plan.to) ?? "24:00:00")"
        return "\(plan.market) \(plan.day)\(window) at \(plan.speed)\(plan.loop ? ", looping" : "")"
    }

    private static func clock(_ nanoseconds: Int64?) -> String? { nanoseconds.map(TapeFile.clock(of:)) }

    private func note(_ change: (inout Progress) -> Void) { progress.withLock { change(&$0) } }

    /// Every pass over the day (one, or until stopped with `loop`).
    private func replay() async {
        repeat {
            if plan.speed == .max {
                note { $0.state = "waiting for a reader" }
                await firstReader()
            }
            guard !Task.isCancelled else { return }
            let replayed: Int
            do {
                replayed = try await pass()
            } catch is CancellationError {
                return
            } catch {
                logger.error("the replay stopped: \(error)")
                note {
                    $0.state = "failed"
                    $0.lastError = "\(error)"
                }
                // Its clients are told, not left in silence.
                _ = await inbox.push(
                    .notice(
                        Notice(
                            .replay, message: "the replay of \(description) stopped: \(error)",
                            details: ["state": .text("failed"), "market": .text(plan.market), "day": .text(plan.day)])),
                    waitingBelow: inbox.capacity)
                return
            }
            note { $0.passes += 1 }
            // A window with no events would loop without pause: one pass says so, and the replay ends.
            if replayed == 0, plan.loop {
                logger.warning("the replay's window holds no events: it does not loop", metadata: ["replay": "\(description)"])
                break
            }
        } while plan.loop && !Task.isCancelled
        note { $0.state = "ended" }
    }

    /// Returns once some subscriber holds a topic of this market.
    private func firstReader() async {
        let (stream, continuation) = AsyncStream.makeStream(of: Void.self, bufferingPolicy: .bufferingNewest(1))
        interest.listen { topics in if !topics.isEmpty { continuation.yield() } }
        for await _ in stream { break }
        interest.listen { _ in }
        continuation.finish()
    }

    /// One pass over the day's window: the start notice, the events at their pace, the end notice.
    /// Returns how many events it replayed.
    ///
    /// The tape is read a little ahead on a task of its own (``readAhead(_:into:)``): a
    /// block's decompression and decoding no longer stop the hand-over of the events before it.
    private func pass() async throws -> Int {
        // Within the file's own day: an event recorded far from it (a clock set wrong, a file written by
        // hand) would else hold the pace for as long as its distance says.
        let day = TapeFile.midnight(of: plan.day).map { $0...($0 + 86_400 * 1_000_000_000) } ?? Int64.min...Int64.max
        let (from, through) = (max(plan.from ?? .min, day.lowerBound), min(plan.to ?? .max, day.upperBound))
        let path = plan.path
        let window = try await BlockingWork.run { () throws in
            TapeWindow(try TapeReader(path: path).records(from: from, through: through))
        }
        note { $0.state = "replaying" }
        passesStarted.increment()
        var details: [String: Notice.Value] = [
            "state": .text("started"), "market": .text(plan.market), "day": .text(plan.day), "speed": .text(plan.speed.description),
        ]
        if let from = Self.clock(plan.from) { details["from"] = .text(from) }
        if let to = Self.clock(plan.to) { details["to"] = .text(to) }
        _ = await inbox.push(.notice(Notice(.replay, message: "replaying \(description): recorded events, not live", details: details)), waitingBelow: inbox.capacity)
        let chunks = BoundedInbox<[TapeRecord], Int>(capacity: Self.chunksAhead, emptyLoss: 0, weight: { _ in 1 }, noteDrop: { lost, _ in lost += 1 })
        var progress = PassProgress(pace: Pace(speed: plan.speed))
        let skipped = await withTaskGroup(of: [Int].self) { group in
            group.addTask { await Self.readAhead(window, into: chunks) }
            await chunks.drain { items in
                for case .element(let chunk) in items where !Task.isCancelled {
                    await replay(chunk, &progress)
                }
            }
            // The drain ends when the reading ahead finished, or when cancelled (then perhaps while the
            // reading ahead waits for room): it is let go either way.
            chunks.finish()
            return await group.next() ?? []
        }
        try Task.checkCancellation()
        if !skipped.isEmpty {
            note { $0.skippedBlocks = skipped.count }
            logger.warning(
                "damaged blocks of the tape were skipped", metadata: ["path": "\(plan.path)", "blocks": "\(skipped.prefix(20))", "count": "\(skipped.count)"])
        }
        let replayed = progress.replayed + (await hand(&progress.batch))
        _ = await inbox.push(
            .notice(
                Notice(
                    .replay, message: "the replay of \(description) ended (\(replayed) events)\(plan.loop ? "; it starts again" : "")",
                    details: ["state": .text("ended"), "market": .text(plan.market), "day": .text(plan.day), "events": .number(Int64(replayed))])),
            waitingBelow: inbox.capacity)
        return replayed
    }

    /// Records read ahead at a time, and how many such chunks may wait (the one being replayed included).
    static let chunkSize = 1024
    static let chunksAhead = 3
    /// The bytes of decoded blocks past its first block's after which a chunk ends (with the block it
    /// was reading: at most one more), however few records it has (1,024 events of 1,024 blocks of
    /// 64 MB each would else be held at once).
    static let chunkBytes = 8 << 20

    /// Reads the window's events and gaps (what a replay hands on) into `chunks`, a chunk at a time,
    /// until the window ends or `chunks` is finished; returns the blocks it skipped (damaged). The
    /// reading (the disk, decompression) runs on threads made for blocking, not the cooperative pool
    /// that hands the events over.
    private static func readAhead(_ window: TapeWindow, into chunks: BoundedInbox<[TapeRecord], Int>) async -> [Int] {
        while !Task.isCancelled {
            let chunk = await BlockingWork.run {
                window.records.withLock { window in
                    var chunk: [TapeRecord] = []
                    chunk.reserveCapacity(chunkSize)
                    var first: Int?
                    while chunk.count < chunkSize, let record = window.next() {
                        switch record {
                        case .event, .gap: chunk.append(record)
                        default: break
                        }
                        if let first, window.decodedBytes - first > chunkBytes, !chunk.isEmpty { break }
                        if first == nil { first = window.decodedBytes }
                    }
                    return chunk
                }
            }
            guard !chunk.isEmpty, await chunks.push(chunk, waitingBelow: chunksAhead) else { break }
        }
        chunks.finish()
        return window.records.withLock { $0.skippedBlocks }
    }

    /// What a pass carries from one chunk of records to the next.
    private struct PassProgress {
        var pace: Pace
        var batch: [MarketEvent] = []
        /// When the batch began (its events' receive time, for the relay's latency figures).
        var batchBegan: UInt64 = 0
        var replayed = 0
    }

    /// Replays a chunk of records: events at their pace, gaps told. Returns early when cancelled.
    private func replay(_ chunk: [TapeRecord], _ progress: inout PassProgress) async {
        let paced = plan.speed != .max
        for record in chunk {
            switch record {
            case .event(let event):
                if paced, let wait = progress.pace.wait(until: event.receivedAt), wait > .milliseconds(1) {
                    progress.replayed += await hand(&progress.batch)
                    try? await Task.sleep(for: wait)
                }
                // Received when its batch began (one clock read and one look at cancellation a batch).
                if progress.batch.isEmpty {
                    if Task.isCancelled { return }
                    progress.batchBegan = MonotonicClock.nanoseconds()
                }
                progress.batch.append(MarketEvent(eventType: event.eventType, ticker: event.ticker, bytes: event.bytes, receivedAt: progress.batchBegan))
                if progress.batch.count >= Self.batchSize { progress.replayed += await hand(&progress.batch) }
            case .gap(let start, let end):
                // What the relay did not receive then, told as its upstream being away for that window.
                progress.replayed += await hand(&progress.batch)
                // Values read from a file: never trap on them.
                let seconds = max(Double(end) - Double(start), 0) / 1e9
                _ = await inbox.push(
                    .connectionLost(reason: "the tape has a gap here: nothing was recorded for \(Int(min(seconds, 1e9).rounded())) s"),
                    waitingBelow: inbox.capacity)
            default:
                continue
            }
        }
    }

    /// Hands what was gathered to the hub, in order; at `max`, first waits while a reader is behind.
    /// Returns how many.
    private func hand(_ batch: inout [MarketEvent]) async -> Int {
        guard !batch.isEmpty else { return 0 }
        let count = batch.count
        if plan.speed == .max {
            // Paced by the slowest reader: what anyone has unread, the batch still on its way to the hub
            // (the push below waits for the one before it), this one and a few notices of the tape's own
            // stay under the fill at which a reader is warned of as falling behind (80% of its buffer),
            // so it is never dropped or warned of.
            // Looked at again after 100 µs, then twice as long each time up to 5 ms: a reader that keeps
            // up is followed closely, one that stopped costs at most 200 looks a second.
            var pause = Duration.microseconds(100)
            while await hub.leastRoom < 2 * Self.batchSize + Self.noticeRoom, !Task.isCancelled {
                try? await Task.sleep(for: pause)
                pause = min(pause * 2, .milliseconds(5))
            }
            _ = await inbox.push(.events(batch), waitingBelow: Self.batchSize)
        } else {
            _ = await inbox.push(.events(batch), waitingBelow: inbox.capacity / 2)
        }
        batch.removeAll(keepingCapacity: true)
        note {
            $0.events += count
            eventsReplayed.increment(by: count)
            $0.lastEventAt = .now
        }
        return count
    }
}

/// A window of a tape, read by one task at a time (the task reading ahead of a replay). `Sendable`
/// through its lock.
private final class TapeWindow: Sendable {
    let records: Mutex<TapeReader.Window>

    init(_ records: sending TapeReader.Window) { self.records = Mutex(records) }
}

/// When each recorded event is due: the first one now, each later one its recorded distance after it,
/// divided by the speed. Value type.
struct Pace {
    let speed: ReplayPlan.Speed
    private var origin: (recorded: Int64, at: ContinuousClock.Instant)?

    init(speed: ReplayPlan.Speed) { self.speed = speed }

    /// How long until the event recorded at `time` is due (`nil`: now, or at `max`).
    mutating func wait(until time: Int64) -> Duration? {
        guard case .times(let factor) = speed else { return nil }
        guard let origin else {
            self.origin = (time, .now)
            return nil
        }
        // Values read from a file, and any speed: computed in floating point and capped at a day.
        let scaled = min(max(Double(time) - Double(origin.recorded), 0) / factor, 86_400e9)
        let due = origin.at + .nanoseconds(Int64(scaled))
        let now = ContinuousClock.now
        return due > now ? due - now : nil
    }
}
