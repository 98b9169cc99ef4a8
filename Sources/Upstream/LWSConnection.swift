import CLibWebSockets
import Foundation
import Logging
import MarketDataHub
import NIOCore
import MarketCore
import Synchronization

let lwsLogger = Logger(label: "relay.lws")

/// The libwebsockets side of ``UpstreamClient``: one `lws_context`, its service thread, and the
/// Polygon handshake state machine.
///
/// Concurrency contract (the C boundary): every lws call except `lws_cancel_service` happens on the
/// service thread. Other threads only change ``Shared`` under `shared`'s lock and wake the thread with
/// `lws_cancel_service`, also under that lock, so the context cannot be destroyed in between. That lock
/// is what makes this type `Sendable`.
final class LWSConnection: Sendable {
    /// All mutable state. Touched by the service thread and by callers of the public API, always under
    /// the lock.
    struct Shared: ~Copyable {
        var context: LWSHandle?
        var retryPolicy: LWSRetryPolicy?
        var wsi: LWSHandle?
        var closeRequested = false
        var exitLoop = false
        /// The connection is to be dropped (and reconnected): a silent upstream.
        var dropRequested = false
        var outbox: [[UInt8]] = []
        /// The bytes in ``outbox``, bounded by ``UpstreamConfiguration/maxUnsentBytes``.
        var outboxBytes = 0
        /// The connection's logic (connect, auth, statuses, close causes, backoff); this type only
        /// moves its bytes and runs its timers.
        var machine: UpstreamConnectionMachine
        var state: UpstreamState = .idle
        var stateWatchers: [UInt64: AsyncStream<UpstreamState>.Continuation] = [:]
        var nextWatcher: UInt64 = 0
        var rx = ByteBuffer()
        var rxOversized = false
        /// The size of the oversized message being passed over, so far.
        var rxOversizedBytes = 0
        /// When a whole message last told lws the connection is alive (at most once a second).
        var confirmedAt: ContinuousClock.Instant?
        var statistics = UpstreamStatistics()
        /// While the upstream is down: since when, and the last down state logged at info level.
        var downSince: ContinuousClock.Instant?
        var lastLoggedDown: UpstreamState?
        var attemptsWhileDown = 0
        /// The deadline moved (``UpstreamConnectionMachine/deadline``): the service thread re-arms
        /// ``deadlineTimer``, which enforces it with no Swift task involved.
        var deadlineChanged = false
        var deadlineTimer: LWSTimer?
        /// The connection being opened (not yet established), and the timer that gives it up when it
        /// has not opened within the handshake timeout (``connectDeadlineReached()``).
        var opening: LWSHandle?
        var openingTimer: LWSTimer?
    }

    let configuration: UpstreamConfiguration
    /// The market the endpoint's path names: its events are routed by their topic tickers (`X:BTC-USD`).
    let marketOfFrames: Market
    /// Derived bars, built from the trades on their way into the inbox.
    let bars: BarDerivation
    /// What an event must be to be taken.
    let eventCheck: UpstreamEventCheck
    let logger: Logger
    /// Warnings the upstream can repeat at its message rate: a line per kind per 10 s.
    let warnings = ThrottledLog()
    let metrics: UpstreamMetrics
    let shared: Mutex<Shared>
    /// Events and connection changes, in wire order, to the consumer (the hub's pump, or a cluster
    /// leader's NATS publisher); bounded by ``UpstreamConfiguration/maxQueuedEvents``.
    let inbox: SourceInbox
    let endContinuation: AsyncStream<ConnectionEnd>.Continuation
    let exitContinuation: AsyncStream<Void>.Continuation

    /// Protocol names and the policy lws keeps pointers to for the context's lifetime.
    private static let protocolName = "relay-upstream"

    init(
        configuration: UpstreamConfiguration,
        logger: Logger,
        inbox: SourceInbox,
        ends: AsyncStream<ConnectionEnd>.Continuation,
        exit: AsyncStream<Void>.Continuation
    ) {
        self.configuration = configuration
        self.logger = logger
        self.shared = Mutex(
            Shared(
                machine: UpstreamConnectionMachine(
                    session: configuration.wire.upstreamSession(key: configuration.apiKey, secret: configuration.secret), timing: .init(configuration))))
        self.metrics = UpstreamMetrics(factory: configuration.metricsFactory)
        self.inbox = inbox
        // The market it was configured for; else the one its path names (a URL given alone).
        self.marketOfFrames = configuration.market ?? Market(rawValue: configuration.endpoint.market.lowercased()) ?? .stocks
        self.bars = BarDerivation(rules: configuration.wire.barRules(of: marketOfFrames), metricsFactory: configuration.metricsFactory)
        self.eventCheck = UpstreamEventCheck(
            market: marketOfFrames, wire: configuration.wire, maxBytes: configuration.maxEventBytes,
            maxFoldedBytes: configuration.maxFoldedBytes)
        self.endContinuation = ends
        self.exitContinuation = exit
    }

