import Foundation
import MarketDataHub
import HummingbirdWSClient
import Logging
import NIOCore
import NIOWebSocket
import PolygonWire
import ServiceLifecycle
import Synchronization
import Testing
import RelayComposition
import RelayConfiguration
import RESTGateway
import Upstream
import RelayBench

#if canImport(FoundationNetworking)
    import FoundationNetworking
#endif

let testLogger: Logger = {
    var logger = Logger(label: "test")
    logger.logLevel = ProcessInfo.processInfo.environment["RELAY_TEST_LOG"].flatMap(Logger.Level.init(rawValue:)) ?? .critical
    return logger
}()

/// The tests' client of vendors' REST APIs, configured as the relay's (``VendorHTTPClient``), for the
/// whole test run.
let vendorTestClient = VendorHTTPClient.make()

struct TimeoutError: Error, CustomStringConvertible {
    var description: String
}

/// Runs `operation`, failing with `what` if it takes longer than `timeout`.
func within<T: Sendable>(
    _ timeout: Duration, _ what: String, _ operation: @escaping @Sendable () async throws -> T
) async throws -> T {
    try await withThrowingTaskGroup(of: T?.self) { group in
        group.addTask { try await operation() }
        group.addTask {
            try await Task.sleep(for: timeout)
            return nil
        }
        defer { group.cancelAll() }
        guard let first = try await group.next(), let value = first else {
            throw TimeoutError(description: "timed out after \(timeout) waiting for \(what)")
        }
        return value
    }
}

/// Waits until an async sequence yields an element satisfying `predicate`; fails after `timeout`.
@discardableResult
func waitFor<S: AsyncSequence & Sendable>(
    _ sequence: S, _ what: String, timeout: Duration = .seconds(10), where predicate: @escaping @Sendable (S.Element) -> Bool
) async throws -> S.Element where S.Element: Sendable {
    try await within(timeout, what) {
        for try await element in sequence where predicate(element) { return element }
        throw TimeoutError(description: "the sequence ended before \(what)")
    }
}

/// Runs services under one ServiceGroup for the duration of `body`, then shuts them down gracefully
/// and waits (bounded) for them to finish.
func withServices<T: Sendable>(
    _ services: [any Service], _ body: () async throws -> T
) async throws -> T {
    let group = ServiceGroup(configuration: .init(services: services.map { .init(service: $0) }, logger: testLogger))
    let running = Task { try await group.run() }
    let result: T
    do {
        result = try await body()
    } catch {
        await group.triggerGracefulShutdown()
        try? await stopped(running, within: .seconds(15), "services to stop")
        throw error
    }
    await group.triggerGracefulShutdown()
    try await stopped(running, within: .seconds(15), "services to stop")
    return result
}

/// Waits for `running` to end; past `timeout` it is cancelled (a graceful stop that hangs is forced,
/// so the test fails at once with `what` named instead of waiting for its time limit: ``within(_:_:_:)``
/// cannot end a wait on another task's value) and this throws. A task that does not end within another
/// `timeout` of its cancellation is left behind, and this throws then: something in it ignores
/// cancellation (once, an HTTP connection parked by a client's pool kept a server for 600 s).
func stopped(_ running: Task<Void, any Error>, within timeout: Duration, _ what: String) async throws {
    let forced = Mutex(false)
    let (outcome, ended) = AsyncStream.makeStream(of: Result<Void, any Error>?.self)
    let waiter = Task {
        ended.yield(await running.result)
        ended.finish()
    }
    let timer = Task {
        try await Task.sleep(for: timeout)
        forced.withLock { $0 = true }
        running.cancel()
        try await Task.sleep(for: timeout)
        ended.yield(nil)
        ended.finish()
    }
    var next = outcome.makeAsyncIterator()
    let result = await next.next() ?? nil
    timer.cancel()
    guard let result else {
        waiter.cancel()
        throw TimeoutError(description: "\(what): still running \(timeout) after being cancelled (left behind)")
    }
    if forced.withLock({ $0 }) { throw TimeoutError(description: "timed out after \(timeout) waiting for \(what) (then cancelled)") }
    try result.get()
}

