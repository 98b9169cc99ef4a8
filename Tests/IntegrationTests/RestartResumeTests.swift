import Foundation
import MarketCore
import PolygonWire
import RelayBench
import RelayComposition
import RelayConfiguration
import Tape
import Testing

/// A relay stopped and started again on the same tape goes on in the same epoch: a client that comes
/// back with its positions from before the restart gets every event the relay had received, a `gap`
/// naming the time it was down, then live, its topic sequences contiguous across. Real relay processes,
/// a real SIGTERM, the tape read back from its file in between.
@Suite("Resume across a restart", .timeLimit(.minutes(3)))
struct RestartResumeTests {
    /// Reads frames until a `resumed` status (included): every object in order.
    func objects(until status: String, from client: WSTestClient, timeout: Duration = .seconds(15)) async throws -> [[String: Any]] {
        var objects: [[String: Any]] = []
        let deadline = ContinuousClock.now + timeout
        while !objects.contains(where: { $0["status"] as? String == status }) {
            let left = deadline - .now
            guard left > .zero else { throw TimeoutError(description: "no \(status) within \(timeout): \(objects.suffix(3))") }
            objects += try JSONSerialization.jsonObject(with: Data(try await client.nextFrame(timeout: left).utf8)) as? [[String: Any]] ?? []
        }
        return objects
    }

    @Test func aClientWithPositionsFromBeforeASIGTERMGetsWhatTheRelayReceivedTheDownWindowThenLive() async throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("relay-restart-\(UUID().uuidString)").path
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let arguments = [
            "serve", "--listen", "127.0.0.1:0", "--no-portfolio", "--demo-rate", "2000", "--client-keys", "k", "--tape-dir", directory,
        ]
        // First run: a client reads some AAPL quotes and trades, then the relay stops (SIGTERM).
        let first = RelayProcess(binary: RelayProcess.siblingBinary(), arguments: arguments, showLogs: false)
        let port = try await first.start(timeout: .seconds(30))
        let client = try await WSTestClient.authenticated(url: "ws://127.0.0.1:\(port)/stocks", key: "k")
        client.send(ClientAction(.subscribe, params: "Q.AAPL,T.*"))
        let success = try await client.waitForStatus("success")
        let epoch = try #require(success.fields["epoch"] as? String)
        var seen = success.eventsBefore
        seen += try await client.nextEvents(200)
        let positions = seen.compactMap { event in EventPosition.read(from: event.bytes).map { (event.topic, $0) } }
        let lastQuote = try #require(positions.last { $0.0.description == "Q.AAPL" }?.1.topic)
        let lastTrade = try #require(positions.last { $0.0.eventType == "T" }?.1.market)
        // More arrive that the client does not count as seen: what it will have missed.
        _ = try await client.nextEvents(100)
        await first.stop()
        #expect(try await client.waitForClose() == 1012, "told to come back (service restart)")

        // What the first run received after those positions is on its tape, ending with its stop.
        let path = TapeFile.path(directory: directory, market: "stocks", day: TapeFile.day(of: WallClock.nowNanoseconds()))
        let recorded = try TapeReader(path: path).records()
        guard case .stopped(let stoppedAt) = recorded.last else {
            Issue.record("the tape ends with a clean stop: \(String(describing: recorded.last))")
            return
        }
        let recordedEvents = recorded.compactMap { record -> TapeEvent? in if case .event(let event) = record { event } else { nil } }
        let missedQuotes = recordedEvents.filter { $0.eventType == "Q" && $0.ticker == "AAPL" && $0.topicSequence > lastQuote }.map(\.topicSequence)
        let missedTrades = recordedEvents.filter { $0.eventType == "T" && $0.sequence > lastTrade }.map(\.sequence)

