import CNats
import Dispatch
import Foundation
import Logging
import PolygonWire
import Synchronization

/// Where the connection to NATS stands, as libnats reports it. Value type, `Sendable`.
public enum NATSState: String, Sendable, Equatable {
    /// Not connected yet; libnats retries in the background.
    case connecting
    case connected
    /// Lost; libnats reconnects in the background and restores every subscription.
    case reconnecting
    /// Closed for good (shutdown).
    case closed
}

/// Errors from NATS and JetStream, with libnats' own text.
public enum NATSError: Error, Sendable, CustomStringConvertible {
    /// The server answered and refused (e.g. a key-value update whose revision is no longer the last).
    case rejected(String)
    /// No answer: not connected, timed out, no JetStream.
    case unavailable(String)

    public var description: String {
        switch self {
        case .rejected(let text): "refused by NATS: \(text)"
        case .unavailable(let text): "NATS unavailable: \(text)"
        }
    }
}

/// The relay's connection to NATS, on the official C client (libnats).
///
/// Concurrency contract (the C boundary): libnats is thread-safe — every call below may be made from
/// any thread, and libnats guards its own objects with its own locks — and it calls back on threads of
/// its own. The Swift state here (`shared`) is only touched under its `Mutex`. Calls that wait for a
/// server answer (key-value operations) run on a dispatch queue of their own, never on the cooperative
/// thread pool. The objects handed to libnats as callback closures (this connection, each
/// ``NATSMessageSink``) are retained for the life of the process: libnats may still call back on its
/// threads while a connection closes, so they are never freed under it.
public final class NATSConnection: Sendable {
    struct Shared {
        var connection: NATSPointer?
        var jetStream: NATSPointer?
        var state: NATSState = .connecting
        var watchers: [UInt64: AsyncStream<NATSState>.Continuation] = [:]
        var nextWatcher: UInt64 = 0
        var closed = false
        var lastError: String?
        var setupError: String?
    }

    public let servers: [String]
    /// The servers without user information, for logs.
    public let displayServers: String
    let shared = Mutex(Shared())
    let logger: Logger
    let onSlowConsumer: Mutex<(@Sendable (NATSSubscription?) -> Void)?> = Mutex(nil)
    /// Blocking requests (key-value) run here, off the cooperative pool.
    static let requestQueue = DispatchQueue(label: "relay-nats-requests", attributes: .concurrent)

    /// - Parameters:
    ///   - servers: `nats://host:port` URLs; libnats picks among them and fails over.
    ///   - name: the client name NATS shows for this connection.
    ///   - security: TLS and credentials; a file that cannot be used leaves the connection closed with
    ///     ``setupError`` saying why.
    public init(
        servers: [String], name: String, security: ClusterConfiguration.Security = .init(), requestTimeout: Duration = .seconds(1),
        logger: Logger
    ) {
        self.servers = servers
        self.displayServers = servers.map(ClusterConfiguration.redacted).joined(separator: ",")
        self.logger = logger
        Self.openLibrary()
        var options: OpaquePointer?
        guard natsOptions_Create(&options) == NATS_OK, let options else {
            shared.withLock { $0.state = .closed }
            return
        }
        defer { natsOptions_Destroy(options) }
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
            logger.error("NATS connection could not be set up: \(problem)")
            shared.withLock {
                $0.state = .closed
                $0.lastError = problem
                $0.setupError = problem
            }
            return
        }

        var connection: OpaquePointer?
        let status = natsConnection_Connect(&connection, options)
        guard let connection, status == NATS_OK || status == NATS_NOT_YET_CONNECTED else {
            let text = Self.lastErrorText(status)
            logger.error("NATS connection could not be set up: \(text)")
            shared.withLock {
                $0.state = .closed
                $0.lastError = text
            }
            return
        }
        var jsOptions = jsOptions()
        jsOptions_Init(&jsOptions)
        jsOptions.Wait = requestTimeout.milliseconds
        var jetStream: OpaquePointer?
        _ = natsConnection_JetStream(&jetStream, connection, &jsOptions)
        shared.withLock { state in
            state.connection = NATSPointer(connection)
            state.jetStream = jetStream.map(NATSPointer.init)
            if status == NATS_OK, state.state == .connecting { state.state = .connected }
        }
        if status == NATS_OK {
            logger.info("NATS connected", metadata: ["servers": "\(displayServers)"])
        } else {
            logger.warning(
                "NATS not reachable yet; retrying in the background", metadata: ["servers": "\(displayServers)"])
        }
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

