import CoreMetrics
import Foundation
import Logging
import MarketDataHub
import MarketCore
import ServiceLifecycle
import Synchronization

/// The relay's one upstream connection per market: a WebSocket client on libwebsockets for either
/// vendor (what it says on the connection is its protocol's ``UpstreamSession``).
///
/// It connects, waits for `connected`, authenticates with the upstream key, then keeps the upstream's
/// subscriptions equal to ``setWantedTopics(_:)``'s latest set, across reconnects. Events arrive on
/// ``messages`` in the order the upstream sent them, one array per upstream message.
///
/// Concurrency: `Sendable`; every method may be called from any thread or task. libwebsockets runs on
/// a thread of its own (see ``LWSConnection``); ``run()`` owns that thread's lifetime and the reconnect
/// loop, and returns after a clean close once shut down (graceful shutdown, cancellation or
/// ``shutdown()``).
public final class UpstreamClient: Service, Sendable {
    /// Every upstream message's events, and the connection's losses and authentications, in wire
    /// order; finishes when the client stops. One consumer: the hub's pump (``HubPump``), or a cluster
    /// leader's NATS publisher.
    public let inbox: SourceInbox

    private let connection: LWSConnection
    private let ends: AsyncStream<ConnectionEnd>
    private let threadExit: AsyncStream<Void>
    private let reconnectTask = Mutex<Task<Void, Never>?>(nil)
    private let started = Mutex(false)
    private let silent = Atomic<Bool>(false)
    private let logger: Logger

    public init(configuration: UpstreamConfiguration, logger: Logger = Logger(label: "relay.upstream")) {
        let inbox = SourceInbox.source(capacity: configuration.maxQueuedEvents)
        let (ends, endContinuation) = AsyncStream.makeStream(of: ConnectionEnd.self)
        let (exit, exitContinuation) = AsyncStream.makeStream(of: Void.self)
        self.inbox = inbox
        self.ends = ends
        self.threadExit = exit
        self.logger = logger
        self.connection = LWSConnection(
            configuration: configuration, logger: logger,
            inbox: inbox, ends: endContinuation, exit: exitContinuation)
    }

    /// The inbox as a sequence (tests and tools; the relay drains ``inbox`` itself): the inbox's own
    /// losses come as ``SourceMessage/lost(count:topics:reason:)``. Call once.
    public var messages: AsyncStream<SourceMessage> {
        let (stream, continuation) = AsyncStream.makeStream(of: SourceMessage.self)
        let inbox = self.inbox
        Task {
            await inbox.drain { items in
                for item in items {
                    switch item {
                    case .element(let message): continuation.yield(message)
                    case .lost(let lost, _):
                        continuation.yield(.lost(count: lost.count, topics: lost.topics, reason: "the consumer fell behind its upstream"))
                    }
                }
            }
            continuation.finish()
        }
        return stream
    }

    /// The configuration this client was made with.
    public var configuration: UpstreamConfiguration { connection.configuration }

    /// Where the connection stands now.
    public var state: UpstreamState { connection.shared.withLock { $0.state } }

    /// The current state, then every change, until the client stops.
    public func stateUpdates() -> AsyncStream<UpstreamState> { connection.stateUpdates() }

    /// Counters since start.
    public var statistics: UpstreamStatistics { connection.shared.withLock { $0.statistics } }

    /// The topics the upstream connection is subscribed to right now (empty while not authenticated).
    public var subscribedTopics: Set<Topic> { connection.shared.withLock { $0.machine.session.subscribed } }

    /// When the last frame or pong arrived from the upstream.
    public var lastMessageAt: ContinuousClock.Instant? { connection.shared.withLock { $0.machine.lastMessageAt } }

    /// Replaces the set of topics the upstream should send. While authenticated the difference is sent
    /// at once (subscribe first, then unsubscribe); otherwise it is sent after the next `auth_success`.
    /// Returns immediately; safe from any thread.
    public func setWantedTopics(_ topics: Set<Topic>) {
        // Derived bars are built here from their trades: the trades are what the upstream is asked for.
        // One caller at a time, so the bars built and the upstream's set are always of the same set.
        let refused = wanting.withLock { _ in
            let (upstream, derived) = connection.bars.upstreamTopics(for: topics)
            let refused = connection.bars.setWanted(derived)
            connection.setWanted(upstream)
            return refused
        }
        if !refused.isEmpty {
            inbox.push(
                .refused(
                    topics: refused, code: 405,
                    reason: "the relay builds at most \(DerivedLimits.sizesPerSymbolBuilt) bar sizes of one symbol at once"))
        }
    }

    private let wanting = Mutex(())

    /// Unsubscribes those of `topics` the upstream sends now and subscribes them again, so the vendor
    /// sends their whole state anew (Alpaca's order books come whole after a subscribe). Returns
    /// immediately; safe from any thread.
    public func renewTopics(_ topics: Set<Topic>) {
        guard !topics.isEmpty else { return }
        connection.renew(topics)
    }

