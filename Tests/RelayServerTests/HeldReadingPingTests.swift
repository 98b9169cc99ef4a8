import NIOCore
import NIOEmbedded
import NIOWebSocket
import Testing

@testable import RelayServer

/// A client whose reading the relay holds (its hub changes backlogged, its pace, its socket full while
/// it still reads) cannot have its pong read: the ping deadline does not judge it gone meanwhile, and
/// does again once reading goes on.
@Suite struct HeldReadingPingTests {
    private static let interval = TimeAmount.seconds(30)

    /// The real handler in an embedded pipeline, its ping deadlines on the embedded loop.
    private func connection(pace: WebSocketConnectionHandler.InboundPace = .init(perSecond: 100, burst: 100)) throws -> (
        EmbeddedChannel, WebSocketConnectionHandler
    ) {
        let channel = EmbeddedChannel()
        let pings = LoopDeadlineQueue<WebSocketConnectionHandler>(loop: channel.embeddedEventLoop, delay: Self.interval) { $0.pingOrDrop() }
        let handler = WebSocketConnectionHandler(
            pings: pings, closeTimeout: .seconds(5), messageLimit: ClientMessageLimit(initial: 4096, full: 4096), outboundLimit: 1 << 20,
            pace: pace)
        try channel.pipeline.syncOperations.addHandler(handler)
        try channel.connect(to: SocketAddress(ipAddress: "127.0.0.1", port: 1)).wait()
        return (channel, handler)
    }

    private func pingsWritten(_ channel: EmbeddedChannel) throws -> Int {
        var count = 0
        while let frame = try channel.readOutbound(as: WebSocketFrame.self) {
            if frame.opcode == .ping { count += 1 }
        }
        return count
    }

    /// A connection pinged once (a quiet client, an interval after it opened).
    private func pinged(pace: WebSocketConnectionHandler.InboundPace = .init(perSecond: 100, burst: 100)) throws -> (
        EmbeddedChannel, WebSocketConnectionHandler
    ) {
        let (channel, handler) = try connection(pace: pace)
        channel.embeddedEventLoop.advanceTime(by: Self.interval)
        #expect(try pingsWritten(channel) == 1, "a quiet client is pinged after an interval")
        return (channel, handler)
    }

    /// The next deadline spares the unanswered peer (`why`); the one after, a whole interval of
    /// reading later with still no pong, drops it.
    private func expectSparedOnceThenDropped(_ channel: EmbeddedChannel, _ why: String) {
        channel.embeddedEventLoop.advanceTime(by: Self.interval)
        #expect(channel.isActive, "\(why): not judged yet")
        channel.embeddedEventLoop.advanceTime(by: Self.interval)
        #expect(!channel.isActive, "a whole interval read, no pong: gone")
    }

    @Test func aPeerWhoseReadingIsHeldIsNotDroppedForAnUnreadPong() throws {
        let (channel, handler) = try pinged()

        handler.holdReading(true)
        channel.embeddedEventLoop.advanceTime(by: Self.interval * 3)
        #expect(channel.isActive, "three intervals without a pong while its reading is held: still open")
        #expect(try pingsWritten(channel) == 0, "no second ping while the first waits unread")

        handler.holdReading(false)
        expectSparedOnceThenDropped(channel, "the next deadline came as reading went on")
    }

    /// A hold that began and ended between two deadlines counts too: the pong may be behind what the
    /// client sent meanwhile.
    @Test func aHoldBetweenTwoDeadlinesGivesTheNextOneAnIntervalMore() throws {
        let (channel, handler) = try pinged()
        handler.holdReading(true)
        handler.holdReading(false)
        expectSparedOnceThenDropped(channel, "held since the last deadline")
    }

    /// Past its pace a client is not read until a token is due: that hold counts too.
    @Test func aClientPausedByItsPaceIsJudgedAfterAWholeIntervalOfReading() throws {
        let (channel, _) = try pinged(pace: .init(perSecond: 1, burst: 1))
        // Two frames: the second finds no token, and reading pauses for a second.
        try channel.writeInbound(WebSocketFrame(fin: true, opcode: .ping, data: ByteBuffer()))
        try channel.writeInbound(WebSocketFrame(fin: true, opcode: .ping, data: ByteBuffer()))
        expectSparedOnceThenDropped(channel, "paused by its pace since the last deadline")
    }

    /// The client's socket full: the relay stops reading it too. If it takes bytes again within the
    /// interval, it reads (slowly), and its pong may still wait unread: judged an interval later.
    @Test func aSlowReaderWhoseSocketFilledIsJudgedAfterAWholeIntervalOfReading() throws {
        let (channel, _) = try pinged()
        setWritable(channel, false)
        setWritable(channel, true)
        expectSparedOnceThenDropped(channel, "its socket was full since the last deadline, and took bytes again")
    }

