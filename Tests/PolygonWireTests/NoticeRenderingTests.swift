import MarketCore
import NIOCore
import PolygonWire
import Testing

/// The relay's notices in Polygon's words, byte for byte: what clients parsed before the notices had a
/// value of their own (numbers first, then the rest, each by key; a refusal is Polygon's `error`).
@Suite("Polygon: notices rendered")
struct NoticeRenderingTests {
    let polygon = PolygonWireProtocol()

    func text(_ notice: Notice) -> String { String(buffer: polygon.render(notice).bytes) }

    @Test func aGapNamesItsWindowThenItsTexts() {
        let gap = Notice(
            .gap, message: "Q.A: missed events are gone",
            details: ["topic": .text("Q.A"), "epoch": .text("e1"), "from": .number(3), "through": .number(9), "unit": .text("market")])
        #expect(text(gap) == #"{"ev":"status","status":"gap","message":"Q.A: missed events are gone","from":3,"through":9,"epoch":"e1","topic":"Q.A","unit":"market"}"#)
    }

    @Test func aResumeAndARecoveryCarryTheirObjectsListsAndFlags() {
        let resumed = Notice(
            .resumed, message: "resumed",
            details: [
                "replayed": Notice.counts([Topic(eventType: "T", ticker: "B")!: 2, Topic(eventType: "T", ticker: "A")!: 1]),
                "gaps": Notice.topics([Topic(eventType: "Q", ticker: "Z")!]), "market_sequence": .number(12),
            ])
        #expect(text(resumed) == #"{"ev":"status","status":"resumed","message":"resumed","market_sequence":12,"gaps":["Q.Z"],"replayed":{"T.A":1,"T.B":2}}"#)
        let recovered = Notice(
            .recovered, message: "recovered \"2\"",
            details: ["complete": .flag(false), "missing": .object([Notice.Detail("T.A", .text("timeout"))]), "from": .number(1), "through": .number(5)])
        #expect(text(recovered) == #"{"ev":"status","status":"recovered","message":"recovered \"2\"","from":1,"through":5,"complete":false,"missing":{"T.A":"timeout"}}"#)
    }

    @Test func aRefusalIsPolygonsErrorWithTheUpstreamsCode() {
        let refused = Notice(.refused, message: "the upstream refused T.AAPL (insufficient subscription)", details: ["code": .number(409)])
        #expect(text(refused) == #"{"ev":"status","status":"error","message":"the upstream refused T.AAPL (insufficient subscription)","code":409}"#)
        #expect(polygon.render(refused).noticeKind == .refused)
    }
}
