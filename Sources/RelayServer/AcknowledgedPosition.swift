import NIOCore
import MarketCore

/// What frames written to a tagged session complete of its position (``AcknowledgedPosition``): the
/// newest market sequence among their events (0: none), the epoch a notice in them started (`sequence`
/// is then of that epoch), and the replayed events written to the connection in all through them (0:
/// none among them; ``ClientFeed/replayedWritten``).
struct WrittenThrough: Equatable, Sendable {
    var sequence: UInt64 = 0
    var epoch: String?
    var replayed = 0

    static let nothing = WrittenThrough()

    /// Later frames' completion on top of this one's: a new epoch starts the sequence again.
    mutating func follow(with later: WrittenThrough) {
        if let epoch = later.epoch {
            self.epoch = epoch
            sequence = later.sequence
        } else if later.sequence != 0 {
            sequence = later.sequence
        }
        replayed = max(replayed, later.replayed)
    }
}

/// Where a tagged connection's client stands, from what its TCP stack acknowledged: after each write
/// the relay notes how many bytes had gone to the socket and the newest market sequence written, and
/// reads the socket's acknowledged byte count (Linux `TCP_INFO`'s `tcpi_bytes_acked`). When the
/// connection breaks, the client has every event up to the newest write wholly acknowledged
/// ``ResumeSettings/marginBytes`` before the last acknowledged byte.
///
/// A position belongs to an epoch: on a cluster a new leadership term starts the market sequences
/// again, and the connection is told so in its stream (an `epoch` notice). The write that carries the
/// notice starts the positions of the new epoch; until the client has acknowledged it, it stands where
/// it stood in the old one (so a resume then is answered for the old epoch's tail, across the terms,
/// rather than replaying the new one from a position that was never in it). Confined to the
/// connection's loop.
final class AcknowledgedPosition {
    private struct Mark {
        let socketBytes: UInt64
        let sequence: UInt64
        let epoch: String?
        /// The replayed events written through it (``WrittenThrough/replayed``).
        let replayed: Int
    }

    private let marginBytes: UInt64
    /// Told where the client stands each time that advances (a running relay's checkpoint reads it).
    var standing: SessionStanding?
    /// Marks not yet known acknowledged (oldest first), and the newest that is.
    private var marks = CircularBuffer<Mark>(initialCapacity: 2)
    private var acknowledged: UInt64
    private var acknowledgedEpoch: String?
    /// The replayed events written through the newest mark known acknowledged.
    private var acknowledgedReplayed = 0
    /// The epoch of the newest write.
    private var writingEpoch: String?
    private var lastAcknowledgedBytes: UInt64 = 0
    /// Per epoch (the acknowledged one and the one being written, at most), each topic this connection
    /// holds at the market sequence it was added at: nothing of it before was the client's, so a resume
    /// takes it from there when that is past where the session resumes (its history may not be whole
    /// before it). Kept while the connection holds the topic, not only until the client is past it: a
    /// session it took back may make the whole session resume from earlier.
    private var floorsByEpoch: [String: [Topic: UInt64]] = [:]

    /// The floors of the epoch the client stands in.
    var floors: [Topic: UInt64] { floorsByEpoch[epoch ?? ""] ?? [:] }

    /// Topics of a session taken back, added after the connection's first topics, are being replayed
    /// from `resumeAfter` (in `epoch`): their replay is written after events of other topics the
    /// client may have acknowledged past it. Until the client has acknowledged the write that ended
    /// the replay (the one through which `replayedThrough` replayed events were written: the hub had
    /// queued that many by the end of the add), or an event after `through` (the market's position
    /// when the last of them was added: whatever was written after it came after their replay), it
    /// stands no further than `resumeAfter`, so a break during the replay skips none of it. Also across
    /// a change of epoch (`from` is then the broken session's epoch, not `epoch`), for the connection's
    /// first topics too: the replay carries the former term's tail and then this term's events from its
    /// start, so until the client has it whole it stands where its session broke, in the former term (a
    /// break during it resumes across the terms again rather than skip the former term's tail).
    private var replaying: (epoch: String?, from: String?, resumeAfter: UInt64, through: UInt64, replayedThrough: Int)?

    /// - Parameter start: the market sequence before anything this connection will be sent.
    init(start: UInt64, marginBytes: Int) {
        acknowledged = start
        self.marginBytes = UInt64(marginBytes)
    }

