import Foundation
import NIOCore
import PolygonWire
import Synchronization
import Testing

@testable import MarketDataHub

private func fields(_ event: MarketEvent) -> [String: Any] {
    (try? JSONSerialization.jsonObject(with: Data(event.bytes.readableBytesView))) as? [String: Any] ?? [:]
}

/// A trade with Polygon's `q`, as the upstream (or a fill, flagged) would send it.
private func trade(_ q: Int, recovered: Bool = false) -> MarketEvent {
    MarketEvent(eventType: "T", ticker: "AAPL", bytes: ByteBuffer(string: #"{"ev":"T","sym":"AAPL","p":1,"q":\#(q)\#(recovered ? #","_r":1"# : "")}"#))
}

/// The hub's side of the gap fill: the request after an outage, recovered events bounded by the first
/// live one and delivered to named holders only, and the `recovered` status.
@Suite("Hub: gap fill")
struct GapFillHubTests {
    @Test func aRecoveryAsksForTheNamedTopicsAndRecoveredEventsGoToTheirHoldersUpToTheFirstLiveOne() async throws {
        let hub = MarketDataHub(history: nil)
        let requests = Mutex<[GapFillRequest]>([])
        await hub.setRecoveryHandler { request in requests.withLock { $0.append(request) } }
        let named = await hub.subscribe(to: topics("T.AAPL"))
        let wildcard = await hub.subscribe(to: topics("T.*"))
        await hub.publish([trade(10)])
        await hub.upstreamLost(reason: "test")
        // Back: the first live trade is q 15, so a fill may bring 11…14 and nothing from 15 on.
        await hub.publish([trade(15)])
        let request = try #require(requests.withLock { $0.first })
        #expect(request.topics.map(\.topic.description) == ["T.AAPL"], "named topics only")
        #expect(RecoveryOrder.sequence.value(of: try #require(request.topics.first?.lastBefore)) == 10)
        let delivered = await hub.deliverRecovered(
            Topic(parsing: "T.AAPL")!, (11...16).map { trade($0, recovered: true) }, order: .sequence, generation: request.generation)
        #expect(delivered == 4)
        var summary = GapFillSummary(from: request.from, through: request.through)
        summary.recovered[Topic(parsing: "T.AAPL")!] = delivered
        await hub.announceRecovered(summary, generation: request.generation)
        await hub.publish([trade(16)])

        // The named holder: 10, the loss, the reconnect and live 15, recovered 11…14, the status, live 16.
        let got = try await take(10, from: named.events)
        #expect(got.compactMap { fields($0)["q"] as? Int } == [10, 15, 11, 12, 13, 14, 16], "\(got.map(\.json))")
        #expect(got.filter { fields($0)["_r"] as? Int == 1 }.count == 4)
        #expect(
            got.compactMap { fields($0)["status"] as? String } == ["upstream_disconnected", "upstream_reconnected", "recovered"],
            "\(got.map(\.json))")
        let status = try #require(got.last { fields($0)["status"] as? String == "recovered" })
        #expect((fields(status)["topics"] as? [String: Int]) == ["T.AAPL": 4] && fields(status)["complete"] as? Bool == true)
        // The wildcard holder: 10, the notices, 15, 16; nothing recovered.
        let wild = try await take(5, from: wildcard.events)
        #expect(wild.compactMap { fields($0)["q"] as? Int } == [10, 15, 16], "\(wild.map(\.json))")
        #expect(wild.allSatisfy { fields($0)["_r"] == nil && fields($0)["status"] as? String != "recovered" })
        let counts = await hub.gapFillStatistics
        #expect(counts.fills == 1 && counts.recovered == 4 && counts.last?.complete == true)
    }
}
