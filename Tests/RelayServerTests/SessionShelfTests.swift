import Foundation
import MarketCore
import MarketDataHub
import PolygonWire
import Synchronization
import Testing

@testable import RelayServer

@Suite("Broken tagged sessions")
struct SessionShelfTests {
    func session(after sequence: UInt64, at instant: ContinuousClock.Instant = .now) -> SessionShelf.Session {
        SessionShelf.Session(epoch: "e", resumeAfter: sequence, topics: [Topic(parsing: "Q.AAPL")!], brokeAt: instant)
    }

    @Test func aSessionIsTakenBackOnceWithinItsWindow() {
        var settings = ResumeSettings()
        settings.window = .seconds(60)
        let shelf = SessionShelf(settings: settings)
        shelf.keep(session(after: 42), as: "alice#s1")
        #expect(shelf.take("alice#s1")?.resumeAfter == 42)
        #expect(shelf.take("alice#s1") == nil, "taken once")
    }

    @Test func anExpiredSessionIsGoneAndItsParkedSubscriberReleased() {
        var settings = ResumeSettings()
        settings.window = .seconds(1)
        let released = Mutex<[SessionShelf.Released]>([])
        let shelf = SessionShelf(settings: settings) { gone in released.withLock { $0.append(gone) } }
        var kept = session(after: 1, at: .now - .seconds(5))
        kept.parked = SubscriberID.make()
        shelf.keep(kept, as: "alice#old")
        #expect(shelf.take("alice#old") == nil)
        #expect(released.withLock { $0.count } == 1)
        #expect(released.withLock { $0.first?.name } == "alice#old" && released.withLock { $0.first?.session.parked } == kept.parked)
        #expect(shelf.expired.load(ordering: .relaxed) == 1)
        #expect(SessionShelf.key(of: "alice#old") == "alice" && SessionShelf.key(of: "a#b#c") == "a#b")
    }

    @Test func oneKeyCannotPushEveryOtherKeysSessionsOffTheShelf() {
        var settings = ResumeSettings()
        settings.sessions = 20  // two per key
        let shelf = SessionShelf(settings: settings)
        shelf.keep(session(after: 1), as: "bob#keep")
        for index in 0..<50 { shelf.keep(session(after: UInt64(index)), as: "mallory#\(index)") }
        #expect(shelf.count == 3, "bob's one and mallory's newest two")
        #expect(shelf.take("bob#keep") != nil)
        #expect(shelf.take("mallory#49") != nil && shelf.take("mallory#0") == nil)
    }

    /// A session pushed off within its window is remembered (its topics, once) until the window ends;
    /// one replaced by its own name's newer session, or let go at its window's end, is not.
    @Test func aSessionPushedOffWithinItsWindowIsRemembered() throws {
        var settings = ResumeSettings()
        settings.sessions = 10  // one per key
        let shelf = SessionShelf(settings: settings)
        let aapl = try #require(Topic(parsing: "T.AAPL"))
        shelf.keep(SessionShelf.Session(epoch: "e", resumeAfter: 1, topics: [aapl], brokeAt: .now), as: "bob#a")
        shelf.keep(SessionShelf.Session(epoch: "e", resumeAfter: 2, topics: [aapl], brokeAt: .now), as: "bob#a")
        #expect(shelf.forgotten.count == 0, "replaced by its own newer session")
        shelf.keep(SessionShelf.Session(epoch: "e", resumeAfter: 3, topics: [aapl], brokeAt: .now), as: "bob#b")
        #expect(shelf.forgotten.take("bob#a")?.topics == [aapl])
        #expect(shelf.forgotten.take("bob#a") == nil, "told once")
        // Past the window it says nothing more.
        shelf.keep(SessionShelf.Session(epoch: "e", resumeAfter: 4, topics: [aapl], brokeAt: .now), as: "bob#c")
        #expect(shelf.forgotten.take("bob#b", now: .now + settings.window + .seconds(1)) == nil)
    }

