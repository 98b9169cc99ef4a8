import MarketCore
import NIOCore
import Tape

/// A recorded day written out as text: one event per line, in arrival order, each with the time the
/// relay received it. `jsonl`: the vendor's own event object (Alpaca's MessagePack as its JSON) with
/// fields added at its end, `"_r"` (receive time, UTC ns), `"_s"` (topic sequence, when recorded) and
/// `"_m"` (market sequence), as the relay adds positions live. `csv`: a header, then
/// `received_ns,received_utc,topic_sequence,market_sequence,event_type,symbol` and one column per field
/// of the events exported (in the order first seen; arrays as JSON text).
///
/// Value type, `Sendable`.
public struct TapeExport: Sendable {
    public enum Format: String, Sendable, CaseIterable {
        case jsonl, csv
    }

    /// The day file read.
    public var path: String
    /// The topics written (`Q.*` a type's every symbol); empty: every event.
    public var topics: [Topic]
    /// The window, as UTC ns of receive time.
    public var from: Int64?
    public var to: Int64?
    public var format: Format
    /// The events' protocol: how an event is written as JSON.
    public var wire: any WireProtocol

    public init(path: String, topics: [Topic] = [], from: Int64? = nil, to: Int64? = nil, format: Format, wire: any WireProtocol) {
        self.path = path
        self.topics = topics
        self.from = from
        self.to = to
        self.format = format
        self.wire = wire
    }

    /// What an export did.
    public struct Outcome: Sendable, Equatable {
        public var events = 0
        /// Events whose bytes could not be written as JSON (counted, left out).
        public var unreadable = 0
        /// Blocks of the tape that did not check (skipped).
        public var skippedBlocks = 0
    }

    /// Writes the export through `write` (a few KB at a time), returns what it did.
    public func run(_ write: (String) throws -> Void) throws -> Outcome {
        let reader = try TapeReader(path: path)
        var outcome = Outcome()
        switch format {
        case .jsonl:
            var text = ""
            try events(reader, &outcome) { event, json in
                text += Self.withReceipt(json, event)
                text += "\n"
                if text.utf8.count >= 64 << 10 {
                    try write(text)
                    text = ""
                }
            }
            if !text.isEmpty { try write(text) }
        case .csv:
            // The columns: every field of the events exported, in the order first seen (a first pass), at
            // most ``maxColumns`` (each row writes each column: events each with a field of its own would
            // make the file grow as their count squared).
            var columns: [String] = []
            var known = Set<String>()
            var first = Outcome()
            try events(reader, &first) { _, json in
                for key in JSONFields.keys(json) where columns.count < Self.maxColumns && !Self.identity.contains(key) && known.insert(key).inserted {
                    columns.append(key)
                }
            }
            var text = (["received_ns", "received_utc", "topic_sequence", "market_sequence", "event_type", "symbol"] + columns).map(Self.csvCell).joined(separator: ",") + "\n"
            try events(reader, &outcome) { event, json in
                let fields = JSONFields.values(json)
                let leading = [
                    "\(event.receivedAt)", Self.utc(event.receivedAt), event.topicSequence == 0 ? "" : "\(event.topicSequence)", "\(event.sequence)",
                    event.eventType, event.ticker,
                ]
                text += (leading + columns.map { fields[$0] ?? "" }).map(Self.csvCell).joined(separator: ",") + "\n"
                if text.utf8.count >= 64 << 10 {
                    try write(text)
                    text = ""
                }
            }
            if !text.isEmpty { try write(text) }
        }
        return outcome
    }

    /// The fields that name an event's type and symbol (their own columns in CSV).
    static let identity: Set<String> = ["ev", "sym", "pair", "T", "S"]

    /// The most fields a CSV export has a column for (those first seen; the others are left out).
    static let maxColumns = 1_000

    /// Each event of the window and topics, with its JSON text.
    private func events(_ reader: TapeReader, _ outcome: inout Outcome, _ body: (TapeEvent, String) throws -> Void) throws {
        for case .event(let event) in reader.records(from: from ?? .min, through: to ?? .max) {
            guard topics.isEmpty || topics.contains(where: { $0.matches(eventType: event.eventType, ticker: event.ticker) })
            else { continue }
            let market = MarketEvent(eventType: event.eventType, ticker: event.ticker, bytes: event.bytes)
            guard let answer = wire.httpAnswer(market, accept: "application/json"), answer.contentType == "application/json",
                let json = answer.body.getString(at: answer.body.readerIndex, length: answer.body.readableBytes), json.hasSuffix("}")
            else {
                outcome.unreadable += 1
                continue
            }
            outcome.events += 1
            try body(event, json)
        }
        outcome.skippedBlocks = reader.skippedBlocks.count
    }

