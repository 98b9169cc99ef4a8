import AsyncSupport
import CNats
import Dispatch
import Foundation
import Logging
import MarketCore
import NIOPosix
import Synchronization

/// Where the connection to NATS stands, as libnats reports it. Value type, `Sendable`.
public enum NATSState: String, Sendable, Equatable {
    /// Not connected yet; libnats retries in the background (and the connection is built again if
    /// libnats gives up).
    case connecting
    case connected
    /// Lost; libnats reconnects in the background and restores every subscription.
    case reconnecting
    /// Closed for good: shut down, or the TLS and credential settings could not be used.
    case closed
}

/// Errors from NATS and JetStream, with libnats' own text.
public enum NATSError: Error, Sendable, CustomStringConvertible {
    /// The server answered and refused (e.g. a key-value update whose revision is no longer the last).
    case rejected(String)
    /// No answer: not connected, timed out.
    case unavailable(String)
    /// Connected, but nothing answers where a bucket's stream should: it does not exist (NATS lost it,
    /// e.g. a restart of a server that kept it in memory, or JetStream is off).
    case gone(String)

    public var description: String {
        switch self {
        case .rejected(let text): "refused by NATS: \(text)"
        case .unavailable(let text): "NATS unavailable: \(text)"
        case .gone(let text): "NATS has no such bucket (\(text))"
        }
    }
}

/// The relay's connection to NATS, on the official C client (libnats).
///
/// libnats reconnects by itself once it has been connected, forever (`MaxReconnect` -1), and retries a
/// failed first connect in the background (`RetryOnFailedConnect`). One case it gives up on: libnats
/// 3.4.1 closes the connection for good when the *first* attempt reached a server that accepted the TCP
/// connection but did not complete the NATS handshake (a stalled server or proxy; fixed upstream in
/// nats.c 77843e72, after 3.4.1), and it also closes it after the same authentication error twice. A
/// connection this type did not close is therefore never left closed: it is built again, with the same
/// options, after a backoff (0.25 s doubling to 4 s), and every subscription made on it is made again on
/// the new one (a ``NATSSubscription`` is a handle that follows the rebuild). The connection given up is
/// destroyed once no call uses it (``NATSHandle``): a node retrying for days holds no more memory. Until a connection is built
/// (the first attempt runs on a queue of its own, not in `init`), publishes are refused and
/// subscriptions wait for it.
///
/// Concurrency contract (the C boundary): libnats is thread-safe — every call below may be made from
/// any thread, and libnats guards its own objects with its own locks — and it calls back on threads of
/// its own. The Swift state here (`shared`) is only touched under its `Mutex`. Calls that wait for a
/// server answer (key-value operations) run on a dispatch queue of their own, never on the cooperative
/// thread pool, as does building a connection (its first attempt waits up to the 2 s connect timeout).
/// The objects handed to libnats as callback closures (this connection, each ``NATSMessageSink``) are
/// retained for the life of the process: libnats may still call back on its threads while a connection
/// closes, so they are never freed under it. Callbacks about a connection that is no longer the current
/// one are ignored.
public final class NATSConnection: Sendable {
    struct Shared {
        /// The current libnats connection and its JetStream context.
        var connection: NATSHandle?
        /// Kept to build the connection again (libnats copies them on each connect).
        var options: NATSPointer?
        var state: NATSState = .connecting
        var watchers: [UInt64: AsyncStream<NATSState>.Continuation] = [:]
        var nextWatcher: UInt64 = 0
        /// Told of each change on the thread that makes it, before the watchers (``onChange(_:)``).
        var changeHandlers: [@Sendable (_ old: NATSState, _ new: NATSState) -> Void] = []
        var closed = false
        var lastError: String?
        var setupError: String?
        /// Every live subscription, made again on each new connection.
        var subscriptions: [UInt64: Registered] = [:]
        var nextSubscription: UInt64 = 1
        /// Connections built so far (each a break in what this node saw of NATS).
        var builds: UInt64 = 0
        /// Builds that failed or were closed by libnats since the last time one was connected.
        var failedBuilds = 0
        var everConnected = false
        /// The problems of building logged since the connection was last connected (each once).
        var buildProblems: Set<String> = []
    }

    /// A subscription as made by a caller, and its libnats subscription on the current connection.
    struct Registered {
        var subject: String
        var sink: NATSMessageSink
        var pendingLimit: Int
        var pendingBytes: Int
        var pointer: NATSPointer?
    }

