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

/// A WebSocket connection's wire side: between the connection's handler (NIO's frame encoder in
/// between) and the socket (TLS, when on), one handler with three jobs, so a connection pays for one
/// pipeline step instead of three (a frame decoder, a size gate and a byte counter).
///
/// **In: the frame reader.** It reads the client's frames (RFC 6455 §5.2) off the raw bytes and hands
/// each on as a `WebSocketFrame`, payload still masked, in place of NIO's `WebSocketFrameDecoder`,
/// which the upgrade adds and ``install(in:limit:tls:)`` takes out: that one costs every connection a
/// `ByteToMessageHandler`, its buffers and a pipeline step (~700 bytes held by each idle client), and
/// this handler already had to read each frame's header for the size gate. A frame's payload is a
/// slice of what was read when it came whole in one read (the usual case) and is gathered only when
/// it spans reads; an idle connection holds nothing here.
///
/// It refuses a frame longer than the connection's ``ClientMessageLimit`` from its header, before its
/// payload is buffered anywhere, and judges each frame only after the frames before it were handled
/// (synchronously, inside the hand-on): a subscribe pipelined right behind `auth` (a Go client sends
/// everything at once) meets the full limit. Errors are NIO's, as its decoder raised them: a control
/// frame that is fragmented or longer than 125 bytes (`fragmentedControlFrame`,
/// `multiByteControlFrameLength`; the handler closes with 1002), a frame past the limit
/// (`invalidFrameLength`; 1009); and what NIO's decoder let through though RFC 6455 says the server
/// must fail the connection: an unmasked frame, a reserved bit or opcode (``ProtocolViolation``;
/// 1002). After an error it reads nothing more.
///
/// **Out: the outlet for whole frames.** On the socket's side of NIO's `WebSocketFrameEncoder`, so frames
/// built whole elsewhere (``WireFrame``: header and payload in one buffer) go out without passing the
/// encoder: written on this handler's context (``write(_:)``) they pass only what lies between it and
/// the socket. Everything else passes through unchanged. The market feed's events take this way: one
/// buffer per frame instead of the encoder's separate header buffer, and no per-frame pipeline steps.
///
/// **The count of bytes out** (``total``): everything written to the connection since the upgrade
/// passes here, so without TLS it is what TCP carries, and it stands in for the ``SocketByteCounter``
/// the connection had until its upgrade (a tagged session's acknowledged positions).
///
/// Event-loop confined.
final class WireGate: ChannelDuplexHandler, RemovableChannelHandler, SocketBytes {
    typealias InboundIn = ByteBuffer
    typealias InboundOut = WebSocketFrame
    typealias OutboundIn = ByteBuffer
    typealias OutboundOut = ByteBuffer

    private var context: ChannelHandlerContext?
    private let limit: ClientMessageLimit
    /// The start of a frame whose header a read cut short (at most 13 bytes; rare).
    private var headerStart: ByteBuffer?
    /// A frame whose payload spans reads: its header and the payload so far.
    private var gathering: (header: FrameHeader, payload: ByteBuffer)?
    /// Bytes read while a frame was being handed on, or before NIO's decoder left (kept, in order).
    private var later: ByteBuffer?
    /// A frame is being handed on, or NIO's decoder has not left yet (it leaves a loop turn after it
    /// is asked to, and the upgrade hands on what came with the request at once): reads wait.
    private var handingOn = true
    /// The client closed its side while NIO's decoder was leaving: told once what it sent before is read.
    private var inputClosedWaiting = false
    private var decoderLeft = false
    private var refused = false
    private(set) var total: UInt64

    /// `bytesBefore`: what went to the socket before this handler counts (the upgrade's response).
    init(limit: ClientMessageLimit, bytesBefore: UInt64 = 0) {
        self.limit = limit
        total = bytesBefore
    }

    func handlerAdded(context: ChannelHandlerContext) {
        self.context = context
    }

    func handlerRemoved(context: ChannelHandlerContext) {
        self.context = nil
    }

    /// On the loop: one whole frame, toward the socket (not flushed).
    func write(_ frame: ByteBuffer) {
        guard let context else { return }
        total &+= UInt64(frame.readableBytes)
        context.write(wrapOutboundOut(frame), promise: nil)
    }

