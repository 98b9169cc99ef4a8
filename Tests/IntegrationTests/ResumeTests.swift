import Foundation
import NIOCore
import PolygonWire
import RelayComposition
import RelayConfiguration
import Testing

/// A returning client gets exactly what it missed, or is told exactly what it cannot: over real sockets.
@Suite("Resume over real sockets")
struct ResumeTests {
    func withRelay(rate: Double = 2_000, _ body: @Sendable (String) async throws -> Void) async throws {
        let relay = Relay(
            settings: RelaySettings(listen: .init(host: "127.0.0.1", port: 0), clientKeys: ["client-key", "py-key"], demoRate: rate),
            logger: testLogger)
        try await withServices([relay]) {
            let parts = try await within(.seconds(15), "the relay to start") { try await relay.ready() }
            try await body("ws://127.0.0.1:\(parts.port)/stocks")
        }
    }

    /// Subscribes and returns the epoch its `success` named and the topic positions of the first events.
    func subscribe(_ client: WSTestClient, _ params: String, events count: Int) async throws -> (epoch: String, events: [MarketEvent]) {
        client.send(ClientAction(.subscribe, params: params))
        let success = try await client.waitForStatus(StatusMessage.Kind.success)
        let epoch = try #require(success.fields["epoch"] as? String, "the subscribe's success names the epoch: \(success.fields)")
        var events = success.eventsBefore
        if events.count < count { events += try await client.nextEvents(count - events.count) }
        return (epoch, events)
    }

    func topicSequences(_ events: [MarketEvent]) -> [UInt64] { events.compactMap { EventPosition.read(from: $0.bytes)?.topic } }

