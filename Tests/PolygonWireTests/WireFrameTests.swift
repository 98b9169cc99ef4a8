import NIOCore
import NIOEmbedded
import NIOWebSocket
import Testing

@testable import PolygonWire

/// Whole frames as the downstream writes them, read back by NIO's own WebSocket frame decoder (an
/// independent reader of RFC 6455).
@Suite("Wire frames")
struct WireFrameTests {
    func events(_ count: Int, padding: Int = 0) -> [MarketEvent] {
        (0..<count).map { index in
            let pad = String(repeating: "x", count: padding)
            return MarketEvent(
                eventType: "Q", ticker: "S\(index)", bytes: ByteBuffer(string: #"{"ev":"Q","sym":"S\#(index)","p":"\#(pad)"}"#),
                receivedAt: UInt64(10_000 - index))
        }
    }

    /// Decodes every frame in `bytes` with NIO's decoder.
    func decode(_ bytes: ByteBuffer) throws -> [WebSocketFrame] {
        let channel = EmbeddedChannel()
        try channel.pipeline.syncOperations.addHandler(ByteToMessageHandler(WebSocketFrameDecoder(maxFrameSize: 1 << 24)))
        try channel.writeInbound(bytes)
        var frames: [WebSocketFrame] = []
        while let frame = try channel.readInbound(as: WebSocketFrame.self) { frames.append(frame) }
        #expect(try channel.finish().isClean)
        return frames
    }

    @Test(arguments: [1, 2, 3, 10, 400, 2_000])
    func aBuiltFrameIsOneTextFrameOfTheEncodersPayload(count: Int) throws {
        // 1 event: under 126 bytes (2-byte header); 2–400: 16-bit length; 2,000 padded: 64-bit length.
        let input = events(count, padding: count >= 2_000 ? 40 : 0)
        let payload = input.reduce(1) { $0 + $1.bytes.readableBytes + 1 }
        let built = WireFrameBuilder.build(payload: payload) { builder in
            for event in input { builder.append(event) }
        }
        let frames = try decode(built.frame)
        #expect(frames.count == 1)
        #expect(frames.first?.opcode == .text)
        #expect(frames.first?.fin == true)
        #expect(frames.first?.maskKey == nil)
        #expect(frames.first?.data == FrameEncoder.frame(for: input))
        #expect(built.frame.readableBytes == WireFrame.headerLength(payload: payload) + payload)
        #expect(built.oldestReceivedAt == UInt64(10_000 - (count - 1)))
    }

    @Test func headerLengthsFollowTheShortestForm() {
        #expect(WireFrame.headerLength(payload: 125) == 2)
        #expect(WireFrame.headerLength(payload: 126) == 4)
        #expect(WireFrame.headerLength(payload: 65_535) == 4)
        #expect(WireFrame.headerLength(payload: 65_536) == 10)
    }

    @Test func aSizeThatDoesNotAddUpStillGivesAWellFormedFrame() throws {
        let input = events(3)
        let right = input.reduce(1) { $0 + $1.bytes.readableBytes + 1 }
        for wrong in [right - 5, right + 7] {
            let built = WireFrameBuilder.build(payload: wrong) { builder in
                for event in input { builder.append(event) }
            }
            let frames = try decode(built.frame)
            #expect(frames.count == 1)
            // Whatever fitted, as valid JSON of whole events.
            let parsed = try FrameParser.parse(try #require(frames.first?.data))
            #expect(parsed.events.count == (wrong < right ? 2 : 3))
        }
    }

    @Test func eventsPastTheFrameLimitBecomeSeveralWholeFrames() throws {
        let input = events(100)
        let frames = WireFrame.frames(for: input, maxFrameBytes: 300)
        #expect(frames.count > 1)
        var all = ByteBuffer()
        for frame in frames { all.writeImmutableBuffer(frame) }
        let decoded = try decode(all)
        #expect(decoded.count == frames.count)
        for frame in decoded { #expect(frame.data.readableBytes <= 300) }
        let tickers = try decoded.flatMap { try FrameParser.parse($0.data).events.map(\.ticker) }
        #expect(tickers == input.map(\.ticker))
    }
}
