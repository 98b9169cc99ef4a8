import Logging
import MarketDataHub
import NIOCore
import NIOWebSocket
import PolygonWire

/// One downstream market client: the Polygon conversation (``ServerSession``) on the way in, its hub
/// subscription on the way out.
///
/// An actor whose executor is its channel's event loop, so its state and its handler live on that loop:
/// a client message is handled synchronously as NIO reads it (no reading task). The only task per
/// connection drains its hub stream (on the cooperative pool, handing frames to the loop's
/// ``LoopWriteQueue``); hub calls (`subscribe`, `add`, `remove`) run one after another in a short-lived
/// task, in the order the client asked.
///
/// Acknowledgements are written before the hub is asked to add a topic, so a client never sees an
/// event before the ack of its subscription. The drain takes everything queued for the client at once
/// and writes it as one frame of the upstream's own bytes (several only past the 1,000,000-byte limit),
/// one flush; it waits for the channel to be writable before taking more, so a slow client backs up
/// into its own hub buffer and nobody else's.
actor MarketConnection {
    struct Dependencies: Sendable {
        let hub: MarketDataHub
        let configuration: RelayServerConfiguration
        let metrics: DownstreamMetrics
        let keyConnections: KeyConnections
        /// Where this connection's drain hands its frames to be written on the loop.
        let writes: LoopWriteQueue
        let logger: Logger
        /// Told each time a client's key is refused (counted per address).
        let authenticationFailed: @Sendable () -> Void
    }

    /// The close code for a client the `disconnect` policy removed: "try again later".
    static let tooSlowCloseCode = WebSocketErrorCode(codeNumber: 1013)

    private enum HubChange {
        case join
        case add([Topic])
        case remove([Topic])
        case leave
    }

    nonisolated let unownedExecutor: UnownedSerialExecutor
    private let loop: any EventLoop
    private let handler: NIOLoopBound<WebSocketConnectionHandler>
    private let dependencies: Dependencies
    private var session: ServerSession
    private var admitted: ClientGrant?
    private var subscription: HubSubscription?
    private var authTimeout: Scheduled<Void>?
    private var hubChanges: [HubChange] = []
    private var hubWorker: Task<Void, Never>?
    private var drain: Task<Void, Never>?
    private var ended = false

    init(handler: NIOLoopBound<WebSocketConnectionHandler>, loop: any EventLoop, dependencies: Dependencies) {
        self.loop = loop
        self.unownedExecutor = loop.executor.asUnownedSerialExecutor()
        self.handler = handler
        self.dependencies = dependencies
        let authentication = dependencies.configuration.authentication
        session = ServerSession(limits: dependencies.configuration.limits, grants: { authentication.grant(for: $0) })
    }

    /// The handler's callbacks into this connection. Called on the loop, so they enter the actor's
    /// isolation synchronously.
    nonisolated func conversation() -> WebSocketConversation {
        WebSocketConversation(
            opened: { self.assumeIsolated { $0.opened() } },
            received: { message in self.assumeIsolated { $0.received(message) } },
            closed: { self.assumeIsolated { $0.closed() } })
    }

    /// Closes with `code` (the shutdown's 1012). Safe from anywhere.
    nonisolated func close(code: WebSocketErrorCode, reason: String) {
        loop.execute { self.assumeIsolated { $0.handler.value.close(code: code, reason: reason) } }
    }

    private func opened() {
        handler.value.write(StatusMessage.connected.frame)
        let timeout = dependencies.configuration.authTimeout
        authTimeout = loop.scheduleTask(in: TimeAmount(timeout)) {
            self.assumeIsolated { $0.authenticationTimedOut() }
        }
        change(.join)
    }

    private func authenticationTimedOut() {
        guard !session.isAuthenticated, !ended else { return }
        handler.value.write(StatusMessage.authTimeout.frame)
        handler.value.close(code: .policyViolation, reason: "no authentication")
    }

    private func received(_ message: ByteBuffer) {
        guard !ended else { return }
        let wasAuthenticated = session.isAuthenticated
        let reaction = session.receive(message)
        if let grant = session.grant, !wasAuthenticated {
            authTimeout?.cancel()
            authTimeout = nil
            // A key's connection limit, answered as Polygon answers one: the status, then 1008.
            guard dependencies.keyConnections.admit(grant) else {
                dependencies.logger.info("downstream client refused: key over its connection limit", metadata: ["key": "\(grant.name)"])
                refuse(
                    StatusMessage(
                        status: StatusMessage.Kind.maxConnections,
                        message: "Maximum number of websocket connections exceeded for key \"\(grant.name)\" (\(grant.maxConnections ?? 0))."),
                    reason: "max connections")
                return
            }
            admitted = grant
            dependencies.logger.debug("downstream client authenticated", metadata: ["key": "\(grant.name)"])
        }
        let handler = self.handler.value
        for frame in reaction.frames { handler.write(frame, flush: false) }
        handler.flush()
        if reaction.close {
            dependencies.authenticationFailed()
            dependencies.logger.info("downstream client refused: authentication failed")
            handler.close(code: .policyViolation, reason: "authentication failed")
            return
        }
        if !reaction.added.isEmpty { change(.add(reaction.added)) }
        if !reaction.removed.isEmpty { change(.remove(reaction.removed)) }
    }

    /// Refuses the way Polygon does: the status that says why, then close 1008.
    func refuse(_ status: StatusMessage, reason: String) {
        handler.value.write(status.frame)
        handler.value.close(code: .policyViolation, reason: reason)
    }

    private func closed() {
        guard !ended else { return }
        ended = true
        authTimeout?.cancel()
        authTimeout = nil
        if let admitted { dependencies.keyConnections.release(admitted) }
        admitted = nil
        drain?.cancel()
        // Nothing the client asked for matters now, but leaving the hub does (after a join in flight).
        hubChanges.removeAll()
        change(.leave)
    }

    // MARK: the hub

    private func change(_ change: HubChange) {
        hubChanges.append(change)
        guard hubWorker == nil else { return }
        hubWorker = Task { await self.applyHubChanges() }
    }

    private func applyHubChanges() async {
        let hub = dependencies.hub
        while !hubChanges.isEmpty {
            switch hubChanges.removeFirst() {
            case .join:
                let joined = await hub.subscribe()
                subscription = joined
                if !ended {
                    let (handler, writability, writes, metrics) = (self.handler, self.handler.value.writability, dependencies.writes, dependencies.metrics)
                    drain = Task.detached {
                        await Self.drain(joined, handler: handler, writability: writability, writes: writes, metrics: metrics)
                    }
                }
            case .add(let topics):
                if let id = subscription?.id { await hub.add(topics, to: id) }
            case .remove(let topics):
                if let id = subscription?.id { await hub.remove(topics, from: id) }
            case .leave:
                if let id = subscription?.id { await hub.remove(id) }
                subscription = nil
            }
        }
        hubWorker = nil
    }

    /// Writes everything the hub queues for this client, coalesced, until the subscription ends.
    ///
    /// Runs on the cooperative pool, not on the loop: a task waiting in its `AsyncStream` is resumed on
    /// the pool whatever its isolation, and a hop onto the loop per batch would add a thread switch per
    /// client per upstream message. Frames go to the loop's ``LoopWriteQueue`` instead, which writes the
    /// frames of many clients in one pass.
    private static func drain(
        _ subscription: HubSubscription, handler: NIOLoopBound<WebSocketConnectionHandler>, writability: Writability,
        writes: LoopWriteQueue, metrics: DownstreamMetrics
    ) async {
        var reader = subscription.makeReader()
        while true {
            // Take nothing more while the client has not taken the last: its hub buffer is the bound.
            await writability.waitUntilWritable()
            guard !writability.isClosed, let batch = await reader.nextBatch(), !writability.isClosed else { break }
            let frames = FrameEncoder.frame(for: batch).map { [$0] } ?? FrameEncoder.frames(for: batch)
            writes.submit(.init(handler: handler, frames: frames, close: nil))
            var delivered = 0
            var oldest = UInt64.max
            for event in batch where !event.isNotice {
                delivered += 1
                if event.receivedAt > 0 { oldest = min(oldest, event.receivedAt) }
            }
            metrics.delivered.increment(by: delivered)
            metrics.writes.increment()
            if oldest != .max {
                metrics.deliveryLatency.recordNanoseconds(Int64(MonotonicClock.nanoseconds() &- oldest))
            }
        }
        if subscription.wasEvicted, !writability.isClosed {
            let notice = StatusMessage(
                status: StatusMessage.Kind.lagging,
                message: "disconnected: this connection did not keep up and its buffer of \(MarketDataHub.bufferLimit) events was full")
            writes.submit(
                .init(handler: handler, frames: [notice.frame], close: (tooSlowCloseCode, "too slow")))
        }
    }
}
