import NIOCore
import NIOWebSocket

/// The largest client message one WebSocket connection accepts right now: small until the client has
/// authenticated (a stranger cannot make the relay buffer a megabyte per connection), the full limit
/// after. Shared by the connection's frame decoder (``GatedFrameDecoder``) and its handler, both on the
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

/// NIO's WebSocket frame decoder with a limit that can grow once: it decodes with a decoder of the
/// small limit while ``ClientMessageLimit`` is small and with one of the full limit after. The limit
/// changes only while a decoded frame is being handled (the auth message), so a decoder is always left
/// between frames, and a frame pipelined right behind `auth` (a Go client sends everything at once) is
/// judged by the full limit. A frame over the limit is refused by its header, before its payload is
/// buffered: the decoder's error reaches the connection's handler, which closes with 1009.
final class GatedFrameDecoder: ByteToMessageDecoder {
    typealias InboundOut = WebSocketFrame

    private let limit: ClientMessageLimit
    private let small: WebSocketFrameDecoder
    private let large: WebSocketFrameDecoder

    init(limit: ClientMessageLimit) {
        self.limit = limit
        small = WebSocketFrameDecoder(maxFrameSize: limit.bytes)
        large = WebSocketFrameDecoder(maxFrameSize: limit.full)
    }

    func decode(context: ChannelHandlerContext, buffer: inout ByteBuffer) throws -> DecodingState {
        let decoder = limit.isOpen ? large : small
        return try decoder.decode(context: context, buffer: &buffer)
    }

    func decodeLast(context: ChannelHandlerContext, buffer: inout ByteBuffer, seenEOF: Bool) throws -> DecodingState {
        var decoder = limit.isOpen ? large : small  // a class: the same decoder, not a copy
        return try decoder.decodeLast(context: context, buffer: &buffer, seenEOF: seenEOF)
    }

    /// Puts a gated decoder where the upgrade put NIO's own (before any byte reached it).
    static func replaceUpgradeDecoder(in channel: any Channel, limit: ClientMessageLimit) throws {
        let operations = channel.pipeline.syncOperations
        let original = try operations.context(handlerType: ByteToMessageHandler<WebSocketFrameDecoder>.self)
        try operations.addHandler(ByteToMessageHandler(GatedFrameDecoder(limit: limit)), position: .after(original.handler))
        operations.removeHandler(context: original, promise: nil)
    }
}