    public let servers: [String]
    /// The servers without user information, for logs.
    public let displayServers: String
    let shared = Mutex(Shared())
    let logger: Logger
    let requestTimeout: Duration
    let onSlowConsumer: Mutex<(@Sendable (NATSSubscription?) -> Void)?> = Mutex(nil)
    /// Calls that wait for the server (key-value requests, flushes) run on these threads of their own,
    /// at most ``requestThreads`` at once; more wait their turn here. Their callers are bounded: 8
    /// `/v1/last` lookups and 4 seeding reads per node, the whole-state asker, the connections' own
    /// flushes, the shared REST budget (four calls per account, one once NATS failed to answer); the lease has a
    /// thread of its own. Not on a concurrent dispatch queue: on Linux that shares its threads with
    /// every `Task.sleep` of the process (their timers fire there), and calls held up to the request
    /// timeout while NATS stalls delayed a 100 ms sleep by 14 s (sixteen of them), the lease's own
    /// deadline among them.
    static let requestPool: NIOThreadPool = {
        let pool = NIOThreadPool(numberOfThreads: requestThreads)
        pool.start()
        return pool
    }()
    static let requestThreads = 16
    /// Builds this connection (a blocking connect), one at a time.
    private let buildQueue = DispatchQueue(label: "relay-nats-connect")
    /// The delay before building again after a build failed or libnats closed the connection.
    static let rebuildBackoff = Backoff(initial: .milliseconds(250), cap: .seconds(4))

    /// - Parameters:
    ///   - servers: `nats://host:port` URLs; libnats picks among them and fails over.
    ///   - name: the client name NATS shows for this connection.
    ///   - security: TLS and credentials; a file that cannot be used leaves the connection closed with
    ///     ``setupError`` saying why (not built again: the files are the operator's to fix).
    public init(
        servers: [String], name: String, security: ClusterConfiguration.Security = .init(), requestTimeout: Duration = .seconds(1),
        logger: Logger
    ) {
        self.servers = servers
        self.displayServers = servers.map(ClusterConfiguration.redacted).joined(separator: ",")
        self.logger = logger
        self.requestTimeout = requestTimeout
        Self.openLibrary()
        var options: OpaquePointer?
        guard natsOptions_Create(&options) == NATS_OK, let options else {
            shared.withLock {
                $0.state = .closed
                $0.setupError = "libnats could not allocate its options"
            }
            return
        }
        let closure = Unmanaged.passRetained(self).toOpaque()
        var cServers = servers.map { strdup($0) }
        defer { for pointer in cServers { free(pointer) } }
        _ = cServers.withUnsafeMutableBufferPointer { buffer in
            guard let base = buffer.baseAddress else { return NATS_INVALID_ARG }
            return base.withMemoryRebound(to: UnsafePointer<CChar>?.self, capacity: buffer.count) {
                natsOptions_SetServers(options, $0, Int32(buffer.count))
            }
        }
        _ = natsOptions_SetName(options, name)
        _ = natsOptions_SetTimeout(options, 2000)
        _ = natsOptions_SetMaxReconnect(options, -1)
        _ = natsOptions_SetReconnectWait(options, 250)
        _ = natsOptions_SetReconnectJitter(options, 250, 1000)
        _ = natsOptions_SetPingInterval(options, 2000)
        _ = natsOptions_SetMaxPingsOut(options, 2)
        // Publishes while reconnecting are buffered up to this much, then refused (not queued forever).
        _ = natsOptions_SetReconnectBufSize(options, 8 * 1024 * 1024)
        _ = natsOptions_SetMaxPendingMsgs(options, 200_000)
        // One delivery thread for all subscriptions: messages reach us in the order NATS sent them,
        // across subjects, so an upstream notice never overtakes the events before it.
        _ = natsOptions_UseGlobalMessageDelivery(options, true)
        _ = natsOptions_SetRetryOnFailedConnect(options, true, natsConnectedCallback, closure)
        _ = natsOptions_SetDisconnectedCB(options, natsDisconnectedCallback, closure)
        _ = natsOptions_SetReconnectedCB(options, natsReconnectedCallback, closure)
        _ = natsOptions_SetClosedCB(options, natsClosedCallback, closure)
        _ = natsOptions_SetErrorHandler(options, natsErrorCallback, closure)
        if let problem = Self.apply(security, secure: servers.contains { $0.lowercased().hasPrefix("tls://") }, to: options) {
            natsOptions_Destroy(options)
            logger.error("NATS connection could not be set up: \(problem)")
            shared.withLock {
                $0.state = .closed
                $0.lastError = problem
                $0.setupError = problem
            }
            return
        }
        shared.withLock { $0.options = NATSPointer(options) }
        build(after: .zero)
    }

    /// Sets TLS and credentials on `options`; why not, if one cannot be used.
    private static func apply(_ security: ClusterConfiguration.Security, secure: Bool, to options: OpaquePointer) -> String? {
        func check(_ status: natsStatus, _ what: String) -> String? {
            status == NATS_OK ? nil : "\(what): \(lastErrorText(status))"
        }
        if secure || security.requiresTLS, let problem = check(natsOptions_SetSecure(options, true), "TLS") { return problem }
        if let file = security.caFile, let problem = check(natsOptions_LoadCATrustedCertificates(options, file), "CA file \(file)") {
            return problem
        }
        if let certificate = security.certificateFile {
            guard let key = security.keyFile else { return "a client certificate needs its key file" }
            let status = natsOptions_LoadCertificatesChain(options, certificate, key)
            if let problem = check(status, "certificate \(certificate) / key \(key)") { return problem }
        }
        if let file = security.credentialsFile,
            let problem = check(natsOptions_SetUserCredentialsFromFiles(options, file, nil), "credentials file \(file)")
        {
            return problem
        }
        if let file = security.nkeySeedFile {
            let publicKey: String
            do throws(NKeyError) { publicKey = try NKey.publicKey(fromSeedFile: file) } catch { return "NKey seed file \(file): \(error)" }
            if let problem = check(natsOptions_SetNKeyFromSeed(options, publicKey, file), "NKey seed file \(file)") { return problem }
        }
        if let token = security.token, let problem = check(natsOptions_SetToken(options, token), "token") { return problem }
        return nil
    }

