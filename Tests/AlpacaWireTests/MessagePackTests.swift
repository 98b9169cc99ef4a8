import AlpacaWire
import MarketCore
import Testing

/// MessagePack as the format defines it: every form read, each value written in its shortest form, and
/// bytes that are no MessagePack (or lie about their lengths) refused without reading past them.
@Suite("MessagePack")
struct MessagePackTests {
    typealias Value = MessagePack.Value

    @Test func everyValueWrittenReadsBackTheSame() throws {
        let values: [Value] = [
            .null, .bool(true), .bool(false), .int(0), .int(127), .int(128), .int(255), .int(256), .int(65_535), .int(65_536),
            .int(4_294_967_296), .int(-1), .int(-32), .int(-33), .int(-128), .int(-129), .int(-32_768), .int(-32_769), .int(Int64.min),
            .int(Int64.max), .uint(UInt64.max), .double(187.25), .double(-0.5), .string(""), .string("AAPL"),
            .string(String(repeating: "x", count: 40)), .string(String(repeating: "é", count: 200)), .string(String(repeating: "y", count: 70_000)),
            .binary([1, 2, 3]), .array([]), .array((0..<20).map { .int(Int64($0)) }),
            .map([.init(.string("T"), .string("t")), .init(.string("S"), .string("AAPL")), .init(.string("p"), .double(187.25))]),
            .timestamp(seconds: 1_700_000_000, nanoseconds: 0), .timestamp(seconds: 1_700_000_000, nanoseconds: 123_456_789),
            .timestamp(seconds: -1, nanoseconds: 5), .timestamp(seconds: 1 << 40, nanoseconds: 1), .ext(type: 7, data: [9, 9, 9]),
        ]
        for value in values {
            #expect(try MessagePack.decode(MessagePack.encode(value)) == value, "\(String(describing: value).prefix(80))")
        }
    }

    @Test func valuesTakeTheirShortestForms() {
        #expect(MessagePack.encode(.int(5)) == [0x05])
        #expect(MessagePack.encode(.int(-5)) == [0xFB])
        #expect(MessagePack.encode(.int(200)) == [0xCC, 200])
        #expect(MessagePack.encode(.string("ab")) == [0xA2, 0x61, 0x62])
        #expect(MessagePack.encode(.array([.null])) == [0x91, 0xC0])
        // The timestamps msgpack-python writes: 32 bits when whole, 64 with nanoseconds.
        #expect(MessagePack.encode(.timestamp(seconds: 1, nanoseconds: 0)) == [0xD6, 0xFF, 0, 0, 0, 1])
        #expect(MessagePack.encode(.timestamp(seconds: 1, nanoseconds: 1)).prefix(2) == [0xD7, 0xFF])
    }

    @Test func bytesThatAreNoMessagePackAreRefused() {
        let bad: [[UInt8]] = [
            [], [0xC1], [0xA5, 0x61], [0x92, 0x01], [0xDD, 0xFF, 0xFF, 0xFF, 0xFF], [0xDF, 0xFF, 0xFF, 0xFF, 0xFF, 0x01],
            [0xDB, 0x7F, 0xFF, 0xFF, 0xFF], [0xA2, 0xFF, 0xFE], [0xC7, 3, 0xFF, 1, 2, 3], [0x01, 0x02],
            Array(repeating: 0x91, count: 100) + [0xC0],
            // Timestamps whose nanoseconds are 10⁹ or more.
            [0xD7, 0xFF, 0xFF, 0xFF, 0xFF, 0xFC, 0, 0, 0, 1], [0xC7, 12, 0xFF, 0x3B, 0x9A, 0xCA, 0x00, 0, 0, 0, 0, 0, 0, 0, 1],
        ]
        for bytes in bad {
            #expect(throws: MessagePack.ReadError.self, "\(bytes.prefix(8))") { try MessagePack.decode(bytes) }
        }
    }

    @Test func randomBytesNeverCrashTheReader() {
        var generator = SystemRandomNumberGenerator()
        for _ in 0..<20_000 {
            let bytes = (0..<Int.random(in: 0...24, using: &generator)).map { _ in UInt8.random(in: 0...255, using: &generator) }
            _ = try? MessagePack.decode(bytes)
            bytes.withUnsafeBytes { raw in _ = try? AlpacaFrame.read(raw) }
        }
    }
}