/// A real WebSocket client on loopback (HummingbirdWSClient), driven step by step from one test task.
final class WSTestClient {
    enum Incoming: Sendable {
        case text(String)
        case closed(code: Int?)
        case timeout(UInt64)
        case failed(String)
    }

    enum Outgoing: Sendable {
        case text(String)
        case close
    }

    private var iterator: AsyncStream<Incoming>.AsyncIterator
    private let incoming: AsyncStream<Incoming>.Continuation
    private let outgoing: AsyncStream<Outgoing>.Continuation
    private let task: Task<Void, Never>
    private var timeoutToken: UInt64 = 0
    private(set) var closeCode: Int??
    private let gate: AsyncStream<Void>.Continuation
    private let paused = PauseFlag()

    final class PauseFlag: Sendable {
        let value = Mutex(false)
    }

    init(url: String) {
        let (inStream, inContinuation) = AsyncStream.makeStream(of: Incoming.self)
        let (outStream, outContinuation) = AsyncStream.makeStream(of: Outgoing.self)
        let (gateStream, gateContinuation) = AsyncStream.makeStream(of: Void.self)
        gate = gateContinuation
        let paused = self.paused
        iterator = inStream.makeAsyncIterator()
        incoming = inContinuation
        outgoing = outContinuation
        task = Task {
            do {
                let close = try await WebSocketClient.connect(
                    url: url, configuration: .init(maxFrameSize: 1 << 24), logger: testLogger
                ) { inbound, outbound, _ in
                    try await withThrowingTaskGroup(of: Void.self) { group in
                        group.addTask {
                            for await message in outStream {
                                switch message {
                                case .text(let text): try await outbound.write(.text(text))
                                case .close:
                                    try await outbound.close(.normalClosure, reason: nil)
                                    return
                                }
                            }
                        }
                        for try await message in inbound.messages(maxSize: 1 << 24) {
                            // A paused client stops reading: its socket buffers fill and the relay
                            // sees a stalled consumer.
                            if paused.value.withLock({ $0 }) {
                                for await _ in gateStream { break }
                            }
                            if case .text(let text) = message { inContinuation.yield(.text(text)) }
                        }
                        group.cancelAll()
                    }
                }
                inContinuation.yield(.closed(code: close.map { Int(UInt16(webSocketErrorCode: $0.closeCode)) }))
            } catch {
                inContinuation.yield(.failed("\(error)"))
            }
            inContinuation.finish()
        }
    }

    deinit {
        outgoing.finish()
        task.cancel()
    }

    func send(_ text: String) { outgoing.yield(.text(text)) }

    /// Stops reading from the socket (after the message being handled), like a stalled consumer.
    func pause() { paused.value.withLock { $0 = true } }

    /// Reads again after ``pause()``.
    func resume() {
        paused.value.withLock { $0 = false }
        gate.yield(())
    }

    func send(_ action: ClientAction) { send(action.json) }

    func close() async {
        outgoing.yield(.close)
        _ = try? await within(.seconds(5), "the client to close") { [task] in await task.value }
    }

    /// The next text frame; throws if the connection closed or nothing came within `timeout`.
    func nextFrame(timeout: Duration = .seconds(10)) async throws -> String {
        timeoutToken += 1
        let token = timeoutToken
        let incoming = self.incoming
        let timer = Task {
            try await Task.sleep(for: timeout)
            incoming.yield(.timeout(token))
        }
        defer { timer.cancel() }
        while true {
            switch await iterator.next() {
            case .text(let text): return text
            case .closed(let code):
                closeCode = .some(code)
                throw TimeoutError(description: "connection closed (code \(code.map(String.init) ?? "none")) while waiting for a frame")
            case .failed(let error): throw TimeoutError(description: "connection failed: \(error)")
            case .timeout(let t) where t == token:
                throw TimeoutError(description: "no frame within \(timeout)")
            case .timeout:
                continue
            case nil:
                throw TimeoutError(description: "connection ended while waiting for a frame")
            }
        }
    }