    /// Why the connection could not be set up (a TLS or credentials file that cannot be used).
    public var setupError: String? { shared.withLock { $0.setupError } }

    private static let opened: Void = {
        _ = nats_Open(-1)
        _ = nats_SetMessageDeliveryPoolSize(1)
    }()

    private static func openLibrary() { _ = opened }

    /// libnats' text for a failed call's `status`: this thread's last error when it is that status (an
    /// older one, of another call on this thread, would mislead), else the status's own text.
    static func lastErrorText(_ status: natsStatus) -> String {
        var last = NATS_OK
        if let text = nats_GetLastError(&last), last != NATS_OK, last == status || status == NATS_OK { return String(cString: text) }
        return String(cString: natsStatus_GetText(status))
    }

    // MARK: building the connection

    /// Builds a libnats connection after `delay`, on ``buildQueue``: connects (its first attempt blocks
    /// for at most the connect timeout; libnats retries in the background after that), makes every
    /// registered subscription on it, and makes it the current one. A failed build is tried again.
    private func build(after delay: Duration) {
        buildQueue.asyncAfter(deadline: .now() + .milliseconds(Int(delay.milliseconds))) { [self] in
            guard let options = shared.withLock({ $0.closed ? nil : $0.options }) else { return }
            var made: OpaquePointer?
            let status = natsConnection_Connect(&made, options.pointer)
            guard let made, status == NATS_OK || status == NATS_NOT_YET_CONNECTED else {
                buildFailed(Self.lastErrorText(status))
                return
            }
            var jsOptions = jsOptions()
            jsOptions_Init(&jsOptions)
            jsOptions.Wait = requestTimeout.milliseconds
            var jetStream: OpaquePointer?
            _ = natsConnection_JetStream(&jetStream, made, &jsOptions)
            let handle = NATSHandle(made, jetStream: jetStream)
            let installed: Bool = shared.withLock { state in
                guard !state.closed else { return false }
                state.connection = handle
                state.builds += 1
                for id in state.subscriptions.keys {
                    guard let registered = state.subscriptions[id] else { continue }
                    state.subscriptions[id]?.pointer = Self.subscribe(made, registered, logger: logger)
                }
                return true
            }
            guard installed else {
                natsConnection_Close(made)
                return
            }
            if status == NATS_NOT_YET_CONNECTED {
                note(buildProblem: "NATS not reachable yet; retrying in the background")
            }
            reconcile(made)
        }
    }

    /// Once a connection is current: its state as libnats has it now (callbacks about it that came
    /// before it was current were ignored).
    private func reconcile(_ connection: OpaquePointer) {
        switch natsConnection_Status(connection) {
        case NATS_CONN_STATUS_CONNECTED: connected(connection)
        case NATS_CONN_STATUS_CLOSED: closedByLibrary(connection)
        case NATS_CONN_STATUS_RECONNECTING, NATS_CONN_STATUS_DISCONNECTED:
            if shared.withLock({ $0.everConnected }) { set(.reconnecting) }
        default: break
        }
    }

    private func buildFailed(_ problem: String) {
        note(buildProblem: "NATS connection could not be made: \(problem); trying again")
        let attempt: Int? = shared.withLock { state in
            guard !state.closed else { return nil }
            state.lastError = problem
            state.failedBuilds += 1
            return state.failedBuilds
        }
        if let attempt { build(after: Self.rebuildBackoff.delay(attempt: attempt)) }
    }

    /// Logs a problem of building once until the connection is connected again (a node retrying for
    /// hours logs a line or two).
    private func note(buildProblem text: String) {
        let fresh = shared.withLock { $0.buildProblems.insert(text).inserted }
        if fresh { logger.warning("\(text)", metadata: ["servers": "\(displayServers)"]) }
    }

    /// Whether `connection` is the current one.
    private func isCurrent(_ connection: OpaquePointer?) -> Bool {
        guard let connection else { return false }
        return shared.withLock { $0.connection?.connection == connection }
    }

    // MARK: libnats' callbacks (on its threads)

    func connected(_ connection: OpaquePointer?) {
        guard isCurrent(connection) else { return }
        let first = shared.withLock { state in
            defer {
                state.everConnected = true
                state.failedBuilds = 0
                state.buildProblems.removeAll()
            }
            return !state.everConnected
        }
        if first { logger.info("NATS connected", metadata: ["servers": "\(displayServers)"]) }
        set(.connected)
    }

    func disconnected(_ connection: OpaquePointer?) {
        // A disconnect while we close on purpose is not news.
        guard isCurrent(connection), !isClosing else { return }
        set(shared.withLock { $0.everConnected } ? .reconnecting : .connecting)
    }

