import CoreMetrics
import MarketDataHub
import NIOCore
import MarketCore
import Synchronization

/// How tagged sessions (`KEY#tag`) are kept for a reconnect. Value type, `Sendable`.
public struct ResumeSettings: Sendable, Equatable {
    /// How long a broken session is kept.
    public var window: Duration = .seconds(60)
    /// Bytes before the last one the client's TCP stack acknowledged that it gets again: what a proxy
    /// between, or its own receive buffer, may have taken and not passed on when the connection broke.
    public var marginBytes: Int = 65_536
    /// Broken sessions kept at once per market; past it the oldest go first.
    public var sessions: Int = 10_000
    /// How long a connection taken over (closed with 4000) has to answer its close: its client is gone,
    /// or has moved on to the connection that took over, whose first subscribe waits for its session.
    public var takenOverAnswer: Duration = .milliseconds(250)
    /// How long a reconnect's first subscribe waits for the session of a connection it took over that
    /// is still closing; past it, the subscribe goes on without it (its topics subscribed live, those
    /// the old connection held told `gap`), and the session joins this connection's when it closes. (A
    /// reconnect that took back a session at sign-in while the old connection was still open does not
    /// wait: the old one's other topics are told `gap` as they are subscribed; its session, kept later,
    /// is replaced by the reconnect's when it closes, unless it has subscribed all of its own.)
    public var takeOverWait: Duration = .seconds(5)

    public init() {}
}

/// The broken tagged sessions of one market, each kept for ``ResumeSettings/window``: where its
/// connection broke (a market sequence of an epoch) and the topics it held. A reconnect with the same key
/// and tag takes it back (once). `Sendable` behind a `Mutex`.
final class SessionShelf: Sendable {
    struct Session: Sendable {
        let epoch: String
        let resumeAfter: UInt64
        let topics: Set<Topic>
        let brokeAt: ContinuousClock.Instant
        /// Its parked hub subscriber, which keeps its topics wanted (so their history stays whole) until
        /// the session expires, or, once taken back, until its topics are subscribed again or a window
        /// has passed since.
        var parked: SubscriberID?
        /// The protocol's own state for the connection that takes it back (``DownstreamSession/carriedOver``).
        var carriedOver: (any Sendable)?
        /// Topics added after the session's start, each at the market sequence it was added at, where
        /// that is past `resumeAfter`: such a topic resumes from there (nothing of it before was the
        /// client's, and its history may not be whole before it).
        var floors: [Topic: UInt64] = [:]
    }

    /// The kept sessions, and their order of arrival market-wide and per key. Every step is O(1)
    /// (amortised): a storm of thousands of breaks costs no more per break than one. A session taken back
    /// or replaced leaves its entries in the orders, known stale by their stamp, and skipped when they
    /// come to the front; as every session is gone within the window, an order holds at most the breaks of
    /// one window.
    private struct Shelf {
        struct Entry {
            let name: String
            let stamp: UInt64
        }

        private(set) var sessions: [String: (session: Session, stamp: UInt64)] = [:]
        private var order = CircularBuffer<Entry>()
        private var byKey: [Substring: (count: Int, order: CircularBuffer<Entry>)] = [:]
        private var stamps: UInt64 = 0

        /// The key part of a session's name (`key#tag`).
        static func key(of name: String) -> Substring { name[..<(name.lastIndex(of: "#") ?? name.endIndex)] }

        private func isLive(_ entry: Entry) -> Bool { sessions[entry.name]?.stamp == entry.stamp }

        mutating func remove(_ name: String) -> Session? {
            guard let session = sessions.removeValue(forKey: name)?.session else { return nil }
            let key = Self.key(of: name)
            if let held = byKey[key], held.count > 1 { byKey[key]?.count = held.count - 1 } else { byKey[key] = nil }
            return session
        }

