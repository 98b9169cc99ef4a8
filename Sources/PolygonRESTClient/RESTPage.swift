/// A page of Polygon's REST history read in one pass over its bytes: each result's known fields as the
/// byte ranges of their values, untouched, and `next_url`.
///
/// Why not `JSONDecoder`: a fill reads hundreds of thousands of results, and decoding them into values
/// took 59% of the relay's CPU in a profile of a 60 s outage over 100 topics; the events it makes only
/// rename keys and copy values. Copying the number text as it came also keeps prices exactly as Polygon
/// wrote them. Malformed JSON throws; a field of the wrong kind is left out.
struct RESTPage {
    /// The result fields the mapping reads (REST trade, quote and aggregate fields).
    enum Field: Int, CaseIterable {
        case price, size, exchange, id, conditions, sequenceNumber, sipTimestamp, participantTimestamp, tape
        case askExchange, askPrice, askSize, bidExchange, bidPrice, bidSize, indicators
        case open, high, low, close, volume, vwap, time

        init?(name: ArraySlice<UInt8>) {
            switch String(decoding: name, as: UTF8.self) {
            case "price": self = .price
            case "size": self = .size
            case "exchange": self = .exchange
            case "id": self = .id
            case "conditions": self = .conditions
            case "sequence_number": self = .sequenceNumber
            case "sip_timestamp": self = .sipTimestamp
            case "participant_timestamp": self = .participantTimestamp
            case "tape": self = .tape
            case "ask_exchange": self = .askExchange
            case "ask_price": self = .askPrice
            case "ask_size": self = .askSize
            case "bid_exchange": self = .bidExchange
            case "bid_price": self = .bidPrice
            case "bid_size": self = .bidSize
            case "indicators": self = .indicators
            case "o": self = .open
            case "h": self = .high
            case "l": self = .low
            case "c": self = .close
            case "v": self = .volume
            case "vw": self = .vwap
            case "t": self = .time
            default: return nil
            }
        }
    }

    /// A byte of a JSON number: digits, sign, point, exponent.
    static func isNumberByte(_ byte: UInt8) -> Bool {
        switch byte {
        case UInt8(ascii: "0")...UInt8(ascii: "9"), UInt8(ascii: "-"), UInt8(ascii: "+"), UInt8(ascii: "."), UInt8(ascii: "e"), UInt8(ascii: "E"): true
        default: false
        }
    }

    struct Malformed: Error, CustomStringConvertible {
        var at: Int
        var description: String { "malformed JSON at byte \(at)" }
    }

    /// One result: the value bytes of its known fields.
    struct Result {
        let bytes: [UInt8]
        fileprivate(set) var ranges = [Range<Int>?](repeating: nil, count: Field.allCases.count)

        /// Whether the result has the field with a value other than `null`.
        func has(_ field: Field) -> Bool {
            guard let range = ranges[field.rawValue] else { return false }
            return !bytes[range].elementsEqual("null".utf8)
        }

        /// The value's text as it came, when it is a JSON number (exactly: `1null`, `-` or `01` are not).
        func number(_ field: Field) -> ArraySlice<UInt8>? {
            guard let range = ranges[field.rawValue], RESTPage.isNumber(bytes[range]) else { return nil }
            return bytes[range]
        }

        /// The value as an integer, when it is one.
        func integer(_ field: Field) -> Int64? {
            guard let text = number(field) else { return nil }
            return Int64(String(decoding: text, as: UTF8.self))
        }

        /// The value's text as it came, when it is a valid JSON string (quotes included) of at most
        /// ``RESTPage/maxStringBytes``.
        func string(_ field: Field) -> ArraySlice<UInt8>? {
            guard let range = ranges[field.rawValue], range.count <= RESTPage.maxStringBytes, RESTPage.isString(bytes[range]) else { return nil }
            return bytes[range]
        }

        /// The value as an array of at most ``RESTPage/maxListCount`` JSON numbers, written again
        /// without the whitespace it came with (whose length the host chooses).
        func numbers(_ field: Field) -> ArraySlice<UInt8>? {
            guard let range = ranges[field.rawValue], bytes[range].first == UInt8(ascii: "["), bytes[range].last == UInt8(ascii: "]") else { return nil }
            let inside = bytes[range].dropFirst().dropLast()
            if inside.allSatisfy(Scanner.isSpace) { return Array("[]".utf8)[...] }
            // Counted before it is split: a host's 16 MB list of ones is refused at its 32nd comma.
            var commas = 0
            for byte in inside where byte == UInt8(ascii: ",") {
                commas += 1
                if commas >= RESTPage.maxListCount { return nil }
            }
            let items = inside.split(separator: UInt8(ascii: ","), omittingEmptySubsequences: false).map(RESTPage.trimmed)
            guard items.allSatisfy(RESTPage.isNumber) else { return nil }
            return (Array("[".utf8) + Array(items.joined(separator: [UInt8(ascii: ",")])) + Array("]".utf8))[...]
        }
    }