@Suite("Alpaca JSON")
struct AlpacaJSONTests {
    /// Bytes are written as an array of numbers, and an excerpt is cut before it is written: a 4 MB value
    /// an upstream sends in a control message is described by its first bytes, not rendered whole.
    /// A key that is a map (whose key is a map, 30 deep) is named by its kind: written and escaped again
    /// at each level, its escapes doubled at each, and 100 bytes of MessagePack became gigabytes.
    @Test func aKeyThatIsAContainerIsNamedNotRendered() {
        var nested: MessagePack.Value = .map([.init(.string("a\"b"), .int(1))])
        for _ in 0..<30 { nested = .map([.init(nested, .int(1))]) }
        #expect(String(decoding: AlpacaJSON.text(nested), as: UTF8.self) == #"{"<map>":1}"#)
        #expect(String(decoding: AlpacaJSON.text(.map([.init(.int(7), .string("x")), .init(.array([]), .null)])), as: UTF8.self) == #"{"7":"x","<array>":null}"#)
        #expect(AlpacaJSON.excerpt(nested, bytes: 300) == #"{"<map>":1}"#)
    }

    @Test func aLimitStopsTheWritingOfALargeValue() {
        #expect(String(decoding: AlpacaJSON.text(.map([.init(.string("x"), .binary([1, 2, 255]))])), as: UTF8.self) == #"{"x":[1,2,255]}"#)
        let large: MessagePack.Value = .map([
            .init(.string("T"), .string("subscription")), .init(.string("x"), .binary([UInt8](repeating: 7, count: 4 << 20))),
            .init(.string("y"), .array(Array(repeating: .string("AAPL"), count: 100_000))),
        ])
        let cut = AlpacaJSON.excerpt(large, bytes: 300)
        #expect(cut.utf8.count == 300, "\(cut.utf8.count) bytes")
        #expect(cut.hasPrefix(#"{"T":"subscription","x":[7,7,"#))
        #expect(AlpacaJSON.text(large).count > 8 << 20, "unlimited: all of it")
        let text: MessagePack.Value = .map([.init(.string(String(repeating: "k", count: 1 << 20)), .string(String(repeating: "\u{1}", count: 4 << 20)))])
        #expect(AlpacaJSON.excerpt(text, bytes: 300) == #"{""# + String(repeating: "k", count: 298), "cut before it is written")
        #expect(AlpacaJSON.excerpt(.array([.int(1), .string("ab")]), bytes: 300) == #"[1,"ab"]"#, "a short value whole")
    }

    @Test func timestampsAreRFC3339WithTheirFractionTrimmed() {
        #expect(AlpacaJSON.rfc3339(seconds: 1_614_009_104, nanoseconds: 208_000_000) == "2021-02-22T15:51:44.208Z")
        #expect(AlpacaJSON.rfc3339(seconds: 1_614_021_300, nanoseconds: 0) == "2021-02-22T19:15:00Z")
        #expect(AlpacaJSON.rfc3339(seconds: 1_653_403_814, nanoseconds: 653_397_416) == "2022-05-24T14:50:14.653397416Z")
        #expect(AlpacaJSON.rfc3339(seconds: 0, nanoseconds: 1) == "1970-01-01T00:00:00.000000001Z")
        #expect(AlpacaJSON.rfc3339(seconds: 951_782_400, nanoseconds: 0) == "2000-02-29T00:00:00Z")
        // Past what RFC 3339 writes: no crash, the plain seconds.
        #expect(AlpacaJSON.rfc3339(seconds: Int64.min, nanoseconds: 0) == "\(Int64.min)")
        #expect(AlpacaJSON.rfc3339(seconds: -62_167_219_200, nanoseconds: 0) == "0000-01-01T00:00:00Z")
    }

    @Test func aTradeReadsAsAlpacasJSON() {
        let trade = MessagePack.Value.map([
            .init(.string("T"), .string("t")), .init(.string("S"), .string("AAPL")), .init(.string("p"), .double(126.55)),
            .init(.string("s"), .int(1)), .init(.string("t"), .timestamp(seconds: 1_614_009_104, nanoseconds: 208_000_000)),
            .init(.string("c"), .array([.string("@"), .string("I")])), .init(.string("z"), .string("C\"q\n")),
        ])
        #expect(
            String(decoding: AlpacaJSON.text(trade), as: UTF8.self)
                == #"{"T":"t","S":"AAPL","p":126.55,"s":1,"t":"2021-02-22T15:51:44.208Z","c":["@","I"],"z":"C\"q\n"}"#)
    }

    @Test func clientJSONReadsIntoValues() {
        let text = Array(#" {"action":"subscribe","trades":["AAPL","\u0041B"],"n":-2,"x":1.5,"ok":true,"none":null} "#.utf8)
        let value = AlpacaJSONReader.value(text)
        #expect(value?["action"] == .string("subscribe"))
        #expect(value?["trades"] == .array([.string("AAPL"), .string("AB")]))
        #expect(value?["n"] == .int(-2) && value?["x"] == .double(1.5) && value?["ok"] == .bool(true) && value?["none"] == .null)
        for bad in [#"{"a":}"#, #"{"a" 1}"#, "[1,2", #""open"#, "{} {}", "tru", String(repeating: "[", count: 40) + String(repeating: "]", count: 40)] {
            #expect(AlpacaJSONReader.value(Array(bad.utf8)) == nil, "\(bad)")
        }
    }
}