        /// Adds `session` as the newest; returns the sessions it pushed out (one of the same name, the
        /// key's oldest past `perKey`, the market's oldest past `limit`).
        mutating func insert(_ session: Session, as name: String, perKey: Int, limit: Int) -> [Released] {
            var released: [Released] = []
            if let replaced = remove(name) { released.append((name, replaced)) }
            let key = Self.key(of: name)
            var held = byKey[key] ?? (0, CircularBuffer())
            while held.count >= perKey, let entry = held.order.popFirst() {
                guard isLive(entry) else { continue }
                if let old = sessions.removeValue(forKey: entry.name)?.session { released.append((entry.name, old)) }
                held.count -= 1
            }
            while let entry = held.order.first, !isLive(entry) { held.order.removeFirst() }
            stamps += 1
            let entry = Entry(name: name, stamp: stamps)
            held.count += 1
            held.order.append(entry)
            byKey[key] = held
            sessions[name] = (session, stamps)
            order.append(entry)
            while sessions.count > limit, let oldest = popOldest() {
                if let old = remove(oldest.name) { released.append((oldest.name, old)) }
            }
            return released
        }

        /// The oldest live entry, taken off the market-wide order.
        private mutating func popOldest() -> Entry? {
            while let entry = order.popFirst() {
                if isLive(entry) { return entry }
            }
            return nil
        }

        /// Whether a task sweeps the shelf (``SessionShelf/startSweeping()``): one at a time.
        var sweeping = false

        /// When the oldest kept session broke (`nil`: none kept).
        mutating func oldestBreak() -> ContinuousClock.Instant? {
            while let entry = order.first {
                if let kept = sessions[entry.name], kept.stamp == entry.stamp { return kept.session.brokeAt }
                order.removeFirst()
            }
            return nil
        }

        /// Removes the sessions broken more than `window` before `now`, oldest first.
        mutating func expire(now: ContinuousClock.Instant, window: Duration) -> [Released] {
            var gone: [Released] = []
            while let entry = order.first {
                if let kept = sessions[entry.name], kept.stamp == entry.stamp {
                    guard now - kept.session.brokeAt > window else { break }
                    if let session = remove(entry.name) { gone.append((entry.name, session)) }
                }
                order.removeFirst()
            }
            return gone
        }
    }

    /// A session let go without being taken back, and its name.
    typealias Released = (name: String, session: Session)

    private let settings: ResumeSettings
    private let shelf = Mutex(Shelf())
    /// A tagged connection open now: its identity, how to close it if it is taken over, where it
    /// stands, and the connections it took over (oldest first) until their sessions are kept (where
    /// they stood stands for their sessions meanwhile).
    private struct Open {
        var id: ObjectIdentifier
        var close: @Sendable () -> Void
        var standing: SessionStanding?
        var replacing: [(id: ObjectIdentifier, standing: SessionStanding)] = []
    }

    /// Tagged connections open now, by name.
    private let live = Mutex<[String: Open]>([:])
    /// Kept sessions that expired unclaimed (`relay_resumes_total{result="expired"}`).
    let expired = Atomic<Int>(0)
    private let expiredCounter: Counter?
    /// Sessions one key may have kept at once: one key cannot push every other key's off the shelf.
    var perKey: Int { max(settings.sessions / 10, 1) }

    /// Lets go of what a session held (it expired, was pushed out, or was replaced): its parked hub
    /// subscriber, and its topics in the key's budget (held until then, so that parked sessions count
    /// against the topic limits like open connections).
    private let release: @Sendable (Released) -> Void

    /// Sessions let go before their window ended: a reconnect under the name is told `gap`.
    let forgotten: ForgottenSessions

    init(settings: ResumeSettings, expiredCounter: Counter? = nil, release: @escaping @Sendable (Released) -> Void = { _ in }) {
        self.settings = settings
        forgotten = ForgottenSessions(names: settings.sessions)
        self.expiredCounter = expiredCounter
        self.release = release
    }