    // MARK: the service thread

    /// Creates the context and services it until asked to stop. Runs on the dedicated thread.
    func serviceLoop(ready: @Sendable (Result<Void, UpstreamError>) -> Void) {
        lws_set_log_level(relay_lws_log_levels(), relayLWSLog)

        let protocols = UnsafeMutablePointer<lws_protocols>.allocate(capacity: 2)
        let name = strdup(Self.protocolName)
        protocols.initialize(repeating: lws_protocols(), count: 2)
        protocols[0].name = UnsafePointer(name)
        protocols[0].callback = relayLWSCallback
        protocols[0].rx_buffer_size = 64 * 1024
        let retryTable = UnsafeMutablePointer<UInt32>.allocate(capacity: 1)
        retryTable.initialize(to: 1000)
        let retry = UnsafeMutablePointer<lws_retry_bo_t>.allocate(capacity: 1)
        retry.initialize(to: lws_retry_bo_t())
        retry.pointee.retry_ms_table = UnsafePointer(retryTable)
        retry.pointee.retry_ms_table_count = 1
        retry.pointee.secs_since_valid_ping = UInt16(clamping: configuration.pingInterval.components.seconds)
        retry.pointee.secs_since_valid_hangup = UInt16(clamping: configuration.deadAfter.components.seconds)
        let caFile = configuration.caFile.map { strdup($0) }
        defer {
            free(name)
            protocols.deallocate()
            retryTable.deallocate()
            retry.deallocate()
            if let caFile { free(caFile) }
        }

        var info = lws_context_creation_info()
        info.port = relay_lws_context_port_no_listen()
        info.protocols = UnsafePointer(protocols)
        info.gid = -1
        info.uid = -1
        info.options = relay_lws_option_ssl_global_init()
        info.fd_limit_per_thread = 64
        info.retry_and_idle_policy = UnsafePointer(retry)
        if let caFile { info.client_ssl_ca_filepath = UnsafePointer(caFile) }
        info.user = Unmanaged.passUnretained(self).toOpaque()

        guard let context = lws_create_context(&info) else {
            ready(.failure(.contextCreationFailed))
            finishThread()
            return
        }
        let (timer, openingTimer) = (Self.timer(owner: self), Self.timer(owner: self))
        shared.withLock { state in
            state.context = LWSHandle(pointer: context)
            state.retryPolicy = LWSRetryPolicy(pointer: UnsafePointer(retry))
            state.deadlineTimer = LWSTimer(pointer: timer)
            state.openingTimer = LWSTimer(pointer: openingTimer)
            state.deadlineChanged = true
        }
        ready(.success(()))
        // Pick up whatever was requested before the context existed.
        lws_cancel_service(context)

        while !shared.withLock({ $0.exitLoop }) {
            if lws_service(context, 0) < 0 { break }
        }
        shared.withLock { state in
            state.context = nil
            state.retryPolicy = nil
            state.deadlineTimer = nil
            state.openingTimer = nil
            state.opening = nil
        }
        for made in [timer, openingTimer] { lws_sul_cancel(relay_lws_timer_sul(made)) }
        lws_context_destroy(context)
        for made in [timer, openingTimer] { made.deallocate() }
        finishThread()
    }

    /// A timer whose callbacks reach `owner` (deallocated by the service thread after the context).
    private static func timer(owner: LWSConnection) -> UnsafeMutablePointer<relay_lws_timer> {
        let timer = UnsafeMutablePointer<relay_lws_timer>.allocate(capacity: 1)
        timer.initialize(to: relay_lws_timer())
        timer.pointee.owner = Unmanaged.passUnretained(owner).toOpaque()
        return timer
    }

