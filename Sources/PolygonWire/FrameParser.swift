import NIOCore

/// Reads Polygon server frames without decoding them: it validates the JSON, finds each element's
/// boundaries, its `ev`, and the ticker field that event type routes by, and keeps the element's bytes.
///
/// Pure functions, no I/O, safe from any thread. Foundation's `JSONDecoder` costs several microseconds
/// per event; this scanner touches each byte once and allocates only the event array (and tickers over
/// 15 bytes). Malformed or truncated input throws ``WireError``; it never traps.
public enum FrameParser {
    /// The deepest nesting accepted inside an event (Polygon's is 3: `XL2` books).
    public static let maxDepth = 32

    /// Parses a frame: a JSON array of objects (a single bare object is accepted too).
    /// - Parameters:
    ///   - receivedAt: stamped on every event (monotonic ns), for latency accounting.
    ///   - market: the market the frame came from: each event's ticker is routed in that market's topic
    ///     form (a crypto `pair` `BTC-USD` on topic `XT.X:BTC-USD`; ``Market/topicTicker(_:)``). The
    ///     event's bytes are untouched.
    public static func parse(_ frame: ByteBuffer, receivedAt: UInt64 = 0, market: Market = .stocks) throws -> ParsedFrame {
        try frame.withUnsafeReadableBytes { raw in
            var scanner = Scanner(bytes: raw, receivedAt: receivedAt, market: market)
            return try scanner.parseFrame(source: frame)
        }
    }

    /// Parses a frame from a string (tests and tools).
    public static func parse(_ text: String) throws -> ParsedFrame {
        try parse(ByteBuffer(string: text))
    }
}

/// The fields of one top-level object that routing needs, as byte ranges into the frame.
private struct ElementFields {
    var ev: Range<Int>?
    var sym: Range<Int>?
    var pair: Range<Int>?
    var p: Range<Int>?
    var T: Range<Int>?
    var status: Range<Int>?
    var message: Range<Int>?
    /// Ranges whose string holds escapes: read through the slow decoder.
    var escaped: Set<Int> = []

    func range(of field: TickerField) -> Range<Int>? {
        switch field {
        case .sym: return sym
        case .pair: return pair
        case .p: return p
        case .T: return T
        }
    }
}

private struct Scanner {
    let bytes: UnsafeRawBufferPointer
    let receivedAt: UInt64
    let market: Market
    var index = 0

    init(bytes: UnsafeRawBufferPointer, receivedAt: UInt64, market: Market) {
        self.bytes = bytes
        self.receivedAt = receivedAt
        self.market = market
    }

    // MARK: frame

    mutating func parseFrame(source: ByteBuffer) throws -> ParsedFrame {
        var result = ParsedFrame()
        skipWhitespace()
        guard index < bytes.count else { throw fault("empty frame") }
        switch bytes[index] {
        case UInt8(ascii: "["):
            index += 1
            skipWhitespace()
            if peek() == UInt8(ascii: "]") {
                index += 1
            } else {
                while true {
                    try parseElement(into: &result, source: source)
                    skipWhitespace()
                    guard index < bytes.count else { throw fault("truncated: array not closed") }
                    let c = bytes[index]
                    index += 1
                    if c == UInt8(ascii: ",") { continue }
                    if c == UInt8(ascii: "]") { break }
                    throw fault("expected ',' or ']' between elements")
                }
            }
        case UInt8(ascii: "{"):
            try parseElement(into: &result, source: source)
        default:
            throw fault("a frame must be a JSON array")
        }
        skipWhitespace()
        guard index == bytes.count else { throw fault("trailing bytes after the frame") }
        return result
    }

    mutating func parseElement(into result: inout ParsedFrame, source: ByteBuffer) throws {
        skipWhitespace()
        guard index < bytes.count else { throw fault("truncated: element expected") }
        guard bytes[index] == UInt8(ascii: "{") else {
            try skipValue(depth: 1)
            result.skipped += 1
            return
        }
        let start = index
        let fields = try parseTopObject()
        let end = index
        guard let evRange = fields.ev else {
            result.skipped += 1
            return
        }
        let ev = string(evRange, fields)
        if ev == "status" {
            let status = fields.status.map { string($0, fields) } ?? ""
            let message = fields.message.map { string($0, fields) } ?? ""
            result.statuses.append(StatusMessage(status: status, message: message))
            return
        }
        let tickerRange: Range<Int>?
        if let field = TickerField.forEventType(ev) {
            tickerRange = fields.range(of: field)
        } else {
            tickerRange = TickerField.fallbackOrder.lazy.compactMap { fields.range(of: $0) }.first
        }
        guard let tickerRange, !tickerRange.isEmpty else {
            result.skipped += 1
            return
        }
        var ticker = string(tickerRange, fields)
        if market.tickerPrefix != nil { ticker = market.topicTicker(ticker) }
        // The slice shares the frame's storage: no copy of the event's bytes.
        guard let slice = source.getSlice(at: source.readerIndex + start, length: end - start) else {
            throw fault("internal: element outside the frame")
        }
        result.events.append(MarketEvent(eventType: ev, ticker: ticker, bytes: slice, receivedAt: receivedAt))
    }

