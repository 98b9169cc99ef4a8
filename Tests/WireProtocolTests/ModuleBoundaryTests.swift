import Foundation
import Testing

/// The seam holds in the source: only the composition root, the executable, the demo feed, the bench and
/// the vendor modules themselves import a vendor module, and the vendor modules do not import each other.
/// Read from `Sources/` as the compiler reads it (a new `import PolygonWire` in the hub fails here,
/// naming the file).
@Suite("Module boundaries: who may import a vendor's module")
struct ModuleBoundaryTests {
    /// The vendors' modules: their wire protocols and their REST clients and gateway dialects.
    static let vendorModules: Set<String> = ["PolygonWire", "AlpacaWire", "PolygonRESTClient", "AlpacaREST"]
    /// The modules that may import them: the composition root and what it is built of for a vendor.
    static let allowed: Set<String> = ["RelayComposition", "relay", "DemoFeed", "RelayBench"]

    static var sources: URL {
        URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
            .appendingPathComponent("Sources")
    }

    /// Every Swift file under `Sources/`: its module, its path within the module and its text.
    static func swiftFiles() throws -> [(module: String, file: String, text: String)] {
        var found: [(String, String, String)] = []
        let modules = try FileManager.default.contentsOfDirectory(atPath: sources.path)
        for module in modules {
            let root = sources.appendingPathComponent(module)
            guard let files = FileManager.default.enumerator(atPath: root.path) else { continue }
            for case let file as String in files where file.hasSuffix(".swift") {
                found.append((module, file, try String(contentsOf: root.appendingPathComponent(file), encoding: .utf8)))
            }
        }
        return found
    }

    /// Every `import` of a vendor module under `Sources/`: (importing module, imported module, file).
    static func vendorImports() throws -> [(module: String, imported: String, file: String)] {
        var found: [(String, String, String)] = []
        for (module, file, text) in try swiftFiles() {
            for line in text.split(separator: "\n") {
                let words = line.split(separator: " ")
                guard let index = words.firstIndex(of: "import"), index + 1 < words.count,
                    words[..<index].allSatisfy({ $0.hasPrefix("@") })
                else { continue }
                let imported = String(words[index + 1])
                if vendorModules.contains(imported) { found.append((module, imported, "\(module)/\(file)")) }
            }
        }
        return found
    }

    @Test func onlyTheCompositionRootTheDemoFeedAndTheBenchImportAVendor() throws {
        let imports = try Self.vendorImports()
        #expect(!imports.isEmpty, "the scan found the composition root's imports (else it read nothing)")
        for found in imports where !Self.allowed.contains(found.module) && !Self.vendorModules.contains(found.module) {
            Issue.record("\(found.file) imports \(found.imported): only \(Self.allowed.sorted()) may")
        }
    }

    @Test func theWireModulesDoNotImportEachOther() throws {
        for found in try Self.vendorImports() where ["PolygonWire", "AlpacaWire"].contains(found.module) {
            Issue.record("\(found.file) imports \(found.imported): a protocol's module depends on MarketCore only")
        }
    }
}
