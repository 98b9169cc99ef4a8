import PolygonWire
import Testing

@testable import Upstream

extension UpstreamConnectionMachine {
    /// A Polygon status, as Polygon's reader hands it on.
    mutating func received(_ status: StatusMessage, now: ContinuousClock.Instant) -> StatusOutcome {
        received(UpstreamControl(status), now: now)
    }
}

/// The upstream connection's logic, driven by hand: no libwebsockets, no sockets, no sleeps; the clock
/// is the instants each input is given.
@Suite("Upstream connection state machine")
struct UpstreamConnectionMachineTests {
    let start = ContinuousClock.now
    let timing = UpstreamConnectionMachine.Timing(handshakeTimeout: .seconds(15), deadAfter: .seconds(30))

    func at(_ seconds: Double) -> ContinuousClock.Instant { start + .milliseconds(Int64(seconds * 1000)) }

    /// A machine whose connection is open (connected and, unless told otherwise, authenticated) at 0 s.
    func open(authenticated: Bool = true, wanted: Set<Topic> = []) -> UpstreamConnectionMachine {
        var machine = UpstreamConnectionMachine(session: ClientSession(apiKey: "key"), timing: timing, seed: 1)
        _ = machine.setWanted(wanted)
        machine.requestConnect()
        let v1 = machine.nextConnect(now: at(0))
        #expect(v1)
        let v2 = machine.established(now: at(0))
        #expect(v2 == .authenticate(within: .seconds(15)))
        _ = machine.received(.connected, now: at(0))
        if authenticated { _ = machine.received(.authSuccess, now: at(0.1)) }
        return machine
    }

    func lost(_ ended: UpstreamConnectionMachine.Ended?) -> (end: ConnectionEnd, state: UpstreamState?, retryAfter: Duration)? {
        guard case .lost(let end, let state, let retryAfter) = ended else { return nil }
        return (end, state, retryAfter)
    }

    // MARK: statuses

    @Test func connectedSendsAuthAndAuthSuccessSubscribesTheWantedSet() throws {
        var machine = UpstreamConnectionMachine(session: ClientSession(apiKey: "key"), timing: timing, seed: 1)
        let v3 = machine.setWanted(Set([Topic(parsing: "Q.AAPL")!]))
        #expect(v3.isEmpty, "nothing is sent before auth_success")
        machine.requestConnect()
        let v4 = machine.nextConnect(now: at(0))
        #expect(v4)
        let v5 = machine.nextConnect(now: at(0))
        #expect(!v5, "one attempt at a time")
        let v6 = machine.established(now: at(0))
        #expect(v6 == .authenticate(within: .seconds(15)))
        let connected = machine.received(.connected, now: at(0))
        #expect(connected.send == [Array(#"{"action":"auth","params":"key"}"#.utf8)] && !connected.close && connected.state == nil)
        let authenticated = machine.received(.authSuccess, now: at(0.2))
        #expect(authenticated.authenticated && authenticated.state == .authenticated)
        #expect(authenticated.send == [Array(#"{"action":"subscribe","params":"Q.AAPL"}"#.utf8)])
        #expect(machine.session.subscribed.map(\.description) == ["Q.AAPL"])
        let v7 = machine.setWanted([])
        #expect(v7 == [Array(#"{"action":"unsubscribe","params":"Q.AAPL"}"#.utf8)], "while authenticated, changes go out at once")
    }

    /// The connection's phase and what is wanted next are two enums: every combination the glue sees is
    /// one the machine can name.
    @Test func thePhaseAndTheIntentFollowTheConnection() {
        var machine = UpstreamConnectionMachine(session: ClientSession(apiKey: "key"), timing: timing, seed: 1)
        #expect(machine.phase == .idle && machine.intent == .wait)
        machine.requestConnect()
        #expect(machine.intent == .connect)
        let first = machine.nextConnect(now: at(0))
        #expect(first && machine.phase == .connecting && machine.intent == .wait)
        _ = machine.established(now: at(1))
        #expect(machine.phase == .open(since: at(1), authenticated: nil))
        _ = machine.received(.authSuccess, now: at(2))
        #expect(machine.phase == .open(since: at(1), authenticated: at(2)))
        // Asked again while one is open: taken up once it ended (after the glue's delay it asks anyway).
        machine.requestConnect()
        let whileOpen = machine.nextConnect(now: at(3))
        #expect(!whileOpen, "one connection at a time")
        let end = machine.ended(.closed, reason: "bye", now: at(40))
        #expect(lost(end)?.end.authenticatedFor == .seconds(38))
        let twice = machine.ended(.closed, reason: "again", now: at(41))
        #expect(machine.phase == .idle && twice == nil, "an end reported twice counts once")
        let second = machine.nextConnect(now: at(42))
        #expect(second && machine.phase == .connecting)
        // Stopping while an attempt is under way: it ends as stopped, and nothing connects again.
        machine.stop()
        #expect(machine.intent == .stop && machine.connectInFlight)
        let stopped = machine.ended(.failed, reason: "refused", now: at(43))
        #expect(stopped == .stopped)
        machine.requestConnect()
        let afterStop = machine.nextConnect(now: at(44))
        #expect(!afterStop && machine.phase == .idle && machine.intent == .stop)
    }

