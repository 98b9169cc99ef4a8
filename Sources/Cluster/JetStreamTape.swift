#if canImport(Glibc)
    import Glibc
#endif
import AsyncSupport
import CNats
import Dispatch
import Foundation
import Logging
import MarketCore
import Synchronization
import Tape

/// How a cluster keeps its tape: one JetStream stream per market, in files on the NATS servers, and
/// what the leader records in it.
public struct ClusterTapeSettings: Sendable, Equatable {
    /// Copies of each block on the NATS servers (1, 3 or 5; more than the servers there are is refused).
    public var replicas = 1
    /// Blocks older than this go (JetStream's `max_age`).
    public var maxAge: Duration = .seconds(7 * 86_400)
    /// The stream's bytes at most; the oldest blocks go first (JetStream's `max_bytes`).
    public var maxBytes: Int64 = 20 << 30
    /// The longest a block waits on the leader before it is written (what a failover can lose).
    public var flushInterval: Duration = .milliseconds(500)
    /// The vendor and upstream path recorded with the events (what a replay speaks).
    public var vendor: String?
    public var upstreamPath: String?

    public init() {}
}

/// A market's tape on a cluster: the JetStream stream `<cluster>-tape-<market>`, one message per block
/// (its header and zstd frame, exactly as a day file holds it) on the subject of its epoch,
/// `<cluster>.tape.<market>.<epoch>` (a block holds one epoch's records; a leadership term is an epoch),
/// written by the leader and read by every node.
///
/// A term's blocks are one run of the stream's sequences (the leader writes its last blocks before it
/// lets the lease go), found by the first and last message of its subject; within it, a seek is a binary
/// search over the blocks' headers, each probe one read of a message by its sequence (about 17 for a
/// day of blocks). The stream
/// is made on the first write or read that finds it missing, with file storage, the replicas and the
/// limits of ``ClusterTapeSettings`` (limits retention, old blocks discarded first); a stream that
/// exists is updated to them.
///
/// Every call here waits for NATS: made on the recorder's and the archive's own queues, never on the
/// cooperative pool. `Sendable`: immutable, and ``NATSConnection`` is.
final class JetStreamTape: Sendable {
    let stream: String
    let subject: String
    let settings: ClusterTapeSettings
    /// The node's connection to NATS, once it has one.
    private let connection = Mutex<NATSConnection?>(nil)
    /// How long a write or a read waits for NATS.
    static let wait: Int64 = 2_000

    init(subjects: ClusterSubjects, settings: ClusterTapeSettings) {
        stream = "\(subjects.cluster)-tape-\(subjects.market)"
        subject = "\(subjects.cluster).tape.\(subjects.market).>"
        subjectPrefix = "\(subjects.cluster).tape.\(subjects.market)."
        self.settings = settings
    }

    private let subjectPrefix: String

    /// The subject of an epoch's blocks (an epoch is a token of letters and digits; anything else, or
    /// none, is filed under `none`).
    func subject(of epoch: String?) -> String {
        guard let epoch, !epoch.isEmpty, epoch.utf8.count <= 64, epoch.utf8.allSatisfy({ ClusterSubjects.isPlain($0) }) else {
            return subjectPrefix + "none"
        }
        return subjectPrefix + epoch
    }

    /// The node's connection, once made.
    func use(_ connection: NATSConnection) {
        self.connection.withLock { $0 = connection }
    }

    /// The JetStream context of the connection as it is now.
    func handle() throws(TapeError) -> NATSHandle {
        guard let handle = connection.withLock({ $0 })?.shared.withLock({ $0.connection }), handle.jetStream != nil else {
            throw TapeError("not connected to NATS")
        }
        return handle
    }

    private let made = Atomic<Bool>(false)

    /// A write failed: the stream is made (or updated) again before the next.
    func streamMayBeGone() {
        made.store(false, ordering: .relaxed)
    }