    @Test func aSubscribeSinceAPositionGetsEveryMissedEventThenResumedThenLive() async throws {
        try await withRelay { url in
            // Another client holds Q.AAPL throughout (so the relay receives all of it) and is the clock.
            let clock = try await WSTestClient.authenticated(url: url)
            _ = try await subscribe(clock, "Q.AAPL", events: 1)
            let first = try await WSTestClient.authenticated(url: url)
            let (epoch, seen) = try await subscribe(first, "Q.AAPL", events: 3)
            let last = try #require(topicSequences(seen).last)
            await first.close()
            // At least 20 more AAPL quotes went by meanwhile.
            _ = try await clock.nextEvents(21)
            let back = try await WSTestClient.authenticated(url: url)
            back.send(#"{"action":"subscribe","params":"Q.AAPL","since":{"epoch":"\#(epoch)","Q.AAPL":\#(last)}}"#)
            let resumed = try await back.waitForStatus(StatusMessage.Kind.resumed)
            let replayed = try #require((resumed.fields["replayed"] as? [String: Int])?["Q.AAPL"])
            #expect(replayed >= 10, "the clock saw 21 quotes, some of them before the first client left")
            var sequences = topicSequences(resumed.eventsBefore)
            sequences += topicSequences(try await back.nextEvents(5))
            #expect(sequences.first == last + 1, "the first replayed event follows the last one seen")
            #expect(sequences == Array((last + 1)...(last + UInt64(sequences.count))), "contiguous across the seam: \(sequences)")
            for client in [clock, back] { await client.close() }
        }
    }

    @Test func aSubscribeSinceATimeGetsWhatArrivedFromThen() async throws {
        try await withRelay { url in
            let clock = try await WSTestClient.authenticated(url: url)
            let (_, before) = try await subscribe(clock, "Q.MSFT", events: 2)
            // A millisecond past what was read: an event the relay received in the same millisecond as
            // the read is "at or after" the time.
            let since = WallClock.nowMilliseconds() + 1
            try await Task.sleep(for: .milliseconds(2))
            let after = try await clock.nextEvents(10)
            let back = try await WSTestClient.authenticated(url: url)
            back.send(#"{"action":"subscribe","params":"Q.MSFT","sinceTime":\#(since)}"#)
            let resumed = try await back.waitForStatus(StatusMessage.Kind.resumed)
            let replayed = topicSequences(resumed.eventsBefore)
            let clockSaw = topicSequences(after)
            #expect(replayed.count >= clockSaw.filter { $0 > (topicSequences(before).last ?? 0) }.count)
            #expect(replayed == Array((replayed.first ?? 0)...(replayed.last ?? 0)), "contiguous: \(replayed)")
            #expect(!replayed.contains(try #require(topicSequences(before).first)), "nothing from before the time")
            for client in [clock, back] { await client.close() }
        }
    }

    @Test func aLargeReplayGoesOutAsTheClientReadsWholeInOrderOnceThenLive() async throws {
        try await withRelay(rate: 10_000) { url in
            let clock = try await WSTestClient.authenticated(url: url)
            let since = WallClock.nowMilliseconds()
            _ = try await subscribe(clock, "Q.*", events: 1)
            // Well past one turn's bytes (256 KiB): the replay is built a part at a time as it is read.
            _ = try await clock.nextEvents(12_000, timeout: .seconds(30))
            let back = try await WSTestClient.authenticated(url: url)
            back.send(#"{"action":"subscribe","params":"Q.*","sinceTime":\#(since)}"#)
            let resumed = try await back.waitForStatus(StatusMessage.Kind.resumed, timeout: .seconds(60))
            let replayed = try #require((resumed.fields["replayed"] as? [String: Int])?["Q.*"])
            #expect(replayed >= 12_000)
            var markets = resumed.eventsBefore.compactMap { EventPosition.read(from: $0.bytes)?.market }
            markets += try await back.nextEvents(200).compactMap { EventPosition.read(from: $0.bytes)?.market }
            let first = try #require(markets.first)
            #expect(markets.count >= replayed + 200)
            #expect(markets == Array(first...(first + UInt64(markets.count) - 1)), "every event once, in order, across the seam")
            for client in [clock, back] { await client.close() }
        }
    }

    @Test func anotherEpochGetsAGapThenTheLastValueThenLive() async throws {
        try await withRelay { url in
            let clock = try await WSTestClient.authenticated(url: url)
            _ = try await subscribe(clock, "Q.AAPL", events: 2)
            let back = try await WSTestClient.authenticated(url: url)
            back.send(#"{"action":"subscribe","params":"Q.AAPL","since":{"epoch":"not-this-one","Q.AAPL":5}}"#)
            // The gap, the last value and the seam arrive together (one delivery of the hub).
            var frame = try await back.nextFrame()
            while !frame.contains(#""status":"gap""#) { frame = try await back.nextFrame() }
            let objects = try #require(try JSONSerialization.jsonObject(with: Data(frame.utf8)) as? [[String: Any]])
            let statuses = objects.compactMap { $0["status"] as? String }
            #expect(Array(statuses.prefix(2)) == [StatusMessage.Kind.gap, StatusMessage.Kind.resumed], "\(frame)")
            #expect(objects.first { $0["status"] as? String == StatusMessage.Kind.gap }?["topic"] as? String == "Q.AAPL")
            let gapAt = try #require(objects.firstIndex { $0["status"] as? String == StatusMessage.Kind.gap })
            #expect(objects.indices.contains(gapAt + 1) && objects[gapAt + 1]["ev"] as? String == "Q", "its last value right after the gap: \(frame)")
            let resumed = try #require(objects.first { $0["status"] as? String == StatusMessage.Kind.resumed })
            #expect((resumed["gaps"] as? [String]) == ["Q.AAPL"])
            #expect(try await back.nextEvents(2).count >= 2, "then live")
            for client in [clock, back] { await client.close() }
        }
    }

    @Test func aMalformedSinceIsAnErrorAndTheConnectionLives() async throws {
        try await withRelay { url in
            let client = try await WSTestClient.authenticated(url: url)
            client.send(#"{"action":"subscribe","params":"Q.AAPL","since":{"Q.AAPL":"twelve"}}"#)
            #expect(try await client.nextParsed().statuses.first?.status == StatusMessage.Kind.error)
            client.send(ClientAction(.subscribe, params: "Q.AAPL"))
            #expect(try await client.nextEvents(1).count >= 1)
            await client.close()
        }
    }

    @Test(.enabled(if: pythonClientAvailable, "python3 -m pip install -r Tests/Interop/requirements.txt"))
    func theOfficialPythonClientWithATaggedKeyMissesNothingAcrossBrokenConnections() async throws {
        try await withRelay(rate: 5_000) { url in
            let port = try #require(URL(string: url)?.port)
            let script = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
                .appendingPathComponent("Interop/resume_python_client.py").path
            let result = try await runPython(
                script, ["--port", "\(port)", "--key", "py-key#strategy-1", "--subscribe", "T.*,Q.*", "--breaks", "3"], timeout: .seconds(120))
            #expect(result.status == 0, "\(result.output)")
            let line = try #require(result.output.split(separator: "\n").last { $0.hasPrefix("{") })
            let summary = try #require(try JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any])
            #expect(summary["missing"] as? Int == 0, "\(summary)")
            #expect(summary["resumed"] as? Int == 3, "\(summary)")
        }
    }
}