    /// Bounded in names and topics, the oldest let go first.
    @Test func forgottenSessionsAreBounded() throws {
        let forgotten = ForgottenSessions(names: 3)
        let until = ContinuousClock.now + .seconds(60)
        for index in 0..<5 { forgotten.forget("k#\(index)", topics: [try #require(Topic(parsing: "T.X\(index)"))], why: "w", until: until) }
        #expect(forgotten.count == 3)
        #expect(forgotten.take("k#1") == nil && forgotten.take("k#4") != nil)
        let many = Set((0..<(ForgottenSessions.mostTopics + 10)).compactMap { Topic(parsing: "T.M\($0)") })
        forgotten.forget("k#many", topics: many, why: "w", until: until)
        #expect(forgotten.take("k#many")?.topics.count == ForgottenSessions.mostTopics)
        // One past its own window is not told, nor merged into the name's next.
        let (a, b) = (try #require(Topic(parsing: "T.A")), try #require(Topic(parsing: "T.B")))
        let now = ContinuousClock.now
        let fresh = ForgottenSessions(names: 10)
        fresh.forget("k#longer", topics: [a], why: "w", until: now + .seconds(60), now: now)
        fresh.forget("k#late", topics: [a], why: "w", until: now + .seconds(1), now: now)
        #expect(fresh.take("k#late", now: now + .seconds(2)) == nil, "behind one whose window goes on")
        fresh.forget("k#late", topics: [a], why: "w", until: now + .seconds(1), now: now)
        fresh.forget("k#late", topics: [b], why: "w", until: now + .seconds(60), now: now + .seconds(2))
        #expect(fresh.take("k#late", now: now + .seconds(3))?.topics == [b])
    }

    @Test func sessionsTakenBackOrReplacedDoNotCountTowardsAKeysShare() {
        var settings = ResumeSettings()
        settings.sessions = 100  // ten per key
        let shelf = SessionShelf(settings: settings)
        for index in 0..<10 { shelf.keep(session(after: UInt64(index)), as: "alice#\(index)") }
        for index in 0..<5 { #expect(shelf.take("alice#\(index)") != nil) }
        // Replaced under the same name: still one session.
        shelf.keep(session(after: 99), as: "alice#9")
        for index in 10..<15 { shelf.keep(session(after: UInt64(index)), as: "alice#\(index)") }
        #expect(shelf.count == 10, "alice's share, none pushed out early")
        #expect(shelf.take("alice#5") != nil, "the oldest still kept")
        shelf.keep(session(after: 15), as: "alice#15")
        shelf.keep(session(after: 16), as: "alice#16")
        #expect(shelf.take("alice#6") == nil, "past the share the oldest goes first")
        #expect(shelf.take("alice#9")?.resumeAfter == 99, "the replacement is kept, and as the newer")
    }

    @Test func aStormOfBreaksKeepsTheNewestWithinTheLimit() {
        var settings = ResumeSettings()
        settings.sessions = 10_000
        let released = Mutex(0)
        let shelf = SessionShelf(settings: settings) { _ in released.withLock { $0 += 1 } }
        for index in 0..<25_000 {
            var kept = session(after: UInt64(index))
            kept.parked = SubscriberID.make()
            shelf.keep(kept, as: "key\(index % 20)#\(index)")
        }
        #expect(shelf.count == 10_000)
        #expect(released.withLock { $0 } == 15_000, "every session pushed out lets go of its parked subscriber")
        #expect(shelf.take("key19#24999") != nil && shelf.take("key0#0") == nil)
    }
}

@Suite("Where a tagged client stands")
struct AcknowledgedPositionTests {
    @Test func theClientStandsAtTheNewestWriteItAcknowledgedLessTheMargin() {
        let position = AcknowledgedPosition(start: 0, marginBytes: 100)
        position.start(at: 10, epoch: "e1")
        position.wrote(socketBytes: 1_000, sequence: 20, acknowledgedBytes: 0)
        position.wrote(socketBytes: 2_000, sequence: 30, acknowledgedBytes: 1_050)
        #expect(position.resumeAfter == 10, "1,050 acknowledged less the 100 B margin does not cover the first write")
        position.wrote(socketBytes: 3_000, sequence: 40, acknowledgedBytes: 2_100)
        #expect(position.resumeAfter == 30 && position.epoch == "e1")
    }

    @Test func aNewEpochsPositionsCountOnlyOnceTheClientAcknowledgedItsNotice() {
        let position = AcknowledgedPosition(start: 0, marginBytes: 0)
        position.start(at: 900, epoch: "e1")
        position.wrote(socketBytes: 1_000, sequence: 950, acknowledgedBytes: 1_000)
        #expect(position.resumeAfter == 950 && position.epoch == "e1")
        // The write with the new term's notice and its first events (sequences start again, far below).
        position.wrote(socketBytes: 2_000, sequence: 5, epoch: "e2", acknowledgedBytes: 1_500)
        #expect(position.resumeAfter == 950 && position.epoch == "e1", "the notice is not acknowledged yet: still in the old epoch")
        position.wrote(socketBytes: 3_000, sequence: 12, acknowledgedBytes: 3_000)
        // Not the old epoch's 950 carried on (the relay's positions are lower now): the new one's own.
        #expect(position.resumeAfter == 12 && position.epoch == "e2")
    }

    @Test func writesNotedBeforeTheStartStandAtLeastThereInItsEpoch() {
        // The hub delivers as soon as the topics are added; the connection learns where after.
        let position = AcknowledgedPosition(start: 0, marginBytes: 0)
        position.wrote(socketBytes: 500, sequence: 0, acknowledgedBytes: 0)
        position.wrote(socketBytes: 800, sequence: 42, acknowledgedBytes: 0)
        position.start(at: 40, epoch: "e1")
        #expect(position.resumeAfter == 40 && position.epoch == "e1")
        position.wrote(socketBytes: 900, sequence: 0, acknowledgedBytes: 500)
        #expect(position.resumeAfter == 40 && position.epoch == "e1", "a write before the start never stands before it")
        position.wrote(socketBytes: 1_000, sequence: 0, acknowledgedBytes: 800)
        #expect(position.resumeAfter == 42 && position.epoch == "e1")
    }

    @Test func acknowledgedBeforeTheStartStillStandsInItsEpoch() {
        let position = AcknowledgedPosition(start: 0, marginBytes: 0)
        position.wrote(socketBytes: 800, sequence: 42, acknowledgedBytes: 800)
        position.start(at: 40, epoch: "e1")
        #expect(position.resumeAfter == 42 && position.epoch == "e1")
    }

    @Test func eachTopicStandsWhereItWasAddedWhileTheConnectionHoldsIt() throws {
        let aapl = try #require(Topic(parsing: "T.AAPL"))
        let msft = try #require(Topic(parsing: "T.MSFT"))
        let nvda = try #require(Topic(parsing: "T.NVDA"))
        let position = AcknowledgedPosition(start: 0, marginBytes: 0)
        position.added([(aapl, UInt64(5))], epoch: "e1")
        #expect(position.floors.isEmpty, "not before the start")
        position.start(at: 10, epoch: "e1")
        position.added([(aapl, UInt64(10)), (msft, UInt64(40))], epoch: "e1")
        position.added([(msft, UInt64(50))], epoch: "e1")
        #expect(position.floors == [aapl: 10, msft: 40], "a topic held already keeps its floor")
        // Added in the hub's next epoch before its notice was written here: kept under that epoch.
        position.added([(nvda, UInt64(45))], epoch: "e2")
        #expect(position.floors == [aapl: 10, msft: 40], "the client stands in e1")
        // Kept past where the client stands: a session taken back may make the whole resume from earlier.
        position.wrote(socketBytes: 1_000, sequence: 41, acknowledgedBytes: 1_000)
        #expect(position.resumeAfter == 41 && position.floors == [aapl: 10, msft: 40])
        position.removed([msft])
        position.added([(msft, UInt64(60))], epoch: "e1")
        #expect(position.floors == [aapl: 10, msft: 60], "removed and added again: from there")
        // The new epoch written: its adds count once the client stands in it; the old one's go.
        position.wrote(socketBytes: 2_000, sequence: 3, epoch: "e2", acknowledgedBytes: 1_000)
        position.added([(nvda, UInt64(5)), (aapl, UInt64(50))], epoch: "e2")
        #expect(position.floors == [aapl: 10, msft: 60] && position.epoch == "e1")
        position.wrote(socketBytes: 3_000, sequence: 60, acknowledgedBytes: 3_000)
        #expect(position.epoch == "e2" && position.floors == [nvda: 45, aapl: 50], "the first add of each in e2")
    }

    @Test func aKeptSessionMergesTheFloorsOfTheSessionItTookBack() throws {
        let aapl = try #require(Topic(parsing: "T.AAPL"))
        let msft = try #require(Topic(parsing: "T.MSFT"))
        let nvda = try #require(Topic(parsing: "T.NVDA"))
        let takenBack = SessionShelf.Session(epoch: "e1", resumeAfter: 20, topics: [msft], brokeAt: .now, floors: [msft: 35])
        // AAPL was added at 30 by the connection that took the session back (acknowledged past it since):
        // the session resumes from the taken-back one's 20, AAPL from 30.
        let kept = SessionStanding.kept(epoch: "e1", acknowledged: 50, floors: [aapl: 30, nvda: 60], topics: [aapl, msft, nvda], takenBack: takenBack)
        #expect(kept == SessionStanding.Now(epoch: "e1", resumeAfter: 20, topics: [aapl, msft, nvda], floors: [aapl: 30, msft: 35, nvda: 60]))
        let alone = SessionStanding.kept(epoch: "e1", acknowledged: 50, floors: [aapl: 30, nvda: 60], topics: [aapl, nvda], takenBack: nil)
        #expect(alone.resumeAfter == 50 && alone.floors == [nvda: 60], "a floor at or before where it resumes says nothing")
        let older = SessionStanding.kept(epoch: "e2", acknowledged: 5, floors: [nvda: 6], topics: [aapl, msft, nvda], takenBack: takenBack)
        #expect(older.epoch == "e1" && older.resumeAfter == 20 && older.floors == [msft: 35], "an older epoch stands for both")
    }

    /// A session kept under a name that is open: the new connection takes it over at its first
    /// subscribe (here the session is kept first, then the connection opens). A crash between must not
    /// lose the session from the checkpoint, whatever the connection holds meanwhile, nor as the
    /// session leaves the shelf for the connection.
    @Test func theCheckpointHoldsAKeptSessionUntilItsConnectionHasTakenItOver() throws {
        let aapl = try #require(Topic(parsing: "T.AAPL"))
        let msft = try #require(Topic(parsing: "T.MSFT"))
        let shelf = SessionShelf(settings: ResumeSettings())
        let kept = SessionShelf.Session(epoch: "e1", resumeAfter: 20, topics: [aapl], brokeAt: .now, floors: [:])
        shelf.keep(kept, as: "key-1#desk")
        let standing = SessionStanding()
        let connection = ObjectIdentifier(standing)
        #expect(shelf.open("key-1#desk", id: connection, standing: standing) {} == .opened)
        var saved = shelf.checkpoint()
        #expect(saved.count == 1 && saved.first?.name == "key-1#desk")
        #expect(saved.first?.standing == SessionStanding.Now(epoch: "e1", resumeAfter: 20, topics: [aapl], floors: [:]), "signed in, nothing subscribed")
        // MSFT subscribed (added at 30) and acknowledged through 50 in e1, the session not taken over.
        standing.holds([msft], takenBack: nil)
        standing.acknowledged(50, epoch: "e1", floors: [msft: 30])
        saved = shelf.checkpoint()
        #expect(
            saved.first?.standing == SessionStanding.Now(epoch: "e1", resumeAfter: 20, topics: [aapl, msft], floors: [msft: 30]),
            "both, from the kept session's 20: \(saved)")
        // Taken: off the shelf and into the connection's standing in one step, before the connection
        // says what it holds.
        _ = try #require(shelf.take("key-1#desk", into: standing))
        saved = shelf.checkpoint()
        #expect(saved.count == 1 && saved.first?.standing.topics == [aapl, msft] && saved.first?.standing.resumeAfter == 20, "\(saved)")
    }

    /// A tagged client signed in again while its last connection was still open: that one is closed,
    /// and its session kept only once its close has run. Meanwhile where it stood stands for its
    /// session in the checkpoint, beside the new connection.
    @Test func aConnectionTakenOverStandsForItsSessionUntilItIsKept() throws {
        let aapl = try #require(Topic(parsing: "T.AAPL"))
        let shelf = SessionShelf(settings: ResumeSettings())
        let old = SessionStanding()
        old.holds([aapl], takenBack: nil)
        old.acknowledged(40, epoch: "e1", floors: [:])
        #expect(shelf.open("key-1#desk", id: ObjectIdentifier(old), standing: old) {} == .opened)
        let new = SessionStanding()
        #expect(shelf.open("key-1#desk", id: ObjectIdentifier(new), standing: new) {} == .tookOver, "the old one is taken over")
        var saved = shelf.checkpoint()
        #expect(saved.map(\.standing) == [SessionStanding.Now(epoch: "e1", resumeAfter: 40, topics: [aapl], floors: [:])], "\(saved)")
        // Its close keeps its session, then says it closed.
        shelf.keep(SessionShelf.Session(epoch: "e1", resumeAfter: 40, topics: [aapl], brokeAt: .now, floors: [:]), as: "key-1#desk")
        shelf.closed("key-1#desk", id: ObjectIdentifier(old))
        saved = shelf.checkpoint()
        #expect(saved.map(\.standing) == [SessionStanding.Now(epoch: "e1", resumeAfter: 40, topics: [aapl], floors: [:])], "\(saved)")
        // Taken over into the new connection's standing: one session still.
        _ = try #require(shelf.take("key-1#desk", into: new))
        #expect(shelf.checkpoint().count == 1)
        new.holds([], takenBack: nil)
        #expect(shelf.checkpoint().isEmpty, "the old connection stands for nothing once its session was kept")
    }

    /// A name's connections taken over and still closing are bounded: past them a sign-in under it is
    /// refused (and the others are not told to close), until one closes.
    @Test func aNameHoldsAFewConnectionsStillClosingAndRefusesMore() {
        let shelf = SessionShelf(settings: ResumeSettings())
        let closes = Mutex(0)
        var standings: [SessionStanding] = []
        for _ in 0...SessionShelf.mostStillClosing {
            let standing = SessionStanding()
            standings.append(standing)
            #expect(shelf.open("key-1#desk", id: ObjectIdentifier(standing), standing: standing) { closes.withLock { $0 += 1 } } != .refused)
        }
        #expect(shelf.openConnections("key-1#desk") == SessionShelf.mostStillClosing + 1)
        let refused = SessionStanding()
        #expect(shelf.open("key-1#desk", id: ObjectIdentifier(refused), standing: refused) {} == .refused)
        #expect(shelf.openConnections("key-1#desk") == SessionShelf.mostStillClosing + 1, "the refused one is not open")
        #expect(closes.withLock { $0 } == SessionShelf.mostStillClosing, "only those taken over were told to close")
        // The oldest closes: a sign-in is taken again.
        shelf.closed("key-1#desk", id: ObjectIdentifier(standings[0]))
        #expect(shelf.open("key-1#desk", id: ObjectIdentifier(refused), standing: refused) {} == .tookOver)
        #expect(shelf.open("key-2#desk", id: ObjectIdentifier(SessionStanding()), standing: nil) {} == .opened, "another name is its own")
    }

    /// Sign-ins in a row while the first connection's session is on its way to the shelf: the
    /// connections taken over stand for it together, and one that closes first leaves the one it took
    /// over in its place (a later sign-in waits for that one's session).
    @Test func connectionsTakenOverInARowStandForTheirSessionsUntilTheyAreKept() throws {
        let aapl = try #require(Topic(parsing: "T.AAPL"))
        let msft = try #require(Topic(parsing: "T.MSFT"))
        let shelf = SessionShelf(settings: ResumeSettings())
        let first = SessionStanding()
        first.holds([aapl], takenBack: nil)
        first.acknowledged(40, epoch: "e1", floors: [:])
        let second = SessionStanding()
        second.holds([msft], takenBack: nil)
        second.acknowledged(60, epoch: "e1", floors: [msft: 50])
        let third = SessionStanding()
        _ = shelf.open("key-1#desk", id: ObjectIdentifier(first), standing: first) {}
        #expect(shelf.open("key-1#desk", id: ObjectIdentifier(second), standing: second) {} == .tookOver)
        #expect(shelf.open("key-1#desk", id: ObjectIdentifier(third), standing: third) {} == .tookOver)
        var saved = shelf.checkpoint()
        #expect(
            saved.map(\.standing) == [SessionStanding.Now(epoch: "e1", resumeAfter: 40, topics: [aapl, msft], floors: [msft: 50])],
            "both, from the first one's 40, MSFT from where the second added it: \(saved)")
        // The third closes before either session is kept: the second stands in its place.
        shelf.closed("key-1#desk", id: ObjectIdentifier(third))
        saved = shelf.checkpoint()
        #expect(saved.map(\.standing) == [SessionStanding.Now(epoch: "e1", resumeAfter: 40, topics: [aapl, msft], floors: [msft: 50])], "\(saved)")
        let fourth = SessionStanding()
        #expect(shelf.open("key-1#desk", id: ObjectIdentifier(fourth), standing: fourth) {} == .tookOver, "a sign-in now waits for a session")
        // Both kept in turn (the second took over the first's as it closed): one session.
        shelf.closed("key-1#desk", id: ObjectIdentifier(first))
        shelf.keep(SessionShelf.Session(epoch: "e1", resumeAfter: 40, topics: [aapl, msft], brokeAt: .now, floors: [msft: 50]), as: "key-1#desk")
        shelf.closed("key-1#desk", id: ObjectIdentifier(second))
        saved = shelf.checkpoint()
        #expect(saved.count == 1 && saved.first?.standing.resumeAfter == 40 && saved.first?.standing.topics == [aapl, msft], "\(saved)")
    }

    /// A session kept under an open name after the connection took back another (an older connection
    /// that closed after its take-over stopped waiting) counts in the checkpoint with it, not hidden by it.
    @Test func aSessionKeptAfterItsConnectionTookBackAnotherCountsWithIt() throws {
        let aapl = try #require(Topic(parsing: "T.AAPL"))
        let msft = try #require(Topic(parsing: "T.MSFT"))
        let shelf = SessionShelf(settings: ResumeSettings())
        shelf.keep(SessionShelf.Session(epoch: "e1", resumeAfter: 100, topics: [aapl], brokeAt: .now), as: "key-1#desk")
        let standing = SessionStanding()
        _ = shelf.open("key-1#desk", id: ObjectIdentifier(standing), standing: standing) {}
        #expect(shelf.take("key-1#desk", into: standing)?.resumeAfter == 100)
        shelf.keep(SessionShelf.Session(epoch: "e1", resumeAfter: 70, topics: [msft], brokeAt: .now), as: "key-1#desk")
        let saved = shelf.checkpoint()
        #expect(
            saved.map(\.standing) == [SessionStanding.Now(epoch: "e1", resumeAfter: 70, topics: [aapl, msft], floors: [:])],
            "both sessions, from the lower start: \(saved)")
    }

    /// Two sessions of one name as one: the newer stands on the older, and one of an older epoch (a
    /// failover between them) stands for both, so they resume across the terms, never skipping the
    /// older one's tail.
    @Test func aNewerSessionMergedOverAnOlderOneKeepsTheOlderEpochsStart() throws {
        let aapl = try #require(Topic(parsing: "T.AAPL"))
        let msft = try #require(Topic(parsing: "T.MSFT"))
        let older = SessionShelf.Session(epoch: "e1", resumeAfter: 100, topics: [aapl], brokeAt: .now)
        let newer = SessionShelf.Session(epoch: "e2", resumeAfter: 5, topics: [msft], brokeAt: .now + .seconds(1))
        let merged = SessionStanding.merged(newer, over: older)
        #expect(SessionStanding.Now(merged) == SessionStanding.Now(epoch: "e1", resumeAfter: 100, topics: [aapl, msft], floors: [:]))
        #expect(merged.brokeAt == newer.brokeAt, "kept for a window from the newer one's break")
        let sameTerm = SessionStanding.merged(SessionShelf.Session(epoch: "e1", resumeAfter: 300, topics: [msft], brokeAt: .now), over: older)
        #expect(SessionStanding.Now(sameTerm) == SessionStanding.Now(epoch: "e1", resumeAfter: 100, topics: [aapl, msft], floors: [:]))
    }

    /// An answer of no session (not no answer).
    static func answeredNone(_ answer: SessionShelf.Session??) -> Bool {
        if case .some(.none) = answer { true } else { false }
    }

    /// A connection that took over from one still open waits for that one's session while it is closing
    /// (its close may wait seconds for a client that is gone), and no longer once it closed.
    @Test func aTakeOverWaitsWhileTheConnectionTakenOverIsClosing() async throws {
        let aapl = try #require(Topic(parsing: "T.AAPL"))
        let shelf = SessionShelf(settings: ResumeSettings())
        /// The take-over's answer for `standing` under `name`, once `closing` ran beside it; `nil` if
        /// none came within 10 s (it may wait a minute).
        func takenOver(
            _ name: String, for standing: SessionStanding, while closing: @escaping @Sendable () async -> Void = {}
        ) async -> SessionShelf.Session?? {
            await withTaskGroup(of: SessionShelf.Session??.self) { group in
                group.addTask { .some(await shelf.takeOver(name, for: ObjectIdentifier(standing), into: standing, timeout: .seconds(60)).session) }
                group.addTask {
                    await closing()
                    try? await Task.sleep(for: .seconds(10))
                    return nil
                }
                let first = await group.next() ?? nil
                group.cancelAll()
                return first
            }
        }
        let old = SessionStanding()
        let new = SessionStanding()
        _ = shelf.open("key-1#desk", id: ObjectIdentifier(old), standing: old) {}
        #expect(shelf.open("key-1#desk", id: ObjectIdentifier(new), standing: new) {} == .tookOver)
        // Kept two seconds on (longer than the take-over used to wait), then closed.
        let kept = await takenOver("key-1#desk", for: new) {
            try? await Task.sleep(for: .seconds(2))
            shelf.keep(SessionShelf.Session(epoch: "e1", resumeAfter: 40, topics: [aapl], brokeAt: .now, floors: [:]), as: "key-1#desk")
            shelf.closed("key-1#desk", id: ObjectIdentifier(old))
        }
        #expect(kept??.resumeAfter == 40, "the session kept while the take-over waited")
        // Another taken over that closes with nothing to keep: the wait ends then, with none.
        let other = SessionStanding()
        let newer = SessionStanding()
        _ = shelf.open("key-2#desk", id: ObjectIdentifier(other), standing: other) {}
        _ = shelf.open("key-2#desk", id: ObjectIdentifier(newer), standing: newer) {}
        let none = await takenOver("key-2#desk", for: newer) { shelf.closed("key-2#desk", id: ObjectIdentifier(other)) }
        #expect(Self.answeredNone(none), "no session, and no waiting past the close (within 10 s)")
        // Three sign-ins in a row, the first two closing: the first does not wait for the second, which
        // is newer (it takes the first's session, never the other way round).
        let first = SessionStanding()
        let second = SessionStanding()
        let third = SessionStanding()
        for standing in [first, second, third] { _ = shelf.open("key-3#desk", id: ObjectIdentifier(standing), standing: standing) {} }
        #expect(Self.answeredNone(await takenOver("key-3#desk", for: first)), "no wait for a newer connection (within 10 s)")
    }

    @Test func aSavedSessionKeepsItsFloorsAndAFileWithoutThemStillReads() throws {
        let saved = SavedSession(name: "key-1#desk", epoch: "e1", resumeAfter: 20, topics: ["T.AAPL", "T.MSFT"], floors: ["T.MSFT": 35])
        let again = try JSONDecoder().decode(SavedSession.self, from: JSONEncoder().encode(saved))
        #expect(again == saved)
        let older = #"{"name":"key-1#desk","epoch":"e1","resumeAfter":20,"topics":["T.AAPL"]}"#
        let read = try JSONDecoder().decode(SavedSession.self, from: Data(older.utf8))
        #expect(read.floors == nil && read.resumeAfter == 20)
    }

    @Test func aTakenBackTopicAddedLaterStandsWhereItsReplayStartsUntilItIsAcknowledged() throws {
        let aapl = try #require(Topic(parsing: "T.AAPL"))
        let msft = try #require(Topic(parsing: "T.MSFT"))
        let standing = SessionStanding()
        let position = AcknowledgedPosition(start: 0, marginBytes: 0)
        position.standing = standing
        standing.holds([aapl], takenBack: nil)
        // A session broken at 10 is taken back: AAPL first, replayed and then live through 50.
        position.start(at: 10, epoch: "e1")
        position.wrote(socketBytes: 1_000, sequence: 50, acknowledgedBytes: 1_000)
        #expect(position.resumeAfter == 50)
        // MSFT next, with the market at 60: its replay (from 10) is written after AAPL's 50.
        position.replaying(from: 10, in: "e1", through: 60, epoch: "e1", replayedThrough: 30)
        standing.holds([aapl, msft], takenBack: nil)
        #expect(position.resumeAfter == 10 && standing.now?.resumeAfter == 10, "a break now would skip MSFT's replay from 50")
        position.wrote(socketBytes: 2_000, sequence: 40, acknowledgedBytes: 2_000)
        #expect(position.resumeAfter == 10, "part of the replay acknowledged: still where it starts")
        // The first event after the add acknowledged: the replay was, whole.
        position.wrote(socketBytes: 3_000, sequence: 61, acknowledgedBytes: 3_000)
        #expect(position.resumeAfter == 61 && standing.now?.resumeAfter == 61)
        // Acknowledged past the add already when told: nothing to hold.
        position.replaying(from: 10, in: "e1", through: 55, epoch: "e1", replayedThrough: 30)
        #expect(position.resumeAfter == 61)
    }

    @Test func aTakenBackTopicsReplayStopsHoldingOnceTheWriteThatEndedItIsAcknowledged() {
        let position = AcknowledgedPosition(start: 0, marginBytes: 0)
        // A session broken at 10 is taken back: its first topics replayed and live through 50.
        position.start(at: 10, epoch: "e1")
        position.wrote(socketBytes: 1_000, sequence: 50, replayed: 12, acknowledgedBytes: 1_000)
        // More of its topics next, with the market at 60; the hub had queued 30 replayed events by then.
        position.replaying(from: 10, in: "e1", through: 60, epoch: "e1", replayedThrough: 30)
        #expect(position.resumeAfter == 10)
        position.wrote(socketBytes: 2_000, sequence: 45, replayed: 20, acknowledgedBytes: 1_000)
        position.wrote(socketBytes: 3_000, sequence: 48, replayed: 30, acknowledgedBytes: 2_000)
        #expect(position.resumeAfter == 10, "part of the replay acknowledged: still where it starts")
        #expect(position.awaitsAcknowledgement)
        // The market falls quiet: nothing after 60 comes. The last write's acknowledgement, read again.
        position.acknowledged(bytes: 3_000)
        #expect(position.resumeAfter == 50 && !position.awaitsAcknowledgement)
        // A replay already written and acknowledged when told of it: nothing to hold.
        position.replaying(from: 10, in: "e1", through: 70, epoch: "e1", replayedThrough: 30)
        #expect(position.resumeAfter == 50)
    }

    @Test func aSessionTakenBackAcrossTermsStandsWhereItBrokeUntilItsReplayIsAcknowledged() throws {
        let aapl = try #require(Topic(parsing: "T.AAPL"))
        let standing = SessionStanding()
        let position = AcknowledgedPosition(start: 0, marginBytes: 0)
        position.standing = standing
        standing.holds([aapl], takenBack: nil)
        // Broken at 300 in e1 (AAPL added at 320), taken back while the market is at 120 in e2: the
        // replay across the terms is e1's tail and then e2's events from its first; 40 replayed
        // events queued by the add's end.
        position.start(at: 120, epoch: "e2")
        position.added([(aapl, UInt64(120))], epoch: "e2")
        position.replaying(from: 300, in: "e1", floors: [(aapl, 320)], through: 120, epoch: "e2", replayedThrough: 40)
        #expect(position.resumeAfter == 300 && position.epoch == "e1", "a break now resumes across the terms again")
        #expect(standing.now == SessionStanding.Now(epoch: "e1", resumeAfter: 300, topics: [aapl], floors: [aapl: 320]), "as it would be shelved")
        position.wrote(socketBytes: 1_000, sequence: 90, replayed: 25, acknowledgedBytes: 1_000)
        #expect(position.resumeAfter == 300 && position.epoch == "e1", "e1's tail may not be all acknowledged")
        position.wrote(socketBytes: 2_000, sequence: 120, replayed: 40, acknowledgedBytes: 2_000)
        #expect(position.resumeAfter == 120 && position.epoch == "e2" && position.floors == [aapl: 120], "added at 120 in e2")
        #expect(standing.now?.epoch == "e2")
    }

    /// A topic subscribed with `since` while a session taken back across the terms is being replayed:
    /// the hold where the session broke, in the former term, stays until the client has both replays
    /// (the `since` replay's hold in this term replaced it, and a break then skipped the former term's
    /// tail).
    @Test func aSinceReplayDuringAReplayAcrossTermsKeepsTheHoldInTheFormerTerm() throws {
        let aapl = try #require(Topic(parsing: "T.AAPL"))
        let position = AcknowledgedPosition(start: 0, marginBytes: 0)
        position.start(at: 120, epoch: "e2")
        position.added([(aapl, UInt64(120))], epoch: "e2")
        position.replaying(from: 300, in: "e1", floors: [(aapl, 320)], through: 120, epoch: "e2", replayedThrough: 40)
        position.wrote(socketBytes: 1_000, sequence: 120, replayed: 40, acknowledgedBytes: nil)
        // MSFT with `since`: its replay in e2 from 60, queued after the first one.
        position.replaying(from: 60, in: "e2", through: 130, epoch: "e2", replayedThrough: 70)
        #expect(position.resumeAfter == 300 && position.epoch == "e1", "still where the session broke")
        position.wrote(socketBytes: 2_000, sequence: 125, replayed: 50, acknowledgedBytes: 2_000)
        #expect(position.resumeAfter == 300 && position.epoch == "e1", "the first replay acknowledged, not the second")
        position.wrote(socketBytes: 3_000, sequence: 130, replayed: 70, acknowledgedBytes: 3_000)
        #expect(position.resumeAfter == 130 && position.epoch == "e2", "both acknowledged")
    }

    /// A connection still in the former term (told of the new one, the notice not acknowledged yet)
    /// that takes back the rest of its session across the terms: it stands no further than where the
    /// session broke, in the former term, through its move to the new one, until it has the replay.
    @Test func aClientStillInTheFormerTermHoldsWhereItsSessionBrokeThroughTheNotice() throws {
        let position = AcknowledgedPosition(start: 0, marginBytes: 0)
        let msft = try #require(Topic(parsing: "T.MSFT"))
        position.start(at: 300, epoch: "e1")
        position.wrote(socketBytes: 1_000, sequence: 350, acknowledgedBytes: 0)
        // The e2 notice written, nothing acknowledged; then the rest of the session, broken at 300 in
        // e1 (MSFT added to it at 320).
        position.wrote(socketBytes: 1_100, sequence: 0, epoch: "e2", acknowledgedBytes: 0)
        position.replaying(from: 300, in: "e1", floors: [(msft, 320)], through: 8, epoch: "e2", replayedThrough: 60)
        #expect(position.resumeAfter == 300 && position.epoch == "e1")
        #expect(position.floors[msft] == 320)
        // An e1 event numbered past the new term's `through` (350 > 8), acknowledged: no release.
        position.acknowledged(bytes: 1_000)
        #expect(position.resumeAfter == 300 && position.epoch == "e1", "not at 350: the replay from 300 is not read")
        // The notice acknowledged: still held in e1, with its floors.
        position.wrote(socketBytes: 2_000, sequence: 4, replayed: 30, acknowledgedBytes: 2_000)
        #expect(position.resumeAfter == 300 && position.epoch == "e1" && position.floors[msft] == 320)
        position.wrote(socketBytes: 3_000, sequence: 8, replayed: 60, acknowledgedBytes: 3_000)
        #expect(position.resumeAfter == 8 && position.epoch == "e2")
    }

    /// A write's acknowledgement counts only once its client acknowledged the margin past it: one that
    /// cannot count before more is written is not waited for (no re-read of the socket for it).
    @Test func onlyAWriteTheMarginBeforeTheNewestWaitsForItsAcknowledgement() {
        let position = AcknowledgedPosition(start: 0, marginBytes: 1_000)
        position.start(at: 10, epoch: "e1")
        position.wrote(socketBytes: 500, sequence: 11, acknowledgedBytes: 0)
        #expect(!position.awaitsAcknowledgement, "at most 500 bytes could be acknowledged: less than the margin past it")
        position.wrote(socketBytes: 1_600, sequence: 12, acknowledgedBytes: 0)
        #expect(position.awaitsAcknowledgement)
        position.acknowledged(bytes: 1_600)
        #expect(position.resumeAfter == 11 && !position.awaitsAcknowledgement)
    }

    @Test func aNoticeWithNoEventOfTheNewEpochYetStandsAtItsStart() {
        let position = AcknowledgedPosition(start: 0, marginBytes: 0)
        position.start(at: 900, epoch: "e1")
        position.wrote(socketBytes: 500, sequence: 0, epoch: "e2", acknowledgedBytes: 500)
        #expect(position.resumeAfter == 0 && position.epoch == "e2")
        position.wrote(socketBytes: 800, sequence: 3, acknowledgedBytes: 800)
        #expect(position.resumeAfter == 3)
    }
}