    /// Makes the stream (or updates it to these settings) once per process, and again after NATS said
    /// it has none.
    func ensureStream(_ handle: NATSHandle) throws(TapeError) {
        guard !made.load(ordering: .relaxed), let jetStream = handle.jetStream else { return }
        var config = jsStreamConfig()
        jsStreamConfig_Init(&config)
        config.Storage = js_FileStorage
        config.Retention = js_LimitsPolicy
        config.Discard = js_DiscardOld
        config.Replicas = Int64(max(settings.replicas, 1))
        config.MaxAge = settings.maxAge.nanoseconds
        config.MaxBytes = settings.maxBytes
        config.AllowDirect = true
        let status = NATSConnection.withStream(&config, named: stream, subject: subject) { config in
            var info: UnsafeMutablePointer<jsStreamInfo>?
            var code = jsErrCode(0)
            var status = js_AddStream(&info, jetStream, &config, nil, &code)
            if status != NATS_OK {
                // It exists: its limits follow the settings (replicas may not change this way).
                status = js_UpdateStream(&info, jetStream, &config, nil, &code)
            }
            if let info { jsStreamInfo_Destroy(info) }
            return status
        }
        guard status == NATS_OK else { throw TapeError("the tape stream \(stream) could not be made: \(NATSConnection.lastErrorText(status))") }
        made.store(true, ordering: .relaxed)
    }

    /// The stream's first and last sequence, bytes and oldest block's time (`nil`: no stream, or NATS
    /// did not answer).
    func bounds(_ handle: NATSHandle) -> (first: UInt64, last: UInt64, bytes: UInt64, firstTime: Int64)? {
        guard let jetStream = handle.jetStream else { return nil }
        var info: UnsafeMutablePointer<jsStreamInfo>?
        var code = jsErrCode(0)
        var options = Self.options()
        guard js_GetStreamInfo(&info, jetStream, stream, &options, &code) == NATS_OK, let info else { return nil }
        defer { jsStreamInfo_Destroy(info) }
        let state = info.pointee.State
        return (state.FirstSeq, state.LastSeq, state.Bytes, state.FirstTime)
    }

    /// The stream sequences of the first and last block of `epoch` (`nil`: none, or NATS did not answer).
    func range(of epoch: String, _ handle: NATSHandle) -> (first: UInt64, last: UInt64)? {
        guard let jetStream = handle.jetStream else { return nil }
        let subject = subject(of: epoch)
        var options = Self.options()
        var lastMessage: OpaquePointer?
        var code = jsErrCode(0)
        guard js_GetLastMsg(&lastMessage, jetStream, stream, subject, &options, &code) == NATS_OK, let lastMessage else { return nil }
        let last = natsMsg_GetSequence(lastMessage)
        natsMsg_Destroy(lastMessage)
        var firstMessage: OpaquePointer?
        var direct = jsDirectGetMsgOptions()
        jsDirectGetMsgOptions_Init(&direct)
        direct.Sequence = 1
        let status = subject.withCString { name in
            direct.NextBySubject = name
            return js_DirectGetMsg(&firstMessage, jetStream, stream, &options, &direct)
        }
        guard status == NATS_OK, let firstMessage else { return nil }
        let first = natsMsg_GetSequence(firstMessage)
        natsMsg_Destroy(firstMessage)
        guard first > 0, last >= first else { return nil }
        return (first, last)
    }

    /// What the stream holds: its bytes, and when NATS stored its oldest block (`nil`: NATS did not
    /// answer, or there is no stream yet). One request.
    func held() -> TapeHeld? {
        guard let handle = try? handle(), let bounds = bounds(handle) else { return nil }
        let empty = bounds.first == 0 || bounds.last < bounds.first
        return TapeHeld(bytes: Int64(clamping: bounds.bytes), days: nil, since: empty ? nil : bounds.firstTime, store: "jetstream")
    }

    /// What a read of one block found.
    enum Fetched {
        /// The block, and the subject it was stored on (its epoch's).
        case block([UInt8], subject: String)
        /// No message at that sequence (discarded by the limits, or never there).
        case gone
        /// NATS did not answer: not connected, timed out.
        case failed(String)
    }

