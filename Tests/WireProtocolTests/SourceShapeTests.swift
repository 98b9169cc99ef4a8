import Foundation
import Testing

/// The shape the code keeps, read from `Sources/`: no function over 120 lines, the hub actor's own file
/// under 500 lines, the function that starts the relay's parts under 100. A function that grows past its
/// bound fails here, named with its file and line, instead of being found in a review a year later.
@Suite("Source shape: functions and the hub's file stay small")
struct SourceShapeTests {
    /// A function, initializer, subscript or computed property body found in a file: where it starts and how many lines it spans.
    struct Body {
        var file: String
        var line: Int
        var declaration: String
        var lines: Int
    }

    /// The declarations whose bodies are measured (after attributes and modifiers), besides computed
    /// properties.
    static let introducers = ["func ", "init(", "init?(", "init<", "deinit ", "deinit{", "subscript(", "subscript<"]
    static let modifiers: Set<String> = [
        "public", "private", "fileprivate", "internal", "package", "open", "static", "class", "final", "override",
        "nonisolated", "mutating", "nonmutating", "convenience", "required", "dynamic", "isolated", "consuming", "borrowing",
        "prefix", "postfix", "infix", "lazy", "weak", "unowned",
    ]

    /// Whether a line declares a body to measure.
    static func declares(_ line: Substring) -> Bool {
        var rest = line.drop { $0 == " " }
        while true {
            if rest.hasPrefix("@") {
                // An attribute, with its arguments if it has any.
                var depth = 0
                var index = rest.startIndex
                while index < rest.endIndex {
                    let character = rest[index]
                    if character == "(" { depth += 1 } else if character == ")" { depth -= 1 } else if character == " ", depth == 0 { break }
                    index = rest.index(after: index)
                }
                rest = rest[index...].drop { $0 == " " }
                continue
            }
            guard let word = rest.split(separator: " ", maxSplits: 1).first else { return false }
            let bare = word.split(separator: "(").first.map(String.init) ?? String(word)
            if modifiers.contains(bare) {
                rest = rest.dropFirst(word.count).drop { $0 == " " }
                continue
            }
            // A computed property (or one with observers) whose body opens on its line.
            if rest.hasPrefix("var "), rest.hasSuffix("{"), !rest.contains(where: { $0 == "=" }) { return true }
            return introducers.contains { rest.hasPrefix($0) }
        }
    }

    /// What a scan carries from one line to the next: inside a multi-line string literal (and the
    /// number of `#` its delimiters carry), and how deep in block comments.
    struct Lexer {
        var text: Int?
        var comments = 0

        /// The code of a line outside string literals and comments: what braces and parentheses are
        /// counted in. Handles raw strings (`#"…"#`, any number of `#`), escapes, multi-line strings and
        /// nested block comments.
        mutating func code(of line: Substring) -> [UInt8] {
            let bytes = Array(line.utf8)
            var code: [UInt8] = []
            var index = 0
            /// Whether `bytes` at `at` closes a string of `hashes` (a quote, or three, then the `#`s).
            func closes(at: Int, quotes: Int, hashes: Int) -> Bool {
                guard at + quotes + hashes <= bytes.count else { return false }
                return bytes[at..<(at + quotes)].allSatisfy { $0 == 0x22 } && bytes[(at + quotes)..<(at + quotes + hashes)].allSatisfy { $0 == 0x23 }
            }
            // A single-line string in progress: its `#` count.
            var string: Int?
            while index < bytes.count {
                let byte = bytes[index]
                if comments > 0 {
                    if byte == 0x2A, index + 1 < bytes.count, bytes[index + 1] == 0x2F {
                        comments -= 1
                        index += 2
                    } else if byte == 0x2F, index + 1 < bytes.count, bytes[index + 1] == 0x2A {
                        comments += 1
                        index += 2
                    } else {
                        index += 1
                    }
                    continue
                }
                if let hashes = text ?? string {
                    let quotes = text == nil ? 1 : 3
                    // An escape (a backslash followed by the string's `#`s) skips the character after it.
                    if byte == 0x5C, closes(at: index + 1, quotes: 0, hashes: hashes) {
                        index += 2 + hashes
                        continue
                    }
                    if closes(at: index, quotes: quotes, hashes: hashes) {
                        index += quotes + hashes
                        if text != nil { text = nil } else { string = nil }
                        continue
                    }
                    index += 1
                    continue
                }
                // A string's opening: `#`s, then one quote or three.
                var hashes = 0
                while index + hashes < bytes.count, bytes[index + hashes] == 0x23 { hashes += 1 }
                if index + hashes < bytes.count, bytes[index + hashes] == 0x22 {
                    if closes(at: index + hashes, quotes: 3, hashes: 0) {
                        text = hashes
                        index += hashes + 3
                    } else {
                        string = hashes
                        index += hashes + 1
                    }
                    continue
                }
                if byte == 0x2F, index + 1 < bytes.count, bytes[index + 1] == 0x2F { break }
                if byte == 0x2F, index + 1 < bytes.count, bytes[index + 1] == 0x2A {
                    comments += 1
                    index += 2
                    continue
                }
                code.append(byte)
                index += 1
            }
            return code
        }
    }