    /// Waits for the server to close the connection and returns its close code.
    func waitForClose(timeout: Duration = .seconds(10)) async throws -> Int? {
        if let closeCode { return closeCode }
        while true {
            do {
                _ = try await nextFrame(timeout: timeout)
            } catch {
                if let closeCode { return closeCode }
                throw error
            }
        }
    }

    /// The next frame parsed.
    func nextParsed(timeout: Duration = .seconds(10)) async throws -> ParsedFrame {
        try FrameParser.parse(try await nextFrame(timeout: timeout))
    }

    /// Reads frames until one holds a status object with `status`; returns that object's JSON fields
    /// (numbers included) and the market events read on the way.
    func waitForStatus(_ status: String, timeout: Duration = .seconds(15)) async throws -> (
        fields: [String: Any], eventsBefore: [MarketEvent]
    ) {
        let deadline = ContinuousClock.now + timeout
        var events: [MarketEvent] = []
        while true {
            let left = deadline - .now
            guard left > .zero else { throw TimeoutError(description: "no \(status) status within \(timeout)") }
            let frame = try await nextFrame(timeout: left)
            let parsed = try FrameParser.parse(frame)
            events += parsed.events
            guard parsed.statuses.contains(where: { $0.status == status }) else { continue }
            let objects = try JSONSerialization.jsonObject(with: Data(frame.utf8)) as? [[String: Any]] ?? []
            if let object = objects.first(where: { $0["status"] as? String == status }) {
                return (object, events)
            }
        }
    }

    /// Collects market events (skipping status frames) until `count` have arrived.
    func nextEvents(_ count: Int, timeout: Duration = .seconds(10)) async throws -> [MarketEvent] {
        var events: [MarketEvent] = []
        let deadline = ContinuousClock.now + timeout
        while events.count < count {
            let left = deadline - .now
            guard left > .zero else { throw TimeoutError(description: "only \(events.count) of \(count) events within \(timeout)") }
            events += try await nextParsed(timeout: left).events
        }
        return events
    }

    /// Connects and authenticates, checking the two handshake frames.
    static func authenticated(url: String, key: String = "client-key") async throws -> WSTestClient {
        let client = WSTestClient(url: url)
        let connected = try await client.nextParsed()
        #expect(connected.statuses == [.connected])
        client.send(ClientAction(.auth, params: key))
        let auth = try await client.nextParsed()
        #expect(auth.statuses == [.authSuccess])
        return client
    }
}

/// A plain HTTP GET on loopback: status and body.
func httpGet(_ url: String, key: String? = nil) async throws -> (status: Int, body: String) {
    guard let target = URL(string: url) else { throw TimeoutError(description: "bad URL \(url)") }
    var request = URLRequest(url: target)
    request.timeoutInterval = 10
    if let key { request.setValue("Bearer \(key)", forHTTPHeaderField: "Authorization") }
    let (data, response) = try await URLSession.shared.data(for: request)
    let status = (response as? HTTPURLResponse)?.statusCode ?? 0
    return (status, String(decoding: data, as: UTF8.self))
}

/// Polls `condition` until it holds; fails after `timeout`. For state that has no change signal.
func eventually(
    _ what: String, timeout: Duration = .seconds(10), _ condition: @escaping @Sendable () async -> Bool
) async throws {
    try await within(timeout, what) {
        while !(await condition()) { try await Task.sleep(for: .milliseconds(20)) }
    }
}