    /// Keeps a broken session under `name` (key name and tag), replacing an older one of that name.
    func keep(_ session: Session, as name: String) {
        let (expired, pushedOut, startsSweeping) = shelf.withLock { shelf -> ([Released], [Released], Bool) in
            let expired = sweep(&shelf, now: session.brokeAt)
            let pushedOut = shelf.insert(session, as: name, perKey: perKey, limit: settings.sessions)
            // Pushed off within their window (not one replaced by its own name's newer session): told
            // in the same step, so a sign-in finds the session or what was let go of it. (The shelf's
            // lock, then the table's: the table never takes the shelf's.)
            for (other, session) in pushedOut where other != name {
                forgotten.forget(
                    other, topics: session.topics,
                    why: "its session was let go before its window ended: the shelf held as many broken sessions as it may (resume.sessions, a tenth of them per key)",
                    until: session.brokeAt + settings.window)
            }
            defer { shelf.sweeping = true }
            return (expired, pushedOut, !shelf.sweeping)
        }
        if startsSweeping { startSweeping() }
        for session in expired + pushedOut { release(session) }
    }

    /// Sweeps each session once its window has passed, whether or not another session comes: one task
    /// for the shelf, asleep until the oldest session's window ends, gone once none is kept (a keep
    /// then starts another). One per kept session held a sleeping task each for a whole window.
    private func startSweeping() {
        let window = settings.window
        Task { [weak self] in
            // Held weakly while asleep: a shelf let go is not kept for a window.
            while let oldest = self?.nextSweep() {
                try? await Task.sleep(until: oldest + window + .milliseconds(100), clock: .continuous)
                self?.sweep()
            }
        }
    }

    /// When the oldest kept session broke; `nil`, and the sweeping task ends, when none is kept.
    private func nextSweep() -> ContinuousClock.Instant? {
        shelf.withLock { shelf in
            guard let oldest = shelf.oldestBreak() else {
                shelf.sweeping = false
                return nil
            }
            return oldest
        }
    }

    /// Lets go of the sessions whose window has passed.
    func sweep(now: ContinuousClock.Instant = .now) {
        for session in shelf.withLock({ sweep(&$0, now: now) }) { release(session) }
    }

    /// Takes back the session kept under `name`, if it is still within its window; into `standing`
    /// (the connection's) in the same step, so a checkpoint finds it on the shelf or there.
    func take(_ name: String, into standing: SessionStanding? = nil, now: ContinuousClock.Instant = .now) -> Session? {
        let (session, released) = shelf.withLock { shelf -> (Session?, [Released]) in
            let released = sweep(&shelf, now: now)
            let session = shelf.remove(name)
            if let session { standing?.tookBack(session) }
            return (session, released)
        }
        for session in released { release(session) }
        return session
    }

    /// What ``open(_:id:standing:close:)`` did.
    enum Opening: Equatable {
        /// No connection was open under the name.
        case opened
        /// One was, and is closed: this one took it over.
        case tookOver
        /// Not opened: the name has ``SessionShelf/mostStillClosing`` connections taken over and still
        /// closing (each sign-in under it would wait for them all, and look at them all every few
        /// milliseconds meanwhile).
        case refused
    }

    /// A tagged connection authenticated as `name`; a connection already open under that name (whose
    /// client has come back before the relay saw it break) is closed, and its session is shelved as it closes.
    func open(_ name: String, id: ObjectIdentifier, standing: SessionStanding? = nil, close: @escaping @Sendable () -> Void) -> Opening {
        let (opening, previous) = live.withLock { live -> (Opening, Open?) in
            let previous = live[name]
            if let previous, previous.replacing.count >= Self.mostStillClosing { return (.refused, nil) }
            var replacing = previous?.replacing ?? []
            if let previous, let standing = previous.standing { replacing.append((previous.id, standing)) }
            live[name] = Open(id: id, close: close, standing: standing, replacing: replacing)
            return (previous == nil ? .opened : .tookOver, previous)
        }
        previous?.close()
        return opening
    }

    /// Connections taken over under one name and still closing, at most: past it, a sign-in under the
    /// name is refused until one has closed and shelved its session (its client has
    /// ``ResumeSettings/takenOverAnswer`` to answer the close; the shelving waits for the connection's
    /// hub changes under way, a take-over's wait for its own older ones included).
    static let mostStillClosing = 4

    /// Why a sign-in under `name` was refused (``open(_:id:standing:close:)``'s ``Opening/refused``).
    static func stillClosingMessage(_ name: String) -> String {
        "session \"\(name)\" has \(mostStillClosing) connections taken over and still closing; sign in again once they have closed"
    }