    /// The block stored at `sequence`, whole.
    func fetch(_ sequence: UInt64, _ handle: NATSHandle) -> Fetched {
        guard let jetStream = handle.jetStream else { return .failed("not connected to NATS") }
        var message: OpaquePointer?
        var code = jsErrCode(0)
        var options = Self.options()
        let status = js_GetMsg(&message, jetStream, stream, sequence, &options, &code)
        if status == NATS_NOT_FOUND { return .gone }
        guard status == NATS_OK, let message else { return .failed(NATSConnection.lastErrorText(status)) }
        defer { natsMsg_Destroy(message) }
        let length = Int(natsMsg_GetDataLength(message))
        guard length > 0, let data = natsMsg_GetData(message), let subject = natsMsg_GetSubject(message) else { return .gone }
        return .block(Array(UnsafeRawBufferPointer(start: data, count: length)), subject: String(cString: subject))
    }

    /// Options that wait ``wait`` for an answer.
    static func options() -> jsOptions {
        var options = jsOptions()
        jsOptions_Init(&options)
        options.Wait = wait
        return options
    }
}

/// The leader's recorder writes here: each block is published to the stream and waits for JetStream's
/// acknowledgement (stored on its replicas), so a block the recorder counts written is on the cluster.
/// A block not acknowledged throws: the recorder pauses and records the window as a gap, as for a full
/// disk. Not `Sendable`: its recorder's.
final class JetStreamTapeSink: TapeBlockSink {
    private let tape: JetStreamTape

    init(tape: JetStreamTape) {
        self.tape = tape
    }

    func begin(day: String) throws {}

    func write(_ block: [UInt8], epoch: String?) throws {
        let handle = try tape.handle()
        try tape.ensureStream(handle)
        guard let jetStream = handle.jetStream else { throw TapeError("not connected to NATS") }
        var options = jsPubOptions()
        jsPubOptions_Init(&options)
        options.MaxWait = JetStreamTape.wait
        let status = tape.stream.withCString { stream in
            options.ExpectStream = stream
            return block.withUnsafeBytes { bytes in
                var acknowledgement: UnsafeMutablePointer<jsPubAck>?
                var code = jsErrCode(0)
                let status = js_Publish(&acknowledgement, jetStream, tape.subject(of: epoch), bytes.baseAddress, Int32(bytes.count), &options, &code)
                if let acknowledgement { jsPubAck_Destroy(acknowledgement) }
                return status
            }
        }
        guard status == NATS_OK else {
            // The stream may be gone (deleted, or lost with a server): the next write makes it again.
            tape.streamMayBeGone()
            throw TapeError("a block was not stored in the tape stream \(tape.stream): \(NATSConnection.lastErrorText(status))")
        }
    }
}

/// An epoch's blocks in the stream as a reader sees them (``TapeBlocks``): their sequences when opened,
/// each block fetched when first asked for and kept for the read (at most ``kept`` at once).
/// Not `Sendable`: one read.
///
/// A block of another epoch inside the run (a late block of a term that lost its lease while another
/// node led) cannot be had, as a damaged one: a reading across it is a gap. The first NATS failure, or
/// ``readFor`` after opening, ends the read: every block after cannot be had either, so a read never
/// waits on NATS for long (the archive's queue serves one read at a time).
final class JetStreamTapeBlocks: TapeBlocks {
    private let tape: JetStreamTape
    private let handle: NATSHandle
    private let subject: String
    private let first: UInt64
    let blockCount: Int
    private let decoder: TapeBlockDecoder
    private let check: TapeEventCheck
    private var cache: [Int: [UInt8]?] = [:]
    private var order: [Int] = []
    private var failed = false
    private let deadline: ContinuousClock.Instant
    static let kept = 64
    /// The longest one read of the stream goes on.
    static let readFor: Duration = .seconds(10)