/// Collects at least `count` events from an upstream event stream.
func collect(_ count: Int, from stream: AsyncStream<SourceMessage>, timeout: Duration = .seconds(10)) async throws -> [MarketEvent] {
    try await within(timeout, "\(count) upstream events") {
        var out: [MarketEvent] = []
        for await message in stream {
            out += message.events ?? []
            if out.count >= count { return out }
        }
        throw TimeoutError(description: "the upstream stream ended after \(out.count) events")
    }
}

func topics(_ list: String...) -> Set<Topic> { Set(list.compactMap { Topic(parsing: $0) }) }

/// An HTTP request with a JSON body on loopback: status and body.
func httpSend(
    _ method: String, _ url: String, json: String? = nil, headers: [String: String] = [:]
) async throws -> (status: Int, body: String) {
    guard let target = URL(string: url) else { throw TimeoutError(description: "bad URL \(url)") }
    var request = URLRequest(url: target)
    request.httpMethod = method
    request.timeoutInterval = 10
    for (name, value) in headers { request.setValue(value, forHTTPHeaderField: name) }
    if let json {
        request.httpBody = Data(json.utf8)
        request.setValue("application/json", forHTTPHeaderField: "Content-Type")
    }
    let (data, response) = try await URLSession.shared.data(for: request)
    return ((response as? HTTPURLResponse)?.statusCode ?? 0, String(decoding: data, as: UTF8.self))
}

/// A JSON object's fields.
func jsonObject(_ text: String) -> [String: Any] {
    (try? JSONSerialization.jsonObject(with: Data(text.utf8)) as? [String: Any]) ?? [:]
}

extension Relay.Components {
    /// The upstream client of the single relay these tests run.
    var upstreamClient: UpstreamClient {
        get throws { try #require(upstream, "a single relay has an upstream client") }
    }
}

/// The path of a file in the tests' Fixtures (the TLS test certificate and key).
func fixture(_ name: String) throws -> String {
    try #require(Bundle.module.url(forResource: name, withExtension: nil, subdirectory: "Fixtures")).path
}

/// Creates a brokerage account over the portfolio API (created 2024-01-01); returns its id.
func createBrokerageAccount(_ base: String, name: String = "Core") async throws -> Int {
    let created = try await httpSend(
        "POST", "\(base)/v1/accounts", json: #"{"name":"\#(name)","kind":"brokerage","createdAt":"2024-01-01T00:00:00Z"}"#)
    #expect(created.status == 201)
    return try #require(jsonObject(created.body)["id"] as? Int)
}

/// A relay on the demo feed with the portfolio sidecar on a fresh SQLite file, for `body`; the file is
/// removed after.
func withPortfolioRelay(
    demoRate: Double = 100, _ body: @Sendable (_ parts: Relay.Components, _ base: String) async throws -> Void
) async throws {
    let directory = FileManager.default.temporaryDirectory.appendingPathComponent("relay-portfolio-\(UUID().uuidString)").path
    defer { try? FileManager.default.removeItem(atPath: directory) }
    let relay = Relay(
        settings: RelaySettings(listen: .init(host: "127.0.0.1", port: 0), demoRate: demoRate, portfolio: .init(dataDirectory: directory)),
        logger: testLogger)
    try await withServices([relay]) {
        let parts = try await within(.seconds(10), "the relay to start") { try await relay.ready() }
        try await body(parts, "http://127.0.0.1:\(parts.port)")
    }
}

/// Runs the relay binary beside the tests with `arguments` to its end: how it ended, and what it wrote
/// (standard output and error together).
func runRelayCommand(_ arguments: [String]) throws -> (reason: Process.TerminationReason, status: Int32, output: String) {
    let process = Process()
    process.executableURL = URL(fileURLWithPath: RelayProcess.siblingBinary())
    process.arguments = arguments
    let pipe = Pipe()
    process.standardOutput = pipe
    process.standardError = pipe
    try process.run()
    let output = String(decoding: pipe.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
    process.waitUntilExit()
    return (process.terminationReason, process.terminationStatus, output)
}