    static func trimmed(_ text: ArraySlice<UInt8>) -> ArraySlice<UInt8> {
        guard let first = text.firstIndex(where: { !Scanner.isSpace($0) }), let last = text.lastIndex(where: { !Scanner.isSpace($0) }) else {
            return text[text.startIndex..<text.startIndex]
        }
        return text[first...last]
    }

    /// The longest string value copied into an event (a trade id is a few dozen bytes).
    static let maxStringBytes = 256
    /// The most numbers in a list copied into an event (conditions, indicators).
    static let maxListCount = 32
    /// The longest number text copied into an event.
    static let maxNumberBytes = 40

    /// Whether `text` is exactly one JSON number (RFC 8259: `-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?`)
    /// of at most ``maxNumberBytes``.
    static func isNumber(_ text: some Collection<UInt8>) -> Bool {
        guard text.count <= maxNumberBytes else { return false }
        func isDigit(_ byte: UInt8) -> Bool { (UInt8(ascii: "0")...UInt8(ascii: "9")).contains(byte) }
        var index = text.startIndex
        func peek() -> UInt8? { index < text.endIndex ? text[index] : nil }
        func digits() -> Int {
            var count = 0
            while let byte = peek(), isDigit(byte) {
                count += 1
                index = text.index(after: index)
            }
            return count
        }
        if peek() == UInt8(ascii: "-") { index = text.index(after: index) }
        if peek() == UInt8(ascii: "0") {
            index = text.index(after: index)
        } else if digits() == 0 {
            return false
        }
        if peek() == UInt8(ascii: ".") {
            index = text.index(after: index)
            guard digits() > 0 else { return false }
        }
        if peek() == UInt8(ascii: "e") || peek() == UInt8(ascii: "E") {
            index = text.index(after: index)
            if peek() == UInt8(ascii: "+") || peek() == UInt8(ascii: "-") { index = text.index(after: index) }
            guard digits() > 0 else { return false }
        }
        return index == text.endIndex
    }

    /// Whether `text` is exactly one JSON string, quotes included, with only JSON's escapes
    /// (`\" \\ \/ \b \f \n \r \t \uXXXX`) and no raw control bytes.
    static func isString(_ text: ArraySlice<UInt8>) -> Bool {
        guard text.count >= 2, text.first == UInt8(ascii: "\""), text.last == UInt8(ascii: "\"") else { return false }
        var index = text.startIndex + 1
        let end = text.endIndex - 1
        while index < end {
            let byte = text[index]
            if byte < 0x20 || byte == UInt8(ascii: "\"") { return false }
            if byte == UInt8(ascii: "\\") {
                guard index + 1 < end else { return false }
                switch text[index + 1] {
                case UInt8(ascii: "\""), UInt8(ascii: "\\"), UInt8(ascii: "/"), UInt8(ascii: "b"), UInt8(ascii: "f"), UInt8(ascii: "n"),
                    UInt8(ascii: "r"), UInt8(ascii: "t"):
                    index += 2
                case UInt8(ascii: "u"):
                    guard index + 6 <= end, text[(index + 2)..<(index + 6)].allSatisfy({ $0.isHexDigit }) else { return false }
                    index += 6
                default: return false
                }
            } else {
                index += 1
            }
        }
        return true
    }

    /// The longest `next_url` a page may name (its JSON text, quotes and escapes included).
    static let maxNextURLBytes = 8 << 10

    /// Calls `body` with each result of the page; returns its `next_url`.
    static func read(_ bytes: [UInt8], _ body: (Result) throws -> Void) throws -> String? {
        var scanner = Scanner(bytes: bytes)
        var next: String?
        try scanner.expect(UInt8(ascii: "{"))
        if try scanner.closes(UInt8(ascii: "}")) { return nil }
        repeat {
            let key = try scanner.string()
            try scanner.expect(UInt8(ascii: ":"))
            switch String(decoding: bytes[key.lowerBound + 1..<key.upperBound - 1], as: UTF8.self) {
            case "results":
                try scanner.expect(UInt8(ascii: "["))
                if try !scanner.closes(UInt8(ascii: "]")) {
                    var result = Result(bytes: bytes)
                    repeat {
                        for index in result.ranges.indices { result.ranges[index] = nil }
                        try scanner.expect(UInt8(ascii: "{"))
                        if try !scanner.closes(UInt8(ascii: "}")) {
                            repeat {
                                let name = try scanner.string()
                                try scanner.expect(UInt8(ascii: ":"))
                                let value = try scanner.value()
                                if let field = Field(name: bytes[name.lowerBound + 1..<name.upperBound - 1]) { result.ranges[field.rawValue] = value }
                            } while try scanner.continues(closing: UInt8(ascii: "}"))
                        }
                        try body(result)
                    } while try scanner.continues(closing: UInt8(ascii: "]"))
                }
            case "next_url":
                let value = try scanner.value()
                // A link is a path and a cursor: one longer than ``maxNextURLBytes`` is no page's.
                guard value.count <= Self.maxNextURLBytes else { throw Malformed(at: value.lowerBound) }
                if bytes[value].first == UInt8(ascii: "\"") { next = try Scanner.unescaped(bytes[value.lowerBound + 1..<value.upperBound - 1]) }
            default:
                _ = try scanner.value()
            }
        } while try scanner.continues(closing: UInt8(ascii: "}"))
        return next
    }