    /// libnats closed `connection`: for good if this type closed it, else it is built again.
    func closedByLibrary(_ connection: OpaquePointer?) {
        let given: (attempt: Int, subscriptions: [NATSPointer], retired: NATSHandle)? = shared.withLock { state in
            guard !state.closed, let current = state.connection, current.connection == connection else { return nil }
            // No publish or subscribe reaches a closed connection; the next build takes over. The
            // connection is destroyed when the last call holding it returns (not under this lock).
            state.connection = nil
            var subscriptions: [NATSPointer] = []
            for id in state.subscriptions.keys {
                if let pointer = state.subscriptions[id]?.pointer { subscriptions.append(pointer) }
                state.subscriptions[id]?.pointer = nil
            }
            state.failedBuilds += 1
            return (state.failedBuilds, subscriptions, current)
        }
        guard let (attempt, subscriptions, retired) = given else {
            if isClosing { set(.closed) }
            return
        }
        defer { withExtendedLifetime(retired) {} }
        // Closed with their connection: what is left of them is freed.
        for subscription in subscriptions { natsSubscription_Destroy(subscription.pointer) }
        var text: UnsafePointer<CChar>?
        if let connection { _ = natsConnection_GetLastError(connection, &text) }
        let why = text.map { String(cString: $0) }.flatMap { $0.isEmpty ? nil : $0 } ?? "no error given"
        note(buildProblem: "NATS connection closed by libnats (\(why)); building it again")
        set(shared.withLock { $0.everConnected } ? .reconnecting : .connecting)
        build(after: Self.rebuildBackoff.delay(attempt: attempt))
    }

    // MARK: state

    public var state: NATSState { shared.withLock { $0.state } }

    /// Whether ``close()`` was called.
    var isClosing: Bool { shared.withLock { $0.closed } }

    /// libnats' last error on this connection, if any.
    public var lastError: String? { shared.withLock { $0.lastError } }

    /// Changes whenever this node may have missed something NATS stored: with each connection built and
    /// each reconnect of it (libnats counts a reconnect before the connection is used again), so a
    /// read answered after a change can be told from one answered before.
    public var continuity: UInt64 {
        let (builds, connection) = shared.withLock { ($0.builds, $0.connection) }
        var reconnects: UInt64 = 0
        if let connection {
            var statistics: OpaquePointer?
            if natsStatistics_Create(&statistics) == NATS_OK, let statistics {
                if natsConnection_GetStats(connection.connection, statistics) == NATS_OK {
                    _ = natsStatistics_GetCounts(statistics, nil, nil, nil, nil, &reconnects)
                }
                natsStatistics_Destroy(statistics)
            }
        }
        return builds << 32 &+ reconnects
    }

    /// The current state, then every change, until the connection closes.
    public func stateUpdates() -> AsyncStream<NATSState> {
        let (stream, continuation) = AsyncStream.makeStream(of: NATSState.self, bufferingPolicy: .bufferingNewest(8))
        let id: UInt64 = shared.withLock { state in
            let id = state.nextWatcher
            state.nextWatcher += 1
            continuation.yield(state.state)
            if state.state == .closed {
                continuation.finish()
            } else {
                state.watchers[id] = continuation
            }
            return id
        }
        continuation.onTermination = { [weak self] _ in
            _ = self?.shared.withLock { $0.watchers.removeValue(forKey: id) }
        }
        return stream
    }

    /// Calls `handler` with each state change, on the thread that makes it (libnats' callback thread for
    /// a disconnection or a reconnection), before any watcher of ``stateUpdates()`` hears of it: for what
    /// must happen in order with the messages libnats delivers around the change. It must not block.
    public func onChange(_ handler: @escaping @Sendable (_ old: NATSState, _ new: NATSState) -> Void) {
        shared.withLock { $0.changeHandlers.append(handler) }
    }

    func set(_ new: NATSState) {
        let change: (old: NATSState, watchers: [AsyncStream<NATSState>.Continuation], handlers: [@Sendable (NATSState, NATSState) -> Void])? =
            shared.withLock { state in
                let old = state.state
                guard old != .closed, old != new else { return nil }
                state.state = new
                let watchers = Array(state.watchers.values)
                if new == .closed { state.watchers.removeAll() }
                return (old, watchers, state.changeHandlers)
            }
        guard let change else { return }
        for handler in change.handlers { handler(change.old, new) }
        let level: Logger.Level = new == .reconnecting ? .warning : .info
        logger.log(level: level, "NATS \(change.old.rawValue) → \(new.rawValue)", metadata: ["servers": "\(displayServers)"])
        for watcher in change.watchers {
            watcher.yield(new)
            if new == .closed { watcher.finish() }
        }
    }

    func recordError(_ text: String) {
        shared.withLock { $0.lastError = text }
    }

    // MARK: publishing and subscribing