    @Test func authFailedClosesAndRetriesOnlyAfterTheLongDelay() {
        var machine = open(authenticated: false)
        let refused = machine.received(StatusMessage(status: StatusMessage.Kind.authFailed, message: "authentication failed"), now: at(0.2))
        #expect(refused.close && refused.state == .authFailed(message: "upstream rejected the API key: authentication failed"))
        let ended = lost(machine.ended(.closed, reason: "connection closed", now: at(0.3)))
        #expect(ended?.end.cause == .authFailed)
        #expect(ended?.state == nil, "the state already says why")
        // The first wait is in the upper half of the delay (relays sharing the key spread out).
        #expect(ended.map { $0.retryAfter >= .seconds(60) && $0.retryAfter <= .seconds(120) } == true, "\(String(describing: ended?.retryAfter))")
    }

    @Test func maxConnectionsClosesAndBacksOffLong() {
        var machine = open()
        let refused = machine.received(
            StatusMessage(status: StatusMessage.Kind.maxConnections, message: "Maximum number of websocket connections exceeded."), now: at(1))
        #expect(refused.close)
        #expect(refused.state == .rejected(message: "another connection holds this account's slot: Maximum number of websocket connections exceeded."))
        let ended = lost(machine.ended(.closed, reason: "closed", now: at(1.1)))
        #expect(ended?.end.cause == .maxConnections)
        // The upper half of min(5 min, 15 s · 2^0).
        #expect(ended.map { $0.retryAfter >= .milliseconds(7500) && $0.retryAfter <= .seconds(15) } == true, "\(String(describing: ended?.retryAfter))")
    }

    @Test func errorAuthTimeoutSuccessAndUnknownStatusesLeaveTheConnectionAsItIs() {
        var machine = open()
        for (status, expected) in [
            (StatusMessage.error("not authorized"), ClientSession.Event.error("not authorized")),
            (StatusMessage(status: StatusMessage.Kind.authTimeout, message: "No authentication request received."), .authTimeout("No authentication request received.")),
            (StatusMessage(status: StatusMessage.Kind.success, message: "subscribed to: Q.AAPL"), .acknowledged("subscribed to: Q.AAPL")),
            (StatusMessage(status: "auth_required", message: "please authenticate"), .other(status: "auth_required", message: "please authenticate")),
            (StatusMessage(status: "brand_new", message: "?"), .other(status: "brand_new", message: "?")),
        ] {
            let outcome = machine.received(status, now: at(1))
            #expect(outcome.event == expected)
            #expect(!outcome.close && outcome.state == nil && outcome.send.isEmpty && !outcome.authenticated, "\(status.status)")
        }
        #expect(machine.isEstablished)
    }

    // MARK: close causes

    @Test func aPeerCloseIsReportedWithItsCodeAndRetriedWithQuickBackoff() {
        var machine = open()
        machine.peerClosed(code: 1011, text: "keepalive ping timeout")
        let ended = lost(machine.ended(.closed, reason: "connection closed", now: at(5)))
        #expect(ended?.end == ConnectionEnd(cause: .closed, reason: "closed by upstream with 1011: keepalive ping timeout", authenticatedFor: .milliseconds(4900)))
        #expect(ended?.state == .disconnected(reason: "closed by upstream with 1011: keepalive ping timeout"))
        #expect(ended.map { $0.retryAfter <= .milliseconds(500) } == true, "full jitter within 0.5 s at the first attempt")
        #expect(machine.session.subscribed.isEmpty && !machine.isEstablished)
    }