    /// On the loop: sends everything written so far, through either way.
    func flush() {
        context?.flush()
    }

    func write(context: ChannelHandlerContext, data: NIOAny, promise: EventLoopPromise<Void>?) {
        total &+= UInt64(unwrapOutboundIn(data).readableBytes)
        context.write(data, promise: promise)
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        var bytes = unwrapInboundIn(data)
        // Handing a frame on cannot read the socket again in NIO today; should it ever, what comes
        // meanwhile waits for the frame being handed on (frames stay in order).
        guard !handingOn else {
            later.setOrWrite(&bytes)
            return
        }
        handingOn = true
        read(&bytes, context)
        readLater(context)
    }

    /// Reads what waited, then reads as it comes.
    private func readLater(_ context: ChannelHandlerContext) {
        while var next = later, !refused {
            later = nil
            read(&next, context)
        }
        handingOn = false
    }

    /// Reading starts once NIO's frame decoder has left the pipeline (`removal`).
    func read(after removal: EventLoopFuture<Void>) {
        removal.assumeIsolated().whenComplete { result in
            guard let context = self.context else { return }
            switch result {
            case .success:
                self.decoderLeft = true
                self.readLater(context)
                if self.inputClosedWaiting {
                    self.inputClosedWaiting = false
                    context.fireUserInboundEventTriggered(ChannelEvent.inputClosed)
                }
            case .failure: context.close(promise: nil)
            }
        }
    }

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        // What the client sent before it closed its side is read before the handler hears of the close.
        if !decoderLeft, let event = event as? ChannelEvent, event == .inputClosed {
            inputClosedWaiting = true
            return
        }
        context.fireUserInboundEventTriggered(event)
    }

    private func read(_ bytes: inout ByteBuffer, _ context: ChannelHandlerContext) {
        if var start = headerStart {
            headerStart = nil
            start.writeBuffer(&bytes)
            bytes = start
        }
        while !refused {
            if var frame = gathering {
                gathering = nil
                let count = min(frame.header.length - frame.payload.readableBytes, bytes.readableBytes)
                if var part = bytes.readSlice(length: count) { frame.payload.writeBuffer(&part) }
                guard frame.payload.readableBytes == frame.header.length else {
                    gathering = frame
                    return
                }
                handOn(frame.header, frame.payload, context)
                continue
            }
            guard bytes.readableBytes > 0 else { return }
            guard let (header, headerLength) = FrameHeader.read(bytes) else {
                // Only part of a header: kept, copied (not the read's whole buffer).
                headerStart = context.channel.allocator.buffer(buffer: bytes)
                return
            }
            if let error = header.error(limit: limit.bytes) {
                refused = true
                context.fireErrorCaught(error)
                return
            }
            bytes.moveReaderIndex(forwardBy: headerLength)
            if let payload = bytes.readSlice(length: header.length) {
                handOn(header, payload, context)
            } else {
                // Grown as the payload comes (a header alone does not make it reserve the whole length).
                var payload = context.channel.allocator.buffer(capacity: bytes.readableBytes)
                payload.writeBuffer(&bytes)
                gathering = (header, payload)
                return
            }
        }
    }

    private func handOn(_ header: FrameHeader, _ payload: ByteBuffer, _ context: ChannelHandlerContext) {
        // The RSV bits are clear: a frame with one set was refused (``FrameHeader/error(limit:)``).
        context.fireChannelRead(wrapInboundOut(WebSocketFrame(fin: header.fin, opcode: header.opcode, maskKey: header.maskKey, data: payload)))
    }

    /// A frame's header (RFC 6455 §5.2).
    struct FrameHeader {
        /// FIN, the three RSV bits and the opcode.
        var first: UInt8
        var maskKey: WebSocketMaskingKey?
        /// The payload's length (a length past `Int.max` reads as `Int.max`: refused as too long).
        var length: Int

        var fin: Bool { first & 0x80 != 0 }
        var opcode: WebSocketOpcode { WebSocketOpcode(encodedWebSocketOpcode: first & 0x0F) ?? .continuation }

        /// The header at the start of `bytes` and its length in bytes, or nil when `bytes` ends inside it.
        static func read(_ bytes: ByteBuffer) -> (FrameHeader, Int)? {
            let at = bytes.readerIndex
            guard let first = bytes.getInteger(at: at, as: UInt8.self), let second = bytes.getInteger(at: at + 1, as: UInt8.self) else {
                return nil
            }
            var offset = 2
            var length = UInt64(second & 0x7F)
            if length == 126 {
                guard let short = bytes.getInteger(at: at + 2, as: UInt16.self) else { return nil }
                length = UInt64(short)
                offset += 2
            } else if length == 127 {
                guard let long = bytes.getInteger(at: at + 2, as: UInt64.self) else { return nil }
                length = long
                offset += 8
            }
            var maskKey: WebSocketMaskingKey?
            if second & 0x80 != 0 {
                guard let key = bytes.getInteger(at: at + offset, as: UInt32.self) else { return nil }
                maskKey = withUnsafeBytes(of: key.bigEndian) { WebSocketMaskingKey($0) }
                offset += 4
            }
            return (FrameHeader(first: first, maskKey: maskKey, length: Int(clamping: length)), offset)
        }

        /// Why this frame is refused, or nil: what RFC 6455 says a server must fail the connection for
        /// (§5.1, §5.2: an unmasked client frame, an RSV bit no extension was agreed for, a reserved
        /// opcode; ``ProtocolViolation``), and what NIO's decoder refused (with its errors).
        func error(limit: Int) -> (any Error)? {
            if maskKey == nil { return ProtocolViolation(reason: "client frames must be masked") }
            if first & 0x70 != 0 { return ProtocolViolation(reason: "reserved bits set") }
            // Continuation, text, binary; close, ping, pong: the rest are reserved.
            if (0x3...0x7).contains(first & 0x0F) || first & 0x0F > 0xA { return ProtocolViolation(reason: "reserved opcode") }
            if opcode.isControlOpcode {
                if !fin { return NIOWebSocketError.fragmentedControlFrame }
                if length > 125 { return NIOWebSocketError.multiByteControlFrameLength }
            }
            return length > limit ? NIOWebSocketError.invalidFrameLength : nil
        }
    }

    /// A client frame RFC 6455 says fails the connection (close 1002 with `reason`).
    struct ProtocolViolation: Error, Equatable {
        let reason: String
    }

    /// Puts a gate in front of the frame encoder the upgrade added and takes out its frame decoder.
    /// Without TLS the gate counts the socket's bytes from now on, in place of the connection's
    /// ``SocketByteCounter`` (which goes); with TLS that counter stays (it counts what TLS makes of them).
    /// Returns the gate and what counts the socket's bytes.
    static func install(in channel: any Channel, limit: ClientMessageLimit, tls: Bool) throws -> (WireGate, (any SocketBytes)?) {
        // NIO's upgrade puts the encoder, then the decoder: in front of the encoder is in front of both.
        let operations = channel.pipeline.syncOperations
        let encoder = try operations.handler(type: WebSocketFrameEncoder.self)
        let decoder = try operations.context(handlerType: ByteToMessageHandler<WebSocketFrameDecoder>.self)
        let counter = try? operations.handler(type: SocketByteCounter.self)
        let gate = WireGate(limit: limit, bytesBefore: tls ? 0 : counter?.total ?? 0)
        try operations.addHandler(gate, position: .before(encoder))
        let removal = channel.eventLoop.makePromise(of: Void.self)
        operations.removeHandler(context: decoder, promise: removal)
        gate.read(after: removal.futureResult)
        if tls { return (gate, counter) }
        if let counter { operations.removeHandler(counter, promise: nil) }
        return (gate, gate)
    }
}

extension Optional where Wrapped == ByteBuffer {
    /// Appends `bytes` (consumed), making the buffer if there is none.
    fileprivate mutating func setOrWrite(_ bytes: inout ByteBuffer) {
        guard var buffer = self else {
            self = bytes
            bytes.moveReaderIndex(to: bytes.writerIndex)
            return
        }
        self = nil
        buffer.writeBuffer(&bytes)
        self = buffer
    }
}