    /// The bytes of one JSON document, read forward.
    struct Scanner {
        let bytes: [UInt8]
        var index = 0

        static func isSpace(_ byte: UInt8) -> Bool { byte == 0x20 || byte == 0x0A || byte == 0x0D || byte == 0x09 }

        mutating func skipSpace() {
            while index < bytes.count, Self.isSpace(bytes[index]) { index += 1 }
        }

        mutating func expect(_ byte: UInt8) throws {
            skipSpace()
            guard index < bytes.count, bytes[index] == byte else { throw Malformed(at: index) }
            index += 1
        }

        /// Takes `byte` if it comes next (an empty object or array).
        mutating func closes(_ byte: UInt8) throws -> Bool {
            skipSpace()
            guard index < bytes.count else { throw Malformed(at: index) }
            if bytes[index] == byte {
                index += 1
                return true
            }
            return false
        }

        /// After a member: `,` (another follows) or `closing` (the end).
        mutating func continues(closing: UInt8) throws -> Bool {
            skipSpace()
            guard index < bytes.count else { throw Malformed(at: index) }
            index += 1
            if bytes[index - 1] == UInt8(ascii: ",") { return true }
            if bytes[index - 1] == closing { return false }
            throw Malformed(at: index - 1)
        }

        /// A string's extent, its quotes included.
        mutating func string() throws -> Range<Int> {
            skipSpace()
            guard index < bytes.count, bytes[index] == UInt8(ascii: "\"") else { throw Malformed(at: index) }
            let start = index
            index += 1
            while index < bytes.count {
                switch bytes[index] {
                case UInt8(ascii: "\\"): index += 2
                case UInt8(ascii: "\""):
                    index += 1
                    return start..<index
                case 0..<0x20: throw Malformed(at: index)
                default: index += 1
                }
            }
            throw Malformed(at: start)
        }

        /// Any value's extent: a string, an object or array (nesting counted), or a number or literal.
        mutating func value() throws -> Range<Int> {
            skipSpace()
            guard index < bytes.count else { throw Malformed(at: index) }
            let start = index
            switch bytes[index] {
            case UInt8(ascii: "\""):
                return try string()
            case UInt8(ascii: "{"), UInt8(ascii: "["):
                var depth = 0
                while index < bytes.count {
                    switch bytes[index] {
                    case UInt8(ascii: "\""):
                        _ = try string()
                        continue
                    case UInt8(ascii: "{"), UInt8(ascii: "["): depth += 1
                    case UInt8(ascii: "}"), UInt8(ascii: "]"):
                        depth -= 1
                        if depth == 0 {
                            index += 1
                            return start..<index
                        }
                    default: break
                    }
                    index += 1
                }
                throw Malformed(at: start)
            default:
                // A number, or `true`, `false`, `null`.
                while index < bytes.count, RESTPage.isNumberByte(bytes[index]) || (UInt8(ascii: "a")...UInt8(ascii: "z")).contains(bytes[index]) {
                    index += 1
                }
                guard index > start else { throw Malformed(at: start) }
                return start..<index
            }
        }

        /// A string's content without its escapes (`next_url`: `\/` and the like).
        static func unescaped(_ content: ArraySlice<UInt8>) throws -> String {
            var out: [UInt8] = []
            var iterator = content.makeIterator()
            while let byte = iterator.next() {
                guard byte == UInt8(ascii: "\\") else {
                    out.append(byte)
                    continue
                }
                switch iterator.next() {
                case UInt8(ascii: "/"): out.append(UInt8(ascii: "/"))
                case UInt8(ascii: "\\"): out.append(UInt8(ascii: "\\"))
                case UInt8(ascii: "\""): out.append(UInt8(ascii: "\""))
                default: throw Malformed(at: 0)
                }
            }
            return String(decoding: out, as: UTF8.self)
        }
    }
}

extension UInt8 {
    fileprivate var isHexDigit: Bool {
        (UInt8(ascii: "0")...UInt8(ascii: "9")).contains(self) || (UInt8(ascii: "a")...UInt8(ascii: "f")).contains(self)
            || (UInt8(ascii: "A")...UInt8(ascii: "F")).contains(self)
    }
}
