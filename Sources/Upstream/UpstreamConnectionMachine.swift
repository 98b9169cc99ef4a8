import MarketCore

/// The upstream connection's logic, without I/O: when to connect, what an established connection
/// must do first, what each control message the vendor sends means (through its protocol's ``UpstreamSession``), why a connection
/// ended (closed, failed, dead, handshake timeout, `auth_failed`, `max_connections`, the lease deadline),
/// and how long to wait before the next attempt.
///
/// Value type, `Sendable`; owned by ``LWSConnection`` under its lock, fed the instants it observes (an
/// injected clock, so tests drive it without libwebsockets or sleeps). Each input returns what the lws
/// glue must do; the glue only moves bytes and runs timers.
struct UpstreamConnectionMachine: Sendable {
    /// The timings the logic applies.
    struct Timing: Sendable {
        var handshakeTimeout: Duration
        var deadAfter: Duration
        var reconnect: ReconnectPolicy

        init(_ configuration: UpstreamConfiguration) {
            handshakeTimeout = configuration.handshakeTimeout
            deadAfter = configuration.deadAfter
            reconnect = configuration.reconnect
        }

        init(handshakeTimeout: Duration, deadAfter: Duration, reconnect: ReconnectPolicy = ReconnectPolicy()) {
            self.handshakeTimeout = handshakeTimeout
            self.deadAfter = deadAfter
            self.reconnect = reconnect
        }
    }

    /// What the glue does when a connection has just opened.
    enum Opened: Equatable {
        /// Close it before a byte is sent: it opened past the deadline.
        case refuse(reason: String)
        /// Wait at most this long for `auth_success` (lws's pending timeout), state `authenticating`.
        case authenticate(within: Duration)
    }

    /// What the glue does after a status from the server.
    struct StatusOutcome: Equatable {
        /// Client messages to write, in order.
        var send: [[UInt8]] = []
        /// Close the connection after writing them.
        var close = false
        /// A new state to report.
        var state: UpstreamState?
        /// `auth_success`: cancel the handshake timeout and tell the consumer events follow.
        var authenticated = false
        /// The session's reading of the status, for the log.
        var event: UpstreamSignal
    }

    /// What the glue does when the deadline timer fires.
    enum DeadlineOutcome: Equatable {
        case nothing
        /// The deadline moved: check again after this long.
        case rearm(after: Duration)
        /// Close the established connection at once.
        case close
    }

    /// What the glue does once a connection ended.
    enum Ended: Equatable {
        /// Shutting down: no reconnect.
        case stopped
        /// Tell the consumer and the state (`state` `nil`: the state already says why), then connect
        /// again after `retryAfter`.
        case lost(ConnectionEnd, state: UpstreamState?, retryAfter: Duration)
    }

    static let deadlineReason = "closed by this relay: the cluster lease it was given was not renewed in time"

    let timing: Timing
    /// The vendor's conversation: auth, the wanted and subscribed topics.
    private(set) var session: any UpstreamSession
    /// The topics last asked for (``setWanted(_:)``).
    private(set) var wanted: Set<Topic> = []

    /// Where the one connection is.
    enum Phase: Equatable {
        /// No connection, none under way.
        case idle
        /// An attempt under way (from ``nextConnect(now:)``), not open yet.
        case connecting
        /// The WebSocket is open since `since`; `authenticated` since then, once `auth_success` came.
        case open(since: ContinuousClock.Instant, authenticated: ContinuousClock.Instant?)
    }

    /// What comes after the connection in hand.
    enum Intent: Equatable {
        /// Nothing yet (the reconnect delay runs, or nothing was asked).
        case wait
        /// A connection is wanted: ``nextConnect(now:)`` starts it once none is under way.
        case connect
        /// Shutting down: close what is open, connect no more.
        case stop
    }

    private(set) var phase = Phase.idle
    private(set) var intent = Intent.wait
    /// When the last frame or pong arrived.
    private(set) var lastMessageAt: ContinuousClock.Instant?
    /// Past this instant no connection may exist (a cluster leader's lease); `nil`: none.
    private(set) var deadline: ContinuousClock.Instant?
    /// Why the connection is ending, when the server said so (`auth_failed`, `max_connections`).
    private var endCause: ConnectionEnd.Cause?
    /// The server's close frame, or the deadline, as the reason shown.
    private var peerClose: String?
    /// Why this side dropped the connection (``dropping(because:)``), if it did.
    private var dropReason: String?
    /// Reconnect attempts since the connection last stayed authenticated for ``ReconnectPolicy/healthyAfter``.
    private(set) var attempt = 0
    private var jitter: SplitMix64

    init(
        session: any UpstreamSession, timing: Timing, seed: UInt64 = UInt64.random(in: 0...UInt64.max)
    ) {
        self.session = session
        self.timing = timing
        jitter = SplitMix64(seed: seed)
    }

    var isEstablished: Bool {
        if case .open = phase { return true }
        return false
    }
    /// An attempt is under way or open (it has yet to end).
    var connectInFlight: Bool { phase != .idle }
    var stopping: Bool { intent == .stop }

    // MARK: connecting

    /// A connection is wanted (at start, and after each reconnect delay).
    mutating func requestConnect() {
        guard intent != .stop else { return }
        intent = .connect
    }

    /// Whether to start a connection now; past the deadline the request waits for a later deadline.
    mutating func nextConnect(now: ContinuousClock.Instant) -> Bool {
        guard intent == .connect, phase == .idle else { return false }
        if let deadline, now >= deadline { return false }
        intent = .wait
        phase = .connecting
        endCause = nil
        peerClose = nil
        return true
    }