    private func finishThread() {
        setState(.stopped)
        inbox.finish()
        endContinuation.finish()
        // Finished after the lock: a watcher's end runs its termination handler, which takes the lock.
        let watchers = shared.withLock { state in
            defer { state.stateWatchers.removeAll() }
            return Array(state.stateWatchers.values)
        }
        for watcher in watchers { watcher.finish() }
        exitContinuation.yield(())
        exitContinuation.finish()
    }

    // MARK: requests from other threads

    /// Wakes the service thread; a no-op once the context is gone.
    func wake(_ state: inout Shared) {
        if let context = state.context { lws_cancel_service(context.pointer) }
    }

    func requestConnect() {
        shared.withLock { state in
            state.machine.requestConnect()
            wake(&state)
        }
    }

    func requestStop() {
        shared.withLock { state in
            state.machine.stop()
            wake(&state)
        }
    }

    /// Drops the connection (the reconnect logic then connects again, as after any drop). Safe from any thread.
    func requestDrop() {
        shared.withLock { state in
            state.dropRequested = true
            wake(&state)
        }
    }

    /// Ends the service loop even if the close handshake never completes.
    func forceExit() {
        shared.withLock { state in
            state.machine.stop()
            state.exitLoop = true
            wake(&state)
        }
    }

    /// Sets (or, with `nil`, lifts) the instant past which the connection may not exist; wakes the
    /// service thread, which schedules its own check for that instant.
    func setDeadline(_ deadline: ContinuousClock.Instant?) {
        shared.withLock { state in
            state.machine.setDeadline(deadline)
            state.deadlineChanged = true
            wake(&state)
        }
    }

    func setWanted(_ topics: Set<Topic>) {
        shared.withLock { state in
            let messages = state.machine.setWanted(topics)
            enqueue(messages, &state)
            if !messages.isEmpty { wake(&state) }
        }
    }

    /// Queues `messages` for the upstream. Past ``UpstreamConfiguration/maxUnsentBytes`` unsent, the
    /// upstream is not reading them: the queue is let go and the connection dropped (reconnected as
    /// after any drop); the next connection subscribes the wanted set whole.
    private func enqueue(_ messages: [[UInt8]], _ state: inout Shared) {
        let added = messages.reduce(0) { $0 + $1.count }
        state.outbox += messages
        state.outboxBytes += added
        // One change alone (the whole wanted set subscribed at a login) never trips it, however large.
        let allowed = max(configuration.maxUnsentBytes, 2 * added)
        guard state.outboxBytes > allowed, state.wsi != nil else { return }
        let reason = "the upstream left \(state.outboxBytes) bytes of our messages unread (at most \(allowed))"
        logger.warning("\(reason): dropping the connection")
        state.statistics.lastError = reason
        state.outbox = []
        state.outboxBytes = 0
        state.machine.dropping(because: reason)
        state.dropRequested = true
        wake(&state)
    }

    func renew(_ topics: Set<Topic>) {
        shared.withLock { state in
            let messages = state.machine.renew(topics)
            enqueue(messages, &state)
            if !messages.isEmpty {
                metrics.renewed.increment(by: topics.intersection(state.machine.session.subscribed).count)
                wake(&state)
            }
        }
    }

    // MARK: state

    /// Records a state change. Each change is logged once: while the upstream is down, retries that end
    /// the same way are logged at debug level, and recovery is one line saying how long it took.
    func setState(_ new: UpstreamState) {
        struct Change {
            var old: UpstreamState
            var watchers: [AsyncStream<UpstreamState>.Continuation]
            var level: Logger.Level
            var recovered: (attempts: Int, down: Duration)?
        }
        let change: Change? = shared.withLock { state in
            guard state.state != new else { return nil }
            let old = state.state
            state.state = new
            var level = Logger.Level.info
            var recovered: (Int, Duration)?
            switch new {
            case .connecting, .authenticating:
                if state.downSince != nil { level = .debug }
                if case .connecting = new, state.downSince != nil { state.attemptsWhileDown += 1 }
            case .disconnected, .authFailed, .rejected:
                if state.downSince == nil {
                    state.downSince = .now
                    state.attemptsWhileDown = 0
                }
                if state.lastLoggedDown == new { level = .debug } else { state.lastLoggedDown = new }
            case .authenticated:
                if let since = state.downSince {
                    recovered = (state.attemptsWhileDown, ContinuousClock.now - since)
                }
                state.downSince = nil
                state.lastLoggedDown = nil
            case .idle, .stopped:
                break
            }
            return Change(old: old, watchers: Array(state.stateWatchers.values), level: level, recovered: recovered)
        }
        guard let change else { return }
        metrics.record(new)
        var metadata: Logger.Metadata = ["upstream": "\(configuration.endpoint)"]
        if let recovered = change.recovered {
            metadata["attempts"] = "\(recovered.attempts)"
            metadata["down_ms"] = "\(recovered.down.milliseconds)"
            logger.info("upstream \(change.old.name) → \(new), recovered", metadata: metadata)
        } else {
            logger.log(level: change.level, "upstream \(change.old.name) → \(new)", metadata: metadata)
        }
        for watcher in change.watchers { watcher.yield(new) }
    }

