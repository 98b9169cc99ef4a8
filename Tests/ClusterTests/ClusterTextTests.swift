import PolygonWire
import Testing

@testable import Cluster

/// What NATS can put into a client's status: bounded and printable, whoever published it.
@Suite("Cluster text clients see: bounded, printable")
struct ClusterTextTests {
    @Test func aHugeControlMessageBecomesAtMost200PrintableBytes() {
        let huge = String(repeating: "upstream gone ", count: 15_000)  // ~200 KB
        let shown = ClusterText.visible(huge)
        #expect(shown.utf8.count <= 200)
        #expect(shown.hasPrefix("upstream gone upstream gone") && shown.hasSuffix("…"))
    }

    @Test func controlCharactersEscapesAndSeparatorsBecomeSpaces() {
        let shown = ClusterText.visible("line one\r\nline\u{0}two\u{1B}[2J\u{2028}three\u{202E}evil\t\tend")
        #expect(shown == "line one line two [2J three evil end")
        #expect(ClusterText.visible("\n\n") == "")
    }

    @Test func textIsCutBetweenCharactersNotInsideOne() {
        let shown = ClusterText.visible(String(repeating: "é👍🏽", count: 100), limit: 50)
        #expect(shown.utf8.count <= 50 && shown.hasSuffix("…"))
        #expect(shown.dropLast().allSatisfy { $0 == "é" || $0 == "👍🏽" })
        #expect(ClusterText.visible("short and fine: 1 % ≥ €") == "short and fine: 1 % ≥ €")
    }

    @Test func aRefusalsReasonReadsBackPrintable() throws {
        let read = try ClusterControl.read("refused:405 T.AAPL symbol limit\u{7}\u{1B}[0m exceeded").get()
        #expect(read == .refused(topics: [Topic(parsing: "T.AAPL")!], code: 405, reason: "symbol limit [0m exceeded"))
        #expect((try? ClusterControl.read("refused:405 T.AAPL " + String(repeating: "x", count: 201)).get()) == nil)
    }
}