    /// Parses the members of a top-level event object, remembering the string fields routing needs.
    mutating func parseTopObject() throws -> ElementFields {
        var fields = ElementFields()
        index += 1  // {
        skipWhitespace()
        if peek() == UInt8(ascii: "}") {
            index += 1
            return fields
        }
        while true {
            skipWhitespace()
            guard peek() == UInt8(ascii: "\"") else { throw fault("expected a member name") }
            let (keyRange, _) = try scanString()
            skipWhitespace()
            guard peek() == UInt8(ascii: ":") else { throw fault("expected ':' after a member name") }
            index += 1
            skipWhitespace()
            if peek() == UInt8(ascii: "\"") {
                let (valueRange, hasEscapes) = try scanString()
                if hasEscapes { fields.escaped.insert(valueRange.lowerBound) }
                assign(key: keyRange, value: valueRange, to: &fields)
            } else {
                try skipValue(depth: 2)
            }
            skipWhitespace()
            guard index < bytes.count else { throw fault("truncated: object not closed") }
            let c = bytes[index]
            index += 1
            if c == UInt8(ascii: ",") { continue }
            if c == UInt8(ascii: "}") { return fields }
            throw fault("expected ',' or '}' in an object")
        }
    }

    func assign(key: Range<Int>, value: Range<Int>, to fields: inout ElementFields) {
        switch key.count {
        case 1:
            switch bytes[key.lowerBound] {
            case UInt8(ascii: "p"): fields.p = value
            case UInt8(ascii: "T"): fields.T = value
            default: break
            }
        case 2:
            if bytes[key.lowerBound] == UInt8(ascii: "e"), bytes[key.lowerBound + 1] == UInt8(ascii: "v") {
                fields.ev = value
            }
        case 3:
            if equals(key, "sym") { fields.sym = value }
        case 4:
            if equals(key, "pair") { fields.pair = value }
        case 6:
            if equals(key, "status") { fields.status = value }
        case 7:
            if equals(key, "message") { fields.message = value }
        default: break
        }
    }

    func equals(_ range: Range<Int>, _ literal: StaticString) -> Bool {
        guard range.count == literal.utf8CodeUnitCount else { return false }
        let lit = literal.utf8Start
        for offset in 0..<range.count where bytes[range.lowerBound + offset] != lit[offset] {
            return false
        }
        return true
    }

    func string(_ range: Range<Int>, _ fields: ElementFields) -> String {
        let raw = UnsafeRawBufferPointer(rebasing: bytes[range])
        if fields.escaped.contains(range.lowerBound) {
            return Scanner.unescape(raw)
        }
        return String(decoding: raw, as: UTF8.self)
    }

    // MARK: values

    mutating func skipValue(depth: Int) throws {
        guard depth <= FrameParser.maxDepth else { throw fault("nesting deeper than \(FrameParser.maxDepth)") }
        skipWhitespace()
        guard index < bytes.count else { throw fault("truncated: value expected") }
        switch bytes[index] {
        case UInt8(ascii: "\""):
            _ = try scanString()
        case UInt8(ascii: "{"):
            index += 1
            skipWhitespace()
            if peek() == UInt8(ascii: "}") {
                index += 1
                return
            }
            while true {
                skipWhitespace()
                guard peek() == UInt8(ascii: "\"") else { throw fault("expected a member name") }
                _ = try scanString()
                skipWhitespace()
                guard peek() == UInt8(ascii: ":") else { throw fault("expected ':' after a member name") }
                index += 1
                try skipValue(depth: depth + 1)
                skipWhitespace()
                guard index < bytes.count else { throw fault("truncated: object not closed") }
                let c = bytes[index]
                index += 1
                if c == UInt8(ascii: ",") { continue }
                if c == UInt8(ascii: "}") { return }
                throw fault("expected ',' or '}' in an object")
            }
        case UInt8(ascii: "["):
            index += 1
            skipWhitespace()
            if peek() == UInt8(ascii: "]") {
                index += 1
                return
            }
            while true {
                try skipValue(depth: depth + 1)
                skipWhitespace()
                guard index < bytes.count else { throw fault("truncated: array not closed") }
                let c = bytes[index]
                index += 1
                if c == UInt8(ascii: ",") { continue }
                if c == UInt8(ascii: "]") { return }
                throw fault("expected ',' or ']' in an array")
            }
        case UInt8(ascii: "t"): try expectLiteral("true")
        case UInt8(ascii: "f"): try expectLiteral("false")
        case UInt8(ascii: "n"): try expectLiteral("null")
        default:
            try scanNumber()
        }
    }

