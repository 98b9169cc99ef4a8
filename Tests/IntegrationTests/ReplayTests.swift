import AlpacaWire
import Foundation
import MarketCore
import PolygonWire
import RelayComposition
import RelayBench
import RelayConfiguration
import Tape
import Testing

/// A day the relay recorded, served again by `relay replay`: a real relay records its demo feed while a
/// client reads, then a second relay replays that tape at the same paths in the same protocol, to a test
/// client (every recorded event, in order, with its recorded bytes) and to the vendors' official clients.
@Suite("Replay: a recorded day served as the market", .serialized, .timeLimit(.minutes(3)))
struct ReplayTests {
    /// Records `count` events of `topics` on `market` from the demo feed (in `vendor`'s protocol) into
    /// `directory`, a subscriber of the market's hub holding them; returns the day's recorded events.
    func record(into directory: String, vendor: WireVendor? = nil, market: Market = .stocks, topics: [String] = ["Q.*", "T.*"], count: Int) async throws
        -> [TapeEvent]
    {
        try await record(into: directory, vendor: vendor, market: market, topics: topics, until: "\(count) events") { $0.count >= count }
    }

    /// The same, until the event types the subscriber got are `enough`.
    func record(
        into directory: String, vendor: WireVendor? = nil, market: Market = .stocks, topics: [String], until what: String,
        enough: @escaping @Sendable ([String]) -> Bool
    ) async throws -> [TapeEvent] {
        var settings = RelaySettings(listen: .init(host: "127.0.0.1", port: 0), demoRate: 2000)
        settings.portfolio = nil
        settings.upstreamVendor = vendor
        settings.tape = TapeSettings(directory: directory)
        let relay = Relay(settings: settings, logger: testLogger)
        try await withServices([relay]) {
            let parts = try await within(.seconds(10), "the recording relay to start") { try await relay.ready() }
            let hub = try #require(parts.markets[market])
            let wanted = Set(topics.compactMap { Topic(parsing: $0) })
            try await within(.seconds(30), "\(what) of \(topics) to be recorded") {
                var reader = await hub.subscribe(to: wanted).makeReader()
                var seen: [String] = []
                while !enough(seen), let batch = await reader.nextBatch() { seen += batch.map(\.eventType) }
            }
        }
        let path = TapeFile.path(directory: directory, market: market.rawValue, day: TapeFile.day(of: WallClock.nowNanoseconds()))
        return try TapeReader(path: path).records().compactMap { record -> TapeEvent? in if case .event(let event) = record { event } else { nil } }
    }

    /// A relay replaying today's tape in `directory`.
    func replaying(_ directory: String, speed: String = "max", markets: [Market] = [.stocks], _ body: (Int) async throws -> Void) async throws {
        var settings = RelaySettings(listen: .init(host: "127.0.0.1", port: 0))
        settings.portfolio = nil
        settings.tape = nil
        var replay = ReplaySettings(directory: directory)
        replay.speed = speed
        replay.markets = markets
        settings.replay = replay
        let relay = Relay(settings: settings, logger: testLogger)
        try await withServices([relay]) {
            let parts = try await within(.seconds(10), "the replaying relay to start") { try await relay.ready() }
            try await body(parts.port)
        }
    }