    /// Publishes `bytes` on `subject`; returns at once (libnats buffers and flushes on its own thread).
    /// Refused while no connection is built or it is closed, or when the reconnect buffer is full.
    @discardableResult
    public func publish(_ subject: String, _ bytes: UnsafeRawBufferPointer) -> Bool {
        guard let connection = shared.withLock({ $0.connection }) else { return false }
        return natsConnection_Publish(connection.connection, subject, bytes.baseAddress, Int32(clamping: bytes.count)) == NATS_OK
    }

    /// Drops what libnats holds to publish while it is not connected (its reconnect buffer, up to
    /// 8 MB): closes the connection, and a new one is built after the rebuild backoff (every
    /// subscription made again on it; a bucket bound on the old one fails until it is bound again).
    /// For a leader whose term ended while it was cut off: what it published meanwhile would otherwise
    /// go out once the link is back, in the next leader's term. Whether it was not connected (and so
    /// closed). (A link that stalls without breaking looks connected to libnats: what it wrote to the
    /// socket meanwhile is the kernel's to deliver, out of reach here.)
    public func discardPendingIfDisconnected() async -> Bool {
        guard let handle = shared.withLock({ $0.closed ? nil : $0.connection }),
            natsConnection_Status(handle.connection) != NATS_CONN_STATUS_CONNECTED
        else { return false }
        logger.warning("NATS not connected as this node's term ended: dropping what it still holds to publish (of the ended term), and connecting anew")
        // Off the cooperative pool: libnats' close waits for its threads (a reconnect may be in a
        // connect of up to its timeout).
        await Self.blocking { natsConnection_Close(handle.connection) }
        return true
    }

    @discardableResult
    public func publish(_ subject: String, _ text: String) -> Bool {
        var text = text
        return text.withUTF8 { publish(subject, UnsafeRawBufferPointer($0)) }
    }

    /// Subscribes `sink` to `subject` (wildcards `*` and `>` allowed). libnats restores the subscription
    /// after a reconnect, and it is made again on a rebuilt connection (or on the first one, when none is
    /// built yet). `nil` when the connection is closed.
    /// - Parameter pendingLimit: messages libnats holds for it while its sink is behind (past them, or
    ///   past `pendingBytes`, it drops them and says so: a slow consumer).
    public func subscribe(_ subject: String, sink: NATSMessageSink, pendingLimit: Int = 100_000, pendingBytes: Int = 256 << 20) -> NATSSubscription? {
        let id: UInt64? = shared.withLock { state in
            guard !state.closed else { return nil }
            let id = state.nextSubscription
            state.nextSubscription += 1
            var registered = Registered(subject: subject, sink: sink, pendingLimit: pendingLimit, pendingBytes: pendingBytes)
            if let connection = state.connection {
                registered.pointer = Self.subscribe(connection.connection, registered, logger: logger)
            }
            state.subscriptions[id] = registered
            return id
        }
        return id.map { NATSSubscription(id: $0, subject: subject, connection: self) }
    }

    /// Makes `registered` on `connection` (under ``shared``'s lock: libnats' subscribe only buffers).
    private static func subscribe(_ connection: OpaquePointer, _ registered: Registered, logger: Logger) -> NATSPointer? {
        var subscription: OpaquePointer?
        let status = natsConnection_Subscribe(&subscription, connection, registered.subject, natsMessageCallback, registered.sink.closure)
        guard status == NATS_OK, let subscription else {
            // On a connection libnats already closed, the next build makes it: no news.
            if natsConnection_Status(connection) != NATS_CONN_STATUS_CLOSED {
                logger.warning(
                    "NATS subscribe failed", metadata: ["subject": "\(registered.subject)", "error": "\(lastErrorText(status))"])
            }
            return nil
        }
        _ = natsSubscription_SetPendingLimits(subscription, Int32(clamping: registered.pendingLimit), Int32(clamping: registered.pendingBytes))
        return NATSPointer(subscription)
    }

    /// Ends subscription `id`.
    func unsubscribe(_ id: UInt64) {
        let pointer = shared.withLock { $0.subscriptions.removeValue(forKey: id)?.pointer }
        guard let pointer else { return }
        _ = natsSubscription_Unsubscribe(pointer.pointer)
        natsSubscription_Destroy(pointer.pointer)
    }

    /// Messages libnats dropped for subscription `id` (on the current connection) because it fell behind.
    func dropped(_ id: UInt64) -> Int64 {
        guard let pointer = shared.withLock({ $0.subscriptions[id]?.pointer }) else { return 0 }
        var count: Int64 = 0
        _ = natsSubscription_GetDropped(pointer.pointer, &count)
        return count
    }

    /// The subscription a libnats subscription pointer belongs to (for its slow-consumer report).
    func subscription(for pointer: OpaquePointer) -> NATSSubscription? {
        shared.withLock { state in
            state.subscriptions.first { $0.value.pointer?.pointer == pointer }.map {
                NATSSubscription(id: $0.key, subject: $0.value.subject, connection: self)
            }
        }
    }

    /// Called (on a libnats thread) when a subscription drops messages because its consumer fell
    /// behind: the subscription, when libnats names it.
    public func onSlowConsumer(_ handler: @escaping @Sendable (NATSSubscription?) -> Void) {
        onSlowConsumer.withLock { $0 = handler }
    }

