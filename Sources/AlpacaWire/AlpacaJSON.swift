import MarketCore

/// JSON for Alpaca's plain WebSocket clients: a MessagePack value written as the JSON Alpaca sends
/// (a timestamp as an RFC 3339 string with up to nine fraction digits, `"2021-02-22T15:51:44.208Z"`).
/// Pure.
public enum AlpacaJSON {
    /// `value` as JSON text, appended to `out`.
    public static func append(_ value: MessagePack.Value, to out: inout [UInt8]) {
        switch value {
        case .null: out += "null".utf8
        case .bool(let flag): out += (flag ? "true" : "false").utf8
        case .int(let number): out += String(number).utf8
        case .uint(let number): out += String(number).utf8
        case .double(let number):
            // JSON has no NaN or infinity.
            if number.isFinite { out += "\(number)".utf8 } else { out += "null".utf8 }
        case .string(let text): appendString(text, to: &out)
        case .binary(let data):
            // Alpaca sends none; a client could: written as an array of bytes rather than lost.
            append(.array(data.map { .int(Int64($0)) }), to: &out)
        case .array(let values):
            out.append(UInt8(ascii: "["))
            for (index, element) in values.enumerated() {
                if index > 0 { out.append(UInt8(ascii: ",")) }
                append(element, to: &out)
            }
            out.append(UInt8(ascii: "]"))
        case .map(let entries):
            out.append(UInt8(ascii: "{"))
            for (index, entry) in entries.enumerated() {
                if index > 0 { out.append(UInt8(ascii: ",")) }
                switch entry.key {
                case .string(let key): appendString(key, to: &out)
                case .map, .array, .binary, .ext:
                    // JSON keys are strings: a key that is itself a map (whose key is a map, and so on)
                    // written and escaped again at each level would double its escapes at each: named by
                    // its kind, never rendered.
                    appendString("<\(Self.kind(of: entry.key))>", to: &out)
                default:
                    var key: [UInt8] = []
                    append(entry.key, to: &key)
                    appendString(String(decoding: key, as: UTF8.self), to: &out)
                }
                out.append(UInt8(ascii: ":"))
                append(entry.value, to: &out)
            }
            out.append(UInt8(ascii: "}"))
        case .timestamp(let seconds, let nanoseconds):
            appendString(rfc3339(seconds: seconds, nanoseconds: nanoseconds), to: &out)
        case .ext(let type, let data):
            append(.map([.init(.string("ext"), .int(Int64(type))), .init(.string("data"), .binary(data))]), to: &out)
        }
    }

    /// A container value's kind, as a key that is one is written.
    static func kind(of value: MessagePack.Value) -> String {
        switch value {
        case .map: "map"
        case .array: "array"
        case .binary: "binary"
        case .ext: "ext"
        default: "value"
        }
    }

    /// `value` as JSON text.
    public static func text(_ value: MessagePack.Value) -> [UInt8] {
        var out: [UInt8] = []
        append(value, to: &out)
        return out
    }

    /// The first `bytes` of `value` as JSON text, for a log line: its strings, bytes and lists are cut
    /// before it is written, so a 4 MB value costs about its first bytes, not a rendering of all of it
    /// (the delivery path's ``append(_:to:)`` is left as it is).
    public static func excerpt(_ value: MessagePack.Value, bytes: Int) -> String {
        var budget = bytes
        return String(decoding: text(cut(value, budget: &budget)).prefix(bytes), as: UTF8.self)
    }

