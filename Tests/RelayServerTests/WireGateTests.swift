import NIOCore
import NIOEmbedded
import NIOWebSocket
import Testing

@testable import RelayServer

/// What reaches the handler after the gate: frames, and errors.
private final class Collector: ChannelInboundHandler {
    typealias InboundIn = WebSocketFrame
    var frames: [WebSocketFrame] = []
    var errors: [NIOWebSocketError] = []
    var violations: [WireGate.ProtocolViolation] = []
    /// Frames read and the input's close, in the order they came.
    var order: [String] = []

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        frames.append(unwrapInboundIn(data))
        order.append("frame")
    }

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        if let event = event as? ChannelEvent, event == .inputClosed { order.append("input closed") }
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        if let error = error as? NIOWebSocketError { errors.append(error) }
        if let violation = error as? WireGate.ProtocolViolation { violations.append(violation) }
    }
}

/// A client frame as a client sends it: masked, with a 7-bit, 16-bit or 64-bit length as its size needs.
private func clientFrame(_ opcode: UInt8, _ payload: [UInt8], fin: Bool = true, mask: [UInt8] = [0x12, 0x34, 0x56, 0x78]) -> [UInt8] {
    var bytes: [UInt8] = [(fin ? 0x80 : 0) | opcode]
    switch payload.count {
    case ..<126: bytes.append(0x80 | UInt8(payload.count))
    case ..<65536: bytes += [0x80 | 126, UInt8(payload.count >> 8), UInt8(payload.count & 0xFF)]
    default: bytes += [0x80 | 127] + (0..<8).reversed().map { UInt8((payload.count >> ($0 * 8)) & 0xFF) }
    }
    bytes += mask
    bytes += payload.enumerated().map { $0.element ^ mask[$0.offset % 4] }
    return bytes
}

@Suite("The wire gate: client frames read off the raw bytes, the limit judged from the header, bytes out counted")
struct WireGateTests {
    /// A gate reading into a collector, on an embedded channel; `reading`: NIO's decoder has left.
    private func gate(limit: Int = 1 << 20, bytesBefore: UInt64 = 0, reading: Bool = true) throws
        -> (EmbeddedChannel, WireGate, Collector, EventLoopPromise<Void>)
    {
        let channel = EmbeddedChannel()
        let gate = WireGate(limit: ClientMessageLimit(initial: limit, full: limit), bytesBefore: bytesBefore)
        let collector = Collector()
        try channel.pipeline.syncOperations.addHandler(gate)
        try channel.pipeline.syncOperations.addHandler(collector)
        let removal = channel.eventLoop.makePromise(of: Void.self)
        gate.read(after: removal.futureResult)
        if reading { removal.succeed() }
        return (channel, gate, collector, removal)
    }

