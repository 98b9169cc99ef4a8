import Foundation
import Testing

/// The operators' kit beside the code: the Prometheus alerting rules (`config/prometheus/`) and what they
/// must agree with.
enum OperatorsKit {
    /// The package's root directory.
    static let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
    static let rules = "config/prometheus/relay-rules.yml"
    static let ruleTests = "config/prometheus/relay-rules.test.yml"

    /// Where Debian's `promtool` (package `prometheus`) lives, if installed.
    static var promtool: String? {
        let candidates =
            (ProcessInfo.processInfo.environment["PATH"] ?? "").split(separator: ":").map { "\($0)/promtool" } + ["/usr/bin/promtool"]
        return candidates.first { FileManager.default.isExecutableFile(atPath: $0) }
    }

    /// promtool is installed, or the run demands it (scripts/test sets RELAY_REQUIRE_PROMTOOL=1, so a
    /// missing promtool fails instead of skipping).
    static var promtoolEnabled: Bool {
        promtool != nil || ProcessInfo.processInfo.environment["RELAY_REQUIRE_PROMTOOL"] == "1"
    }

    /// Runs promtool in the package's root; its exit status and output (stdout and stderr). Bounded by
    /// `timeout`.
    static func runPromtool(_ arguments: [String], timeout: Duration = .seconds(60)) async throws -> (status: Int32, output: String) {
        let promtool = try #require(promtool, "promtool is not installed (Debian: apt-get install prometheus; scripts/test does)")
        return try await runProcess(promtool, arguments, in: root, timeout: timeout, what: "promtool to finish")
    }

    /// The `relay_…` metric names a text mentions (in expressions, comments and annotations alike).
    static func metricNames(in text: String) throws -> Set<String> {
        let name = try Regex(#"\brelay_[a-z0-9_]+"#)
        return Set(text.matches(of: name).map { String(text[$0.range]) })
    }

    /// The text of every source file under `Sources/`.
    static func sourcesText() throws -> String {
        let sources = root.appendingPathComponent("Sources")
        guard let files = FileManager.default.enumerator(at: sources, includingPropertiesForKeys: nil) else { return "" }
        var text = ""
        for case let file as URL in files where ["swift", "c", "h"].contains(file.pathExtension) {
            text += try String(contentsOf: file, encoding: .utf8)
            text += "\n"
        }
        return text
    }
}

@Suite("Operators' kit: the Prometheus alerting rules")
struct OperatorsKitTests {
    @Test(.enabled(if: OperatorsKit.promtoolEnabled, "promtool is not installed (scripts/test installs Debian's prometheus)"))
    func theAlertingRulesPassTheirPromtoolUnitTests() async throws {
        let check = try await OperatorsKit.runPromtool(["check", "rules", OperatorsKit.rules])
        #expect(check.status == 0, "promtool check rules \(OperatorsKit.rules):\n\(check.output)")
        let test = try await OperatorsKit.runPromtool(["test", "rules", OperatorsKit.ruleTests])
        #expect(test.status == 0, "promtool test rules \(OperatorsKit.ruleTests):\n\(test.output)")
    }

    /// The rules cannot drift from the code: each metric they name is a label the relay's sources give
    /// a metric (`Gauge(label: "relay_…")`, as a string literal), a histogram's series by its base name.
    @Test func everyMetricTheRulesNameIsOneTheRelayEmits() throws {
        let rules = try String(contentsOf: OperatorsKit.root.appendingPathComponent(OperatorsKit.rules), encoding: .utf8)
        let named = try OperatorsKit.metricNames(in: rules)
        // The scan itself works: the rules name the upstream, hub, history and cluster metrics.
        #expect(named.contains("relay_upstream_state") && named.contains("relay_cluster_leader"), "found only \(named.sorted())")
        let sources = try OperatorsKit.sourcesText()
        func emitted(_ name: String) -> Bool {
            if sources.contains("\"\(name)\"") { return true }
            // A histogram (swift-metrics' Timer) is emitted under its base name, scraped as three series.
            for suffix in ["_bucket", "_sum", "_count"] where name.hasSuffix(suffix) {
                if sources.contains("\"\(name.dropLast(suffix.count))\"") { return true }
            }
            return false
        }
        let missing = named.filter { !emitted($0) }.sorted()
        #expect(
            missing.isEmpty,
            "\(OperatorsKit.rules) names metrics that no file under Sources/ emits (as a string literal): \(missing.joined(separator: ", "))"
        )
    }
}