    /// A close frame's reason is the server's text: what reaches logs and clients is visible text only
    /// (no line breaks to forge log lines, no bidi or control characters).
    @Test func aPeerClosesReasonIsToldAsVisibleText() {
        var machine = open()
        machine.peerClosed(code: 1000, text: "bye\n2026-12-07 level=error forged\u{202E}\u{0007}x")
        let ended = lost(machine.ended(.closed, reason: "connection closed", now: at(5)))
        #expect(ended?.end.reason == "closed by upstream with 1000: bye 2026-12-07 level=error forged x", "\(ended?.end.reason ?? "")")
    }

    @Test func aFailedConnectIsReportedOnceAndBacksOffExponentially() {
        var machine = UpstreamConnectionMachine(session: ClientSession(apiKey: "key"), timing: timing, seed: 7)
        var ceilings: [Duration] = []
        for attempt in 0..<4 {
            machine.requestConnect()
            let v8 = machine.nextConnect(now: at(Double(attempt)))
            #expect(v8)
            let ended = lost(machine.ended(.failed, reason: "connection failed: refused", now: at(Double(attempt))))
            #expect(ended?.end.cause == .failed && ended?.end.reason == "connection failed: refused")
            let v9 = machine.ended(.failed, reason: "again", now: at(Double(attempt)))
            #expect(v9 == nil, "lws may report a failure twice")
            ceilings.append(ReconnectPolicy().ceiling(attempt: attempt))
            #expect(ended.map { $0.retryAfter <= ceilings[attempt] } == true)
        }
        #expect(machine.attempt == 4)
        #expect(ceilings == [.milliseconds(500), .seconds(1), .seconds(2), .seconds(4)])
    }

    @Test func silenceIsDeadAndAMissingAuthSuccessIsAHandshakeTimeout() {
        var silent = open()
        silent.heard(now: at(1))
        let dead = lost(silent.ended(.closed, reason: "connection closed", now: at(31)))
        #expect(dead?.end.cause == .dead && dead?.end.reason == "no data and no pong for 30.0 seconds")
        var unanswered = open(authenticated: false)
        unanswered.heard(now: at(10))
        let timedOut = lost(unanswered.ended(.closed, reason: "connection closed", now: at(15)))
        #expect(timedOut?.end.cause == .handshakeTimeout && timedOut?.end.reason == "no auth_success within 15.0 seconds")
    }

    @Test func anAttemptCountResetsOnlyAfterStayingAuthenticated() {
        var machine = open()
        _ = machine.ended(.closed, reason: "x", now: at(1))
        #expect(machine.attempt == 1, "authenticated for 0.9 s: not healthy yet")
        machine.requestConnect()
        let v10 = machine.nextConnect(now: at(2))
        #expect(v10)
        _ = machine.established(now: at(2))
        _ = machine.received(.connected, now: at(2))
        _ = machine.received(.authSuccess, now: at(2))
        _ = machine.ended(.closed, reason: "x", now: at(40))
        #expect(machine.attempt == 1, "38 s authenticated: the count started over, then this end counted")
    }

    @Test func theLeaseDeadlineClosesAndForbidsConnectingUntilMoved() {
        var machine = open()
        machine.setDeadline(at(3))
        let v11 = machine.deadlineReached(now: at(1))
        #expect(v11 == .rearm(after: .seconds(2)))
        let v12 = machine.deadlineReached(now: at(3))
        #expect(v12 == .close)
        let ended = lost(machine.ended(.closed, reason: "connection closed", now: at(3)))
        #expect(ended?.end.reason == UpstreamConnectionMachine.deadlineReason)
        machine.requestConnect()
        let v13 = machine.nextConnect(now: at(4))
        #expect(!v13, "past the deadline no connection opens")
        machine.setDeadline(at(10))
        let v14 = machine.nextConnect(now: at(4))
        #expect(v14)
        // A handshake that outlasted the deadline is refused before a byte is sent.
        machine.setDeadline(at(4.5))
        let v15 = machine.established(now: at(5))
        #expect(v15 == .refuse(reason: UpstreamConnectionMachine.deadlineReason))
        machine.setDeadline(nil)
        let v16 = machine.deadlineReached(now: at(6))
        #expect(v16 == .nothing)
    }

    @Test func stoppingEndsWithoutAReconnect() {
        var machine = open()
        machine.stop()
        machine.requestConnect()
        let v17 = machine.ended(.closed, reason: "closed", now: at(1))
        #expect(v17 == .stopped)
        let v18 = machine.nextConnect(now: at(2))
        #expect(!v18)
    }
}
