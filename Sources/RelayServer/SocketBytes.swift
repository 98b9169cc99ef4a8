import NIOConcurrencyHelpers
import NIOCore

/// What counts the bytes written to a connection's socket: a ``SocketByteCounter``, or without TLS
/// the connection's ``WireGate`` once it is upgraded. Read on the connection's loop.
protocol SocketBytes: AnyObject {
    var total: UInt64 { get }
}

/// Counts the bytes written to a connection's socket (first in the pipeline, after TLS, so it counts
/// what TCP carries). Confined to the channel's loop; read by the connection's handler after its writes.
/// Without TLS a WebSocket connection's ``WireGate`` takes over at the upgrade and this one goes.
final class SocketByteCounter: ChannelOutboundHandler, RemovableChannelHandler, SocketBytes {
    typealias OutboundIn = IOData
    typealias OutboundOut = IOData

    private(set) var total: UInt64 = 0

    func write(context: ChannelHandlerContext, data: NIOAny, promise: EventLoopPromise<Void>?) {
        let data = unwrapOutboundIn(data)
        total &+= UInt64(data.readableBytes)
        context.write(wrapOutboundOut(data), promise: promise)
    }

    /// Returns once every byte handed to `channel` before the call has gone to its socket, or the
    /// channel failed or closed: an empty write below every other handler (TLS included), which NIO
    /// completes in order, after the writes queued before it. A response that has been handed over
    /// whole may still sit in NIO's buffer for a client that does not read; this is when it has gone.
    /// At once where no counter is in the pipeline (a WebSocket connection without TLS).
    static func written(on channel: any Channel) async {
        let done: EventLoopFuture<Void> = channel.eventLoop.flatSubmit {
            guard let context = try? channel.pipeline.syncOperations.context(handlerType: SocketByteCounter.self) else {
                return channel.eventLoop.makeSucceededVoidFuture()
            }
            let promise = channel.eventLoop.makePromise(of: Void.self)
            context.writeAndFlush(NIOAny(IOData.byteBuffer(ByteBuffer())), promise: promise)
            return promise.futureResult
        }
        try? await done.get()
    }
}

/// The start of Linux's `struct tcp_info` (`<linux/tcp.h>`) through `tcpi_bytes_acked`: 8 one-byte
/// fields, 24 `__u32`, then `__u64` pacing rate, max pacing rate and bytes acknowledged (byte 120).
/// The kernel fills as much as is asked for, so this prefix is all that is read.
struct TCPInfoPrefix: Sendable {
    var words: (UInt64, UInt64, UInt64, UInt64, UInt64, UInt64, UInt64, UInt64, UInt64, UInt64, UInt64, UInt64, UInt64, UInt64, UInt64, UInt64) =
        (0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)

    /// `tcpi_bytes_acked`: bytes the peer's TCP stack acknowledged.
    var bytesAcknowledged: UInt64 { words.15 }

    /// The socket's acknowledged bytes, read on the channel's loop (`nil` where the socket cannot say).
    static func bytesAcknowledged(by channel: any Channel) -> UInt64? {
        guard let provider = channel as? any SocketOptionProvider else { return nil }
        let acknowledged = NIOLockedValueBox<UInt64?>(nil)
        // On its loop the option is read inline: the future is complete when it returns.
        provider.unsafeGetSocketOption(level: 6 /* IPPROTO_TCP */, name: 11 /* TCP_INFO */).whenSuccess { (info: TCPInfoPrefix) in
            acknowledged.withLockedValue { $0 = info.bytesAcknowledged }
        }
        return acknowledged.withLockedValue { $0 }
    }
}