    /// The tagged connection `id` closed: after its session is kept, if it has one (a checkpoint finds
    /// it open, kept, or where it stood while the connection that took it over is open).
    func closed(_ name: String, id: ObjectIdentifier) {
        live.withLock { live in
            guard let entry = live[name] else { return }
            if entry.id != id {
                live[name]?.replacing.removeAll { $0.id == id }
            } else if let older = entry.replacing.last {
                // Gone before the sessions of those it took over are kept: the newest of them stands
                // in its place until it is (one that signs in meanwhile waits for its session).
                live[name] = Open(id: older.id, close: {}, standing: older.standing, replacing: Array(entry.replacing.dropLast()))
            } else {
                live[name] = nil
            }
        }
    }

    /// The session of a connection taken over, once it closed and was kept, for the connection `id`:
    /// waits while a connection older than it under `name` is still closing (a connection taken over
    /// has ``ResumeSettings/takenOverAnswer`` to answer its close), up to `timeout`
    /// (``ResumeSettings/takeOverWait`` unless given). Not for newer ones: they take this one's
    /// session, never the other way round. With it, the topics of those older ones still closing when
    /// the wait ran out (read in the same look as the decision), less the session's: not resumed.
    func takeOver(
        _ name: String, for id: ObjectIdentifier, into standing: SessionStanding?, timeout: Duration? = nil
    ) async -> (session: Session?, stillClosing: Set<Topic>) {
        let deadline = ContinuousClock.now + (timeout ?? settings.takeOverWait)
        while true {
            let (closing, older) = live.withLock { live -> (Bool, [SessionStanding]) in
                // The ones taken over, oldest first: any at all for the open one, any before it else.
                guard let entry = live[name], let oldest = entry.replacing.first else { return (false, []) }
                let older = entry.id == id ? entry.replacing : Array(entry.replacing.prefix { $0.id != id })
                return (entry.id == id || oldest.id != id, older.map(\.standing))
            }
            // Taken only once none older is closing (each one's session is kept before it says it
            // closed): one in between takes the older one's into its own first, so the newest gets
            // them all, in order.
            guard closing, ContinuousClock.now < deadline, !Task.isCancelled else {
                let session = take(name, into: standing)
                // Read outside the table's lock: each standing has its own.
                let stillClosing = closing ? SessionStanding.topics(of: older) : []
                return (session, stillClosing.subtracting(session?.topics ?? []))
            }
            try? await Task.sleep(for: .milliseconds(5))
        }
    }

    /// The topics of the connections the open one under `name` took over that are still closing (their
    /// sessions not kept yet).
    func topicsStillClosing(_ name: String) -> Set<Topic> {
        // Read outside the table's lock: each standing has its own.
        SessionStanding.topics(of: live.withLock { $0[name]?.replacing.map(\.standing) ?? [] })
    }

    /// Sessions kept now.
    var count: Int { shelf.withLock { $0.sessions.count } }

    /// Connections open under `name`: the newest, and those it took over that are still closing.
    func openConnections(_ name: String) -> Int { live.withLock { $0[name].map { 1 + $0.replacing.count } ?? 0 } }

    /// Broken connections whose sessions are on their way to the shelf (a connection's hub changes run
    /// after it closed): a relay that stops saves its shelf once none is.
    private let onTheirWay = Atomic<Int>(0)

    /// A connection closed with a session to keep (``keep(_:as:)`` comes later, from its hub changes).
    func shelving() { onTheirWay.add(1, ordering: .relaxed) }

    /// It was kept (or let go).
    func shelved() { onTheirWay.subtract(1, ordering: .relaxed) }

    /// Waits until no broken connection's session is on its way to the shelf (at most `timeout`, and
    /// not past a cancellation): a stopping relay saves its sessions then.
    func settled(timeout: Duration = .seconds(2)) async {
        let deadline = ContinuousClock.now + timeout
        while onTheirWay.load(ordering: .relaxed) > 0, ContinuousClock.now < deadline, !Task.isCancelled {
            try? await Task.sleep(for: .milliseconds(5))
        }
    }