    /// The WebSocket handshake completed.
    mutating func established(now: ContinuousClock.Instant) -> Opened {
        phase = .open(since: now, authenticated: nil)
        lastMessageAt = now
        if let deadline, now >= deadline {
            peerClose = Self.deadlineReason
            return .refuse(reason: Self.deadlineReason)
        }
        return .authenticate(within: timing.handshakeTimeout)
    }

    /// A frame or a pong arrived.
    mutating func heard(now: ContinuousClock.Instant) {
        lastMessageAt = now
    }

    /// This side drops the open connection for `reason` (the upstream does not read what it is sent):
    /// the reason its end is reported with.
    mutating func dropping(because reason: String) {
        dropReason = reason
    }

    /// The server's close frame. Its reason is the server's to choose, and goes to the log, `/healthz`
    /// and every client's `upstream_disconnected` notice: made visible text first, as its statuses are.
    mutating func peerClosed(code: Int, text: String) {
        let text = VisibleText.visible(text, limit: VisibleText.vendorBytes)
        peerClose = text.isEmpty ? "closed by upstream with \(code)" : "closed by upstream with \(code): \(text)"
    }

    // MARK: the conversation

    /// A control message from the server.
    mutating func received(_ control: UpstreamControl, now: ContinuousClock.Instant) -> StatusOutcome {
        let reaction = session.react(to: control)
        var outcome = StatusOutcome(send: reaction.send, close: reaction.signal.closes, event: reaction.signal)
        switch reaction.signal {
        case .authenticated:
            if case .open(let since, _) = phase { phase = .open(since: since, authenticated: now) }
            outcome.authenticated = true
            outcome.state = .authenticated
        case .authFailed(let message):
            endCause = .authFailed
            outcome.state = .authFailed(message: "upstream rejected the API key: \(message)")
        case .maxConnections(let message):
            endCause = .maxConnections
            outcome.state = .rejected(message: "another connection holds this account's slot: \(message)")
        case .connected, .acknowledged, .error, .refused, .authTimeout, .other:
            break
        }
        return outcome
    }

    /// The topics the server should send; returns the messages that move it there (sent only while
    /// authenticated; otherwise after the next `auth_success`).
    mutating func setWanted(_ topics: Set<Topic>) -> [[UInt8]] {
        wanted = topics
        return session.want(topics)
    }

    /// Asks the server for `topics` anew: those subscribed now are unsubscribed and subscribed again (a
    /// vendor sends an order book whole after a subscribe). Messages only while authenticated.
    mutating func renew(_ topics: Set<Topic>) -> [[UInt8]] {
        let held = topics.intersection(session.subscribed)
        guard !held.isEmpty else { return [] }
        return session.want(wanted.subtracting(held)) + session.want(wanted)
    }

    // MARK: the deadline

    mutating func setDeadline(_ deadline: ContinuousClock.Instant?) {
        self.deadline = deadline
    }

    /// The deadline timer fired at `now`.
    mutating func deadlineReached(now: ContinuousClock.Instant) -> DeadlineOutcome {
        guard let deadline else { return .nothing }
        if now < deadline { return .rearm(after: deadline - now) }
        guard isEstablished else { return .nothing }
        peerClose = Self.deadlineReason
        return .close
    }

    // MARK: ending

    /// Shutdown: close what is open, connect no more.
    mutating func stop() {
        intent = .stop
    }

    /// The connection ended (lws closed it, or it never opened); `nil` when no attempt was under way
    /// (lws may report a failed connect twice).
    mutating func ended(_ cause: ConnectionEnd.Cause, reason: String, now: ContinuousClock.Instant) -> Ended? {
        let (opened, authenticatedSince): (ContinuousClock.Instant?, ContinuousClock.Instant?)
        switch phase {
        case .idle: return nil
        case .connecting: (opened, authenticatedSince) = (nil, nil)
        case .open(let since, let authenticated): (opened, authenticatedSince) = (since, authenticated)
        }
        phase = .idle
        var finalCause = endCause ?? cause
        var finalReason = dropReason ?? (cause == .closed ? (peerClose ?? reason) : reason)
        if endCause == nil, dropReason == nil, let opened, !stopping {
            // lws hung up for silence (the retry policy's hang-up) or for the handshake timeout.
            if let last = lastMessageAt, now - last >= timing.deadAfter - .milliseconds(500) {
                finalCause = .dead
                finalReason = "no data and no pong for \(timing.deadAfter)"
            } else if authenticatedSince == nil, now - opened >= timing.handshakeTimeout - .milliseconds(500) {
                finalCause = .handshakeTimeout
                finalReason = "no auth_success within \(timing.handshakeTimeout)"
            }
        }
        let authenticatedFor = authenticatedSince.map { now - $0 }
        endCause = nil
        peerClose = nil
        dropReason = nil
        session.connectionEnded()
        if stopping { return .stopped }
        let end = ConnectionEnd(cause: finalCause, reason: finalReason, authenticatedFor: authenticatedFor)
        if let up = authenticatedFor, up >= timing.reconnect.healthyAfter { attempt = 0 }
        let delay = timing.reconnect.delay(after: finalCause, attempt: attempt, using: &jitter)
        attempt += 1
        let state: UpstreamState? =
            switch finalCause {
            case .authFailed, .maxConnections: nil
            case .closed, .failed, .dead, .handshakeTimeout: .disconnected(reason: finalReason)
            }
        return .lost(end, state: state, retryAfter: delay)
    }
}