    init?(tape: JetStreamTape, epoch: String, check: TapeEventCheck) {
        guard let handle = try? tape.handle(), let range = tape.range(of: epoch, handle), let decoder = try? TapeBlockDecoder(check: check.check) else {
            return nil
        }
        self.tape = tape
        self.check = check
        self.handle = handle
        self.decoder = decoder
        subject = tape.subject(of: epoch)
        first = range.first
        // (A count NATS says, clamped: a read is bounded by its budget of blocks, not by this.)
        blockCount = Int(clamping: range.last - range.first + 1)
        deadline = .now + Self.readFor
    }

    private func bytes(ofBlock index: Int) -> [UInt8]? {
        guard index >= 0, index < blockCount else { return nil }
        if let kept = cache[index] { return kept }
        guard !failed, ContinuousClock.now < deadline else { return nil }
        let found: [UInt8]?
        switch tape.fetch(first + UInt64(index), handle) {
        case .block(let bytes, let subject): found = subject == self.subject ? bytes : nil
        case .gone: found = nil
        case .failed:
            failed = true
            return nil
        }
        if order.count >= Self.kept { cache[order.removeFirst()] = nil }
        cache[index] = found
        order.append(index)
        return found
    }

    func header(ofBlock index: Int) -> TapeBlockHeader? {
        bytes(ofBlock: index)?.withUnsafeBytes { TapeBlockDecoder.header(of: $0) }
    }

    /// The block's records, `nil` (damaged: a gap) when one of its events is not one event of its
    /// topic as a node takes it from NATS: whoever may publish on the tape's subject could write one.
    func records(inBlock index: Int) -> [TapeRecord]? {
        let refusals = decoder.refusals
        let records = bytes(ofBlock: index)?.withUnsafeBytes { decoder.records(of: $0) }
        if records == nil, decoder.refusals > refusals, let reason = decoder.lastRefusal { check.refused(reason) }
        return records
    }
}

/// What a node takes from its cluster's tape: each event checked as the node checks one from NATS
/// (``EventCheck``, in the blocks' decoder), and where a refusal is told. `Sendable`: immutable.
struct TapeEventCheck: Sendable {
    let check: EventCheck
    let metrics: ClusterMetrics
    let logger: Logger

    /// A block was refused for one of its events (`reason`): counted and logged.
    func refused(_ reason: String) {
        metrics.rejected("tape", "a tape block holds an event that does not check: \(reason)", logger: logger)
    }
}

/// Copies a cluster's tape of one market (its JetStream stream) into day files on this machine, where
/// `relay replay`, `relay tape export` and `relay tape ls` read it. Each UTC day the stream holds is
/// written whole to a new file and then renamed over the day's file (a pull again replaces it, never
/// appends twice), under the market's tape lock (a relay recording there is not overwritten).
///
/// This is where the stream's blocks enter a tape's folder, and any NATS publisher may have written
/// one: each block is read whole and each of its events checked as a node checks one from NATS
/// (``EventCheck``, in the protocol of the vendor its day's first block names); a block that does not
/// read or holds an event that does not check is left out. A replay then serves the folder's events as
/// they are.
public enum ClusterTapePull {
    public struct Outcome: Sendable {
        /// The days written, and the blocks copied (blocks NATS no longer had, or sent damaged, are left out).
        public var days: [String] = []
        public var blocks = 0
        public var missing = 0
        /// Blocks left out for an event that did not check, and why the first did not (at most 200 bytes).
        public var refused = 0
        public var firstRefusal: String?
        /// Days kept as they were here: the local file begins earlier than what the stream still holds.
        public var kept: [String] = []

        /// One more block left out, for `why` (kept if it is the first).
        mutating func refuse(_ why: String) {
            refused += 1
            if firstRefusal == nil { firstRefusal = VisibleText.visible(why, limit: 200) }
        }
    }