    /// An event's JSON without the positions the hub writes into it.
    static func withoutPositions(_ text: String) -> String {
        text.replacingOccurrences(of: #","_s":\d+,"_m":\d+"#, with: "", options: .regularExpression)
    }

    @Test func everyRecordedEventIsReplayedInOrderWithItsRecordedBytes() async throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("relay-replay-\(UUID().uuidString)").path
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let recorded = try await record(into: directory, count: 1_500)
        try #require(recorded.count >= 1_500)
        // `relay tape export` writes the same events, a line each, with their positions and receive times.
        let exported = try await runProcess(
            RelayProcess.siblingBinary(), ["tape", "export", "--tape-dir", directory, "--market", "stocks", "--format", "jsonl"], timeout: .seconds(30),
            what: "relay tape export")
        #expect(exported.status == 0, "\(exported.output.suffix(500))")
        let lines = exported.output.split(separator: "\n").filter { $0.hasPrefix("{") }.map { jsonObject(String($0)) }
        #expect(lines.count == recorded.count, "a line per recorded event")
        #expect(lines.map { $0["_m"] as? Int } == recorded.map { Int($0.sequence) })
        #expect(lines.map { $0["_r"] as? Int } == recorded.map { Int($0.receivedAt) })
        try await replaying(directory) { port in
            let client = try await WSTestClient.authenticated(url: "ws://127.0.0.1:\(port)/stocks")
            client.send(ClientAction(.subscribe, params: "Q.*,T.*"))
            let started = try await client.waitForStatus("replay")
            #expect(started.fields["state"] as? String == "started", "\(started.fields)")
            #expect(started.fields["day"] as? String == TapeFile.day(of: WallClock.nowNanoseconds()))
            #expect(started.fields["speed"] as? String == "max")
            let ended = try await client.waitForStatus("replay", timeout: .seconds(60))
            #expect(ended.fields["state"] as? String == "ended", "\(ended.fields)")
            // Nothing is published before the start notice, so the events read with it (in its frame, after
            // it) are the replay's first.
            // At `max` the replay keeps no history, so its events carry no positions: the recorded bytes exactly.
            let replayed = (started.eventsBefore + ended.eventsBefore).map { String(buffer: $0.bytes) }
            let expected = recorded.map { String(buffer: $0.bytes) }
            #expect(replayed.count == expected.count, "every recorded event (\(replayed.count) of \(expected.count))")
            if replayed.count == expected.count { #expect(replayed == expected, "in order, with the recorded bytes (time fields included)") }
            #expect(ended.fields["events"] as? Int == recorded.count)
            await client.close()
            // /healthz tells what the source is.
            let health = jsonObject(try await httpGet("http://127.0.0.1:\(port)/healthz").body)
            let upstream = ((health["markets"] as? [String: Any])?["stocks"] as? [String: Any])?["upstream"] as? [String: Any]
            let source = upstream?["url"] as? String
            #expect(source?.hasPrefix("tape:") == true, "\(String(describing: upstream))")
        }
    }

    @Test func aReplayAtAFiniteSpeedKeepsAHistoryAndPositionsItsEvents() async throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("relay-replay-pos-\(UUID().uuidString)").path
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let recorded = try await record(into: directory, count: 300)
        // A hundredth of the recorded pace (a demo feed at 2,000/s: one event every 50 ms or so), so the
        // client subscribes while the replay is under way.
        try await replaying(directory, speed: "0.01") { port in
            let client = try await WSTestClient.authenticated(url: "ws://127.0.0.1:\(port)/stocks")
            client.send(ClientAction(.subscribe, params: "Q.*,T.*"))
            var events: [MarketEvent] = []
            while events.count < 5 { events += try FrameParser.parse(try await client.nextFrame(timeout: .seconds(30))).events }
            let objects = events.map { jsonObject(String(buffer: $0.bytes)) }
            let sequences = objects.compactMap { $0["_m"] as? Int }
            #expect(sequences.count == events.count && objects.allSatisfy { $0["_s"] is Int }, "each event positioned: \(objects.prefix(2))")
            #expect(sequences == Array(sequences.first.map { $0..<($0 + sequences.count) } ?? 0..<0), "in the replay's own market sequence")
            let recordedBytes = Set(recorded.map { String(buffer: $0.bytes) })
            #expect(events.allSatisfy { recordedBytes.contains(Self.withoutPositions(String(buffer: $0.bytes))) }, "the recorded bytes, positions added")
            await client.close()
        }
    }

    @Test(.enabled(if: pythonClientAvailable, "python3 -m pip install -r Tests/Interop/requirements.txt"))
    func polygonsOfficialClientReplaysUnchanged() async throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("relay-replay-py-\(UUID().uuidString)").path
        defer { try? FileManager.default.removeItem(atPath: directory) }
        _ = try await record(into: directory, count: 3_000)
        // At max the replay waits for its first reader: the client's subscribe starts it.
        try await replaying(directory) { port in
            let result = try await runPythonClient(["--port", "\(port)", "--key", "py-key", "--subscribe", "Q.AAPL,T.MSFT", "--count", "20"])
            #expect(result.status == 0, "\(result.output)")
        }
    }

    @Test(.enabled(if: alpacaSDKsAvailable, "scripts/test installs Alpaca's SDKs"))
    func alpacaPysOptionStreamReplaysAnAlpacaTapeUnchanged() async throws {
        // Alpaca's options come in MessagePack: recorded so, replayed so, at the same path.
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("relay-replay-alpaca-\(UUID().uuidString)").path
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let contract = "SPY251219C00650000"
        // Trades of a contract are rarer than its quotes: recorded until there are a few of each.
        let recorded = try await record(
            into: directory, vendor: .alpaca, market: .options, topics: ["t.\(contract)", "q.\(contract)"], until: "3 trades and 3 quotes"
        ) { types in types.filter { $0 == "t" }.count >= 3 && types.filter { $0 == "q" }.count >= 3 }
        let kinds = recorded.map(\.eventType)
        try #require(kinds.filter { $0 == "t" }.count >= 3 && kinds.filter { $0 == "q" }.count >= 3, "trades and quotes recorded: \(kinds)")
        try await replaying(directory, markets: [.options]) { port in
            let python = try #require(alpacaPython)
            let result = try await runPython(
                AlpacaDownstreamTests.script, ["--sdk", "alpaca-py", "--options", "indicative", "--port", "\(port)", "--symbols", contract],
                timeout: .seconds(60), python: python)
            #expect(result.status == 0, "\(result.output.suffix(3000))")
            let got = AlpacaDownstreamTests.kinds(AlpacaDownstreamTests.lastJSON(result.output))
            #expect(got["trades"]?.first?["type"] as? String == "alpaca.data.models.trades.Trade", "\(got)")
            #expect(got["quotes"]?.first?["type"] as? String == "alpaca.data.models.quotes.Quote", "\(got)")
            #expect(got.values.joined().allSatisfy { $0["symbol"] as? String == contract })
        }
    }
}
