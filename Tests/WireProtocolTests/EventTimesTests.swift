import AlpacaWire
import Foundation
import MarketCore
import NIOCore
import Testing

/// The two fields a client that asked gets in each event: written into its copy of the event's own bytes,
/// in JSON before the closing brace and in MessagePack as two more map entries, with the receive time
/// turned from the monotonic clock into Unix time against the reading's wall clock.
@Suite("Event times")
struct EventTimesTests {
    // Monotonic 5,000 ns is Unix 1,700,000,000,000,005,000 ns; the frame goes out at monotonic 9,000.
    let reading = EventTimes.Reading(sent: 1_700_000_000_000_009_000, monotonicNow: 9_000)

    func written(_ event: MarketEvent) -> ByteBuffer {
        var buffer = ByteBuffer()
        EventTimes.write(event, bytes: event.bytes, reading: reading, into: &buffer)
        return buffer
    }

    @Test func aJSONEventGetsBothFieldsBeforeItsClosingBrace() {
        let event = MarketEvent(eventType: "T", ticker: "AAPL", bytes: ByteBuffer(string: #"{"ev":"T","sym":"AAPL","p":1.5,"_s":3,"_m":9}"#), receivedAt: 5_000)
        #expect(String(buffer: written(event)) == #"{"ev":"T","sym":"AAPL","p":1.5,"_s":3,"_m":9,"_r":1700000000000005000,"_o":1700000000000009000}"#)
        let empty = MarketEvent(eventType: "T", ticker: "AAPL", bytes: ByteBuffer(string: "{ }"), receivedAt: 5_000)
        #expect(String(buffer: written(empty)) == #"{ "_r":1700000000000005000,"_o":1700000000000009000}"#)
    }

    @Test func whatHasNoReceiveTimeOrIsNoObjectIsLeftAsItIs() {
        let notice = MarketEvent(eventType: "status", ticker: "", bytes: ByteBuffer(string: #"{"ev":"status"}"#))
        #expect(String(buffer: written(notice)) == #"{"ev":"status"}"#)
        let odd = MarketEvent(eventType: "T", ticker: "AAPL", bytes: ByteBuffer(string: "[1,2]"), receivedAt: 5_000)
        #expect(String(buffer: written(odd)) == "[1,2]")
        let binary = MarketEvent(eventType: "t", ticker: "AAPL", bytes: ByteBuffer(bytes: [0x93, 1, 2, 3]), receivedAt: 5_000)
        #expect(written(binary) == binary.bytes)
    }

    @Test(arguments: [3, 14, 15, 20])
    func aMessagePackEventGetsTwoMoreEntriesAndAHeaderCountingThem(fieldCount: Int) throws {
        var fields: [(String, MessagePack.Value)] = [("T", .string("t")), ("S", .string("AAPL"))]
        for index in 2..<fieldCount { fields.append(("f\(index)", .int(Int64(index)))) }
        let made = AlpacaEvents.event("t", "AAPL", fields)
        let event = MarketEvent(eventType: "t", ticker: "AAPL", bytes: made.bytes, receivedAt: 5_000)
        let bytes = Array(written(event).readableBytesView)
        let value = try bytes.withUnsafeBytes { raw in
            var reader = MessagePack.Reader(raw)
            return try reader.value()
        }
        guard case .map(let entries) = value else {
            Issue.record("not a map: \(value)")
            return
        }
        #expect(entries.count == fieldCount + 2)
        #expect(value["S"]?.string == "AAPL" && value["f2"]?.integer == (fieldCount > 2 ? 2 : nil))
        #expect(value["_r"]?.integer == 1_700_000_000_000_005_000)
        #expect(value["_o"]?.integer == 1_700_000_000_000_009_000)
    }
}
