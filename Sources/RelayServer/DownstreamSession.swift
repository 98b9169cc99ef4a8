import HummingbirdWebSocket
import Logging
import MarketDataHub
import NIOCore
import NIOWebSocket
import PolygonWire

/// One downstream WebSocket client: the Polygon conversation (``ServerSession``) on the way in, the
/// client's hub subscription on the way out.
///
/// Lives for one connection, inside the WebSocket handler's task. Its reader (this task) and its writer
/// (a child task draining the hub stream) share the outbound writer, which orders concurrent writes.
/// Acknowledgements are written before the hub starts sending a new topic, so a client never sees an
/// event before the ack of its subscription.
///
/// The writer serialises nothing: it takes everything queued for this client at once and writes it as
/// one frame of the upstream's own bytes (several only past the 1,000,000-byte limit), one flush.
/// Each write waits for the socket to be writable, so a slow client backs up into its own hub buffer.
struct DownstreamSession {
    let hub: MarketDataHub
    let configuration: RelayServerConfiguration
    let metrics: DownstreamMetrics
    let keyConnections: KeyConnections
    let logger: Logger
    /// Told each time this client's key is refused (counted per address).
    let authenticationFailed: @Sendable () -> Void

    /// The close code for a client the `disconnect` policy removed: "try again later".
    static let tooSlowCloseCode = WebSocketErrorCode(codeNumber: 1013)

    func run(inbound: WebSocketInboundStream, outbound: WebSocketOutboundWriter) async throws {
        try await write(StatusMessage.connected.frame, to: outbound)
        let subscription = await hub.subscribe()
        let authentication = configuration.authentication
        var session = ServerSession(limits: configuration.limits, grants: { authentication.grant(for: $0) })
        var admitted: ClientGrant?
        defer { if let admitted { keyConnections.release(admitted) } }
        var logger = self.logger
        logger[metadataKey: "subscriber"] = "\(subscription.id)"
        logger.debug("downstream client connected")

        try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask {
                try await drain(subscription, to: outbound)
            }
            let authTimeout = Task { [configuration] in
                try await Task.sleep(for: configuration.authTimeout)
                try await write(StatusMessage.authTimeout.frame, to: outbound)
                try await outbound.close(.policyViolation, reason: "no authentication")
            }
            defer {
                authTimeout.cancel()
                group.cancelAll()
            }
            for try await message in inbound.messages(maxSize: configuration.maxClientMessageBytes) {
                let buffer: ByteBuffer
                switch message {
                case .text(let text): buffer = ByteBuffer(string: text)
                case .binary(let data): buffer = data
                }
                let wasAuthenticated = session.isAuthenticated
                let reaction = session.receive(buffer)
                if let grant = session.grant, !wasAuthenticated {
                    authTimeout.cancel()
                    // A key's connection limit, answered as Polygon answers one: the status, then 1008.
                    guard keyConnections.admit(grant) else {
                        logger.info("downstream client refused: key over its connection limit", metadata: ["key": "\(grant.name)"])
                        try await Self.refuse(
                            StatusMessage(
                                status: StatusMessage.Kind.maxConnections,
                                message: "Maximum number of websocket connections exceeded for key \"\(grant.name)\" (\(grant.maxConnections ?? 0))."
                            ), reason: "max connections", outbound: outbound)
                        break
                    }
                    admitted = grant
                    logger.debug("downstream client authenticated", metadata: ["key": "\(grant.name)"])
                }
                for frame in reaction.frames { try await write(frame, to: outbound) }
                if reaction.close {
                    authenticationFailed()
                    logger.info("downstream client refused: authentication failed")
                    try await outbound.close(.policyViolation, reason: "authentication failed")
                    break
                }
                if !reaction.added.isEmpty { await hub.add(reaction.added, to: subscription.id) }
                if !reaction.removed.isEmpty { await hub.remove(reaction.removed, from: subscription.id) }
            }
            await hub.remove(subscription.id)
        }
        logger.debug("downstream client left")
    }

    /// Writes everything the hub queues for this client, coalesced, until the subscription ends.
    private func drain(_ subscription: HubSubscription, to outbound: WebSocketOutboundWriter) async throws {
        var reader = subscription.makeReader()
        while let batch = await reader.nextBatch() {
            for frame in FrameEncoder.frames(for: batch) { try await write(frame, to: outbound) }
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
        if subscription.wasEvicted {
            try await write(
                StatusMessage(
                    status: StatusMessage.Kind.lagging,
                    message: "disconnected: this connection did not keep up and its buffer of \(MarketDataHub.bufferLimit) events was full"
                ).frame, to: outbound)
            try await outbound.close(Self.tooSlowCloseCode, reason: "too slow")
        }
    }

    /// Refuses a connection the way Polygon does: the status that says why, then close 1008.
    static func refuse(_ status: StatusMessage, reason: String, outbound: WebSocketOutboundWriter) async throws {
        try await outbound.write(.custom(WebSocketFrame(fin: true, opcode: .text, data: status.frame)))
        try await outbound.close(.policyViolation, reason: reason)
    }

    private func write(_ frame: ByteBuffer, to outbound: WebSocketOutboundWriter) async throws {
        try await outbound.write(.custom(WebSocketFrame(fin: true, opcode: .text, data: frame)))
    }
}