    func stateUpdates() -> AsyncStream<UpstreamState> {
        let (stream, continuation) = AsyncStream.makeStream(of: UpstreamState.self)
        let id: UInt64? = shared.withLock { state in
            if state.state == .stopped && state.context == nil && state.machine.stopping {
                return nil
            }
            let id = state.nextWatcher
            state.nextWatcher += 1
            state.stateWatchers[id] = continuation
            continuation.yield(state.state)
            return id
        }
        guard let id else {
            continuation.yield(.stopped)
            continuation.finish()
            return stream
        }
        continuation.onTermination = { [weak self] _ in
            _ = self?.shared.withLock { $0.stateWatchers.removeValue(forKey: id) }
        }
        return stream
    }

    // MARK: callbacks (service thread only)

    func handle(
        wsi: OpaquePointer, reason: lws_callback_reasons, input: UnsafeMutableRawPointer?, length: Int
    ) -> Int32 {
        switch reason {
        case LWS_CALLBACK_EVENT_WAIT_CANCELLED:
            serviceRequests()
        case LWS_CALLBACK_CLIENT_ESTABLISHED:
            stopOpening()
            let opened = shared.withLock { state in
                state.wsi = LWSHandle(pointer: wsi)
                state.opening = nil
                let opened = state.machine.established(now: .now)
                if case .refuse = opened {
                    state.statistics.deadlineCloses += 1
                    state.statistics.lastDeadlineClose = .now
                }
                return opened
            }
            switch opened {
            case .refuse:
                // Opened past the deadline (the handshake outlasted it): closed before a byte is sent.
                return -1
            case .authenticate(let within):
                // lws closes the connection if `auth_success` has not cancelled this by then.
                lws_set_timeout(wsi, PENDING_TIMEOUT_USER_OK, Int32(clamping: within.components.seconds))
                setState(.authenticating)
            }
        case LWS_CALLBACK_CLIENT_RECEIVE:
            receive(wsi: wsi, input: input, length: length)
        case LWS_CALLBACK_CLIENT_WRITEABLE:
            return write(wsi: wsi)
        case LWS_CALLBACK_CLIENT_CONNECTION_ERROR:
            let message = input.map { String(cString: $0.assumingMemoryBound(to: CChar.self)) } ?? "unknown error"
            connectionEnded(cause: .failed, reason: "connection failed: \(message)")
        case LWS_CALLBACK_WS_PEER_INITIATED_CLOSE:
            if let input, length >= 2 {
                let bytes = UnsafeRawBufferPointer(start: input, count: length)
                let code = Int(bytes[0]) << 8 | Int(bytes[1])
                let text = String(decoding: bytes.dropFirst(2), as: UTF8.self)
                shared.withLock { $0.machine.peerClosed(code: code, text: text) }
            }
        case LWS_CALLBACK_CLIENT_CLOSED:
            connectionEnded(cause: .closed, reason: "connection closed")
        case LWS_CALLBACK_WSI_DESTROY:
            // The connection being opened is freed (however it ended): never closed again by the timer.
            let freed = shared.withLock { state in
                guard state.opening?.pointer == wsi else { return false }
                state.opening = nil
                return true
            }
            if freed { stopOpening() }
        case LWS_CALLBACK_CLIENT_RECEIVE_PONG:
            shared.withLock { $0.machine.heard(now: .now) }
        case LWS_CALLBACK_CLIENT_APPEND_HANDSHAKE_HEADER:
            // The protocol's header on the upgrade (Alpaca: MessagePack frames, please).
            guard let header = configuration.wire.upstreamUpgradeHeader, let input else { break }
            let cursor = input.assumingMemoryBound(to: UnsafeMutablePointer<UInt8>?.self)
            guard let start = cursor.pointee else { return -1 }
            let end = start + length
            let added = header.name.withCString { name in
                header.value.withCString { value in
                    lws_add_http_header_by_name(
                        wsi, UnsafeRawPointer(name).assumingMemoryBound(to: UInt8.self), UnsafeRawPointer(value).assumingMemoryBound(to: UInt8.self),
                        Int32(header.value.utf8.count), cursor, end)
                }
            }
            if added != 0 { return -1 }
        default:
            break
        }
        return 0
    }