    /// `json` with `"_r"`, `"_s"` (when recorded) and `"_m"` before its closing brace.
    static func withReceipt(_ json: String, _ event: TapeEvent) -> String {
        let separator = json == "{}" ? "" : ","
        let topic = event.topicSequence == 0 ? "" : ",\"_s\":\(event.topicSequence)"
        return String(json.dropLast()) + "\(separator)\"_r\":\(event.receivedAt)\(topic),\"_m\":\(event.sequence)}"
    }

    /// `2026-11-20T09:30:00.123456789Z`.
    static func utc(_ nanoseconds: Int64) -> String {
        // A time read from a file: before 1970 it is written as 1970's start, never trapped on.
        let nanoseconds = max(nanoseconds, 0)
        let fraction = String(nanoseconds % 1_000_000_000)
        return "\(TapeFile.day(of: nanoseconds))T\(TapeFile.clock(of: nanoseconds)).\(String(repeating: "0", count: 9 - fraction.count))\(fraction)Z"
    }

    /// A CSV cell: quoted when it holds a comma, a quote or a line break (quotes doubled).
    static func csvCell(_ text: String) -> String {
        guard text.contains(where: { $0 == "," || $0 == "\"" || $0 == "\n" || $0 == "\r" }) else { return text }
        return "\"" + text.replacingOccurrences(of: "\"", with: "\"\"") + "\""
    }
}

/// The top-level fields of a JSON object's text, in their order, each value as its JSON text (a string's
/// without its quotes and escapes undone only for `\"` and `\\`). Enough for a vendor's flat event
/// objects; anything it cannot follow ends the fields found so far.
enum JSONFields {
    static func keys(_ json: String) -> [String] { fields(json).map(\.key) }

    static func values(_ json: String) -> [String: String] {
        Dictionary(fields(json).map { ($0.key, $0.value) }, uniquingKeysWith: { first, _ in first })
    }

    static func fields(_ json: String) -> [(key: String, value: String)] {
        let bytes = Array(json.utf8)
        var index = 0
        var fields: [(key: String, value: String)] = []
        func skipSpace() { while index < bytes.count, [0x20, 0x09, 0x0A, 0x0D].contains(bytes[index]) { index += 1 } }
        /// A string starting at `index` (its quote): its text, `index` past it.
        func string() -> String? {
            guard index < bytes.count, bytes[index] == UInt8(ascii: "\"") else { return nil }
            index += 1
            var text: [UInt8] = []
            while index < bytes.count, bytes[index] != UInt8(ascii: "\"") {
                if bytes[index] == UInt8(ascii: "\\"), index + 1 < bytes.count {
                    index += 1
                    if bytes[index] != UInt8(ascii: "\""), bytes[index] != UInt8(ascii: "\\") { text.append(UInt8(ascii: "\\")) }
                }
                text.append(bytes[index])
                index += 1
            }
            guard index < bytes.count else { return nil }
            index += 1
            return String(decoding: text, as: UTF8.self)
        }
        /// Any other value: its text up to the `,` or `}` that ends it at this depth.
        func raw() -> String? {
            let start = index
            var depth = 0
            var quoted = false
            while index < bytes.count {
                let byte = bytes[index]
                if quoted {
                    if byte == UInt8(ascii: "\\") { index += 1 } else if byte == UInt8(ascii: "\"") { quoted = false }
                } else if byte == UInt8(ascii: "\"") {
                    quoted = true
                } else if byte == UInt8(ascii: "[") || byte == UInt8(ascii: "{") {
                    depth += 1
                } else if byte == UInt8(ascii: "]") || byte == UInt8(ascii: "}") {
                    if depth == 0 { break }
                    depth -= 1
                } else if byte == UInt8(ascii: ","), depth == 0 {
                    break
                }
                index += 1
            }
            guard index <= bytes.count, index > start else { return nil }
            return String(decoding: bytes[start..<index], as: UTF8.self).trimmingSpaces()
        }
        skipSpace()
        guard index < bytes.count, bytes[index] == UInt8(ascii: "{") else { return [] }
        index += 1
        while true {
            skipSpace()
            guard let key = string() else { return fields }
            skipSpace()
            guard index < bytes.count, bytes[index] == UInt8(ascii: ":") else { return fields }
            index += 1
            skipSpace()
            guard let value = index < bytes.count && bytes[index] == UInt8(ascii: "\"") ? string() : raw() else { return fields }
            fields.append((key, value))
            skipSpace()
            guard index < bytes.count, bytes[index] == UInt8(ascii: ",") else { return fields }
            index += 1
        }
    }
}

extension String {
    fileprivate func trimmingSpaces() -> String {
        var text = Substring(self)
        while text.last?.isWhitespace == true { text = text.dropLast() }
        while text.first?.isWhitespace == true { text = text.dropFirst() }
        return String(text)
    }
}