    /// The sessions kept now and those of the tagged connections open now, each where it stands (what
    /// a running relay saves every second, for a start after a crash): a connection's is where its
    /// client has acknowledged, so a session restored from it may replay a little twice, never skip.
    func checkpoint() -> [(name: String, standing: SessionStanding.Now)] {
        // Both read in one step (the open ones' lock, then the shelf's: nothing takes them the other
        // way). A connection that closes is kept on the shelf before it leaves the open ones; one that
        // signs in takes its session off the shelf into its standing; one taken over stands for its
        // session, beside the connection that took it over, until the session is kept.
        var (open, kept) = live.withLock { live in
            (
                live.compactMap { name, entry in entry.standing.map { (name, $0, entry.replacing.map(\.standing)) } },
                shelf.withLock { $0.sessions.mapValues(\.session) }
            )
        }
        var all: [(name: String, standing: SessionStanding.Now)] = []
        // A name open and kept: a connection that took over from one still open, whose session was kept
        // after it signed in (it takes it at its first subscribe), or one that closed and is not out of
        // the open ones yet. Where it stands counts the kept session as taken back (or, not kept yet,
        // where the connections it took over stood), so the checkpoint holds the session either way.
        for (name, standing, replaced) in open {
            let before = kept.removeValue(forKey: name) ?? SessionStanding.merged(replaced)
            if let now = standing.now(takingBack: before), !now.topics.isEmpty { all.append((name, now)) }
        }
        for (name, session) in kept { all.append((name, SessionStanding.Now(session))) }
        return all
    }

    private func sweep(_ shelf: inout Shelf, now: ContinuousClock.Instant) -> [Released] {
        let gone = shelf.expire(now: now, window: settings.window)
        if !gone.isEmpty {
            expired.add(gone.count, ordering: .relaxed)
            expiredCounter?.increment(by: gone.count)
        }
        return gone
    }

    /// The key part of a session's name (`key#tag`): whose topic budget it counts against.
    static func key(of name: String) -> String { String(Shelf.key(of: name)) }
}

/// Where an open tagged connection stands, as a checkpoint reads it from another thread: the epoch and
/// market sequence through which its client has every event (``AcknowledgedPosition/resumeAfter``,
/// stored as it advances: what it acknowledged, held back while a replay is not), the
/// topics it holds, and the session it took back whose topics it has not all subscribed again (its
/// start stands for those). `Sendable` behind a `Mutex` (written on the connection's loop, read by the
/// checkpoint once a second).
final class SessionStanding: Sendable {
    /// Where a session stands: as it would be shelved.
    struct Now: Sendable, Equatable {
        var epoch: String
        var resumeAfter: UInt64
        var topics: Set<Topic>
        var floors: [Topic: UInt64]
    }

    private struct State {
        var epoch: String?
        var acknowledged: UInt64 = 0
        var floors: [Topic: UInt64] = [:]
        var topics: Set<Topic> = []
        var takenBack: SessionShelf.Session?
    }

    private let state = Mutex(State())

    func acknowledged(_ sequence: UInt64, epoch: String?, floors: [Topic: UInt64]) {
        state.withLock {
            $0.acknowledged = sequence
            $0.epoch = epoch
            $0.floors = floors
        }
    }

    /// It took `session` back: counted with the connection's from now on.
    func tookBack(_ session: SessionShelf.Session) {
        state.withLock { $0.takenBack = session }
    }

    func holds(_ topics: Set<Topic>, takenBack: SessionShelf.Session?) {
        state.withLock {
            $0.topics = topics
            $0.takenBack = takenBack
        }
    }

    /// The topics it holds, its own and those of a session it took back, whether or not it stands in
    /// an epoch yet.
    var topics: Set<Topic> { state.withLock { $0.topics.union($0.takenBack?.topics ?? []) } }

    /// The topics all of `standings` hold.
    static func topics(of standings: [SessionStanding]) -> Set<Topic> { standings.reduce(into: []) { $0.formUnion($1.topics) } }

    /// Where it stands (as the connection's close would shelve it), once it stands in an epoch or has
    /// taken back a session.
    var now: Now? { now(takingBack: nil) }