    private enum Wakeup {
        case none, connect, writable(OpaquePointer), drop(OpaquePointer), exit
    }

    private func serviceRequests() {
        scheduleDeadlineCheck()
        let wakeup: Wakeup = shared.withLock { state in
            if state.machine.stopping {
                if let wsi = state.wsi, state.machine.isEstablished {
                    state.closeRequested = true
                    return .writable(wsi.pointer)
                }
                if !state.machine.connectInFlight { state.exitLoop = true }
                return .exit
            }
            if state.dropRequested {
                state.dropRequested = false
                if let wsi = state.wsi { return .drop(wsi.pointer) }
            }
            // Past the deadline no connection is opened; the request waits for a later deadline.
            if state.machine.nextConnect(now: .now) { return .connect }
            if let wsi = state.wsi, state.machine.isEstablished, !state.outbox.isEmpty || state.closeRequested {
                return .writable(wsi.pointer)
            }
            return .none
        }
        switch wakeup {
        case .none, .exit: break
        case .connect: connect()
        case .writable(let wsi): lws_callback_on_writable(wsi)
        // lws closes it at its next service (a second at most), from its own timeout handling.
        case .drop(let wsi): lws_set_timeout(wsi, PENDING_TIMEOUT_USER_OK, 1)
        }
    }

    // MARK: the deadline (service thread only)

    /// (Re)arms the timer for the current deadline after a change.
    private func scheduleDeadlineCheck() {
        let plan: (LWSHandle, LWSTimer, ContinuousClock.Instant?)? = shared.withLock { state in
            guard state.deadlineChanged, let context = state.context, let timer = state.deadlineTimer else { return nil }
            state.deadlineChanged = false
            return (context, timer, state.machine.deadline)
        }
        guard let (context, timer, deadline) = plan else { return }
        let sul = relay_lws_timer_sul(timer.pointer)
        guard let deadline else {
            lws_sul_cancel(sul)
            return
        }
        lws_sul_schedule(context.pointer, 0, sul, relayLWSDeadlineCallback, max(0, (deadline - .now).microseconds))
    }

    /// Called by the timer: closes the connection at once if the deadline has passed, else re-arms for
    /// the (moved) deadline.
    func deadlineReached() {
        enum Action { case nothing, rearm(LWSHandle, LWSTimer, Int64), close(OpaquePointer) }
        let action: Action = shared.withLock { state in
            let now = ContinuousClock.now
            switch state.machine.deadlineReached(now: now) {
            case .nothing:
                return .nothing
            case .rearm(let after):
                guard let context = state.context, let timer = state.deadlineTimer else { return .nothing }
                return .rearm(context, timer, after.microseconds)
            case .close:
                guard let wsi = state.wsi else { return .nothing }
                state.statistics.deadlineCloses += 1
                state.statistics.lastDeadlineClose = now
                return .close(wsi.pointer)
            }
        }
        switch action {
        case .nothing:
            break
        case .rearm(let context, let timer, let microseconds):
            lws_sul_schedule(context.pointer, 0, relay_lws_timer_sul(timer.pointer), relayLWSDeadlineCallback, max(0, microseconds))
        case .close(let wsi):
            logger.warning("upstream closed: the cluster lease this node was given passed without renewal")
            // Not inside a callback of this wsi, so it may be closed synchronously: the socket is gone
            // when this returns.
            lws_set_timeout(wsi, PENDING_TIMEOUT_USER_OK, relay_lws_to_kill_sync())
        }
    }

