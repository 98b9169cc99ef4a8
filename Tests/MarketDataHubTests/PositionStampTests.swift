@testable import MarketCore
import NIOCore
import Testing

/// Positions written into JSON events: byte for byte what a client reads, whatever the event's size,
/// the positions' widths and where the buffers of a publish end.
@Suite("Positions stamped into JSON events")
struct PositionStampTests {
    static func event(_ text: String) -> MarketEvent {
        MarketEvent(eventType: "T", ticker: "AAPL", bytes: ByteBuffer(string: text), receivedAt: 0)
    }

    /// The stamp as the wire defines it: the two fields before the closing brace, with a comma after any
    /// field already there.
    static func expected(_ text: String, _ position: EventPosition) -> String {
        guard text.count >= 2, text.hasSuffix("}") else { return text }
        let body = text.dropLast()
        let empty = body.allSatisfy { $0 == "{" || $0 == " " || $0 == "\n" || $0 == "\t" || $0 == "\r" }
        return "\(body)\(empty ? "" : ",")\"_s\":\(position.topic),\"_m\":\(position.market)}"
    }

    @Test func eachEventGetsBothFieldsBeforeItsClosingBrace() {
        let texts = [
            #"{"ev":"T","sym":"AAPL","p":1.5}"#, "{}", "{ }", "[1,2]", "}", #"{"ev":"Q","sym":"A"}"#,
            #"{"ev":"T","sym":"B","x":{"y":[1,{}]}}"#,
        ]
        let positions = [
            EventPosition(topic: 1, market: 1), EventPosition(topic: 9, market: 10), EventPosition(topic: 10, market: 99),
            EventPosition(topic: 5, market: 6), EventPosition(topic: 7, market: 8),
            EventPosition(topic: UInt64.max, market: UInt64.max), EventPosition(topic: 1 << 53, market: 123_456_789_012),
        ]
        let stamped = EventPosition.stamp(texts.map(Self.event), positions)
        #expect(stamped.count == texts.count)
        for (index, event) in stamped.enumerated() {
            #expect(String(buffer: event.bytes) == Self.expected(texts[index], positions[index]), "event \(index)")
            #expect(event.sequence == positions[index].market)
        }
        #expect(EventPosition.readWritten(from: stamped[0].bytes) == positions[0])
        #expect(EventPosition.readWritten(from: stamped[6].bytes) == positions[6])
    }

    @Test func aPublishLargerThanOneBufferIsStampedWhole() {
        // Events of many sizes, past several 16 KiB buffers, one larger than a buffer on its own.
        var texts: [String] = []
        for index in 0..<3_000 {
            let padding = String(repeating: "x", count: (index * 37) % 300)
            texts.append(#"{"ev":"T","sym":"S\#(index)","c":"\#(padding)"}"#)
        }
        texts.insert(#"{"ev":"T","sym":"BIG","c":""# + String(repeating: "y", count: 40_000) + #""}"#, at: 1_500)
        let positions = texts.indices.map { EventPosition(topic: UInt64($0 % 17 + 1), market: UInt64($0) * 1_000_003 + 1) }
        let stamped = EventPosition.stamp(texts.map(Self.event), positions)
        #expect(stamped.count == texts.count)
        for (index, event) in stamped.enumerated() where String(buffer: event.bytes) != Self.expected(texts[index], positions[index]) {
            Issue.record("event \(index) stamped as \(String(buffer: event.bytes).prefix(120))")
        }
    }
}

extension PositionStampTests {
    /// The widest stamp (20-digit positions) into exactly the room the stamp promises, and a buffer that a
    /// publish fills to its last byte with it.
    @Test func theWidestStampFitsItsRoomExactly() {
        let text = #"{"ev":"T","sym":"AAPL","p":1.5}"#
        let widest = EventPosition(topic: UInt64.max, market: UInt64.max)
        let expected = Self.expected(text, widest)
        #expect(expected.utf8.count == text.utf8.count + EventPosition.maxGrowth, "the widest stamp grows an event by maxGrowth")
        let body = Array(text.utf8.dropLast())
        let room = UnsafeMutableRawBufferPointer.allocate(byteCount: text.utf8.count + EventPosition.maxGrowth, alignment: 1)
        defer { room.deallocate() }
        let written = body.withUnsafeBytes { EventPosition.writeStamped(body: $0, widest, into: room) }
        #expect(written == room.count)
        #expect(String(decoding: UnsafeRawBufferPointer(room), as: UTF8.self) == expected)
        // 76 bytes and 52 of growth: a 128-byte buffer filled to its end.
        let filling = #"{"ev":"T","sym":"AAPL","c":""# + String(repeating: "z", count: 76 - 30) + #""}"#
        #expect(filling.utf8.count == 76)
        let stamped = EventPosition.stamp([Self.event(filling)], [widest])
        #expect(stamped.map { String(buffer: $0.bytes) } == [Self.expected(filling, widest)])
    }
}