    /// Where it stands, counting `kept` (its name's session on the shelf, or where connections it took
    /// over stood) as taken back, after a session the connection took back itself if it has one (that
    /// one was on the shelf at its sign-in: `kept` came from connections still open then, so it is
    /// newer). Counting a session twice changes nothing, so one taken back between the reads is safe.
    func now(takingBack kept: SessionShelf.Session?) -> Now? {
        state.withLock { state in
            let takenBack = state.takenBack.map { own in kept.map { Self.merged($0, over: own) } ?? own } ?? kept
            let topics = state.topics.union(takenBack?.topics ?? [])
            guard let epoch = state.epoch, !epoch.isEmpty else { return takenBack.map { Now($0, topics: topics) } }
            return Self.kept(epoch: epoch, acknowledged: state.acknowledged, floors: state.floors, topics: topics, takenBack: takenBack)
        }
    }

    /// Where several connections stood (oldest first), as one session: each newer one with the older
    /// ones' as the session it took back, with its own floors (not those left where it alone stood:
    /// an older one's start may be before them); `nil`: none.
    static func merged(_ standings: [SessionStanding]) -> SessionShelf.Session? {
        standings.reduce(nil as SessionShelf.Session?) { older, next in
            next.now(takingBack: older).map { SessionShelf.Session($0, brokeAt: .now) } ?? older
        }
    }

    /// `newer` with `older` as the session it took back, as one session (one of an older epoch stands
    /// for both).
    static func merged(_ newer: SessionShelf.Session, over older: SessionShelf.Session) -> SessionShelf.Session {
        let now = kept(
            epoch: newer.epoch, acknowledged: newer.resumeAfter, floors: newer.floors, topics: newer.topics.union(older.topics), takenBack: older)
        return SessionShelf.Session(now, brokeAt: newer.brokeAt, carriedOver: newer.carriedOver ?? older.carriedOver)
    }

    /// Where a tagged session stands when its connection stands at `acknowledged` in `epoch` (with the
    /// `floors` of topics it added since), holding `topics`, having taken back a session (`takenBack`)
    /// whose topics are not all subscribed again: that one's start (and floors) hold in the same epoch;
    /// one of an older epoch stands for both (they resume across the terms, never partly).
    static func kept(
        epoch: String, acknowledged: UInt64, floors: [Topic: UInt64], topics: Set<Topic>, takenBack: SessionShelf.Session?
    ) -> Now {
        // A floor at or before where the session resumes says nothing more.
        func past(_ floors: [Topic: UInt64], _ resumeAfter: UInt64) -> [Topic: UInt64] {
            floors.filter { $0.value > resumeAfter && topics.contains($0.key) }
        }
        guard let takenBack else { return Now(epoch: epoch, resumeAfter: acknowledged, topics: topics, floors: past(floors, acknowledged)) }
        guard takenBack.epoch == epoch else {
            return Now(epoch: takenBack.epoch, resumeAfter: takenBack.resumeAfter, topics: topics, floors: past(takenBack.floors, takenBack.resumeAfter))
        }
        let resumeAfter = min(acknowledged, takenBack.resumeAfter)
        return Now(epoch: epoch, resumeAfter: resumeAfter, topics: topics, floors: past(takenBack.floors.merging(floors) { _, own in own }, resumeAfter))
    }
}

extension SessionShelf.Session {
    /// A session kept where `now` stands.
    init(_ now: SessionStanding.Now, brokeAt: ContinuousClock.Instant, carriedOver: (any Sendable)? = nil) {
        self.init(epoch: now.epoch, resumeAfter: now.resumeAfter, topics: now.topics, brokeAt: brokeAt, carriedOver: carriedOver, floors: now.floors)
    }
}

extension SessionStanding.Now {
    /// Where `session` stands, holding `topics` (its own unless given).
    init(_ session: SessionShelf.Session, topics: Set<Topic>? = nil) {
        self.init(epoch: session.epoch, resumeAfter: session.resumeAfter, topics: topics ?? session.topics, floors: session.floors)
    }
}