    private func connect() {
        guard let (context, retryPolicy) = shared.withLock({ state in state.context.map { ($0.pointer, state.retryPolicy?.pointer) } })
        else { return }
        setState(.connecting)
        shared.withLock { $0.statistics.connectAttempts += 1 }
        let endpoint = configuration.endpoint
        let hostHeader = (endpoint.port == (endpoint.secure ? 443 : 80)) ? endpoint.host : "\(endpoint.host):\(endpoint.port)"
        let wsi: OpaquePointer? = endpoint.host.withCString { host in
            endpoint.path.withCString { path in
                hostHeader.withCString { hostHeader in
                    Self.protocolName.withCString { protocolName in
                        var info = lws_client_connect_info()
                        info.context = context
                        info.address = host
                        info.port = Int32(endpoint.port)
                        info.path = path
                        info.host = hostHeader
                        info.origin = hostHeader
                        info.ietf_version_or_minus_one = -1
                        info.local_protocol_name = protocolName
                        // A redirect is not followed: the credentials go to the host configured, never
                        // to one the upstream names (in the clear, or anywhere).
                        info.ssl_connection = (endpoint.secure ? relay_lws_client_flag_use_ssl() : 0) | relay_lws_client_flag_no_follow_redirect()
                        info.retry_and_idle_policy = retryPolicy
                        return lws_client_connect_via_info(&info)
                    }
                }
            }
        }
        guard let wsi else {
            // lws may or may not have reported CONNECTION_ERROR already; connectionEnded reports once.
            connectionEnded(cause: .failed, reason: "connection failed: could not start the connection")
            return
        }
        // lws's own timeouts do not give up a server that takes the TCP connection and never answers
        // the upgrade: the relay's do, within the handshake timeout.
        let timer: LWSTimer? = shared.withLock { state in
            // (Failed already inside the call: its destroy came first, and nothing is left to give up.)
            guard state.machine.connectInFlight, state.wsi == nil else { return nil }
            state.opening = LWSHandle(pointer: wsi)
            return state.openingTimer
        }
        if let timer {
            lws_sul_schedule(
                context, 0, relay_lws_timer_sul(timer.pointer), relayLWSOpeningCallback, max(configuration.handshakeTimeout.microseconds, 1))
        }
    }

    /// The connection being opened is established or gone: its timer is cancelled.
    private func stopOpening() {
        guard let timer = shared.withLock({ $0.openingTimer }) else { return }
        lws_sul_cancel(relay_lws_timer_sul(timer.pointer))
    }

    /// Called by the opening timer (service thread): a connection not open within the handshake
    /// timeout is reported failed and closed at once.
    func connectDeadlineReached() {
        let pending: OpaquePointer? = shared.withLock { state in
            defer { state.opening = nil }
            return state.wsi == nil ? state.opening?.pointer : nil
        }
        guard let pending else { return }
        connectionEnded(
            cause: .failed, reason: "connection failed: the upstream did not open the WebSocket within \(configuration.handshakeTimeout)")
        // Not inside a callback of this wsi: closed synchronously (its own failure report then is one too many, and dropped).
        lws_set_timeout(pending, PENDING_TIMEOUT_USER_OK, relay_lws_to_kill_sync())
    }

    private func connectionEnded(cause: ConnectionEnd.Cause, reason: String) {
        // Whatever was being opened is over (lws frees it after this report).
        stopOpening()
        let ended: UpstreamConnectionMachine.Ended? = shared.withLock { state in
            state.opening = nil
            guard let ended = state.machine.ended(cause, reason: reason, now: .now) else { return nil }
            state.wsi = nil
            state.closeRequested = false
            state.outbox = []
            state.outboxBytes = 0
            state.rx.clear()
            state.rxOversized = false
            switch ended {
            case .stopped: state.exitLoop = true
            case .lost(let end, _, _): state.statistics.reconnectsByCause[end.cause.rawValue, default: 0] += 1
            }
            return ended
        }
        switch ended {
        case nil:
            return
        case .stopped:
            setState(.stopped)
        case .lost(var end, let state, let retryAfter):
            metrics.reconnects[end.cause]?.increment()
            bars.reset()
            inbox.push(.connectionLost(reason: end.reason))
            if let state { setState(state) }
            end.retryAfter = retryAfter
            endContinuation.yield(end)
        }
    }