    /// - Parameter check: what an event must be, for a stream whose `source` record says it was
    ///   recorded from this vendor and upstream path (`nil`: none said so yet).
    public static func pull(
        servers: [String], security: ClusterConfiguration.Security = .init(), cluster: String, market: String, directory: String,
        check: @escaping @Sendable (_ source: (vendor: String, path: String?)?) -> EventCheck, timeout: Duration = .seconds(10), logger: Logger
    ) async throws -> Outcome {
        let subjects = try ClusterSubjects(cluster: cluster, market: market)
        let lock = try TapeLock(directory: directory, market: market)
        let connection = NATSConnection(servers: servers, name: "relay tape pull", security: security, logger: logger)
        if let problem = connection.setupError { throw TapeError("NATS: \(problem)") }
        let deadline = ContinuousClock.now + timeout
        while connection.state != .connected, ContinuousClock.now < deadline, (try? await Task.sleep(for: .milliseconds(50))) != nil {}
        if Task.isCancelled {
            await connection.close()
            throw CancellationError()
        }
        guard connection.state == .connected else {
            await connection.close()
            throw TapeError("NATS at \(connection.displayServers) did not answer in \(timeout)")
        }
        let tape = JetStreamTape(subjects: subjects, settings: ClusterTapeSettings())
        tape.use(connection)
        let copied = await BlockingWork.run(on: DispatchQueue(label: "relay.tape.pull")) {
            Result {
                try withExtendedLifetime(lock) {
                    sweepPartials(directory: directory, market: market)
                    return try copy(tape, market: market, directory: directory, check: check)
                }
            }
        }
        await connection.close()
        return try copied.get()
    }

    /// How a day's blocks are checked: in the protocol its first block named (`named`), or the default
    /// vendor's; `vendorLost`: its first block named the vendor and was refused.
    private struct DayCheck {
        let check: EventCheck
        let named: Bool
        var vendorLost = false

        /// Why a block of the day whose records are `records`, naming `sources` (whose protocols
        /// `protocolOf` names), is refused, or `nil`.
        func problem(
            in records: [TapeRecord], sources: [(vendor: String, path: String?)], protocolOf: ((vendor: String, path: String?)) -> String
        ) -> String? {
            if vendorLost { return "the day's first block, which named its vendor, did not check" }
            // A writer names its source once a day (and once a term): a block naming more is none of a writer's.
            guard sources.count <= 4 else { return "a block naming \(sources.count) sources" }
            for source in sources {
                let other = protocolOf(source)
                if other != check.wire.name { return "a source of the \(other.prefix(32)) protocol in a day of \(check.wire.name)" }
            }
            return check.problem(in: records).map { named ? $0 : "\($0) (checked as \(check.wire.name): its day names no vendor)" }
        }
    }

    /// Removes the day files a pull cut short by a kill left half written (`<day>.tape.pull`), which no
    /// retention counts: under the market's tape lock, which no other pull holds meanwhile.
    static func sweepPartials(directory: String, market: String) {
        let folder = "\(directory)/\(market)"
        for name in (try? FileManager.default.contentsOfDirectory(atPath: folder)) ?? [] {
            let day = String(name.prefix(10))
            let path = "\(folder)/\(name)"
            if TapeFile.isTapeDay(day), path == partialPath(directory: directory, market: market, day: day) { unlink(path) }
        }
    }

    /// How long after a block's first event its leader stores it on NATS at most (it writes every half
    /// second, and drops what it cannot write): ample.
    static let writtenWithin: Int64 = 3_600 * 1_000_000_000
    /// Blocks missing in a row after which a pull stops (a stream lets go of its oldest blocks only).
    static let goneInARowAtMost = 10_000

    /// Where a pull writes `day`'s file before it is renamed over the day's.
    static func partialPath(directory: String, market: String, day: String) -> String {
        TapeStagedDays.partialPath(directory: directory, market: market, day: day, suffix: ".pull")
    }

