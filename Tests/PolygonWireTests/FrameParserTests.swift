import Foundation
import MarketCore
import NIOCore
import Testing

@testable import PolygonWire

/// One line of `sample-events.jsonl`: a channel and the exact bytes of its example frame.
struct SampleFrame: CustomTestStringConvertible, Sendable {
    var channel: String
    var frameText: String
    var testDescription: String { channel }

    static func load() throws -> [SampleFrame] {
        let url = try #require(Bundle.module.url(forResource: "sample-events", withExtension: "jsonl", subdirectory: "Fixtures"))
        let text = try String(contentsOf: url, encoding: .utf8)
        return try text.split(separator: "\n").map { line in
            let object = try JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any]
            let channel = try #require(object?["channel"] as? String)
            // The frame's own bytes, exactly as published: from `"frame":` to the line's last `}`.
            let marker = try #require(line.range(of: #""frame":"#))
            let end = try #require(line.lastIndex(of: "}"))
            return SampleFrame(channel: channel, frameText: String(line[marker.upperBound..<end]))
        }
    }
}

/// The ticker each sample event must route by, per the protocol notes.
let expectedTicker: [String: String] = [
    "/stocks/T": "MSFT", "/stocks/Q": "MSFT", "/stocks/A": "SPCE", "/stocks/AM": "GTE", "/stocks/LULD": "MSFT",
    "/stocks/NOI": "NTEST.Q", "/business/stocks/FMV": "AAPL", "/launchpad/stocks/AM": "GTE",
    "/launchpad/stocks/LV": "AAPL", "/options/T": "O:AMC210827C00037000", "/options/Q": "O:SPY241220P00720000",
    "/options/A": "O:ONEM220121C00025000", "/options/AM": "O:ONEM220121C00025000",
    "/business/options/FMV": "O:TSLA210903C00700000", "/launchpad/options/AM": "O:ONEM220121C00025000",
    "/launchpad/options/LV": "O:TSLA210903C00700000", "/forex/C": "USD/CNH", "/forex/CA": "USD/EUR",
    "/forex/CAS": "USD/EUR", "/business/forex/FMV": "C:EURUSD", "/launchpad/forex/AM": "C:USD-EUR",
    "/launchpad/forex/LV": "C:EURUSD", "/crypto/XT": "BTC-USD", "/crypto/XQ": "BTC-USD", "/crypto/XL2": "BTC-USD",
    "/crypto/XA": "BCD-USD", "/crypto/XAS": "BCD-USD", "/business/crypto/FMV": "X:BTC-USD",
    "/launchpad/crypto/AM": "X:BTC-USD", "/launchpad/crypto/LV": "X:BTC-USD", "/indices/A": "I:SPX",
    "/indices/AM": "I:SPX", "/indices/V": "I:SPX",
]