    /// A socket that fills during the interval may hold a pong behind what the client read late; one
    /// that stays full for the whole next interval (a peer that reads nothing, once its kernel buffers
    /// are full) is not spared again.
    @Test func aSocketFullForAWholeIntervalIsNotSpared() throws {
        let (channel, _) = try pinged()
        setWritable(channel, false)
        expectSparedOnceThenDropped(channel, "its socket filled during the interval")
    }

    @Test func aSocketThatDrainedOnceThenStaysFullIsDroppedAfterTheNextInterval() throws {
        let (channel, _) = try pinged()
        setWritable(channel, false)
        channel.embeddedEventLoop.advanceTime(by: Self.interval)
        #expect(channel.isActive, "filled during the interval: not judged yet")
        setWritable(channel, true)
        setWritable(channel, false)
        expectSparedOnceThenDropped(channel, "it took bytes again during the interval")
    }

    /// Full already when the ping went: nothing taken for the whole interval after it.
    @Test func aSocketFullWhenPingedIsDroppedAtTheNextDeadline() throws {
        let (channel, _) = try connection()
        setWritable(channel, false)
        channel.embeddedEventLoop.advanceTime(by: Self.interval)
        #expect(try pingsWritten(channel) == 1, "pinged after an interval, its socket full")
        channel.embeddedEventLoop.advanceTime(by: Self.interval)
        #expect(!channel.isActive, "full at the ping and since: gone")
    }

    private func setWritable(_ channel: EmbeddedChannel, _ writable: Bool) {
        channel.isWritable = writable
        channel.pipeline.fireChannelWritabilityChanged()
    }

    @Test func aPeerThatIsReadAndDoesNotAnswerIsDropped() throws {
        let (channel, _) = try pinged()
        channel.embeddedEventLoop.advanceTime(by: Self.interval)
        #expect(!channel.isActive, "no pong for a whole interval")
    }

    @Test func aPongKeepsAHeldPeerOnceItIsRead() throws {
        let (channel, handler) = try pinged()
        handler.holdReading(true)
        channel.embeddedEventLoop.advanceTime(by: Self.interval)
        handler.holdReading(false)
        try channel.writeInbound(WebSocketFrame(fin: true, opcode: .pong, data: ByteBuffer()))
        channel.embeddedEventLoop.advanceTime(by: Self.interval)
        #expect(channel.isActive, "the pong read after the hold answers the ping")
        #expect(try pingsWritten(channel) == 1, "and the next interval pings again")
    }
}

/// A client that sends a close frame and then reads nothing more never takes the relay's answer: the
/// connection is closed anyway after the close timeout (it held its slot, its address's place and its
/// session for good: no ping is sent to a closing connection, and no write completes).
@Suite struct ClientCloseTimeoutTests {
    /// Takes every write and completes none (a socket whose peer reads nothing).
    private final class NeverWritten: ChannelOutboundHandler {
        typealias OutboundIn = NIOAny
        var held: [EventLoopPromise<Void>] = []
        func write(context: ChannelHandlerContext, data: NIOAny, promise: EventLoopPromise<Void>?) {
            if let promise { held.append(promise) }
        }
        func flush(context: ChannelHandlerContext) {}
    }

    @Test func aClientThatClosesAndReadsNothingMoreIsClosedAfterTheCloseTimeout() throws {
        let channel = EmbeddedChannel()
        let pings = LoopDeadlineQueue<WebSocketConnectionHandler>(loop: channel.embeddedEventLoop, delay: .seconds(30)) { $0.pingOrDrop() }
        let handler = WebSocketConnectionHandler(
            pings: pings, closeTimeout: .seconds(5), messageLimit: ClientMessageLimit(initial: 4096, full: 4096), outboundLimit: 1 << 20,
            pace: .init(perSecond: 100, burst: 100))
        let stalled = NeverWritten()
        try channel.pipeline.syncOperations.addHandler(stalled)
        try channel.pipeline.syncOperations.addHandler(handler)
        try channel.connect(to: SocketAddress(ipAddress: "127.0.0.1", port: 1)).wait()

        var code = ByteBuffer()
        code.write(webSocketErrorCode: .normalClosure)
        try channel.writeInbound(WebSocketFrame(fin: true, opcode: .connectionClose, data: code))
        #expect(!stalled.held.isEmpty, "the answer was written (and waits)")
        channel.embeddedEventLoop.advanceTime(by: .seconds(4))
        #expect(channel.isActive, "within the close timeout: still open")
        channel.embeddedEventLoop.advanceTime(by: .seconds(2))
        #expect(!channel.isActive, "past the close timeout: closed, its answer never taken")
        for promise in stalled.held { promise.fail(ChannelError.ioOnClosedChannel) }
    }
}
