import Foundation
import Testing

/// The shape the code keeps, read from `Sources/`: no function over 120 lines, the hub actor's own file
/// under 500 lines, the function that starts the relay's parts under 100. A function that grows past its
/// bound fails here, named with its file and line, instead of being found in a review a year later.
@Suite("Source shape: functions and the hub's file stay small")
struct SourceShapeTests {
    /// A function, initializer or accessor body found in a file: where it starts and how many lines it spans.
    struct Body {
        var file: String
        var line: Int
        var declaration: String
        var lines: Int
    }

    /// The declarations whose bodies are measured (after attributes and modifiers).
    static let introducers = ["func ", "init(", "init?(", "init<", "deinit ", "deinit{", "subscript(", "subscript<"]
    static let modifiers: Set<String> = [
        "public", "private", "fileprivate", "internal", "package", "open", "static", "class", "final", "override",
        "nonisolated", "mutating", "nonmutating", "convenience", "required", "dynamic", "isolated", "consuming", "borrowing",
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
            return introducers.contains { rest.hasPrefix($0) }
        }
    }

    /// The code of a line outside string literals and comments (`inText` carries a multi-line string
    /// literal across lines).
    static func code(of line: Substring, inText: inout Bool) -> String {
        var code = ""
        var inString = false
        var index = line.startIndex
        while index < line.endIndex {
            let rest = line[index...]
            if rest.hasPrefix("\"\"\"") {
                if !inString { inText.toggle() }
                index = line.index(index, offsetBy: 3)
                continue
            }
            let character = line[index]
            if inText {
                index = line.index(after: index)
                continue
            }
            if inString {
                if character == "\\" {
                    index = line.index(index, offsetBy: 2, limitedBy: line.endIndex) ?? line.endIndex
                    continue
                }
                if character == "\"" { inString = false }
            } else if character == "\"" {
                inString = true
            } else if rest.hasPrefix("//") {
                break
            } else {
                code.append(character)
            }
            index = line.index(after: index)
        }
        return code
    }

    /// Every measured body under `Sources/`.
    static func bodies() throws -> [Body] {
        var found: [Body] = []
        let sources = ModuleBoundaryTests.sources
        let modules = try FileManager.default.contentsOfDirectory(atPath: sources.path)
        for module in modules {
            let root = sources.appendingPathComponent(module)
            guard let files = FileManager.default.enumerator(atPath: root.path) else { continue }
            for case let file as String in files where file.hasSuffix(".swift") {
                let text = try String(contentsOf: root.appendingPathComponent(file), encoding: .utf8)
                let lines = text.split(separator: "\n", omittingEmptySubsequences: false)
                var codes: [String] = []
                var inText = false
                for line in lines { codes.append(code(of: line, inText: &inText)) }
                for (start, line) in lines.enumerated() where declares(line) {
                    // Its body: from the first `{` (a requirement without one, within a few lines, has none)
                    // to the brace that closes it.
                    var depth = 0
                    var opened = false
                    var end = start
                    scan: while end < lines.count {
                        for character in codes[end] {
                            if character == "{" {
                                depth += 1
                                opened = true
                            } else if character == "}" {
                                depth -= 1
                                if opened, depth == 0 { break scan }
                            }
                        }
                        if !opened, end > start + 15 { break }
                        end += 1
                    }
                    guard opened, end < lines.count else { continue }
                    found.append(
                        Body(
                            file: "\(module)/\(file)", line: start + 1,
                            declaration: String(line.drop { $0 == " " }.prefix(80)), lines: end - start + 1))
                }
            }
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
