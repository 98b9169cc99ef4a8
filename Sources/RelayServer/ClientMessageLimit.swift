import NIOCore
import NIOWebSocket

/// The largest client message one WebSocket connection accepts right now: small until the client has
/// authenticated (a stranger cannot make the relay buffer a megabyte per connection), the full limit
/// after. Shared by the connection's ``WireGate`` and its handler, both on the
/// connection's event loop; not `Sendable`.
final class ClientMessageLimit {
    private(set) var bytes: Int
    let full: Int

    init(initial: Int, full: Int) {
        bytes = min(initial, full)
        self.full = full
    }

    /// From now on, messages up to the full limit (the client authenticated).
    func open() { bytes = full }

    var isOpen: Bool { bytes == full }
}

/// A WebSocket connection's wire side: between NIO's WebSocket codec and the socket (TLS, when on),
/// one handler with two jobs, so a connection pays for one pipeline step instead of two.
///
/// **In: the size gate.** In front of NIO's WebSocket frame decoder, on the raw bytes: reads each client
/// frame's header and refuses a frame longer than the connection's ``ClientMessageLimit`` before its
/// payload is buffered anywhere (NIO's decoder, whose own limit is the full one, holds a frame whole
/// until it is complete). It hands the bytes on frame by frame, so a frame is judged only after the
/// frames before it were decoded and handled (synchronously, inside the hand-on): a subscribe pipelined
/// right behind `auth` (a Go client sends everything at once) meets the full limit. Past the limit it
/// raises NIO's `invalidFrameLength` error (the connection's handler closes with 1009) and drops the rest.
///
/// **Out: the outlet for whole frames.** On the socket's side of NIO's `WebSocketFrameEncoder`, so frames
/// built whole elsewhere (``WireFrame``: header and payload in one buffer) go out without passing the
/// encoder: written on this handler's context (``write(_:)``) they pass only what lies between it and
/// the socket. Everything else passes through unchanged. The market feed's events take this way: one
/// buffer per frame instead of the encoder's separate header buffer, and no per-frame pipeline steps.
///
/// Event-loop confined.
final class WireGate: ChannelDuplexHandler, RemovableChannelHandler {
    typealias InboundIn = ByteBuffer
    typealias InboundOut = ByteBuffer
    typealias OutboundIn = ByteBuffer
    typealias OutboundOut = ByteBuffer

    private var context: ChannelHandlerContext?
    private let limit: ClientMessageLimit
    /// Payload bytes of the current frame still to hand on.
    private var remaining: UInt64 = 0
    /// A frame header not yet complete.
    private var header = ByteBuffer()
    private var refused = false

    init(limit: ClientMessageLimit) {
        self.limit = limit
    }

    func handlerAdded(context: ChannelHandlerContext) {
        self.context = context
    }

    func handlerRemoved(context: ChannelHandlerContext) {
        self.context = nil
    }

    /// On the loop: one whole frame, toward the socket (not flushed).
    func write(_ frame: ByteBuffer) {
        context?.write(wrapOutboundOut(frame), promise: nil)
    }

    /// On the loop: sends everything written so far, through either way.
    func flush() {
        context?.flush()
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        var bytes = unwrapInboundIn(data)
        while bytes.readableBytes > 0, !refused {
            if remaining > 0 {
                let count = Int(min(remaining, UInt64(bytes.readableBytes)))
                if let slice = bytes.readSlice(length: count) { context.fireChannelRead(wrapInboundOut(slice)) }
                remaining -= UInt64(count)
                continue
            }
            // A header: 2 bytes, then 2 or 8 of length, then 4 of mask.
            let needed = Self.headerLength(header, next: bytes)
            let take = min(needed - header.readableBytes, bytes.readableBytes)
            if var part = bytes.readSlice(length: take) { header.writeBuffer(&part) }
            guard header.readableBytes == needed, needed == Self.headerLength(header, next: ByteBuffer()) else { continue }
            let length = Self.payloadLength(header)
            guard length <= UInt64(limit.bytes) else {
                refused = true
                context.fireErrorCaught(NIOWebSocketError.invalidFrameLength)
                return
            }
            let complete = header
            header.clear()
            remaining = length
            context.fireChannelRead(wrapInboundOut(complete))
        }
    }

    /// How long the header starting in `header` (then `next`) is, as far as its bytes tell so far.
    private static func headerLength(_ header: ByteBuffer, next: ByteBuffer) -> Int {
        var view = header
        var following = next
        view.writeBuffer(&following)
        guard view.readableBytes >= 2, let second = view.getInteger(at: view.readerIndex + 1, as: UInt8.self) else { return 2 }
        let masked = second & 0x80 != 0 ? 4 : 0
        switch second & 0x7F {
        case 126: return 4 + masked
        case 127: return 10 + masked
        default: return 2 + masked
        }
    }

    private static func payloadLength(_ header: ByteBuffer) -> UInt64 {
        let start = header.readerIndex
        let short = UInt64((header.getInteger(at: start + 1, as: UInt8.self) ?? 0) & 0x7F)
        switch short {
        case 126: return UInt64(header.getInteger(at: start + 2, as: UInt16.self) ?? 0)
        case 127: return header.getInteger(at: start + 2, as: UInt64.self) ?? .max
        default: return short
        }
    }

    /// Puts a gate in front of the decoder the upgrade added.
    static func install(in channel: any Channel, limit: ClientMessageLimit) throws -> WireGate {
        // NIO's upgrade puts the encoder, then the decoder: in front of the encoder is in front of both.
        let operations = channel.pipeline.syncOperations
        let encoder = try operations.handler(type: WebSocketFrameEncoder.self)
        let gate = WireGate(limit: limit)
        try operations.addHandler(gate, position: .before(encoder))
        return gate
    }
}
