import DemoFeed
import Foundation
import PolygonWire
import RelayComposition
import Testing

/// A JSON number as an integer.
private func int(_ value: Any?) -> Int64? { (value as? NSNumber)?.int64Value }

/// The gap fill over real sockets: the demo feed keeps streaming into nobody while its WebSocket is
/// down, and its REST history (what it generated) is the truth the recovered events are compared with.
@Suite("Gap fill: an upstream outage recovered from REST", .serialized)
struct GapFillTests {
    /// Everything a client read, parsed: events as JSON objects, statuses included.
    final class Reader {
        var objects: [[String: Any]] = []
        let client: WSTestClient

        init(_ client: WSTestClient) { self.client = client }

        /// Reads until an object satisfies `condition`, or fails after `timeout`.
        func read(until what: String, timeout: Duration = .seconds(30), _ condition: ([String: Any]) -> Bool) async throws {
            let deadline = ContinuousClock.now + timeout
            while true {
                let left = deadline - .now
                guard left > .zero else { throw TimeoutError(description: "no \(what) within \(timeout)") }
                let frame = try await client.nextFrame(timeout: left)
                let parsed = (try? JSONSerialization.jsonObject(with: Data(frame.utf8)) as? [[String: Any]]) ?? []
                objects += parsed
                if parsed.contains(where: condition) { return }
            }
        }

        /// Reads whatever arrives for `duration`.
        func read(for duration: Duration) async throws {
            let end = ContinuousClock.now + duration
            while ContinuousClock.now < end {
                guard let frame = try? await client.nextFrame(timeout: end - .now) else { return }
                objects += (try? JSONSerialization.jsonObject(with: Data(frame.utf8)) as? [[String: Any]]) ?? []
            }
        }

        func events(_ type: String, _ ticker: String) -> [[String: Any]] {
            objects.filter { $0["ev"] as? String == type && ($0["sym"] as? String) == ticker }
        }

        func statuses(_ status: String) -> [[String: Any]] { objects.filter { $0["status"] as? String == status } }
    }

    /// The feed's own record of `path` (its REST history), as JSON objects.
    static func truth(_ feed: DemoFeed, _ path: String, _ query: String, key: String = "upstream-secret") async throws -> [[String: Any]] {
        let port = try await feed.listeningPort()
        let answer = try await httpGet("http://127.0.0.1:\(port)\(path)?\(query)&apiKey=\(key)")
        #expect(answer.status == 200, "\(answer.body.prefix(300))")
        let object = try JSONSerialization.jsonObject(with: Data(answer.body.utf8)) as? [String: Any]
        return object?["results"] as? [[String: Any]] ?? []
    }

