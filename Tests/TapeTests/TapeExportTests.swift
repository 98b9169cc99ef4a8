import AlpacaWire
import Foundation
import MarketCore
import NIOCore
import PolygonWire
import Testing

@testable import Tape
@testable import TapeReplay

/// A recorded day written out as JSON lines or CSV, from real tape files: the window and the topics
/// kept, each line the vendor's event with its receive time, Alpaca's MessagePack as its JSON, CSV
/// columns from the events' own fields, quoted where they must be.
@Suite("Tape export: a recorded day as JSON lines or CSV")
struct TapeExportTests {
    static let midnight = TapeFile.midnight(of: "2026-11-20") ?? 0

    func withTape(_ events: [TapeEvent], _ body: (String) throws -> Void) throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("tape-export-\(UUID().uuidString)").path
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let writer = try TapeWriter(directory: directory, market: "stocks", blockBytes: 512)
        try writer.append(.epoch("e1", at: Self.midnight))
        for event in events { try writer.append(.event(event)) }
        try writer.flush()
        try body(TapeFile.path(directory: directory, market: "stocks", day: "2026-11-20"))
    }

    func polygon(_ index: Int) -> TapeEvent {
        let trade = index % 2 == 0
        let text = trade
            ? #"{"ev":"T","sym":"AAPL","p":189.5,"s":100,"c":[0,12],"t":\#(index)}"#
            : #"{"ev":"Q","sym":"MSFT","bp":415.1,"ap":415.2,"x":"a,\"b\"","t":\#(index)}"#
        return TapeEvent(
            receivedAt: Self.midnight + Int64(index) * 1_000_000_000, sequence: UInt64(index + 1), topicSequence: UInt64(index / 2 + 1),
            eventType: trade ? "T" : "Q",
            ticker: trade ? "AAPL" : "MSFT", bytes: Array(text.utf8))
    }

    func export(_ path: String, _ format: TapeExport.Format, topics: String? = nil, from: Int64? = nil, to: Int64? = nil, wire: any WireProtocol = .polygon)
        throws -> (text: String, outcome: TapeExport.Outcome)
    {
        var text = ""
        let export = TapeExport(path: path, topics: topics.map { Topic.parseList($0).topics } ?? [], from: from, to: to, format: format, wire: wire)
        let outcome = try export.run { text += $0 }
        return (text, outcome)
    }

    @Test func jsonLinesAreTheVendorsEventsWithTheirReceiveTimeInOrder() throws {
        try withTape((0..<10).map(polygon)) { path in
            let (text, outcome) = try export(path, .jsonl)
            let lines = text.split(separator: "\n").map(String.init)
            #expect(outcome.events == 10 && lines.count == 10)
            #expect(lines[0] == #"{"ev":"T","sym":"AAPL","p":189.5,"s":100,"c":[0,12],"t":0,"_r":\#(Self.midnight),"_s":1,"_m":1}"#)
            let objects = lines.compactMap { try? JSONSerialization.jsonObject(with: Data($0.utf8)) as? [String: Any] }
            #expect(objects.count == 10, "every line is a JSON object")
            #expect(objects.map { $0["_m"] as? Int } == (1...10).map { $0 }, "in arrival order")
            // Only trades of AAPL, from 00:00:03 to 00:00:07.
            let window = try export(path, .jsonl, topics: "T.AAPL", from: Self.midnight + 3_000_000_000, to: Self.midnight + 7_000_000_000)
            let kept = window.text.split(separator: "\n").compactMap { try? JSONSerialization.jsonObject(with: Data($0.utf8)) as? [String: Any] }
            #expect(kept.map { $0["t"] as? Int } == [4, 6], "\(window.text)")
            #expect(try export(path, .jsonl, topics: "Q.*").outcome.events == 5)
        }
    }

    @Test func csvHasAColumnPerFieldAndQuotesWhatItMust() throws {
        try withTape((0..<4).map(polygon)) { path in
            let (text, outcome) = try export(path, .csv)
            let lines = text.split(separator: "\n").map(String.init)
            #expect(outcome.events == 4 && lines.count == 5)
            #expect(lines[0] == "received_ns,received_utc,topic_sequence,market_sequence,event_type,symbol,p,s,c,t,bp,ap,x", "the fields in the order first seen")
            #expect(lines[1] == "\(Self.midnight),2026-11-20T00:00:00.000000000Z,1,1,T,AAPL,189.5,100,\"[0,12]\",0,,,")
            #expect(lines[2] == "\(Self.midnight + 1_000_000_000),2026-11-20T00:00:01.000000000Z,1,2,Q,MSFT,,,,1,415.1,415.2,\"a,\"\"b\"\"\"")
        }
    }

    @Test func alpacasMessagePackIsWrittenAsItsJSON() throws {
        let trade = AlpacaEvents.trade("AAPL", id: 7, price: 189.5, size: 100, nanoseconds: 1_700_000_000_000_000_000)
        let event = TapeEvent(
            receivedAt: Self.midnight, sequence: 1, eventType: "t", ticker: "AAPL", bytes: Array(trade.bytes.readableBytesView))
        try withTape([event]) { path in
            let (text, outcome) = try export(path, .jsonl, wire: .alpaca(.iex))
            #expect(outcome.events == 1 && outcome.unreadable == 0)
            let object = try #require(try JSONSerialization.jsonObject(with: Data(text.utf8)) as? [String: Any], "\(text)")
            #expect(object["T"] as? String == "t" && object["S"] as? String == "AAPL" && object["p"] as? Double == 189.5, "\(object)")
            #expect(object["_r"] as? Int == Int(Self.midnight))
            let csv = try export(path, .csv, wire: .alpaca(.iex)).text
            #expect(csv.hasPrefix("received_ns,received_utc,topic_sequence,market_sequence,event_type,symbol,i,x,p,s,c,z,t\n"), "\(csv)")
        }
    }

    @Test func fieldsAreReadInTheirOrderAndAnythingElseEndsThem() {
        #expect(JSONFields.keys(#"{"b":1, "a":[1,{"x":2}],"c":"q\"uote","d":{"e":"}"}}"#) == ["b", "a", "c", "d"])
        #expect(JSONFields.values(#"{"a":[1,2],"c":"q\"uote"}"#) == ["a": "[1,2]", "c": #"q"uote"#])
        #expect(JSONFields.keys("not json").isEmpty)
        #expect(JSONFields.keys(#"{"a":1,"b""#) == ["a"], "a torn object keeps what it read")
        #expect(TapeExport.utc(-100_000_000) == "1970-01-01T00:00:00.000000000Z", "a time read from a file is never trapped on")
        #expect(TapeExport.utc(1_500_000_001) == "1970-01-01T00:00:01.500000001Z")
    }
}