    private func write(wsi: OpaquePointer) -> Int32 {
        enum Next { case close, send([UInt8], more: Bool), nothing }
        let next: Next = shared.withLock { state in
            if state.closeRequested { return .close }
            guard !state.outbox.isEmpty else { return .nothing }
            let message = state.outbox.removeFirst()
            state.outboxBytes -= message.count
            return .send(message, more: !state.outbox.isEmpty)
        }
        switch next {
        case .nothing:
            return 0
        case .close:
            lws_close_reason(wsi, LWS_CLOSE_STATUS_NORMAL, nil, 0)
            return -1
        case .send(let message, let more):
            // lws needs LWS_PRE bytes of headroom before the payload.
            let pre = relay_lws_pre()
            var buffer = [UInt8](repeating: 0, count: pre)
            buffer += message
            let count = buffer.count - pre
            let binary = configuration.wire.upstreamSendsBinary
            let written = buffer.withUnsafeMutableBufferPointer { pointer -> Int32 in
                guard let base = pointer.baseAddress else { return -1 }
                return lws_write(wsi, base + pre, count, binary ? LWS_WRITE_BINARY : LWS_WRITE_TEXT)
            }
            if written < count {
                logger.warning("upstream write failed; closing the connection")
                return -1
            }
            if more { lws_callback_on_writable(wsi) }
            return 0
        }
    }

    private func receive(wsi: OpaquePointer, input: UnsafeMutableRawPointer?, length: Int) {
        let isFinal = lws_is_final_fragment(wsi) != 0
        let (complete, oversizedBytes, alive): (ByteBuffer?, Int, Bool) = shared.withLock { state in
            let now = ContinuousClock.now
            state.machine.heard(now: now)
            // A whole message is as good a sign of life as a pong: a server streaming data whose pong is
            // behind the backlog (or that answers none) is not hung up on. Told once a second at most.
            var alive = false
            if isFinal, state.confirmedAt.map({ now - $0 >= .seconds(1) }) ?? true {
                state.confirmedAt = now
                alive = true
            }
            if !state.rxOversized {
                if state.rx.readableBytes + length > configuration.maxMessageBytes {
                    state.rxOversized = true
                    state.rxOversizedBytes = state.rx.readableBytes
                    state.rx.clear()
                } else if let input, length > 0 {
                    state.rx.writeBytes(UnsafeRawBufferPointer(start: input, count: length))
                }
            }
            if state.rxOversized { state.rxOversizedBytes += length }
            guard isFinal else { return (nil, 0, false) }
            if state.rxOversized {
                state.rxOversized = false
                state.statistics.oversizedMessages += 1
                return (nil, state.rxOversizedBytes, alive)
            }
            let message = state.rx
            state.rx = ByteBuffer()
            state.statistics.messagesReceived += 1
            return (message, 0, alive)
        }
        guard isFinal else { return }
        if alive { lws_validity_confirmed(wsi) }
        guard let complete else {
            metrics.oversized.increment()
            bars.reset()  // its trades are lost: no bar open now is whole
            let reason = "an upstream message of \(oversizedBytes) bytes, over this market's limit of \(configuration.maxMessageBytes), was dropped"
            logThrottled("oversized", reason)
            // Its clients are told: what the message held is missing from their stream (and the tape's).
            inbox.push(.lost(count: 1, topics: nil, reason: reason))
            return
        }
        metrics.messages.increment()
        process(complete, wsi: wsi)
    }

    /// A status that ended the connection (or a stop) asked for its close: nothing it sends after that is
    /// taken (lws hands over every frame already read before the close is written).
    private var closing: Bool { shared.withLock { $0.closeRequested } }

    private func process(_ message: ByteBuffer, wsi: OpaquePointer) {
        if closing { return }
        let parsed: UpstreamReading
        do {
            parsed = try configuration.wire.readUpstream(message, receivedAt: MonotonicClock.nanoseconds(), market: marketOfFrames)
        } catch {
            shared.withLock { $0.statistics.malformedMessages += 1 }
            metrics.malformed.increment()
            bars.reset()
            logThrottled("malformed", "malformed upstream message dropped (\(message.readableBytes) bytes): \(error)")
            return
        }
        for control in parsed.controls {
            handle(control, wsi: wsi)
            // A status that ends the connection ends its message too: nothing after it is taken (a
            // thousand `auth_success`, `auth_failed` pairs would subscribe everything a thousand times
            // over, to be dropped at the close).
            if closing { return }
        }
        guard !parsed.events.isEmpty else { return }
        let (passing, refused, problem) = eventCheck.passing(parsed.events)
        if refused > 0, let problem {
            shared.withLock { $0.statistics.refusedEvents += refused }
            metrics.refused.increment(by: refused)
            logThrottled("refused", "upstream events dropped (\(refused) in a message of \(message.readableBytes) bytes): \(problem)")
        }
        guard !passing.isEmpty else { return }
        let count = passing.count
        shared.withLock { $0.statistics.eventsReceived += count }
        metrics.events.increment(by: count)
        // Events are slices of their message; a large message is not kept alive by a few of them.
        let events = message.readableBytes > configuration.compactMessagesAbove ? MarketEvent.compacted(passing) : passing
        guard bars.push(events, into: inbox) else {
            // The consumer is this far behind: dropped, counted, and announced in place by the inbox.
            shared.withLock { $0.statistics.droppedEvents += count }
            metrics.dropped.increment(by: count)
            logThrottled("queue full", "upstream events dropped: events of \(configuration.maxQueuedEvents) (each 4 KB of one weighing one more) already wait for the hub")
            return
        }
    }

