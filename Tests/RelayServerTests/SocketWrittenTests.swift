import NIOCore
import NIOPosix
import RelayTestSupport
import Synchronization
import Testing

@testable import RelayServer

/// `SocketByteCounter.written(on:)`: a response handed to NIO whole is not yet sent; this waits until
/// what was queued before it has gone to the socket. On a real loopback connection whose client does
/// not read.
@Suite struct SocketWrittenTests {
    @Test func returnsOnlyOnceTheBytesQueuedBeforeItHaveGoneToTheSocket() async throws {
        let group = MultiThreadedEventLoopGroup(numberOfThreads: 1)
        let accepted = group.next().makePromise(of: (any Channel).self)
        let server = try await ServerBootstrap(group: group)
            .childChannelOption(.socketOption(.so_sndbuf), value: 4096)
            .childChannelInitializer { child in
                child.eventLoop.makeCompletedFuture {
                    try child.pipeline.syncOperations.addHandler(SocketByteCounter())
                    accepted.succeed(child)
                }
            }
            .bind(host: "127.0.0.1", port: 0).get()
        let port = try #require(server.localAddress?.port)
        // A client that reads nothing until told.
        let client = try await ClientBootstrap(group: group)
            .channelOption(.autoRead, value: false)
            .channelOption(.socketOption(.so_rcvbuf), value: 4096)
            .connect(host: "127.0.0.1", port: port).get()
        let child = try await accepted.futureResult.get()

        // 8 MiB in 64 KiB writes: far more than the two small socket buffers take.
        let pieces = 128
        let writesDone = Mutex(0)
        for _ in 0..<pieces {
            child.writeAndFlush(ByteBuffer(repeating: 1, count: 64 << 10)).whenComplete { _ in writesDone.withLock { $0 += 1 } }
        }
        try await eventually("NIO to hold what the socket does not take", timeout: .seconds(10)) {
            try await child.eventLoop.submit { !child.isWritable }.get()
        }
        let writtenAtStart = writesDone.withLock { $0 }
        #expect(writtenAtStart < pieces, "some writes wait in NIO")

        let seenWhenWritten = Mutex<Int?>(nil)
        let waiter = Task {
            await SocketByteCounter.written(on: child)
            seenWhenWritten.withLock { $0 = writesDone.withLock { $0 } }
        }
        // The client reads: the writes go, in order, then the empty one.
        try await client.setOption(.autoRead, value: true).get()
        client.read()
        await waiter.value
        #expect(seenWhenWritten.withLock { $0 } == pieces, "every write queued before it went first")

        // A channel without a counter (here the client's; a WebSocket connection without TLS) has
        // nothing to wait for, even with a write of its own waiting.
        try await client.setOption(.autoRead, value: false).get()
        client.writeAndFlush(ByteBuffer(repeating: 2, count: 4 << 20), promise: nil)
        await SocketByteCounter.written(on: client)

        try await client.close().get()
        try await server.close().get()
        try await group.shutdownGracefully()
    }
}
