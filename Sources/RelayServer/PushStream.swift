import MarketCore
import NIOCore
import NIOWebSocket

/// A server-push WebSocket route on the relay's port (the portfolio's live valuation): each
/// connection gets the frames of its own `frames(entitlement)` stream, text, one message per element; what the
/// client sends is read and ignored. Value type, `Sendable`.
public struct PushStream: Sendable {
    /// The route, e.g. `/v1/portfolio/stream`.
    public var path: String
    /// Whether a client key needs its portfolio read right (else any accepted key will do).
    public var needsPortfolioRight: Bool
    /// A new stream of frames for one connection, for what its key may read (everything without keys);
    /// it ends when the connection does.
    public var frames: @Sendable (Entitlement) async -> AsyncStream<ByteBuffer>

    public init(path: String, needsPortfolioRight: Bool, frames: @escaping @Sendable (Entitlement) async -> AsyncStream<ByteBuffer>) {
        self.path = path
        self.needsPortfolioRight = needsPortfolioRight
        self.frames = frames
    }
}

/// One connection of a ``PushStream``: an actor on the connection's event loop whose one task writes
/// each frame of the stream as it comes (skipping frames while the client has not taken the last).
actor PushConnection {
    nonisolated let unownedExecutor: UnownedSerialExecutor
    private let loop: any EventLoop
    private let handler: NIOLoopBound<WebSocketConnectionHandler>
    private let stream: PushStream
    private let entitlement: Entitlement
    private var task: Task<Void, Never>?
    private var ended = false

    init(handler: NIOLoopBound<WebSocketConnectionHandler>, loop: any EventLoop, stream: PushStream, entitlement: Entitlement) {
        self.entitlement = entitlement
        self.loop = loop
        self.unownedExecutor = loop.executor.asUnownedSerialExecutor()
        self.handler = handler
        self.stream = stream
    }

    nonisolated func conversation() -> WebSocketConversation {
        WebSocketConversation(
            opened: { self.assumeIsolated { $0.opened() } },
            received: { _ in },
            closed: { self.assumeIsolated { $0.closed() } })
    }

    nonisolated func close(code: WebSocketErrorCode, reason: String) {
        loop.execute { self.assumeIsolated { $0.handler.value.close(code: code, reason: reason) } }
    }

    private func opened() {
        task = Task { await self.run() }
    }

    private func run() async {
        let frames = await stream.frames(entitlement)
        var iterator = frames.makeAsyncIterator()
        while !ended {
            guard let frame = await iterator.next(isolation: self), !ended else { break }
            // A client that has not read the last one misses this one: the next carries the news too.
            guard handler.value.isWritable else { continue }
            handler.value.write(frame)
        }
        // The stream ended on its own (the service stopped): say goodbye properly.
        if !ended { handler.value.close(code: .normalClosure, reason: nil) }
    }

    private func closed() {
        guard !ended else { return }
        ended = true
        task?.cancel()
    }
}
