import Foundation
import MarketCore
import PolygonWire
import RelayBench
import RelayComposition
import RelayConfiguration
import Tape
import Testing

/// The relay records what its hub publishes: a real relay on its demo feed, a real client, the tape
/// read back from its files after the relay stopped.
@Suite("The tape: the relay records every market's events", .timeLimit(.minutes(2)))
struct TapeRecordingTests {
    @Test func everyPublishedEventIsOnTheTapeInOrderOnceTheRelayStops() async throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("relay-tape-\(UUID().uuidString)").path
        defer { try? FileManager.default.removeItem(atPath: directory) }
        var settings = RelaySettings(listen: .init(host: "127.0.0.1", port: 0), demoRate: 500)
        settings.portfolio = nil
        settings.tape = TapeSettings(directory: directory)
        settings.tape?.flushInterval = .seconds(60)  // nothing written on a timer: the stop writes it all
        let relay = Relay(settings: settings, logger: testLogger)
        let hub = try await withServices([relay]) {
            let parts = try await within(.seconds(10), "the relay to start") { try await relay.ready() }
            let client = try await WSTestClient.authenticated(url: "ws://127.0.0.1:\(parts.port)/stocks")
            client.send(ClientAction(.subscribe, params: "Q.*,T.*"))
            _ = try await client.nextEvents(200)
            await client.close()
            // /healthz tells each market's recording (the markets nobody subscribed to record nothing yet).
            let health = jsonObject(try await httpGet("http://127.0.0.1:\(parts.port)/healthz").body)
            let stocks = (health["markets"] as? [String: Any])?["stocks"] as? [String: Any]
            let tape = stocks?["tape"] as? [String: Any]
            #expect(tape?["recording"] as? Bool == true, "\(String(describing: stocks))")
            #expect(tape?["eventsDropped"] as? Int == 0)
            #expect(tape?["pausedBecause"] == nil)
            return parts.hub
        }
        let (epoch, last) = await hub.position
        try #require(last >= 200)
        let path = TapeFile.path(directory: directory, market: "stocks", day: TapeFile.day(of: WallClock.nowNanoseconds()))
        let reader = try TapeReader(path: path)
        let records = reader.records()
        let events = records.compactMap { record -> TapeEvent? in if case .event(let event) = record { event } else { nil } }
        let firstEpoch = records.firstIndex { if case .epoch = $0 { true } else { false } }
        let firstEvent = records.firstIndex { if case .event = $0 { true } else { false } }
        #expect(firstEpoch.map { if case .epoch(let told, _) = records[$0] { told == epoch } else { false } } == true, "the hub's epoch")
        #expect((firstEpoch ?? .max) < (firstEvent ?? .max), "told before the events")
        let sequences = events.map(\.sequence)
        #expect(sequences.last == last, "the last event the hub published is on the tape")
        #expect(sequences == Array((sequences.first ?? 1)...last), "every position from the first recorded, none twice")
        #expect(events.allSatisfy { ["Q", "T"].contains($0.eventType) && $0.bytes.readableBytes > 0 })
        let now = WallClock.nowNanoseconds()
        #expect(events.allSatisfy { $0.receivedAt > now - 120_000_000_000 && $0.receivedAt <= now }, "wall-clock receive times")
    }

    /// A relay process killed with SIGKILL mid-recording, then started again on the same tape: what it
    /// wrote before is read whole (a torn tail cut, never read), the second run appends after it, and
    /// `relay tape ls` counts it all without damage.
    @Test func aRelayKilledMidRecordingLeavesATapeThatReadsAndGoesOn() async throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("relay-tape-kill-\(UUID().uuidString)").path
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let arguments = [
            "serve", "--listen", "127.0.0.1:0", "--no-portfolio", "--demo-rate", "2000", "--client-keys", "k", "--tape-dir", directory,
        ]
        let path = TapeFile.path(directory: directory, market: "stocks", day: TapeFile.day(of: WallClock.nowNanoseconds()))
        @Sendable func recordedEvents() -> [TapeEvent] {
            guard let reader = try? TapeReader(path: path) else { return [] }
            return reader.records().compactMap { record -> TapeEvent? in if case .event(let event) = record { event } else { nil } }
        }
        // First run: events flow to a client and onto the tape, then SIGKILL with a block half gathered.
        let relay = RelayProcess(
            binary: RelayProcess.siblingBinary(), arguments: arguments, showLogs: false, environment: ["RELAY_TAPE_FLUSH_MS": "100"])
        let port = try await relay.start(timeout: .seconds(30))
        let client = try await WSTestClient.authenticated(url: "ws://127.0.0.1:\(port)/stocks", key: "k")
        client.send(ClientAction(.subscribe, params: "Q.*,T.*"))
        _ = try await client.nextEvents(300)
        try await eventually("a few blocks on the tape", timeout: .seconds(20)) { recordedEvents().count >= 300 }
        await relay.kill()
        await client.close()
        let beforeRestart = recordedEvents()
        let killedAt = WallClock.nowNanoseconds()
        #expect(try TapeReader(path: path).damaged.isEmpty, "a torn tail is not damage")
        let sequences = beforeRestart.map(\.sequence)
        #expect(sequences == Array((sequences.first ?? 1)...(sequences.last ?? 0)), "whole blocks only: every position once, in order")

        // Second run on the same tape: it appends after the last whole block.
        let again = RelayProcess(
            binary: RelayProcess.siblingBinary(), arguments: arguments, showLogs: false, environment: ["RELAY_TAPE_FLUSH_MS": "100"])
        let secondPort = try await again.start(timeout: .seconds(30))
        let second = try await WSTestClient.authenticated(url: "ws://127.0.0.1:\(secondPort)/stocks", key: "k")
        second.send(ClientAction(.subscribe, params: "Q.*"))
        _ = try await second.nextEvents(100)
        await second.close()
        await again.stop()
        let after = recordedEvents()
        #expect(Array(after.prefix(beforeRestart.count)) == beforeRestart, "what was on the tape is still there, first")
        #expect(after.dropFirst(beforeRestart.count).contains { $0.receivedAt > killedAt }, "the second run's events follow")
        let summary = try #require(try TapeDaySummary.all(directory: directory).first { $0.market == "stocks" })
        #expect(summary.events == after.count, "\(summary) against \(after.count)")
        #expect(summary.skippedBlocks == 0 && summary.damagedBytes == 0)
    }
}