    /// `value` with no more than about `budget` bytes of text left in it (each part takes from it).
    static func cut(_ value: MessagePack.Value, budget: inout Int) -> MessagePack.Value {
        guard budget > 0 else { return .null }
        switch value {
        case .string(let text):
            let kept = text.utf8.count <= budget ? text : String(decoding: text.utf8.prefix(budget), as: UTF8.self)
            budget -= kept.utf8.count + 2
            return .string(kept)
        case .binary(let data):
            // Each byte takes two characters at least ("7,").
            let kept = Array(data.prefix(budget / 2 + 1))
            budget -= kept.count * 2 + 2
            return .binary(kept)
        case .ext(let type, let data):
            let kept = Array(data.prefix(budget / 2 + 1))
            budget -= kept.count * 2 + 24
            return .ext(type: type, data: kept)
        case .array(let values):
            var kept: [MessagePack.Value] = []
            for element in values {
                guard budget > 0 else { break }
                kept.append(cut(element, budget: &budget))
                budget -= 1
            }
            return .array(kept)
        case .map(let entries):
            var kept: [MessagePack.Value.Entry] = []
            for entry in entries {
                guard budget > 0 else { break }
                let key: MessagePack.Value
                switch entry.key {
                case .map, .array, .binary, .ext:
                    // Named by its kind, as ``append(_:to:)`` writes such a key.
                    key = .string("<\(kind(of: entry.key))>")
                    budget -= 9
                default: key = cut(entry.key, budget: &budget)
                }
                kept.append(.init(key, cut(entry.value, budget: &budget)))
                budget -= 2
            }
            return .map(kept)
        default:
            budget -= 24
            return value
        }
    }

    static func appendString(_ text: String, to out: inout [UInt8]) {
        out.append(UInt8(ascii: "\""))
        out += JSONText.escape(text).utf8
        out.append(UInt8(ascii: "\""))
    }

    /// RFC 3339 in UTC, the fraction without trailing zeros (none when whole).
    public static func rfc3339(seconds: Int64, nanoseconds: UInt32) -> String {
        // Years 0 to 9999 only (what RFC 3339 can write); anything else as its plain count of seconds.
        guard (-62_167_219_200...253_402_300_799).contains(seconds) else { return "\(seconds)" }
        let days = seconds >= 0 ? seconds / 86_400 : (seconds - 86_399) / 86_400
        let secondOfDay = seconds - days * 86_400
        let (year, month, day) = civil(fromDays: days)
        func two(_ value: Int64) -> String { value < 10 ? "0\(value)" : "\(value)" }
        var text = "\(year < 1000 ? String(repeating: "0", count: 4 - String(year).count) : "")\(year)-\(two(month))-\(two(day))T"
        text += "\(two(secondOfDay / 3600)):\(two(secondOfDay / 60 % 60)):\(two(secondOfDay % 60))"
        if nanoseconds > 0 {
            var fraction = String(nanoseconds % 1_000_000_000)
            fraction = String(repeating: "0", count: 9 - fraction.count) + fraction
            while fraction.hasSuffix("0") { fraction.removeLast() }
            text += "." + fraction
        }
        return text + "Z"
    }

    /// The proleptic Gregorian date `days` after 1970-01-01 (Howard Hinnant's `civil_from_days`).
    static func civil(fromDays days: Int64) -> (year: Int64, month: Int64, day: Int64) {
        let shifted = days + 719_468
        let era = (shifted >= 0 ? shifted : shifted - 146_096) / 146_097
        let dayOfEra = shifted - era * 146_097
        let yearOfEra = (dayOfEra - dayOfEra / 1460 + dayOfEra / 36524 - dayOfEra / 146_096) / 365
        let dayOfYear = dayOfEra - (365 * yearOfEra + yearOfEra / 4 - yearOfEra / 100)
        let monthIndex = (5 * dayOfYear + 2) / 153
        let day = dayOfYear - (153 * monthIndex + 2) / 5 + 1
        let month = monthIndex < 10 ? monthIndex + 3 : monthIndex - 9
        return (yearOfEra + era * 400 + (month <= 2 ? 1 : 0), month, day)
    }
}

/// Reads a JSON text into a MessagePack value (a client's message in the JSON codec): strict JSON,
/// nested at most ``MessagePack/maxDepth`` deep, numbers as integers when they are whole and fit.
/// Pure; `nil` for anything that is not one JSON value, or holds more than `maxContainers` arrays and
/// objects.
public enum AlpacaJSONReader {
    public static func value(_ bytes: [UInt8], maxContainers: Int = .max) -> MessagePack.Value? {
        var reader = Reader(bytes: bytes, containersLeft: maxContainers)
        guard let value = reader.value(depth: 0) else { return nil }
        reader.skipSpace()
        return reader.index == bytes.count ? value : nil
    }

    private struct Reader {
        let bytes: [UInt8]
        var index = 0
        var containersLeft: Int

        mutating func skipSpace() {
            while index < bytes.count, [0x20, 0x09, 0x0A, 0x0D].contains(bytes[index]) { index += 1 }
        }

