import Foundation
import PolygonWire
import RelayComposition
import RelayConfiguration
import RelayServer
import Testing

/// Receive and send times over real sockets: a key with `timestamps` (and Polygon's subscribe option)
/// gets `_r` and `_o` in every event, on the relay's and the wall clock's terms; every other client gets
/// the events' bytes exactly as before; Polygon's official client takes the stamped events as its models.
@Suite("Receive timestamps", .timeLimit(.minutes(2)))
struct ReceiveTimesTests {
    func withStampingRelay(_ body: @Sendable (_ port: Int) async throws -> Void) async throws {
        var settings = RelaySettings(listen: .init(host: "127.0.0.1", port: 0), clientKeys: ["plain-key"], demoRate: 500)
        var stamped = try ClientKey(name: "stamped", secret: "stamped-key")
        stamped.timestamps = true
        settings.clientKeyRights = [stamped]
        let relay = Relay(settings: settings, logger: testLogger)
        try await withServices([relay]) {
            let parts = try await within(.seconds(10), "the relay to start") { try await relay.ready() }
            try await body(parts.port)
        }
    }

    /// The next frame's market events (notices left out), as objects.
    static func events(_ client: WSTestClient) async throws -> [[String: Any]] {
        let frame = try await client.nextFrame()
        let objects = try JSONSerialization.jsonObject(with: Data(frame.utf8)) as? [[String: Any]] ?? []
        return objects.filter { $0["ev"] as? String != "status" }
    }

    static func nanoseconds() -> Int64 { Int64(Date().timeIntervalSince1970 * 1e9) }

    @Test func aStampedKeysEventsCarryTheirReceiveAndSendTimesAndOthersDoNot() async throws {
        try await withStampingRelay { port in
            let started = Self.nanoseconds()
            let stamped = try await WSTestClient.authenticated(url: "ws://127.0.0.1:\(port)/stocks", key: "stamped-key")
            let plain = try await WSTestClient.authenticated(url: "ws://127.0.0.1:\(port)/stocks", key: "plain-key")
            stamped.send(#"{"action":"subscribe","params":"T.*,Q.*"}"#)
            plain.send(#"{"action":"subscribe","params":"T.*,Q.*"}"#)
            var seen = 0
            while seen < 200 {
                let events = try await Self.events(stamped)
                for event in events {
                    let received = try #require(event["_r"] as? Int64, "every market event has _r: \(event)")
                    let sent = try #require(event["_o"] as? Int64, "every market event has _o: \(event)")
                    #expect(received >= started - 1_000_000_000 && received <= sent, "read before it was sent: \(event)")
                    #expect(sent <= Self.nanoseconds(), "sent before it arrived here: \(event)")
                    // Its own fields stay: positions before the times, the vendor's fields untouched.
                    #expect(event["sym"] is String && (event["t"] as? Int64) != nil, "\(event)")
                }
                seen += events.count
            }
            var plainSeen = 0
            while plainSeen < 100 {
                let events = try await Self.events(plain)
                #expect(events.allSatisfy { $0["_r"] == nil && $0["_o"] == nil }, "a plain key's events are as they were")
                plainSeen += events.count
            }
            await stamped.close()
            await plain.close()
        }
    }

    @Test func aSubscribeCanAskForThemAndAnUnknownValueIsAClearError() async throws {
        try await withStampingRelay { port in
            let client = try await WSTestClient.authenticated(url: "ws://127.0.0.1:\(port)/stocks", key: "plain-key")
            client.send(#"{"action":"subscribe","params":"T.AAPL","timestamps":"yes"}"#)
            let error = try await client.waitForStatus("error")
            #expect((error.fields["message"] as? String)?.contains("malformed") == true, "\(error.fields)")
            client.send(#"{"action":"subscribe","params":"T.*","timestamps":true}"#)
            var stampedEvents = 0
            while stampedEvents < 50 {
                let events = try await Self.events(client)
                for event in events {
                    #expect((event["_r"] as? Int64) != nil && (event["_o"] as? Int64) != nil, "\(event)")
                }
                stampedEvents += events.count
            }
            await client.close()
        }
    }

    @Test(.enabled(if: pythonClientAvailable, "python3 -m pip install -r Tests/Interop/requirements.txt"))
    func polygonsOfficialClientTakesStampedEventsAsItsModels() async throws {
        try await withStampingRelay { port in
            let result = try await runPythonClient(["--port", "\(port)", "--key", "stamped-key", "--subscribe", "Q.AAPL,T.MSFT", "--count", "20"])
            #expect(result.status == 0, "\(result.output)")
            let summary = try #require(result.output.split(separator: "\n").last { $0.hasPrefix("{") })
            let object = try JSONSerialization.jsonObject(with: Data(summary.utf8)) as? [String: Any]
            #expect((object?["messages"] as? Int ?? 0) >= 20, "\(summary)")
        }
    }
}