    private static let text = Array(#"{"action":"subscribe","params":"T.AAPL"}"#.utf8)
    private static let medium = (0..<300).map { UInt8($0 % 251) }
    private static let stream: [UInt8] =
        clientFrame(0x1, text) + clientFrame(0x2, medium) + clientFrame(0x9, Array("hi".utf8)) + clientFrame(0x1, Array("part one, ".utf8), fin: false)
        + clientFrame(0x0, Array("part two".utf8)) + clientFrame(0x1, [])

    private static func expectTheStream(_ frames: [WebSocketFrame], _ comment: Comment) {
        #expect(frames.map(\.opcode) == [.text, .binary, .ping, .text, .continuation, .text], comment)
        #expect(frames.map(\.fin) == [true, true, true, false, true, true], comment)
        #expect(frames.map { Array($0.unmaskedData.readableBytesView) } == [text, medium, Array("hi".utf8), Array("part one, ".utf8), Array("part two".utf8), []], comment)
    }

    @Test func framesComeOutTheSameHoweverTheReadsCutThem() throws {
        // Whole, then cut in two at every byte (inside headers, masks, 16-bit lengths and payloads).
        for cut in 0..<Self.stream.count {
            let (channel, _, collector, _) = try gate()
            for part in [Self.stream[..<cut], Self.stream[cut...]] where !part.isEmpty {
                try channel.writeInbound(ByteBuffer(bytes: part))
            }
            Self.expectTheStream(collector.frames, "cut at byte \(cut)")
            #expect(collector.errors.isEmpty)
        }
        // A byte at a time.
        let (channel, _, collector, _) = try gate()
        for byte in Self.stream { try channel.writeInbound(ByteBuffer(bytes: [byte])) }
        Self.expectTheStream(collector.frames, "a byte a read")
    }

    @Test func aLongFrameIsReadWhole() throws {
        let payload = (0..<70_000).map { UInt8($0 % 253) }
        let (channel, _, collector, _) = try gate()
        let bytes = clientFrame(0x2, payload)
        for start in stride(from: 0, to: bytes.count, by: 4096) {
            try channel.writeInbound(ByteBuffer(bytes: bytes[start..<min(start + 4096, bytes.count)]))
        }
        #expect(collector.frames.count == 1)
        #expect(collector.frames.first.map { Array($0.unmaskedData.readableBytesView) } == payload, "a 64-bit length, over 18 reads")
    }

    @Test func aFrameOverTheLimitIsRefusedFromItsHeaderAndNothingAfterIsRead() throws {
        let (channel, _, collector, _) = try gate(limit: 100)
        // Only the header of the long frame comes: refused before any payload.
        try channel.writeInbound(ByteBuffer(bytes: clientFrame(0x1, Self.text) + Array(clientFrame(0x1, Self.medium).prefix(8))))
        #expect(collector.frames.count == 1, "the frame before it is read")
        #expect(collector.errors == [.invalidFrameLength])
        try channel.writeInbound(ByteBuffer(bytes: clientFrame(0x1, Self.text)))
        #expect(collector.frames.count == 1, "nothing after the refusal")
        #expect(collector.errors.count == 1)
    }

    @Test func controlFramesMustBeShortAndWhole() throws {
        let (long, _, longCollector, _) = try gate()
        try long.writeInbound(ByteBuffer(bytes: clientFrame(0x9, Array(repeating: 7, count: 126))))
        #expect(longCollector.errors == [.multiByteControlFrameLength])
        #expect(longCollector.frames.isEmpty)
        let (fragmented, _, fragmentedCollector, _) = try gate()
        try fragmented.writeInbound(ByteBuffer(bytes: clientFrame(0x8, [3, 232], fin: false)))
        #expect(fragmentedCollector.errors == [.fragmentedControlFrame])
        #expect(fragmentedCollector.frames.isEmpty)
    }

    @Test func whatRFC6455SaysFailsTheConnectionDoes() throws {
        var unmasked = clientFrame(0x1, Self.text)
        unmasked[1] &= 0x7F
        unmasked.removeSubrange(2..<6)
        var reservedBit = clientFrame(0x1, Self.text)
        reservedBit[0] |= 0x40
        for (bytes, reason) in [
            (unmasked, "client frames must be masked"), (reservedBit, "reserved bits set"), (clientFrame(0x3, Self.text), "reserved opcode"),
            (clientFrame(0xB, []), "reserved opcode"),
        ] {
            let (channel, _, collector, _) = try gate()
            try channel.writeInbound(ByteBuffer(bytes: bytes + clientFrame(0x1, Self.text)))
            #expect(collector.violations == [WireGate.ProtocolViolation(reason: reason)])
            #expect(collector.frames.isEmpty, "nothing is read from a connection that failed: \(reason)")
        }
    }

    @Test func whatComesBeforeNIOsDecoderHasLeftIsReadAfterInOrder() throws {
        let (channel, _, collector, removal) = try gate(reading: false)
        try channel.writeInbound(ByteBuffer(bytes: Self.stream.prefix(20)))
        try channel.writeInbound(ByteBuffer(bytes: Self.stream.dropFirst(20)))
        #expect(collector.frames.isEmpty, "nothing is handed on while the decoder is still there")
        removal.succeed()
        Self.expectTheStream(collector.frames, "handed on once it left")
    }

    @Test func aCloseOfTheClientsSideWhileNIOsDecoderLeavesComesAfterWhatItSentBefore() throws {
        let (channel, _, collector, removal) = try gate(reading: false)
        try channel.writeInbound(ByteBuffer(bytes: clientFrame(0x1, Self.text)))
        channel.pipeline.fireUserInboundEventTriggered(ChannelEvent.inputClosed)
        #expect(collector.order.isEmpty)
        removal.succeed()
        #expect(collector.order == ["frame", "input closed"])
        channel.pipeline.fireUserInboundEventTriggered(ChannelEvent.inputClosed)
        #expect(collector.order == ["frame", "input closed", "input closed"], "once reading, events pass at once")
    }

    @Test func everyByteWrittenPastTheGateIsCountedFromWhatCameBefore() throws {
        let (channel, gate, _, _) = try gate(bytesBefore: 129)
        gate.write(ByteBuffer(bytes: [0x81, 3, 1, 2, 3]))
        try channel.writeOutbound(ByteBuffer(bytes: [0x89, 0]))
        #expect(gate.total == 129 + 5 + 2)
        #expect(try channel.readOutbound(as: ByteBuffer.self)?.readableBytes == 5)
        #expect(try channel.readOutbound(as: ByteBuffer.self)?.readableBytes == 2)
    }

    /// The pipeline NIO's upgrade leaves (a byte counter from the connection's start, then its encoder and
    /// decoder), with 150 bytes counted (the upgrade's response).
    private func upgradedPipeline() throws -> (EmbeddedChannel, SocketByteCounter) {
        let channel = EmbeddedChannel()
        let counter = SocketByteCounter()
        try channel.pipeline.syncOperations.addHandler(counter)
        try channel.writeOutbound(ByteBuffer(repeating: 0, count: 150))
        try channel.pipeline.syncOperations.addHandler(WebSocketFrameEncoder())
        try channel.pipeline.syncOperations.addHandler(ByteToMessageHandler(WebSocketFrameDecoder(maxFrameSize: 1 << 20)))
        try channel.pipeline.syncOperations.addHandler(Collector())
        return (channel, counter)
    }

    @Test func withoutTLSTheGateTakesOverTheCountAndNIOsDecoderLeaves() throws {
        let (channel, counter) = try upgradedPipeline()
        let (gate, socketBytes) = try WireGate.install(in: channel, limit: ClientMessageLimit(initial: 4096, full: 4096), tls: false)
        #expect(socketBytes === gate, "the gate counts")
        #expect(gate.total == counter.total && gate.total == 150, "from what the counter had")
        #expect((try? channel.pipeline.syncOperations.handler(type: SocketByteCounter.self)) == nil, "the counter is gone")
        channel.embeddedEventLoop.run()
        #expect((try? channel.pipeline.syncOperations.handler(type: ByteToMessageHandler<WebSocketFrameDecoder>.self)) == nil, "NIO's decoder is gone")
        try channel.writeInbound(ByteBuffer(bytes: clientFrame(0x1, Self.text)))
        let collector = try channel.pipeline.syncOperations.handler(type: Collector.self)
        #expect(collector.frames.map { Array($0.unmaskedData.readableBytesView) } == [Self.text], "frames come from the gate")
    }

    @Test func withTLSTheCounterStaysForWhatTLSMakesOfTheBytes() throws {
        let (channel, counter) = try upgradedPipeline()
        let (gate, socketBytes) = try WireGate.install(in: channel, limit: ClientMessageLimit(initial: 4096, full: 4096), tls: true)
        #expect(socketBytes === counter)
        #expect(gate.total == 0)
        #expect((try? channel.pipeline.syncOperations.handler(type: SocketByteCounter.self)) != nil)
    }
}