        mutating func literal(_ text: String, _ value: MessagePack.Value) -> MessagePack.Value? {
            let expected = Array(text.utf8)
            guard bytes.count - index >= expected.count, Array(bytes[index..<(index + expected.count)]) == expected else { return nil }
            index += expected.count
            return value
        }

        mutating func value(depth: Int) -> MessagePack.Value? {
            guard depth < MessagePack.maxDepth else { return nil }
            skipSpace()
            guard index < bytes.count else { return nil }
            switch bytes[index] {
            case UInt8(ascii: "n"): return literal("null", .null)
            case UInt8(ascii: "t"): return literal("true", .bool(true))
            case UInt8(ascii: "f"): return literal("false", .bool(false))
            case UInt8(ascii: "\""): return string().map { .string($0) }
            case UInt8(ascii: "["):
                guard containersLeft > 0 else { return nil }
                containersLeft -= 1
                index += 1
                var values: [MessagePack.Value] = []
                skipSpace()
                if index < bytes.count, bytes[index] == UInt8(ascii: "]") {
                    index += 1
                    return .array(values)
                }
                while true {
                    guard let element = value(depth: depth + 1) else { return nil }
                    values.append(element)
                    skipSpace()
                    guard index < bytes.count else { return nil }
                    index += 1
                    if bytes[index - 1] == UInt8(ascii: "]") { return .array(values) }
                    guard bytes[index - 1] == UInt8(ascii: ",") else { return nil }
                }
            case UInt8(ascii: "{"):
                guard containersLeft > 0 else { return nil }
                containersLeft -= 1
                index += 1
                var entries: [MessagePack.Value.Entry] = []
                skipSpace()
                if index < bytes.count, bytes[index] == UInt8(ascii: "}") {
                    index += 1
                    return .map(entries)
                }
                while true {
                    skipSpace()
                    guard index < bytes.count, bytes[index] == UInt8(ascii: "\""), let key = string() else { return nil }
                    skipSpace()
                    guard index < bytes.count, bytes[index] == UInt8(ascii: ":") else { return nil }
                    index += 1
                    guard let element = value(depth: depth + 1) else { return nil }
                    entries.append(.init(.string(key), element))
                    skipSpace()
                    guard index < bytes.count else { return nil }
                    index += 1
                    if bytes[index - 1] == UInt8(ascii: "}") { return .map(entries) }
                    guard bytes[index - 1] == UInt8(ascii: ",") else { return nil }
                }
            default: return number()
            }
        }

        mutating func string() -> String? {
            index += 1
            var out: [UInt8] = []
            while index < bytes.count {
                let byte = bytes[index]
                index += 1
                switch byte {
                case UInt8(ascii: "\""): return String(validating: out, as: UTF8.self)
                case UInt8(ascii: "\\"):
                    guard index < bytes.count else { return nil }
                    let escaped = bytes[index]
                    index += 1
                    switch escaped {
                    case UInt8(ascii: "\""), UInt8(ascii: "\\"), UInt8(ascii: "/"): out.append(escaped)
                    case UInt8(ascii: "n"): out.append(0x0A)
                    case UInt8(ascii: "r"): out.append(0x0D)
                    case UInt8(ascii: "t"): out.append(0x09)
                    case UInt8(ascii: "b"): out.append(0x08)
                    case UInt8(ascii: "f"): out.append(0x0C)
                    case UInt8(ascii: "u"):
                        guard bytes.count - index >= 4, let code = UInt32(String(decoding: bytes[index..<(index + 4)], as: UTF8.self), radix: 16)
                        else { return nil }
                        index += 4
                        // A lone surrogate stands for nothing: the replacement character.
                        out += Array(String(Unicode.Scalar(code).map(Character.init) ?? "\u{FFFD}").utf8)
                    default: return nil
                    }
                case 0..<0x20: return nil
                default: out.append(byte)
                }
            }
            return nil
        }

        mutating func number() -> MessagePack.Value? {
            let start = index
            while index < bytes.count, "+-0123456789.eE".utf8.contains(bytes[index]) { index += 1 }
            let text = String(decoding: bytes[start..<index], as: UTF8.self)
            guard !text.isEmpty else { return nil }
            if let whole = Int64(text) { return .int(whole) }
            return Double(text).map { .double($0) }
        }
    }
}