    /// Sends what is buffered and waits (bounded) for the server to confirm it.
    public func flush(timeout: Duration = .seconds(1)) async -> Bool {
        guard let connection = shared.withLock({ $0.connection }) else { return false }
        return await Self.blocking { natsConnection_FlushTimeout(connection.connection, timeout.milliseconds) == NATS_OK }
    }

    /// Closes the connection for good (pending publishes are flushed first, bounded); it is not built
    /// again.
    public func close() async {
        let (connection, first): (NATSHandle?, Bool) = shared.withLock { state in
            guard !state.closed else { return (nil, false) }
            state.closed = true
            return (state.connection, true)
        }
        guard first else { return }
        if let connection {
            await Self.blocking {
                _ = natsConnection_FlushTimeout(connection.connection, 500)
                natsConnection_Close(connection.connection)
            }
        }
        set(.closed)
    }

    // MARK: JetStream key-value

    /// Binds to a key-value bucket, creating it (in memory, one value per key) if it does not exist.
    /// - Parameter ttl: how long a value lives after its last write (at least 100 ms).
    /// - Parameter ownQueue: the bucket's calls wait for the server on a serial queue of its own (a
    ///   thread of their own), not in the shared ``requestPool``, where other buckets' calls may each
    ///   hold a thread up to the request timeout while NATS stalls: for the lease, whose renewals must
    ///   not wait behind `/v1/last` lookups.
    /// - Parameter limits: the bucket holds no value over `valueBytes` and no more than `bytes` in all,
    ///   its oldest values going first past that (made so, or an existing bucket changed so); `nil`:
    ///   libnats' defaults (no limit but the server's, new values refused when one is reached).
    /// - Parameter creating: `false`: only a bucket that exists is bound.
    public func keyValue(
        bucket: String, ttl: Duration?, ownQueue: Bool = false, limits: KeyValueLimits? = nil, creating: Bool = true
    ) async throws(NATSError) -> KeyValueBucket {
        guard let handle = shared.withLock({ $0.connection }), handle.jetStream != nil else {
            throw .unavailable("no JetStream context (not connected)")
        }
        // Opened on its own queue too: the lease's bucket is opened again after NATS came back, when
        // the pool may still be held by lookups.
        let queue = ownQueue ? DispatchQueue(label: "relay-nats-\(bucket)") : nil
        let result: Result<NATSPointer, NATSError> = await Self.blocking(on: queue) {
            // The connection is held until this returns (the store keeps what it needs of it after).
            withExtendedLifetime(handle) {
                guard let jetStream = handle.jetStream else { return .failure(.unavailable("no JetStream context")) }
                var store: OpaquePointer?
                if let limits {
                    let status = Self.limitStream(of: bucket, limits, jetStream: jetStream)
                    guard status == NATS_OK else { return .failure(Self.error(status)) }
                }
                var status = js_KeyValue(&store, jetStream, bucket)
                if status == NATS_NOT_FOUND, creating {
                    var config = kvConfig()
                    kvConfig_Init(&config)
                    config.History = 1
                    config.StorageType = js_MemoryStorage
                    if let ttl { config.TTL = max(ttl.nanoseconds, 100_000_000) }
                    status = bucket.withCString { name in
                        config.Bucket = name
                        return js_CreateKeyValue(&store, jetStream, &config)
                    }
                    // Another node may have created it in between.
                    if status != NATS_OK { status = js_KeyValue(&store, jetStream, bucket) }
                }
                guard status == NATS_OK, let store else { return .failure(Self.error(status)) }
                return .success(NATSPointer(store))
            }
        }
        let store = try result.get()
        let kept: Duration? = await Self.blocking(on: queue) {
            var status: OpaquePointer?
            guard kvStore_Status(&status, store.pointer) == NATS_OK, let status else { return nil }
            defer { kvStatus_Destroy(status) }
            return .nanoseconds(kvStatus_TTL(status))
        }
        return KeyValueBucket(name: bucket, store: store, connection: self, ttl: kept, queue: queue)
    }