    /// Whether a line carries on a signature that ended on the line before: its body's brace, its
    /// result, its effects or its generic constraints.
    static func continuesSignature(_ code: [UInt8]) -> Bool {
        let line = String(decoding: code, as: UTF8.self).drop { $0 == " " }
        return ["{", "->", "where", "async", "throws", "rethrows", "&", ","].contains { line.hasPrefix($0) }
    }

    /// Every measured body under `Sources/`.
    static func bodies() throws -> [Body] {
        try ModuleBoundaryTests.swiftFiles().flatMap { bodies(in: $0.text, file: "\($0.module)/\($0.file)") }
    }

    /// The measured bodies of one file's text.
    static func bodies(in text: String, file: String) -> [Body] {
        var found: [Body] = []
        let lines = text.split(separator: "\n", omittingEmptySubsequences: false)
        var codes: [[UInt8]] = []
        var lexer = Lexer()
        for line in lines { codes.append(lexer.code(of: line)) }
        for (start, line) in lines.enumerated() where declares(line) {
            // Its body: from the first `{` outside its parameter list (a default argument may be a closure)
            // to the brace that closes it; a requirement without one (within a few lines) has none.
            var depth = 0
            var parentheses = 0
            var opened = false
            var end = start
            scan: while end < lines.count {
                for byte in codes[end] {
                    switch byte {
                    case UInt8(ascii: "("): parentheses += 1
                    case UInt8(ascii: ")"): parentheses -= 1
                    case UInt8(ascii: "{") where opened || parentheses == 0:
                        depth += 1
                        opened = true
                    case UInt8(ascii: "}") where opened:
                        depth -= 1
                        if depth == 0 { break scan }
                    default: break
                    }
                }
                // A declaration whose signature ended without a body (a protocol's requirement): the next
                // line does not carry the signature on.
                if !opened, parentheses == 0, end + 1 < lines.count, !continuesSignature(codes[end + 1]) { break }
                if !opened, end > start + 15 { break }
                end += 1
            }
            guard opened, end < lines.count else { continue }
            found.append(Body(file: file, line: start + 1, declaration: String(line.drop { $0 == " " }.prefix(80)), lines: end - start + 1))
        }
        return found
    }

    @Test func noFunctionIsOver120Lines() throws {
        let bodies = try Self.bodies()
        #expect(bodies.count > 1000, "the scan found the functions of Sources/ (else it read nothing)")
        #expect(bodies.contains { $0.declaration.contains("func publish(_ events: [MarketEvent])") && $0.lines > 40 })
        for body in bodies where body.lines > 120 {
            Issue.record("\(body.file):\(body.line) is \(body.lines) lines (at most 120): \(body.declaration)")
        }
    }

    @Test func theHubActorsOwnFileIsUnder500Lines() throws {
        let file = ModuleBoundaryTests.sources.appendingPathComponent("MarketDataHub/MarketDataHub.swift")
        let text = try String(contentsOf: file, encoding: .utf8)
        #expect(text.contains("public actor MarketDataHub"), "the hub actor is declared in its own file")
        let lines = text.split(separator: "\n", omittingEmptySubsequences: false).count
        #expect(lines < 500, "MarketDataHub.swift is \(lines) lines: move a job of the hub into a file (or a value) of its own")
    }

    @Test func theFunctionThatStartsTheRelaysPartsIsUnder100Lines() throws {
        let bodies = try Self.bodies()
        let runParts = bodies.first { $0.file == "RelayComposition/Relay.swift" && $0.declaration.contains("func runParts(") }
        #expect(runParts != nil, "Relay.runParts starts the relay's parts")
        if let runParts { #expect(runParts.lines < 100, "Relay.runParts is \(runParts.lines) lines") }
    }
}

/// The shape test's own reading of Swift: what it counts as code, and where a body ends.
@Suite("Source shape: the scan reads Swift's strings and comments")
struct SourceShapeLexerTests {
    static func code(_ lines: [String]) -> String {
        var lexer = SourceShapeTests.Lexer()
        return lines.map { String(decoding: lexer.code(of: Substring($0)), as: UTF8.self) }.joined(separator: "\n")
    }

    @Test func stringsAndCommentsAreNotCode() {
        #expect(Self.code([#"let a = "{" + "\"}" // }"#]) == "let a =  +  ")
        #expect(Self.code([##"let b = #"x"}"# + #"\"#"##]) == "let b =  + ")
        #expect(Self.code(["let c = \"\"\"", "  } \"quoted\" {", "  \"\"\" + d {"]) == "let c = \n\n + d {")
        #expect(Self.code(["/* { /* } */ still { */ e {"]) == " e {")
        #expect(Self.code(["f(/* ( */ x) // {"]) == "f( x) ")
    }

    @Test func aBodyIsMeasuredFromItsOwnBraceNotADefaultArgumentsClosure() throws {
        let bodies = try SourceShapeTests.bodies()
        let run = bodies.first { $0.file == "MarketDataHub/HubPump.swift" && $0.declaration.contains("static func run(") }
        #expect((run?.lines ?? 0) > 30, "HubPump.run (a default closure argument before its body) measured \(run?.lines ?? 0) lines")
    }
}