    private static func copy(
        _ tape: JetStreamTape, market: String, directory: String, check: (_ source: (vendor: String, path: String?)?) -> EventCheck
    ) throws -> Outcome {
        let handle = try tape.handle()
        let decoder = try TapeBlockDecoder()
        // Each day's events are checked in the protocol its file will be replayed in: the one of the vendor
        // its first block names (a leader writes its `source` at each day's start; none: the default
        // vendor's). A block naming a vendor of another protocol is refused (the replay would else
        // serve its events, checked as that protocol's, in the day's); so is every block of a day whose
        // first block named its vendor and was refused (its file would name none).
        var days: [String: DayCheck] = [:]
        guard let bounds = tape.bounds(handle) else { throw TapeError("NATS has no tape stream \(tape.stream) (is this the cluster's name?)") }
        var outcome = Outcome()
        guard bounds.first > 0, bounds.last >= bounds.first else { return outcome }
        // The leader writes each block within seconds of its first event, and NATS stores it then: a
        // block that says it began well before the oldest block NATS stored was not written by a leader
        // (a publisher on the tape's subjects can write one). Refused, or a block naming midnight of a
        // day the stream no longer holds would replace that day's file here with itself.
        let oldest = bounds.firstTime > 0 ? bounds.firstTime - Self.writtenWithin : Int64.min
        var goneInARow = 0
        // Each day's blocks go to its own new file, in stream order, however the days come.
        let staged = TapeStagedDays(directory: directory, market: market, suffix: ".pull")
        for sequence in bounds.first...bounds.last {
            let block: [UInt8]
            switch tape.fetch(sequence, handle) {
            case .block(let bytes, _):
                block = bytes
                goneInARow = 0
            case .gone:
                outcome.missing += 1
                goneInARow += 1
                // The stream's blocks run on from its first (it lets go of the oldest only): this many
                // missing in a row is a last sequence no stream has, not a tape to walk to its end.
                if goneInARow >= Self.goneInARowAtMost {
                    staged.discard()
                    throw TapeError("\(goneInARow) blocks in a row missing from \(tape.stream) after block \(sequence - UInt64(goneInARow)) (it said its last is \(bounds.last)); nothing was replaced")
                }
                continue
            case .failed(let why):
                // A pull cut short replaces nothing.
                staged.discard()
                throw TapeError("NATS stopped answering at block \(sequence) of \(tape.stream): \(why); nothing was replaced")
            }
            guard let header = block.withUnsafeBytes({ TapeBlockDecoder.header(of: $0) }), let records = block.withUnsafeBytes({ decoder.records(of: $0) })
            else {
                outcome.missing += 1
                continue
            }
            guard header.firstTime >= oldest else {
                outcome.refuse("a block that began on \(TapeFile.day(of: header.firstTime)), over an hour before the oldest block NATS stored")
                continue
            }
            let day = TapeFile.day(of: header.firstTime)
            // A block of no day a tape has (a time a writer never gives) is not made a file of its own.
            guard TapeFile.isTapeDay(day) else {
                outcome.missing += 1
                continue
            }
            let named = records.compactMap { record -> (vendor: String, path: String?)? in
                if case .source(let vendor, let path, _) = record { (vendor, path) } else { nil }
            }
            let dayCheck = days[day] ?? DayCheck(check: check(named.first), named: !named.isEmpty)
            if let problem = dayCheck.problem(in: records, sources: named, protocolOf: { check($0).wire.name }) {
                // The day's first block: the day is checked as it said, and its vendor is lost if it named one.
                if days[day] == nil { days[day] = DayCheck(check: dayCheck.check, named: dayCheck.named, vendorLost: dayCheck.named) }
                outcome.refuse(problem)
                continue
            }
            days[day] = dayCheck
            try staged.append(block, day: day, firstTime: header.firstTime)
            outcome.blocks += 1
        }
        // A day here that begins earlier than the stream's (whose oldest blocks its limits let go) holds
        // more than the pull: kept.
        (outcome.days, outcome.kept) = try staged.commit { day, first in
            let path = TapeFile.path(directory: directory, market: market, day: day)
            guard let local = try? TapeReader(path: path), let begins = local.header(ofBlock: 0)?.firstTime else { return false }
            return begins < first
        }
        return outcome
    }
}