    /// Where the client stands before its first topic: the market sequence then (in `epoch`), or where
    /// its broken session resumes. Only the first call counts.
    ///
    /// The hub may deliver as soon as the first topics are added, before the connection is told where
    /// they were added: writes noted before this are of events after `sequence`, in `epoch` (unless one
    /// told of a newer epoch), and stand at least there.
    func start(at sequence: UInt64, epoch: String?) {
        guard !started else { return }
        started = true
        if !marks.isEmpty {
            var lifted = CircularBuffer<Mark>(initialCapacity: marks.count)
            for mark in marks {
                lifted.append(mark.epoch == nil ? Mark(socketBytes: mark.socketBytes, sequence: max(mark.sequence, sequence), epoch: epoch, replayed: mark.replayed) : mark)
            }
            marks = lifted
        }
        if writingEpoch == nil { writingEpoch = epoch }
        if acknowledgedEpoch == nil {
            acknowledged = max(acknowledged, sequence)
            acknowledgedEpoch = epoch
        }
        tell()
    }

    /// Topics were added, each at the market sequence given in `epoch` (the hub's: its notice may not be
    /// written to this connection yet). A topic held already keeps its floor (a subscribe again changes
    /// nothing).
    func added(_ added: some Sequence<(Topic, UInt64)>, epoch: String?) {
        guard started else { return }
        keep(added, in: epoch)
        tell()
    }

    /// Notes floors in `epoch`; a topic with one there keeps it.
    private func keep(_ added: some Sequence<(Topic, UInt64)>, in epoch: String?) {
        let key = epoch ?? ""
        // At most the acknowledged epoch, the one written and the hub's.
        if floorsByEpoch[key] == nil, floorsByEpoch.count >= 3 {
            let kept = [acknowledgedEpoch, writingEpoch, self.epoch].map { $0 ?? "" }
            floorsByEpoch = floorsByEpoch.filter { kept.contains($0.key) }
        }
        var floors = floorsByEpoch[key] ?? [:]
        for (topic, sequence) in added where floors[topic] == nil { floors[topic] = sequence }
        floorsByEpoch[key] = floors
    }

    /// Topics of a session taken back were added with a replay from `resumeAfter` (in `from`: the
    /// session's epoch, `epoch` unless it broke in a former term, where `floors` are its floors) by a
    /// connection that already held others (or from another epoch); the market stood at `through` in
    /// `epoch` after the add, and the hub had queued `replayedThrough` replayed events to the connection
    /// in all (see ``replaying``). A client that still stands in `from` (told of `epoch`, not yet past
    /// the notice) stands no further than `resumeAfter` there.
    func replaying(
        from resumeAfter: UInt64, in from: String?, floors: [(Topic, UInt64)] = [], through: UInt64, epoch: String?, replayedThrough: Int
    ) {
        // A hold across the terms into `epoch` stands: it covers this replay too (below).
        let acrossTerms = replaying.map { $0.epoch == epoch && $0.from != $0.epoch } ?? false
        guard started, acknowledgedReplayed < replayedThrough,
            acrossTerms || (acknowledgedEpoch == epoch ? acknowledged <= through : acknowledgedEpoch == from)
        else { return }
        if from != epoch, !floors.isEmpty { keep(floors, in: from) }
        var hold = (epoch: epoch, from: from, resumeAfter: resumeAfter, through: through, replayedThrough: replayedThrough)
        // One more replay of the same session (a connection takes back one: one `from`), or one in this
        // epoch (a topic subscribed with `since`) while a hold across the terms stands: that hold stays
        // (where the session broke, in the former term), until the client has both replays.
        if let known = replaying, known.epoch == epoch, known.from == from || known.from != known.epoch {
            hold.from = known.from
            hold.through = max(known.through, through)
            hold.replayedThrough = max(known.replayedThrough, replayedThrough)
            hold.resumeAfter = known.from == from ? min(known.resumeAfter, resumeAfter) : known.resumeAfter
        }
        replaying = hold
        tell()
    }

    /// Topics were removed: added again, they start from there.
    func removed(_ topics: some Sequence<Topic>) {
        guard !floorsByEpoch.isEmpty else { return }
        for topic in topics {
            for key in floorsByEpoch.keys { floorsByEpoch[key]?[topic] = nil }
        }
        tell()
    }