    /// Makes a key-value bucket's stream (one value per key, in memory, as libnats makes one) with
    /// `limits`, its oldest values discarded past them. A stream that exists keeps its configuration
    /// but for these three (discard policy, bytes, message size), changed only when they differ. Waits
    /// for the server: called on a blocking queue.
    private static func limitStream(of bucket: String, _ limits: KeyValueLimits, jetStream: OpaquePointer) -> natsStatus {
        let name = "KV_\(bucket)"
        var code = jsErrCode(0)
        var found: UnsafeMutablePointer<jsStreamInfo>?
        let status = js_GetStreamInfo(&found, jetStream, name, nil, &code)
        if status == NATS_OK, let found {
            defer { jsStreamInfo_Destroy(found) }
            guard let existing = found.pointee.Config else { return NATS_ERR }
            let maxMessage = Int32(clamping: limits.valueBytes)
            let current = existing.pointee
            if current.Discard == js_DiscardOld, current.MaxBytes == limits.bytes, current.MaxMsgSize == maxMessage { return NATS_OK }
            var config = current
            config.Discard = js_DiscardOld
            config.MaxBytes = limits.bytes
            config.MaxMsgSize = maxMessage
            var updated: UnsafeMutablePointer<jsStreamInfo>?
            let result = js_UpdateStream(&updated, jetStream, &config, nil, &code)
            if let updated { jsStreamInfo_Destroy(updated) }
            return result
        }
        guard status == NATS_NOT_FOUND else { return status }
        var config = jsStreamConfig()
        jsStreamConfig_Init(&config)
        config.Storage = js_MemoryStorage
        config.Retention = js_LimitsPolicy
        config.Discard = js_DiscardOld
        config.MaxMsgsPerSubject = 1
        config.MaxBytes = limits.bytes
        config.MaxMsgSize = Int32(clamping: limits.valueBytes)
        config.AllowRollup = true
        config.DenyDelete = true
        config.AllowDirect = true
        return withStream(&config, named: name, subject: "$KV.\(bucket).>") { config in
            var info: UnsafeMutablePointer<jsStreamInfo>?
            var status = js_AddStream(&info, jetStream, &config, nil, &code)
            if let made = info { jsStreamInfo_Destroy(made) }
            info = nil
            // Made by another node at the same time: its bounds stand.
            if status != NATS_OK, js_GetStreamInfo(&info, jetStream, name, nil, &code) == NATS_OK { status = NATS_OK }
            if let info { jsStreamInfo_Destroy(info) }
            return status
        }
    }

    /// Runs `body` with `config` naming the stream `name` on its one subject `subject` (the C strings
    /// it points at live for the call): what a stream is made or changed with.
    static func withStream(
        _ config: inout jsStreamConfig, named name: String, subject: String, _ body: (inout jsStreamConfig) -> natsStatus
    ) -> natsStatus {
        name.withCString { name in
            subject.withCString { subject in
                var subjects: [UnsafePointer<CChar>?] = [subject]
                return subjects.withUnsafeMutableBufferPointer { list in
                    config.Name = name
                    config.Subjects = list.baseAddress
                    config.SubjectsLen = 1
                    return body(&config)
                }
            }
        }
    }

    static func error(_ status: natsStatus) -> NATSError {
        let text = lastErrorText(status)
        switch status {
        case NATS_ERR: return .rejected(text)
        // Connected, yet nothing listens where the bucket's stream should: it does not exist.
        case NATS_NO_RESPONDERS: return .gone(text)
        default: return .unavailable(text)
        }
    }

    /// Runs a libnats call that waits for the server and returns its result: on `queue` (a serial
    /// queue of its own, see ``keyValue(bucket:ttl:ownQueue:)``) or in the ``requestPool``.
    static func blocking<T: Sendable>(on queue: DispatchQueue? = nil, _ work: @escaping @Sendable () -> T) async -> T {
        if let queue { return await BlockingWork.run(on: queue, work) }
        return await BlockingWork.run(in: requestPool, work)
    }
}

/// What a key-value bucket may hold: no value over `valueBytes`, no more than `bytes` in all (its
/// oldest values go first past that).
public struct KeyValueLimits: Sendable, Equatable {
    public var valueBytes: Int
    public var bytes: Int64

    public init(valueBytes: Int, bytes: Int64) {
        self.valueBytes = valueBytes
        self.bytes = bytes
    }
}

/// A libnats object pointer (`natsConnection`, `jsCtx`, `kvStore`).
///
/// `@unchecked Sendable` at the C boundary: libnats objects are thread-safe (each guards itself with
/// its own lock), and the relay never frees one while another thread may use it.
struct NATSPointer: @unchecked Sendable {
    let pointer: OpaquePointer
    init(_ pointer: OpaquePointer) { self.pointer = pointer }
}

/// One libnats connection and its JetStream context, destroyed (``natsConnection_Destroy``,
/// ``jsCtx_Destroy``) when the last Swift reference goes: ``NATSConnection`` holds the current one, and
/// each call takes a reference for as long as it uses the pointers. libnats keeps its own references
/// for its threads, subscriptions and key-value stores, so it frees the memory only when they are done.
///
/// `@unchecked Sendable` for the reason given on ``NATSPointer``; immutable.
final class NATSHandle: @unchecked Sendable {
    let connection: OpaquePointer
    let jetStream: OpaquePointer?

    init(_ connection: OpaquePointer, jetStream: OpaquePointer?) {
        self.connection = connection
        self.jetStream = jetStream
    }

    deinit {
        if let jetStream { jsCtx_Destroy(jetStream) }
        natsConnection_Destroy(connection)
    }
}

/// One NATS subscription: a handle that follows the connection when it is built again. `Sendable`.
public struct NATSSubscription: Sendable, Hashable {
    let id: UInt64
    public let subject: String
    let connection: NATSConnection?

    /// Messages libnats dropped for this subscription because it fell behind (on the current connection).
    public var dropped: Int64 { connection?.dropped(id) ?? 0 }

    /// Ends the subscription. Messages already handed to the delivery thread may still arrive.
    public func cancel() { connection?.unsubscribe(id) }

