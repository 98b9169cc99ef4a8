import NIOCore
import Testing

@testable import PolygonWire

@Suite("Frame encoding")
struct FrameEncoderTests {
    func events(_ count: Int) -> [MarketEvent] {
        (0..<count).map { index in
            MarketEvent(eventType: "Q", ticker: "S\(index)", bytes: ByteBuffer(string: #"{"ev":"Q","sym":"S\#(index)","bp":1.10}"#))
        }
    }

    @Test func encodedFramesParseBackToTheSameEventsInOrder() throws {
        let input = events(25)
        let frames = FrameEncoder.frames(for: input)
        #expect(frames.count == 1)
        let parsed = try frames.flatMap { try FrameParser.parse($0).events }
        #expect(parsed.map(\.json) == input.map(\.json))
    }

    @Test func framesAreSplitUnderTheByteLimit() throws {
        let input = events(100)
        let limit = 300
        let frames = FrameEncoder.frames(for: input, maxFrameBytes: limit)
        #expect(frames.count > 1)
        for frame in frames { #expect(frame.readableBytes <= limit) }
        let parsed = try frames.flatMap { try FrameParser.parse($0).events }
        #expect(parsed.map(\.ticker) == input.map(\.ticker))
    }

    @Test func anEventLargerThanTheLimitGetsAFrameOfItsOwn() throws {
        let big = MarketEvent(
            eventType: "Q", ticker: "B", bytes: ByteBuffer(string: #"{"ev":"Q","sym":"B","pad":"\#(String(repeating: "x", count: 500))"}"#))
        let frames = FrameEncoder.frames(for: events(2) + [big] + events(2), maxFrameBytes: 200)
        let parsed = try frames.map { try FrameParser.parse($0).events.map(\.ticker) }
        #expect(parsed.contains(["B"]))
        #expect(parsed.flatMap { $0 } == ["S0", "S1", "B", "S0", "S1"])
    }

    @Test func statusFramesEscapeTheirText() throws {
        let frame = StatusMessage.error("bad \"quote\"\n").frame
        let parsed = try FrameParser.parse(frame)
        #expect(parsed.statuses == [StatusMessage(status: "error", message: "bad \"quote\"\n")])
    }
}