    private var started = false

    /// A write went to the socket: `socketBytes` in all so far, its newest event `sequence`; with
    /// `epoch`, the write told the client of a new epoch, and `sequence` (0: none yet) is of that epoch;
    /// `replayed`: the replayed events written in all through it (0: none in it).
    func wrote(socketBytes: UInt64, sequence: UInt64, epoch: String? = nil, replayed: Int = 0, acknowledgedBytes: UInt64?) {
        let newest: UInt64
        if let epoch, epoch != writingEpoch {
            writingEpoch = epoch
            newest = sequence
        } else {
            newest = max(sequence, marks.last?.sequence ?? (acknowledgedEpoch == writingEpoch ? acknowledged : 0))
        }
        marks.append(
            Mark(socketBytes: socketBytes, sequence: newest, epoch: writingEpoch, replayed: max(replayed, marks.last?.replayed ?? acknowledgedReplayed)))
        if let acknowledgedBytes { advance(to: acknowledgedBytes) }
        // Bounded: a client that acknowledges nothing keeps at most this many marks (the oldest merge).
        if marks.count > 4096 { marks.removeFirst(2048) }
    }

    /// What the client's TCP stack acknowledged, read again after the last write (``wrote``).
    func acknowledged(bytes acknowledgedBytes: UInt64) {
        advance(to: acknowledgedBytes)
    }

    /// A write waits for the client's acknowledgement that what was written since can bring: its mark
    /// lies ``ResumeSettings/marginBytes`` or more before the newest write's end (the newest marks
    /// stand only once more is written).
    var awaitsAcknowledgement: Bool {
        guard let oldest = marks.first, let newest = marks.last else { return false }
        return oldest.socketBytes &+ marginBytes <= newest.socketBytes
    }

    private func advance(to acknowledgedBytes: UInt64) {
        let epochBefore = acknowledgedEpoch
        lastAcknowledgedBytes = max(lastAcknowledgedBytes, acknowledgedBytes)
        let safe = lastAcknowledgedBytes > marginBytes ? lastAcknowledgedBytes - marginBytes : 0
        var taken = 0
        for mark in marks {
            guard mark.socketBytes <= safe else { break }
            acknowledged = mark.sequence
            acknowledgedEpoch = mark.epoch
            acknowledgedReplayed = mark.replayed
            taken += 1
        }
        if taken > 0 {
            marks.removeFirst(taken)
            // The replay acknowledged whole (or the client moved past both its epochs: from there it resumes).
            if let known = replaying,
                acknowledgedReplayed >= known.replayedThrough || (acknowledgedEpoch == known.epoch && acknowledged > known.through)
                    || (acknowledgedEpoch != known.epoch && acknowledgedEpoch != known.from)
            {
                replaying = nil
                // The former term's floors say nothing more once the client stands in this one.
                if known.from != known.epoch, known.from != acknowledgedEpoch, known.from != writingEpoch { floorsByEpoch[known.from ?? ""] = nil }
            }
            // Floors of the epoch the client left say nothing more (unless a hold stands there).
            if acknowledgedEpoch != epochBefore, epochBefore != writingEpoch, epochBefore != replaying?.from { floorsByEpoch[epochBefore ?? ""] = nil }
            tell()
        }
    }

    /// The market sequence through which the client has every event of its topics (in ``epoch``).
    var resumeAfter: UInt64 {
        guard let replaying else { return acknowledged }
        if replaying.from == acknowledgedEpoch { return min(acknowledged, replaying.resumeAfter) }
        return replaying.epoch == acknowledgedEpoch ? replaying.resumeAfter : acknowledged
    }

    /// Whether it stands anywhere yet (its first topics were added).
    var isStarted: Bool { started }

    /// The epoch of ``resumeAfter`` (`nil` or empty: not known here; the hub's): a former term's while a
    /// replay across terms is not acknowledged whole.
    var epoch: String? {
        guard let replaying, replaying.epoch == acknowledgedEpoch || replaying.from == acknowledgedEpoch else { return acknowledgedEpoch }
        return replaying.from
    }

    /// Tells ``standing`` where the client stands now.
    private func tell() {
        standing?.acknowledged(resumeAfter, epoch: epoch, floors: floors)
    }
}