    /// Sets the instant past which the upstream connection may not exist (a cluster leader's lease
    /// validity; `nil` lifts it). The service thread enforces it itself, with no Swift task: at the
    /// deadline it closes the socket, and it opens no connection until a later deadline is given. Call
    /// again with each renewal. Returns immediately; safe from any thread.
    public func setDeadline(_ deadline: ContinuousClock.Instant?) {
        connection.setDeadline(deadline)
    }

    /// Starts the service thread, connects, and reconnects until shut down.
    public func run() async throws {
        let alreadyStarted = started.withLock { value in
            defer { value = true }
            return value
        }
        precondition(!alreadyStarted, "UpstreamClient.run() may be called once")

        let connection = self.connection
        let readiness = AsyncStream.makeStream(of: Result<Void, UpstreamError>.self)
        let thread = Thread {
            connection.serviceLoop { result in
                readiness.continuation.yield(result)
                readiness.continuation.finish()
            }
        }
        thread.name = "relay-upstream-lws"
        thread.start()
        var readyResult: Result<Void, UpstreamError> = .failure(.contextCreationFailed)
        for await result in readiness.stream { readyResult = result }
        try readyResult.get()

        let loop = Task { await self.reconnectLoop() }
        reconnectTask.withLock { $0 = loop }
        connection.requestConnect()
        let watch = Task { await self.watchForSilence() }
        defer { watch.cancel() }
        let barClock = Task { await self.closeBars() }
        defer { barClock.cancel() }

        await withGracefulShutdownHandler {
            await withTaskCancellationHandler {
                await loop.value
            } onCancel: {
                self.shutdown()
            }
        } onGracefulShutdown: {
            self.shutdown()
        }
        for await _ in threadExit {}
    }

    /// Finishes derived time bars whose window has passed, ten times a second.
    private func closeBars() async {
        let grace = connection.configuration.barGrace
        while !Task.isCancelled {
            connection.bars.tick(grace: grace, into: inbox)
            try? await Task.sleep(for: .milliseconds(100))
        }
    }

    /// Whether the upstream is silent now (``SilenceWatch``).
    public var isSilent: Bool { silent.load(ordering: .relaxed) }

    /// Looks every few seconds for a silent upstream; shows it and drops the connection once per silence.
    private func watchForSilence() async {
        let configuration = connection.configuration
        guard let after = configuration.silentAfter else { return }
        let gauge = Gauge(label: "relay_upstream_silent", factory: configuration.metricsFactory)
        gauge.record(0)
        var watch = SilenceWatch(after: after, market: configuration.market)
        let step = min(after / 4, .seconds(5))
        while !Task.isCancelled {
            let verdict = watch.look(
                authenticated: state == .authenticated, subscribed: subscribedTopics.count, events: statistics.eventsReceived,
                now: .now, date: Date())
            silent.store(watch.silent, ordering: .relaxed)
            gauge.record(watch.silent ? 1 : 0)
            switch verdict {
            case .quiet, .silent: break
            case .reconnect:
                logger.warning(
                    "upstream silent: connected, topics subscribed, market open, and no event; reconnecting once",
                    metadata: ["silent_for_s": "\(after.components.seconds)", "topics": "\(subscribedTopics.count)"])
                connection.requestDrop()
            case .recovered:
                logger.info("upstream no longer silent: events arrive again")
            }
            try? await Task.sleep(for: step)
        }
    }

    /// Closes the connection cleanly and stops the service thread. Safe to call more than once.
    public func shutdown() {
        reconnectTask.withLock { $0?.cancel() }
        connection.requestStop()
        let connection = self.connection
        // The close handshake is bounded: after `closeTimeout` the loop ends regardless.
        Task {
            try? await Task.sleep(for: connection.configuration.closeTimeout)
            connection.forceExit()
        }
    }

    /// Waits out the delay the connection's logic chose after each end, then connects again.
    private func reconnectLoop() async {
        for await end in ends {
            if Task.isCancelled { return }
            let attempt = connection.shared.withLock { $0.machine.attempt }
            if end.cause == .maxConnections {
                logger.warning(
                    "another consumer holds this account's upstream connection (the vendor allows one per account and market); retrying with backoff",
                    metadata: ["in_s": "\(end.retryAfter.milliseconds / 1000)", "attempt": "\(attempt)"])
            }
            logger.debug(
                "upstream reconnect scheduled",
                metadata: ["in_ms": "\(end.retryAfter.milliseconds)", "attempt": "\(attempt)", "reason": "\(end.reason)"])
            do {
                try await Task.sleep(for: end.retryAfter)
            } catch {
                return
            }
            connection.requestConnect()
        }
    }
}