    /// A warning (or a line at `level`) that may repeat at the upstream's message rate: logged at most
    /// every ten seconds, with the count of those held back.
    private func logThrottled(_ key: String, _ message: @autoclosure () -> String, level: Logger.Level = .warning) {
        warnings.log(level, key, "\(message())", to: logger)
    }

    /// Carries out what the connection's logic says a status means.
    private func handle(_ control: UpstreamControl, wsi: OpaquePointer) {
        let outcome = shared.withLock { state in
            let outcome = state.machine.received(control, now: .now)
            enqueue(outcome.send, &state)
            switch outcome.event {
            case .error(let message): state.statistics.lastError = message
            case .refused(let code, let message, let topics): state.statistics.lastError = "\(code) \(message) (\(topics.count) topics refused)"
            case .authTimeout(let message): state.statistics.lastError = "auth_timeout: \(message)"
            default: break
            }
            if outcome.close { state.closeRequested = true }
            return outcome
        }
        if outcome.authenticated {
            lws_set_timeout(wsi, NO_PENDING_TIMEOUT, 0)
            inbox.push(.authenticated)
        }
        if let state = outcome.state { setState(state) }
        switch outcome.event {
        case .connected, .authenticated, .authFailed, .maxConnections:
            break
        case .acknowledged(let message):
            logger.debug("upstream: \(message)")
        case .error(let message):
            logThrottled("error-status", "upstream error status: \(message)")
        case .refused(let code, let message, let topics):
            // The clients of these topics are told: their subscription gets nothing from upstream.
            logThrottled("refused", "upstream refused a subscription of \(topics.count) topics: \(code) \(message)")
            // The bars built from a refused trade topic get nothing either.
            if !topics.isEmpty { inbox.push(.refused(topics: topics.union(bars.derived(from: topics)), code: code, reason: message)) }
        case .authTimeout(let message):
            // Statuses are the server's to repeat (a frame of thousands): logged at most every ten seconds.
            logThrottled("auth-timeout", "upstream timed out our authentication: \(message)")
        case .other(let status, let message):
            // As often as the upstream says them: logged at most every ten seconds too.
            logThrottled("other-status", "upstream status \(status): \(message)", level: .info)
        }
        if !outcome.send.isEmpty || outcome.close { lws_callback_on_writable(wsi) }
    }
}

/// A libwebsockets object pointer kept in ``LWSConnection/Shared``.
///
/// `@unchecked Sendable` at the C boundary: lws objects are only used on the service thread, except
/// `lws_cancel_service`, which lws documents as safe from any thread and which is only called under the
/// lock that also guards the context's destruction.
struct LWSHandle: @unchecked Sendable {
    let pointer: OpaquePointer
}

/// The retry and idle policy lws keeps a pointer to; see ``LWSHandle`` for why this is `Sendable`.
struct LWSRetryPolicy: @unchecked Sendable {
    let pointer: UnsafePointer<lws_retry_bo_t>
}

/// The deadline timer lws keeps in its scheduler; only armed, cancelled and freed on the service
/// thread. See ``LWSHandle`` for why this is `Sendable`.
struct LWSTimer: @unchecked Sendable {
    let pointer: UnsafeMutablePointer<relay_lws_timer>
}

extension Duration {
    /// Whole microseconds (truncated), for lws's scheduler.
    fileprivate var microseconds: Int64 {
        let (seconds, attoseconds) = components
        return seconds * 1_000_000 + attoseconds / 1_000_000_000_000
    }
}