@Suite("Frame parsing")
struct FrameParserTests {
    /// An upstream status's words are the vendor's: bounded and printable before they reach a log or a client.
    @Test func anUpstreamStatusMessageIsCutAndCleaned() throws {
        let frame = ByteBuffer(string: #"[{"ev":"status","status":"error","message":"bad\u0007\u001b"# + String(repeating: "y", count: 50_000) + #""}]"#)
        let parsed = try PolygonWireProtocol().readUpstream(frame, receivedAt: 0, market: .stocks)
        let status = try #require(parsed.controls.first?.message as? StatusMessage)
        let message = status.message
        #expect(status.status == "error")
        #expect(message.utf8.count <= VisibleText.vendorBytes && message.hasPrefix("bad y"), "\(message.prefix(20))")
    }

    @Test("every published example frame parses, routes by its ticker field and keeps its bytes", arguments: try SampleFrame.load())
    func samplesRouteAndKeepBytes(sample: SampleFrame) throws {
        let parsed = try FrameParser.parse(sample.frameText)
        #expect(parsed.statuses.isEmpty)
        #expect(parsed.skipped == 0)
        let event = try #require(parsed.events.first)
        #expect(parsed.events.count == 1)
        #expect(event.ticker == expectedTicker[sample.channel])
        // The element is the frame minus its brackets, byte for byte.
        #expect("[" + event.json + "]" == sample.frameText)
    }

    @Test func allSampleChannelsAreCovered() throws {
        let channels = Set(try SampleFrame.load().map(\.channel))
        #expect(channels == Set(expectedTicker.keys))
    }

    @Test func eachEventTypeUsesItsOwnTickerField() throws {
        // A trade has a numeric `p` (price) and a forex quote a string `p` (pair): each must route right.
        let frame =
            #"[{"ev":"T","sym":"AAPL","p":189.5,"pair":"X"},{"ev":"C","p":"EUR/USD","sym":"WRONG"},{"ev":"V","T":"I:SPX","sym":"WRONG"},{"ev":"XQ","pair":"ETH-USD","sym":"WRONG"}]"#
        let parsed = try FrameParser.parse(frame)
        #expect(parsed.events.map(\.topic.description) == ["T.AAPL", "C.EUR/USD", "V.I:SPX", "XQ.ETH-USD"])
    }

    @Test func unknownEventTypeFallsBackToTheFirstTickerFieldPresent() throws {
        let parsed = try FrameParser.parse(#"[{"ev":"NEW","pair":"A-B"},{"ev":"NEW2","T":"Z"}]"#)
        #expect(parsed.events.map(\.topic.description) == ["NEW.A-B", "NEW2.Z"])
    }

    @Test func statusMessagesAreRecognised() throws {
        let parsed = try FrameParser.parse(
            #"[{"ev":"status","status":"auth_success","message":"authenticated"},{"ev":"Q","sym":"A"},{"ev":"status","status":"success","message":"subscribed to: Q.A"}]"#
        )
        #expect(
            parsed.statuses == [
                StatusMessage(status: "auth_success", message: "authenticated"),
                StatusMessage(status: "success", message: "subscribed to: Q.A"),
            ])
        #expect(parsed.events.count == 1)
    }

    @Test func unknownFieldsNumberFormatsAndWhitespaceSurviveByteForByte() throws {
        let element =
            #"{ "ev" : "Q", "sym":"AAPL", "bp":1.50, "ap":1E+3, "z":-0.0, "new":{"deep":[1,[2,{"x":null}]],"s":"\u00e9\n"}, "ok":true }"#
        let parsed = try FrameParser.parse("[ \(element) ,\n{\"ev\":\"T\",\"sym\":\"B\"} ]")
        #expect(parsed.events.first?.json == element)
        #expect(parsed.events.count == 2)
    }

    @Test func escapedTickersAreDecoded() throws {
        let parsed = try FrameParser.parse(#"[{"ev":"Q","sym":"A\u0042C"},{"ev":"C","p":"EUR\/USD"}]"#)
        #expect(parsed.events.map(\.ticker) == ["ABC", "EUR/USD"])
    }

    @Test func elementsWithoutTypeOrTickerAreSkippedAndCounted() throws {
        let parsed = try FrameParser.parse(#"[{"sym":"A"},{"ev":"Q"},{"ev":"Q","sym":5},42,"x",{"ev":"Q","sym":"OK"}]"#)
        #expect(parsed.events.map(\.ticker) == ["OK"])
        #expect(parsed.skipped == 5)
    }

    @Test func aBareObjectIsAcceptedAsAFrameOfOne() throws {
        let parsed = try FrameParser.parse(#"{"ev":"Q","sym":"A"}"#)
        #expect(parsed.events.count == 1)
    }

    @Test(
        "malformed input is an error, never a crash",
        arguments: [
            "", " ", "[", "[{", #"[{"ev":"Q""#, #"[{"ev":"Q","sym":"A"}"#, #"[{"ev":"Q","sym":"A"}]]"#,
            #"[{"ev":"Q","sym":"A",}]"#, #"[{"ev"}]"#, "[01]", "[1.]", "[-]", "[1e]", "[\"\u{01}\"]", #"["\q"]"#,
            #"["\u12G4"]"#, "[tru]", "[nul]", "null", "42", #"[{"ev":"Q","sym":"A"} {"ev":"T"}]"#, "[,]", "[1,]",
            #"[{"a" 1}]"#, #"[{1:2}]"#, "[\"unterminated]", "]", "[]x",
        ])
    func malformedInputThrows(input: String) {
        #expect(throws: WireError.self) { try FrameParser.parse(input) }
    }

    @Test func everyTruncationOfAValidFrameIsRejected() throws {
        let frame =
            #"[{"ev":"XL2","pair":"BTC-USD","b":[[33712.71,0.18635]],"a":[[1e-3,0.1]],"s":"x\"y"},{"ev":"status","status":"success","message":"m"}]"#
        let bytes = Array(frame.utf8)
        for length in 0..<bytes.count {
            var buffer = ByteBuffer()
            buffer.writeBytes(bytes[0..<length])
            #expect(throws: WireError.self, "prefix of \(length) bytes") { try FrameParser.parse(buffer) }
        }
        #expect(try FrameParser.parse(frame).events.count == 1)
    }

    @Test func nestingBeyondTheLimitIsRejected() {
        let deep = String(repeating: "[", count: 200) + String(repeating: "]", count: 200)
        #expect(throws: WireError.self) { try FrameParser.parse(#"[{"ev":"Q","sym":"A","x":\#(deep)}]"#) }
    }

    @Test func eventBytesShareTheFrameStorageAndOutliveIt() throws {
        var frame: ByteBuffer? = ByteBuffer(string: #"[{"ev":"Q","sym":"A","bp":1}]"#)
        let event = try #require(try FrameParser.parse(frame!).events.first)
        frame = nil
        #expect(event.json == #"{"ev":"Q","sym":"A","bp":1}"#)
    }
}