    /// Scans a string starting at its opening quote; returns the range of its content.
    mutating func scanString() throws -> (Range<Int>, hasEscapes: Bool) {
        index += 1  // opening quote
        let start = index
        var hasEscapes = false
        while index < bytes.count {
            let c = bytes[index]
            if c == UInt8(ascii: "\"") {
                let range = start..<index
                index += 1
                return (range, hasEscapes)
            }
            if c == UInt8(ascii: "\\") {
                hasEscapes = true
                index += 1
                guard index < bytes.count else { break }
                switch bytes[index] {
                case UInt8(ascii: "\""), UInt8(ascii: "\\"), UInt8(ascii: "/"), UInt8(ascii: "b"),
                    UInt8(ascii: "f"), UInt8(ascii: "n"), UInt8(ascii: "r"), UInt8(ascii: "t"):
                    index += 1
                case UInt8(ascii: "u"):
                    guard index + 4 < bytes.count else { throw fault("truncated: \\u escape") }
                    for k in 1...4 where Scanner.hexValue(bytes[index + k]) == nil {
                        throw fault("bad \\u escape")
                    }
                    index += 5
                default:
                    throw fault("bad escape in a string")
                }
                continue
            }
            if c < 0x20 { throw fault("control character in a string") }
            index += 1
        }
        throw fault("truncated: string not closed")
    }

    mutating func scanNumber() throws {
        let start = index
        if peek() == UInt8(ascii: "-") { index += 1 }
        guard let first = peek(), Scanner.isDigit(first) else { throw fault("unexpected character") }
        if first == UInt8(ascii: "0") {
            index += 1
        } else {
            skipDigits()
        }
        if peek() == UInt8(ascii: ".") {
            index += 1
            guard let d = peek(), Scanner.isDigit(d) else { throw fault("digit expected after '.'") }
            skipDigits()
        }
        if let e = peek(), e == UInt8(ascii: "e") || e == UInt8(ascii: "E") {
            index += 1
            if let sign = peek(), sign == UInt8(ascii: "+") || sign == UInt8(ascii: "-") { index += 1 }
            guard let d = peek(), Scanner.isDigit(d) else { throw fault("digit expected in exponent") }
            skipDigits()
        }
        if index == start { throw fault("number expected") }
    }

    mutating func skipDigits() {
        while index < bytes.count, Scanner.isDigit(bytes[index]) { index += 1 }
    }

    mutating func expectLiteral(_ literal: StaticString) throws {
        let n = literal.utf8CodeUnitCount
        guard index + n <= bytes.count, equals(index..<(index + n), literal) else {
            throw fault("unexpected character")
        }
        index += n
    }

    mutating func skipWhitespace() {
        while index < bytes.count {
            switch bytes[index] {
            case 0x20, 0x09, 0x0A, 0x0D: index += 1
            default: return
            }
        }
    }

    func peek() -> UInt8? { index < bytes.count ? bytes[index] : nil }

    func fault(_ reason: String) -> WireError { WireError(offset: index, reason: reason) }

    static func isDigit(_ c: UInt8) -> Bool { c >= 0x30 && c <= 0x39 }

    static func hexValue(_ c: UInt8) -> UInt32? {
        switch c {
        case 0x30...0x39: return UInt32(c - 0x30)
        case 0x41...0x46: return UInt32(c - 0x41 + 10)
        case 0x61...0x66: return UInt32(c - 0x61 + 10)
        default: return nil
        }
    }

    /// Decodes a string's escapes (already validated by `scanString`). Unpaired surrogates become U+FFFD.
    static func unescape(_ raw: UnsafeRawBufferPointer) -> String {
        var scalars = String.UnicodeScalarView()
        var utf8: [UInt8] = []
        func flush() {
            if !utf8.isEmpty {
                scalars.append(contentsOf: String(decoding: utf8, as: UTF8.self).unicodeScalars)
                utf8.removeAll(keepingCapacity: true)
            }
        }
        var i = 0
        func hex4(_ at: Int) -> UInt32 {
            var value: UInt32 = 0
            for k in 0..<4 { value = value << 4 | (hexValue(raw[at + k]) ?? 0) }
            return value
        }
        while i < raw.count {
            let c = raw[i]
            guard c == UInt8(ascii: "\\"), i + 1 < raw.count else {
                utf8.append(c)
                i += 1
                continue
            }
            let e = raw[i + 1]
            i += 2
            switch e {
            case UInt8(ascii: "b"): utf8.append(0x08)
            case UInt8(ascii: "f"): utf8.append(0x0C)
            case UInt8(ascii: "n"): utf8.append(0x0A)
            case UInt8(ascii: "r"): utf8.append(0x0D)
            case UInt8(ascii: "t"): utf8.append(0x09)
            case UInt8(ascii: "u") where i + 4 <= raw.count:
                flush()
                var value = hex4(i)
                i += 4
                if (0xD800...0xDBFF).contains(value), i + 6 <= raw.count, raw[i] == UInt8(ascii: "\\"),
                    raw[i + 1] == UInt8(ascii: "u")
                {
                    let low = hex4(i + 2)
                    if (0xDC00...0xDFFF).contains(low) {
                        value = 0x10000 + ((value - 0xD800) << 10) + (low - 0xDC00)
                        i += 6
                    }
                }
                scalars.append(Unicode.Scalar(value) ?? "\u{FFFD}")
            default: utf8.append(e)
            }
        }
        flush()
        return String(scalars)
    }
}
