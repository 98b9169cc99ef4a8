import Foundation

/// JSON string escaping for the few strings the relay writes itself.
public enum JSONText {
    /// JSON's white space: space, line feed, carriage return, tab.
    @inlinable
    public static func isSpace(_ byte: UInt8) -> Bool {
        byte == 0x20 || byte == 0x0A || byte == 0x0D || byte == 0x09
    }

    public static func escape(_ text: String) -> String {
        var out = ""
        out.reserveCapacity(text.utf8.count)
        for scalar in text.unicodeScalars {
            switch scalar {
            case "\"": out += "\\\""
            case "\\": out += "\\\\"
            case "\n": out += "\\n"
            case "\r": out += "\\r"
            case "\t": out += "\\t"
            case let s where s.value < 0x20:
                let hex = String(s.value, radix: 16)
                out += "\\u" + String(repeating: "0", count: 4 - hex.count) + hex
            default: out.unicodeScalars.append(scalar)
            }
        }
        return out
    }
}

extension JSONText {
    /// The members of one JSON object as the raw text of each value (a number's digits exactly as sent,
    /// a string with its quotes, an array or object whole), for a relay that rewrites a vendor's event
    /// into another of the vendor's shapes without passing prices through `Double`. `nil`: not one
    /// well-formed object (nesting deeper than 32, a string left open, text after the object).
    public static func members(of text: Substring) -> [String: Substring]? {
        var scanner = Scanner(text: text)
        return scanner.object(keeping: nil)
    }

    /// The raw text of one member's value (as ``members(of:)``), the object checked whole the same way
    /// but no other member kept: what a page of millions of members costs is its scan, not a
    /// dictionary of them. `nil`: not one well-formed object, or one naming the member twice (a reader
    /// taking the first would see another value than the one read here); `.some(nil)`: no such member.
    /// A name is compared as a JSON reader reads it (`"next\u005furl"` is `next_url`).
    public static func member(_ name: String, of text: Substring) -> Substring?? {
        if case .found(let value) = reading(name, of: text) { return .some(value) }
        return nil
    }

    /// What ``member(_:of:)`` finds, telling a text that is not one readable object from one that
    /// names the member twice.
    public enum MemberReading: Equatable, Sendable {
        /// Not one well-formed object.
        case unreadable
        /// An object naming the member more than once.
        case twice
        /// The member's raw value, `nil` when the object has none.
        case found(Substring?)
    }

    public static func reading(_ name: String, of text: Substring) -> MemberReading {
        var scanner = Scanner(text: text)
        guard let members = scanner.object(keeping: name) else { return scanner.namedTwice ? .twice : .unreadable }
        return .found(members[name])
    }

    /// A string value's text without its quotes (escapes left as written), `nil` if it is no string.
    public static func unquoted(_ value: Substring?) -> Substring? {
        guard let value, value.count >= 2, value.first == "\"", value.last == "\"" else { return nil }
        return value.dropFirst().dropLast()
    }

    /// Reads UTF-8 bytes; the members' values are slices of the text (UTF-8 indices are the text's).
    private struct Scanner {
        let text: Substring
        let utf8: Substring.UTF8View
        var index: Substring.Index
        /// Whether the member kept was named twice (the object is then not read).
        var namedTwice = false

        init(text: Substring) {
            self.text = text
            utf8 = text.utf8
            index = utf8.startIndex
        }

        /// The object's members, or only the one named `kept`.
        mutating func object(keeping kept: String?) -> [String: Substring]? {
            skipSpace()
            guard peek == UInt8(ascii: "{") else { return nil }
            advance()
            var members: [String: Substring] = [:]
            skipSpace()
            if peek == UInt8(ascii: "}") {
                advance()
                return finished() ? members : nil
            }
            while true {
                skipSpace()
                guard let keyText = string() else { return nil }
                skipSpace()
                guard peek == UInt8(ascii: ":") else { return nil }
                advance()
                skipSpace()
                let start = index
                guard value(depth: 0) else { return nil }
                var key = String(keyText.dropFirst().dropLast())
                // A name written with escapes is read as a JSON reader reads it (rare: decoded then).
                if key.utf8.contains(UInt8(ascii: "\\")) {
                    guard let read = try? JSONDecoder().decode(String.self, from: Data(keyText.utf8)) else { return nil }
                    key = read
                }
                if let kept {
                    if key == kept {
                        guard members[key] == nil else {
                            namedTwice = true
                            return nil
                        }
                        members[key] = text[start..<index]
                    }
                } else {
                    members[key] = text[start..<index]
                }
                skipSpace()
                if peek == UInt8(ascii: ",") {
                    advance()
                    continue
                }
                guard peek == UInt8(ascii: "}") else { return nil }
                advance()
                return finished() ? members : nil
            }
        }

        private mutating func finished() -> Bool {
            skipSpace()
            return index == utf8.endIndex
        }

        private var peek: UInt8? { index < utf8.endIndex ? utf8[index] : nil }

        private mutating func advance() { index = utf8.index(after: index) }

        private mutating func skipSpace() {
            while let byte = peek, JSONText.isSpace(byte) { advance() }
        }

        /// A string, quotes included.
        private mutating func string() -> Substring? {
            guard peek == UInt8(ascii: "\"") else { return nil }
            let start = index
            advance()
            while let byte = peek {
                advance()
                if byte == UInt8(ascii: "\\") {
                    guard peek != nil else { return nil }
                    advance()
                } else if byte == UInt8(ascii: "\"") {
                    return text[start..<index]
                }
            }
            return nil
        }

        private mutating func value(depth: Int) -> Bool {
            guard depth < 32, let first = peek else { return false }
            switch first {
            case UInt8(ascii: "\""): return string() != nil
            case UInt8(ascii: "{"), UInt8(ascii: "["):
                let object = first == UInt8(ascii: "{")
                let close = object ? UInt8(ascii: "}") : UInt8(ascii: "]")
                advance()
                skipSpace()
                if peek == close {
                    advance()
                    return true
                }
                while true {
                    skipSpace()
                    if object {
                        guard string() != nil else { return false }
                        skipSpace()
                        guard peek == UInt8(ascii: ":") else { return false }
                        advance()
                        skipSpace()
                    }
                    guard value(depth: depth + 1) else { return false }
                    skipSpace()
                    if peek == UInt8(ascii: ",") {
                        advance()
                        continue
                    }
                    guard peek == close else { return false }
                    advance()
                    return true
                }
            default:
                // A number, true, false or null: its bytes up to the next delimiter.
                let start = index
                while let byte = peek, Self.wordBytes[Int(byte)] { advance() }
                let word = text[start..<index]
                if word.isEmpty { return false }
                if word == "true" || word == "false" || word == "null" { return true }
                return Double(word) != nil
            }
        }

        private static let wordBytes: [Bool] = (0..<256).map { Array("-+.0123456789eEtrufalsn".utf8).contains(UInt8($0)) }
    }
}