        // Second run on the same tape: the client comes back with where it stood.
        let startedAt = WallClock.nowMilliseconds()
        let second = RelayProcess(binary: RelayProcess.siblingBinary(), arguments: arguments, showLogs: false)
        let secondPort = try await second.start(timeout: .seconds(30))
        let back = try await WSTestClient.authenticated(url: "ws://127.0.0.1:\(secondPort)/stocks", key: "k")
        back.send(#"{"action":"subscribe","params":"Q.AAPL,T.*","since":{"epoch":"\#(epoch)","Q.AAPL":\#(lastQuote),"T.*":\#(lastTrade)}}"#)
        let told = try await objects(until: "resumed", from: back)
        let subscribed = told.first { $0["status"] as? String == "success" }
        #expect(subscribed?["epoch"] as? String == epoch, "the same epoch: \(String(describing: subscribed))")
        // The previous run's events, each topic's gap, then this run's, then `resumed`.
        let gaps = told.enumerated().filter { $0.element["status"] as? String == "gap" }
        #expect(Set(gaps.compactMap { $0.element["topic"] as? String }) == ["Q.AAPL", "T.*"], "\(gaps.map(\.element))")
        for (_, gap) in gaps {
            #expect(gap["unit"] as? String == "unix_ms" && gap["epoch"] as? String == epoch, "\(gap)")
            // The client's topics stopped being received when it was closed, just before the stop.
            let letGo = recorded.last { record in
                if case .wanted(let topic, false, _) = record { topic == gap["topic"] as? String } else { false }
            }
            #expect(gap["from"] as? Int64 == (letGo?.time ?? stoppedAt) / 1_000_000, "from when it was last received: \(gap)")
            #expect((letGo?.time ?? 0) <= stoppedAt)
            #expect((gap["through"] as? Int64 ?? 0) >= startedAt, "until this run received the topic: \(gap)")
        }
        let seam = gaps.first?.offset ?? told.count
        let before = told.prefix(seam).filter { $0["ev"] != nil }
        #expect(before.filter { $0["ev"] as? String == "Q" }.compactMap { ($0["_s"] as? NSNumber)?.uint64Value } == missedQuotes,
            "every AAPL quote the first run received after the client's position, none twice")
        #expect(before.filter { $0["ev"] as? String == "T" }.compactMap { ($0["_m"] as? NSNumber)?.uint64Value } == missedTrades,
            "every trade likewise")
        #expect(!missedTrades.isEmpty || !missedQuotes.isEmpty, "the client had not read everything before the stop")
        // Live: AAPL's topic sequence goes on from the first run's last.
        let live = try await back.nextEvents(400).filter { $0.topic.description == "Q.AAPL" }.compactMap { EventPosition.read(from: $0.bytes) }
        let lastRecordedQuote = missedQuotes.last ?? lastQuote
        #expect(live.first.map { $0.topic > lastRecordedQuote } == true, "numbers go on past the previous run's: \(live.prefix(3))")
        await back.close()
        await second.stop()
    }

    /// Polygon's official Python client, unmodified, three of them with tagged keys, reading while the
    /// relay is stopped (SIGTERM) and started again on the same port and tape: each reconnects on its
    /// own, its session is taken back from what the first run saved, and no topic sequence is missing
    /// across the restart (the first run's events it had not read are replayed, numbers go on).
    ///
    /// Killed (SIGKILL) instead, the relay takes the sessions back from its last checkpoint (a second
    /// old at most: a little comes twice, nothing is skipped) and its numbers leap past what it reserved
    /// (the last flush interval's events never reached the tape, but their numbers reached clients).
    @Test(.enabled(if: pythonClientAvailable, "python3 -m pip install -r Tests/Interop/requirements.txt"), arguments: [false, true])
    func taggedOfficialClientsMissNothingTheRelayReceivedAcrossARestart(killed: Bool) async throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("relay-restart-py-\(UUID().uuidString)").path
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let ready = "\(directory)/ready"
        func relay(port: Int) -> RelayProcess {
            RelayProcess(
                binary: RelayProcess.siblingBinary(),
                arguments: [
                    "serve", "--listen", "127.0.0.1:\(port)", "--no-portfolio", "--demo-rate", "2000", "--client-keys", "py-key", "--tape-dir",
                    "\(directory)/tape",
                ], showLogs: false, captureLogs: true)
        }
        let first = relay(port: 0)
        let port = try await first.start(timeout: .seconds(30))
        let script = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
            .appendingPathComponent("Interop/restart_python_client.py").path
        let clients = Task {
            try await runPython(
                script, ["--port", "\(port)", "--key", "py-key", "--clients", "3", "--subscribe", "Q.*", "--before", "300", "--after", "300", "--ready-file", ready],
                timeout: .seconds(150))
        }
        try await eventually("every client reading", timeout: .seconds(60)) { FileManager.default.fileExists(atPath: ready) }
        if killed {
            // Killed once the running relay's checkpoint holds every client's session.
            let sessions = "\(directory)/tape/stocks/sessions.json"
            try await eventually("the sessions checkpointed", timeout: .seconds(10)) {
                let data = FileManager.default.contents(atPath: sessions) ?? Data()
                return ((try? JSONSerialization.jsonObject(with: data)) as? [Any])?.count == 3
            }
            await first.kill()
        } else {
            await first.stop()
        }
        let second = relay(port: port)
        _ = try await second.start(timeout: .seconds(30))
        let result = try await clients.value
        await second.stop()
        #expect(result.status == 0, "\(result.output)")
        let line = try #require(result.output.split(separator: "\n").last { $0.hasPrefix("{") })
        let summary = try #require(try JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any])
        #expect(summary["missing"] as? Int == 0, "\(summary)")
        #expect(summary["resumed"] as? Int == 3, "\(summary)")
        // Each was told the time nothing was received, in Unix ms.
        let gaps = summary["gaps"] as? [[String: Any]] ?? []
        #expect(
            gaps.count == 3 && gaps.allSatisfy { $0["unit"] as? String == "unix_ms" && $0["topic"] as? String == "Q.*" },
            """
            \(summary)
            the tape's marks: \(Self.marks(directory: "\(directory)/tape"))
            first run: \(Self.warnings(in: first.output))
            second run: \(Self.warnings(in: second.output))
            """)
        if !killed { #expect(summary["leaps"] as? Int == 0, "numbers go on by one across a clean restart: \(summary)") }
    }

    /// The lines of a relay's log above `info` (what explains a gap it told).
    static func warnings(in log: String) -> String {
        log.split(separator: "\n").filter { !$0.contains(" info ") && !$0.contains(" debug ") && !$0.contains(" trace ") }.suffix(40).joined(separator: "\n")
    }

    /// What a stocks tape recorded beside its events (what was wanted, losses, holes, stops), each with
    /// the number of events before it: what explains a `gap` a resume told.
    static func marks(directory: String) -> String {
        let path = TapeFile.path(directory: directory, market: "stocks", day: TapeFile.day(of: WallClock.nowNanoseconds()))
        guard let records = try? TapeReader(path: path).records() else { return "(no tape at \(path))" }
        var events = 0
        var marks: [String] = []
        for record in records {
            if case .event = record { events += 1 } else { marks.append("\(events): \(record)") }
        }
        return marks.suffix(60).joined(separator: "; ")
    }

    /// A client whose position the memory no longer holds (a 4 s history here) resumes from the tape:
    /// the tape's events, then the memory's, then live, its topic sequences contiguous, no gap.
    @Test func aPositionOlderThanTheMemoryResumesFromTheTape() async throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("relay-archive-\(UUID().uuidString)").path
        defer { try? FileManager.default.removeItem(atPath: directory) }
        var settings = RelaySettings(listen: .init(host: "127.0.0.1", port: 0), demoRate: 2_000)
        settings.portfolio = nil
        settings.tape = TapeSettings(directory: directory)
        settings.tape?.flushInterval = .milliseconds(100)
        // Long enough that the tape (flushed every 100 ms) is ahead of what the memory lets go, even on a
        // machine busy with other tests.
        settings.history?.maxAge = .seconds(4)
        let relay = Relay(settings: settings, logger: testLogger)
        try await withServices([relay]) {
            let parts = try await within(.seconds(10), "the relay to start") { try await relay.ready() }
            let url = "ws://127.0.0.1:\(parts.port)/stocks"
            // Another client holds the topic throughout, so the relay receives all of it.
            let holder = try await WSTestClient.authenticated(url: url)
            holder.send(ClientAction(.subscribe, params: "Q.AAPL"))
            _ = try await holder.waitForStatus("success")
            let first = try await WSTestClient.authenticated(url: url)
            first.send(ClientAction(.subscribe, params: "Q.AAPL"))
            let success = try await first.waitForStatus("success")
            let epoch = try #require(success.fields["epoch"] as? String)
            let seen = success.eventsBefore + (try await first.nextEvents(5))
            let last = try #require(seen.compactMap { EventPosition.read(from: $0.bytes) }.last)
            await first.close()
            // The memory lets it go (older than 2 s); the holder keeps reading meanwhile.
            let deadline = ContinuousClock.now + .seconds(30)
            while (await parts.hub.oldestHeldSequence ?? 0) <= last.market + 1 {
                try #require(ContinuousClock.now < deadline, "the memory still holds the client's position after 30 s")
                _ = try? await holder.nextEvents(1, timeout: .milliseconds(200))
            }
            let back = try await WSTestClient.authenticated(url: url)
            back.send(#"{"action":"subscribe","params":"Q.AAPL","since":{"epoch":"\#(epoch)","Q.AAPL":\#(last.topic)}}"#)
            let resumed = try await back.waitForStatus("resumed")
            #expect((resumed.fields["gaps"] as? [String] ?? []).isEmpty, "\(resumed.fields)")
            var sequences = resumed.eventsBefore.compactMap { EventPosition.read(from: $0.bytes)?.topic }
            #expect(sequences.count >= 5, "four seconds and more of AAPL quotes: \(sequences.count)")
            sequences += try await back.nextEvents(3).compactMap { EventPosition.read(from: $0.bytes)?.topic }
            #expect(sequences == Array((last.topic + 1)...(last.topic + UInt64(sequences.count))), "contiguous from the tape through live: \(sequences)")
            #expect(await parts.hub.resumeStatistics.fromArchive >= 1)
            for client in [holder, back] { await client.close() }
        }
    }

    /// SIGHUP (a closed terminal, or a reload the relay does not have) stops it as SIGTERM does: clients
    /// told 1012, the tape ended with its stop record; then it exits with status 129, so a supervisor
    /// that restarts on failure starts it again (the default action ended it at once, with nothing saved).
    @Test func aSIGHUPStopsTheRelayCleanlyWithAStatusThatAsksForARestart() async throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("relay-hangup-\(UUID().uuidString)").path
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let relay = RelayProcess(
            binary: RelayProcess.siblingBinary(),
            arguments: ["serve", "--listen", "127.0.0.1:0", "--no-portfolio", "--demo-rate", "200", "--client-keys", "k", "--tape-dir", directory],
            showLogs: false)
        let port = try await relay.start(timeout: .seconds(30))
        let client = try await WSTestClient.authenticated(url: "ws://127.0.0.1:\(port)/stocks", key: "k")
        client.send(ClientAction(.subscribe, params: "T.*"))
        _ = try await client.waitForStatus("success")
        kill(relay.process.processIdentifier, SIGHUP)
        #expect(try await client.waitForClose() == 1012, "told to come back (service restart)")
        try await eventually("the relay to exit") { !relay.process.isRunning }
        #expect(relay.process.terminationReason == .exit && relay.process.terminationStatus == 129, "\(relay.process.terminationReason) \(relay.process.terminationStatus)")
        let path = TapeFile.path(directory: directory, market: "stocks", day: TapeFile.day(of: WallClock.nowNanoseconds()))
        let recorded = try TapeReader(path: path).records()
        guard case .stopped = recorded.last else {
            Issue.record("the tape ends with a clean stop: \(String(describing: recorded.last))")
            return
        }
        await relay.stop()
    }
}