    /// Checks that a topic's `q` values seen by the client are exactly the feed's over the span the
    /// client saw, without a duplicate, and that the ones the fill brought are flagged and were missed.
    static func expectExact(_ seen: [[String: Any]], truth: [[String: Any]], topic: String, outage: ClosedRange<Int64>) {
        let sequences = seen.compactMap { int($0["q"]) }
        #expect(sequences.count == Set(sequences).count, "\(topic): no duplicates at either seam")
        guard let low = sequences.min(), let high = sequences.max() else {
            Issue.record("\(topic): no events")
            return
        }
        let expected = Set(truth.compactMap { int($0["sequence_number"]) }.filter { (low...high).contains($0) })
        #expect(Set(sequences) == expected, "\(topic): missing \(expected.subtracting(sequences).sorted().prefix(10)), extra \(Set(sequences).subtracting(expected).sorted().prefix(10))")
        let recovered = seen.filter { int($0["_r"]) == 1 }
        #expect(!recovered.isEmpty, "\(topic): the outage's events were recovered")
        let times = recovered.compactMap { int($0["t"]) }
        #expect(times == times.sorted(), "\(topic): recovered oldest first")
        // The outage is in the relay's arrival times and `t` is the event's own time: an event made
        // just before the relay's last arrival can still have been on its way (on a cluster node, in
        // NATS when the node's link was cut). A second of that lead, and none after.
        let window = (outage.lowerBound - 1_000)...outage.upperBound
        #expect(
            times.allSatisfy { window.contains($0) },
            "\(topic): recovered events lie in the outage \(outage) (less a second): outside: \(times.filter { !window.contains($0) }.prefix(10))")
    }

    @Test func namedTopicsGetExactlyWhatTheFeedGeneratedMeanwhileWildcardsTheNoticeOnly() async throws {
        try await withFaultyFeedRelay(restFromFeed: true) { parts, feed, url in
            let named = Reader(try await subscribedClient(url, "T.AAPL,Q.MSFT,AM.AAPL"))
            let wildcard = Reader(try await subscribedClient(url, "T.*"))
            // The outage straddles a minute's end, so that minute's bar is sent while nobody listens.
            while (WallClock.nowMilliseconds() / 1000) % 60 != 57 {
                try await named.read(for: .milliseconds(200))
            }
            #expect(feed.inject(.drop, refusingFor: .seconds(4)) == 1)
            try await named.read(until: "the recovered status") { $0["status"] as? String == StatusMessage.Kind.recovered }
            try await named.read(for: .seconds(1))
            try await wildcard.read(until: "the reconnect notice") { $0["status"] as? String == StatusMessage.Kind.upstreamReconnected }
            try await wildcard.read(for: .seconds(1))

            let back = try #require(named.statuses(StatusMessage.Kind.upstreamReconnected).first)
            let outage = try #require(int(back["last_event_before_ms"]))...(try #require(int(back["first_event_after_ms"])))
            let recovered = try #require(named.statuses(StatusMessage.Kind.recovered).first)
            #expect(recovered["complete"] as? Bool == true, "\(recovered)")
            #expect(int(recovered["from"]) == outage.lowerBound && int(recovered["through"]) == outage.upperBound)
            let counts = recovered["topics"] as? [String: Any] ?? [:]
            #expect(Set(counts.keys) == ["T.AAPL", "Q.MSFT", "AM.AAPL"])

            let trades = named.events("T", "AAPL")
            let span = "timestamp.gte=\((int(trades.first?["t"]) ?? 0) * 1_000_000)&order=asc&limit=50000"
            Self.expectExact(trades, truth: try await Self.truth(feed, "/v3/trades/AAPL", span), topic: "T.AAPL", outage: outage)
            let quotes = named.events("Q", "MSFT")
            let quoteSpan = "timestamp.gte=\((int(quotes.first?["t"]) ?? 0) * 1_000_000)&order=asc&limit=50000"
            Self.expectExact(quotes, truth: try await Self.truth(feed, "/v3/quotes/MSFT", quoteSpan), topic: "Q.MSFT", outage: outage)
            #expect(int(counts["T.AAPL"]) == Int64(trades.filter { int($0["_r"]) == 1 }.count))

            // The minute that ended in the outage: its bar, recovered, equal to the feed's, and only once.
            let minute = outage.upperBound / 60_000 * 60_000 - 60_000
            let bars = named.events("AM", "AAPL").filter { int($0["s"]) == minute }
            #expect(bars.count == 1, "one bar of the minute that ended in the outage: \(bars)")
            let truthBars = try await Self.truth(feed, "/v2/aggs/ticker/AAPL/range/1/minute/\(minute)/\(minute)", "adjusted=true")
            let bar = try #require(bars.first)
            let truthBar = try #require(truthBars.first)
            #expect(int(bar["_r"]) == 1 && int(bar["e"]) == minute + 60_000)
            for field in ["o", "h", "l", "c", "v"] {
                #expect((bar[field] as? NSNumber)?.doubleValue == (truthBar[field] as? NSNumber)?.doubleValue, "AM.AAPL \(field)")
            }
            #expect(bar["av"] == nil && bar["op"] == nil, "fields REST does not give are left out")

            // The wildcard's holder: the notices, no recovered event, no recovered status.
            #expect(!wildcard.statuses(StatusMessage.Kind.upstreamDisconnected).isEmpty)
            #expect(wildcard.objects.allSatisfy { int($0["_r"]) == nil })
            #expect(wildcard.statuses(StatusMessage.Kind.recovered).isEmpty)
            let fills = await parts.hub.gapFillStatistics
            #expect(fills.fills == 1 && fills.incomplete == 0)
            let requests = try #require(await parts.gapFillers[.stocks]?.requests)
            #expect(requests == 3, "one page per topic")
            // Shown in /v1/status: the market's counts, and the fill among the recent changes.
            try await eventually("/v1/status to show the fill") {
                guard let status = try? await httpGet("http://127.0.0.1:\(parts.port)/v1/status", key: "client-key"),
                    let object = try? JSONSerialization.jsonObject(with: Data(status.body.utf8)) as? [String: Any],
                    let markets = object["markets"] as? [[String: Any]], let gapFill = markets.first?["gapFill"] as? [String: Any],
                    let changes = object["changes"] as? [[String: Any]]
                else { return false }
                return int(gapFill["fills"]) == 1 && changes.contains { ($0["what"] as? String) == "gap filled" }
            }
            await named.client.close()
            await wildcard.client.close()
        }
    }

    @Test func aFillWhoseRESTFailsSaysIncompleteAndNamesWhatIsMissing() async throws {
        var feedConfiguration = DemoFeedConfiguration(port: 0, apiKey: "upstream-secret")
        // Every attempt of both topics' requests (the REST client tries each four times).
        feedConfiguration.restFailures = 8
        try await withFaultyFeedRelay(feed: feedConfiguration, restFromFeed: true) { parts, feed, url in
            let named = Reader(try await subscribedClient(url, "T.AAPL,Q.MSFT"))
            #expect(feed.inject(.drop, refusingFor: .seconds(1)) == 1)
            try await named.read(until: "the recovered status") { $0["status"] as? String == StatusMessage.Kind.recovered }
            let recovered = try #require(named.statuses(StatusMessage.Kind.recovered).first)
            #expect(recovered["complete"] as? Bool == false, "\(recovered)")
            let missing = recovered["missing"] as? [String: String] ?? [:]
            #expect(Set(missing.keys) == ["T.AAPL", "Q.MSFT"], "\(recovered)")
            #expect(missing.values.allSatisfy { $0.contains("503") }, "\(missing)")
            #expect(named.objects.allSatisfy { int($0["_r"]) == nil }, "nothing invented")
            #expect(await parts.hub.gapFillStatistics.incomplete == 1)
            await named.client.close()
        }
    }

    @Test(.enabled(if: pythonClientAvailable, "python3 -m pip install -r Tests/Interop/requirements.txt"))
    func theOfficialPythonClientTakesTheRecoveredEventsAndMissesNothing() async throws {
        try await withFaultyFeedRelay(restFromFeed: true) { parts, feed, url in
            let script = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
                .appendingPathComponent("Interop/gap_fill_python_client.py").path
            let result = try await runPython(
                script,
                ["--port", "\(parts.port)", "--key", "client-key", "--feed-port", "\(try await feed.listeningPort())", "--feed-key", "upstream-secret"],
                timeout: .seconds(90))
            #expect(result.status == 0, "\(result.output)")
            #expect(await parts.hub.gapFillStatistics.fills == 1, "\(result.output)")
        }
    }
}