    static func lastErrorText(_ status: natsStatus) -> String {
        var last = NATS_OK
        if let text = nats_GetLastError(&last), last != NATS_OK { return String(cString: text) }
        return String(cString: natsStatus_GetText(status))
    }

    // MARK: state

    public var state: NATSState { shared.withLock { $0.state } }

    /// Whether ``close()`` was called.
    var isClosing: Bool { shared.withLock { $0.closed } }

    /// libnats' last error on this connection, if any.
    public var lastError: String? { shared.withLock { $0.lastError } }

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

    func set(_ new: NATSState) {
        let change: (old: NATSState, watchers: [AsyncStream<NATSState>.Continuation])? = shared.withLock { state in
            let old = state.state
            guard old != .closed, old != new else { return nil }
            state.state = new
            let watchers = Array(state.watchers.values)
            if new == .closed { state.watchers.removeAll() }
            return (old, watchers)
        }
        guard let change else { return }
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
    /// Refused while closed, or when the reconnect buffer is full.
    @discardableResult
    public func publish(_ subject: String, _ bytes: UnsafeRawBufferPointer) -> Bool {
        guard let connection = shared.withLock({ $0.connection }) else { return false }
        return natsConnection_Publish(connection.pointer, subject, bytes.baseAddress, Int32(clamping: bytes.count)) == NATS_OK
    }

    @discardableResult
    public func publish(_ subject: String, _ text: String) -> Bool {
        var text = text
        return text.withUTF8 { publish(subject, UnsafeRawBufferPointer($0)) }
    }

    /// Subscribes `sink` to `subject` (wildcards `*` and `>` allowed). libnats restores the subscription
    /// after a reconnect. `nil` when the connection is closed.
    public func subscribe(_ subject: String, sink: NATSMessageSink, pendingLimit: Int = 100_000) -> NATSSubscription? {
        guard let connection = shared.withLock({ $0.connection }) else { return nil }
        var subscription: OpaquePointer?
        let status = natsConnection_Subscribe(&subscription, connection.pointer, subject, natsMessageCallback, sink.closure)
        guard status == NATS_OK, let subscription else {
            logger.warning("NATS subscribe failed", metadata: ["subject": "\(subject)", "error": "\(Self.lastErrorText(status))"])
            return nil
        }
        _ = natsSubscription_SetPendingLimits(subscription, Int32(clamping: pendingLimit), 256 * 1024 * 1024)
        return NATSSubscription(pointer: subscription, subject: subject)
    }

    /// Called (on a libnats thread) when a subscription drops messages because its consumer fell
    /// behind: the subscription, when libnats names it.
    public func onSlowConsumer(_ handler: @escaping @Sendable (NATSSubscription?) -> Void) {
        onSlowConsumer.withLock { $0 = handler }
    }

    /// Sends what is buffered and waits (bounded) for the server to confirm it.
    public func flush(timeout: Duration = .seconds(1)) async -> Bool {
        guard let connection = shared.withLock({ $0.connection }) else { return false }
        return await Self.blocking { natsConnection_FlushTimeout(connection.pointer, timeout.milliseconds) == NATS_OK }
    }

    /// Closes the connection for good (pending publishes are flushed first, bounded).
    public func close() async {
        let connection: NATSPointer? = shared.withLock { state in
            guard !state.closed else { return nil }
            state.closed = true
            return state.connection
        }
        guard let connection else { return }
        await Self.blocking {
            _ = natsConnection_FlushTimeout(connection.pointer, 500)
            natsConnection_Close(connection.pointer)
        }
        set(.closed)
    }

    // MARK: JetStream key-value

    /// Binds to a key-value bucket, creating it (in memory, one value per key) if it does not exist.
    /// - Parameter ttl: how long a value lives after its last write (at least 100 ms).
    public func keyValue(bucket: String, ttl: Duration?) async throws(NATSError) -> KeyValueBucket {
        guard let jetStream = shared.withLock({ $0.jetStream }) else { throw .unavailable("no JetStream context") }
        let result: Result<NATSPointer, NATSError> = await Self.blocking {
            var store: OpaquePointer?
            var status = js_KeyValue(&store, jetStream.pointer, bucket)
            if status == NATS_NOT_FOUND {
                var config = kvConfig()
                kvConfig_Init(&config)
                config.History = 1
                config.StorageType = js_MemoryStorage
                if let ttl { config.TTL = max(ttl.nanoseconds, 100_000_000) }
                status = bucket.withCString { name in
                    config.Bucket = name
                    return js_CreateKeyValue(&store, jetStream.pointer, &config)
                }
                // Another node may have created it in between.
                if status != NATS_OK { status = js_KeyValue(&store, jetStream.pointer, bucket) }
            }
            guard status == NATS_OK, let store else { return .failure(Self.error(status)) }
            return .success(NATSPointer(store))
        }
        let store = try result.get()
        let kept: Duration? = await Self.blocking {
            var status: OpaquePointer?
            guard kvStore_Status(&status, store.pointer) == NATS_OK, let status else { return nil }
            defer { kvStatus_Destroy(status) }
            return .nanoseconds(kvStatus_TTL(status))
        }
        return KeyValueBucket(name: bucket, store: store, connection: self, ttl: kept)
    }

    static func error(_ status: natsStatus) -> NATSError {
        let text = lastErrorText(status)
        return status == NATS_ERR ? .rejected(text) : .unavailable(text)
    }

    /// Runs a libnats call that waits for the server on the request queue and returns its result.
    static func blocking<T: Sendable>(_ work: @escaping @Sendable () -> T) async -> T {
        await withCheckedContinuation { continuation in
            requestQueue.async { continuation.resume(returning: work()) }
        }
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

/// One NATS subscription. `@unchecked Sendable` for the reason given on ``NATSPointer``.
public struct NATSSubscription: @unchecked Sendable, Hashable {
    let pointer: OpaquePointer
    public let subject: String

    /// Messages libnats dropped for this subscription because it fell behind.
    public var dropped: Int64 {
        var count: Int64 = 0
        _ = natsSubscription_GetDropped(pointer, &count)
        return count
    }

    /// Ends the subscription. Messages already handed to the delivery thread may still arrive.
    public func cancel() {
        _ = natsSubscription_Unsubscribe(pointer)
        natsSubscription_Destroy(pointer)
    }

    public static func == (lhs: Self, rhs: Self) -> Bool { lhs.pointer == rhs.pointer }
    public func hash(into hasher: inout Hasher) { hasher.combine(pointer) }
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

    init(name: String, store: NATSPointer, connection: NATSConnection, ttl: Duration?) {
        self.name = name
        self.store = store
        self.connection = connection
        self.ttl = ttl
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
        let result: Result<UInt64, NATSError> = await NATSConnection.blocking {
            var revision: UInt64 = 0
            let status = kvStore_CreateString(&revision, store.pointer, key, value)
            return status == NATS_OK ? .success(revision) : .failure(NATSConnection.error(status))
        }
        return try result.get()
    }

    /// Writes `value` only if `key`'s last revision is still `last`: the lease's "renew".
    public func update(_ key: String, _ value: String, last: UInt64) async throws(NATSError) -> UInt64 {
        let store = self.store
        let result: Result<UInt64, NATSError> = await NATSConnection.blocking {
            var revision: UInt64 = 0
            let status = kvStore_UpdateString(&revision, store.pointer, key, value, last)
            return status == NATS_OK ? .success(revision) : .failure(NATSConnection.error(status))
        }
        return try result.get()
    }

    /// The current value of `key`, or `nil` when it has none (never written, deleted or expired).
    public func get(_ key: String) async throws(NATSError) -> Entry? {
        let store = self.store
        let result: Result<Entry?, NATSError> = await NATSConnection.blocking {
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
        let result: Result<Void, NATSError> = await NATSConnection.blocking {
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