    public static func == (lhs: Self, rhs: Self) -> Bool { lhs.id == rhs.id && lhs.connection === rhs.connection }
    public func hash(into hasher: inout Hasher) { hasher.combine(id) }
}

/// Receives the messages of one or more subscriptions, on libnats' delivery thread: the subject and
/// the payload, valid only during the call (copy what you keep). Must return quickly.
///
/// `Sendable`. Retained for the life of the process (see ``NATSConnection``): make one per kind of
/// subscription, not one per subject.
public final class NATSMessageSink: Sendable {
    let handler: @Sendable (_ subject: UnsafePointer<CChar>, _ payload: UnsafeRawBufferPointer) -> Void

    public init(_ handler: @escaping @Sendable (_ subject: UnsafePointer<CChar>, _ payload: UnsafeRawBufferPointer) -> Void) {
        self.handler = handler
        // Kept for libnats' callbacks; see the type's comment.
        _ = Unmanaged.passRetained(self)
    }

    /// What libnats hands back to the message callback.
    var closure: UnsafeMutableRawPointer { Unmanaged.passUnretained(self).toOpaque() }
}

/// A JetStream key-value bucket. `Sendable`: libnats' `kvStore` is thread-safe; every call that waits
/// for the server runs off the cooperative pool.
public final class KeyValueBucket: Sendable {
    public let name: String
    /// How long the bucket keeps a value after its last write, as the server reported it on bind
    /// (`.zero`: forever); `nil` if the server did not say.
    public let ttl: Duration?
    let store: NATSPointer
    let connection: NATSConnection
    /// Where its calls wait for the server: a serial queue of its own, or (`nil`) the shared request pool.
    let queue: DispatchQueue?

    init(name: String, store: NATSPointer, connection: NATSConnection, ttl: Duration?, queue: DispatchQueue?) {
        self.name = name
        self.store = store
        self.connection = connection
        self.ttl = ttl
        self.queue = queue
    }

    /// One stored value and its revision.
    public struct Entry: Sendable {
        public var value: [UInt8]
        public var revision: UInt64
        public var text: String { String(decoding: value, as: UTF8.self) }
    }

    /// Writes `value` only if `key` has no value (or was deleted): the lease's "take".
    public func create(_ key: String, _ value: String) async throws(NATSError) -> UInt64 {
        let store = self.store
        let result: Result<UInt64, NATSError> = await NATSConnection.blocking(on: queue) {
            var revision: UInt64 = 0
            let status = kvStore_CreateString(&revision, store.pointer, key, value)
            return status == NATS_OK ? .success(revision) : .failure(NATSConnection.error(status))
        }
        return try result.get()
    }

    /// Writes `value` only if `key`'s last revision is still `last`: the lease's "renew".
    public func update(_ key: String, _ value: String, last: UInt64) async throws(NATSError) -> UInt64 {
        let store = self.store
        let result: Result<UInt64, NATSError> = await NATSConnection.blocking(on: queue) {
            var revision: UInt64 = 0
            let status = kvStore_UpdateString(&revision, store.pointer, key, value, last)
            return status == NATS_OK ? .success(revision) : .failure(NATSConnection.error(status))
        }
        return try result.get()
    }

    /// The current value of `key`, or `nil` when it has none (never written, deleted or expired).
    public func get(_ key: String) async throws(NATSError) -> Entry? {
        let store = self.store
        let result: Result<Entry?, NATSError> = await NATSConnection.blocking(on: queue) {
            var entry: OpaquePointer?
            let status = kvStore_Get(&entry, store.pointer, key)
            if status == NATS_NOT_FOUND { return .success(nil) }
            guard status == NATS_OK, let entry else { return .failure(NATSConnection.error(status)) }
            defer { kvEntry_Destroy(entry) }
            let length = Int(kvEntry_ValueLen(entry))
            var value = [UInt8](repeating: 0, count: length)
            if length > 0, let bytes = kvEntry_Value(entry) {
                value.withUnsafeMutableBytes { $0.copyMemory(from: UnsafeRawBufferPointer(start: bytes, count: length)) }
            }
            return .success(Entry(value: value, revision: kvEntry_Revision(entry)))
        }
        return try result.get()
    }

    /// Deletes `key` (a delete marker: the next ``create(_:_:)`` succeeds).
    public func delete(_ key: String) async throws(NATSError) {
        let store = self.store
        let result: Result<Void, NATSError> = await NATSConnection.blocking(on: queue) {
            let status = kvStore_Delete(store.pointer, key)
            return status == NATS_OK ? .success(()) : .failure(NATSConnection.error(status))
        }
        try result.get()
    }

    /// Writes a value without waiting for JetStream's acknowledgement: a plain publish on the key's
    /// subject, which the bucket's stream stores. For values written often, where the next write
    /// repairs a lost one.
    @discardableResult
    public func putWithoutAck(_ key: String, _ bytes: UnsafeRawBufferPointer) -> Bool {
        connection.publish("$KV.\(name).\(key)", bytes)
    }
}

extension Duration {
    var nanoseconds: Int64 {
        let (seconds, attoseconds) = components
        return seconds * 1_000_000_000 + attoseconds / 1_000_000_000
    }
}
