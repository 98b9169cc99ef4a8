#if canImport(Glibc)
    import Glibc
#endif
import Foundation
import PolygonWire
import RelayComposition
import RelayConfiguration
import RelayServer
import Testing

/// HTTP clients over real sockets: what their connections can hold, and what a wrong key costs them.
@Suite("HTTP clients meet bounds", .timeLimit(.minutes(2)))
struct HTTPClientBoundsTests {
    func withRelay(_ adjust: (inout RelaySettings) -> Void, _ body: @Sendable (_ port: Int) async throws -> Void) async throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("relay-http-\(UUID().uuidString)").path
        defer { try? FileManager.default.removeItem(atPath: directory) }
        var settings = RelaySettings(
            listen: .init(host: "127.0.0.1", port: 0), clientKeys: ["client-key"], demoRate: 200, portfolio: .init(dataDirectory: directory))
        adjust(&settings)
        let relay = Relay(settings: settings, logger: testLogger)
        try await withServices([relay]) {
            let parts = try await within(.seconds(10), "the relay to start") { try await relay.ready() }
            try await body(parts.port)
        }
    }

    /// One kept-alive request on `socket`: the answer's text, up to what arrives within its timeout.
    func ask(_ socket: RawSocket, _ path: String, key: String = "client-key") -> String {
        _ = socket.send("GET \(path) HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer \(key)\r\n\r\n")
        return String(decoding: socket.receive() ?? [], as: UTF8.self)
    }

    @Test func anAddressesKeptAliveHTTPConnectionsAreCappedAndItsWebSocketsStillGetIn() async throws {
        try await withRelay({ $0.connectionLimits.httpConnectionsPerAddress = 3 }) { port in
            let kept = try (0..<3).map { _ in try RawSocket(port: port) }
            for socket in kept { #expect(ask(socket, "/nothing").hasPrefix("HTTP/1.1 404"), "a connection within the cap is served") }
            // A fourth is told why and closed; the three go on.
            let fourth = try RawSocket(port: port)
            _ = fourth.send("GET /nothing HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            let (refusal, ended) = fourth.readAll(within: .seconds(5))
            #expect(refusal.hasPrefix("HTTP/1.1 503"), "\(refusal)")
            #expect(refusal.contains("too many HTTP connections from this address (3)") && refusal.lowercased().contains("retry-after: 1"))
            #expect(ended, "the refused connection was left open")
            #expect(ask(kept[0], "/nothing").hasPrefix("HTTP/1.1 404"), "the kept connections are still served")
            // Market clients are not HTTP connections: one gets in and is served.
            let client = try await WSTestClient.authenticated(url: "ws://127.0.0.1:\(port)/stocks")
            client.send(ClientAction(.subscribe, params: "Q.AAPL"))
            #expect(try await client.nextEvents(1).count >= 1)
            await client.close()
            // A place freed by a close is taken again (the close is counted on the relay's loop: asked
            // until it is, within a bound).
            kept[2].reset()
            let deadline = ContinuousClock.now + .seconds(10)
            var served = false
            while !served, ContinuousClock.now < deadline {
                served = ask(try RawSocket(port: port), "/nothing").hasPrefix("HTTP/1.1 404")
            }
            #expect(served, "a closed HTTP connection's place was never freed")
        }
    }

    @Test func aWrongKeyOverHTTPIsAnsweredAfterItsAddresssDelayAndEndsItsConnection() async throws {
        try await withRelay({
            $0.connectionLimits.failureDelay = .milliseconds(400)
            $0.connectionLimits.maxFailureDelay = .seconds(5)
        }) { port in
            // Three wrong keys in a row, each on a kept-alive connection: answered at once, then after
            // 0.4 and 0.8 s; each answer ends its connection.
            var answeredAfter: [Duration] = []
            for _ in 0..<3 {
                let guesser = try RawSocket(port: port)
                let start = ContinuousClock.now
                _ = guesser.send("GET /v1/status HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer guess\r\n\r\n")
                let (answer, ended) = guesser.readAll(within: .seconds(5))
                answeredAfter.append(.now - start)
                #expect(answer.hasPrefix("HTTP/1.1 401") && answer.lowercased().contains("connection: close"), "\(answer)")
                #expect(ended, "a wrong key's connection was kept open")
            }
            #expect(answeredAfter[2] >= .milliseconds(700), "the third failure was answered after \(answeredAfter[2])")
            // A request sent behind a wrong key's on its connection is not handled (its answer could not
            // be sent): the 401 and the end, nothing more.
            let pipelined = try RawSocket(port: port)
            _ = pipelined.send(
                "GET /v1/status HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer guess\r\n\r\n"
                    + "GET /v1/status HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer client-key\r\n\r\n")
            let (answers, closed) = pipelined.readAll(within: .seconds(10))
            #expect(closed && answers.hasPrefix("HTTP/1.1 401") && answers.components(separatedBy: "HTTP/1.1 ").count == 2, "\(answers)")
            // The right key from the same address is answered at once all the while.
            let start = ContinuousClock.now
            #expect(ask(try RawSocket(port: port), "/v1/status").hasPrefix("HTTP/1.1 200"))
            #expect(.now - start < .seconds(2), "the right key waited \(ContinuousClock.now - start)")
            // The market feed counts the same failures: its next wrong key waits too (1.6 s).
            let feedGuesser = WSTestClient(url: "ws://127.0.0.1:\(port)/stocks")
            _ = try await feedGuesser.nextParsed()
            let feedStart = ContinuousClock.now
            feedGuesser.send(ClientAction(.auth, params: "guess"))
            #expect(try await feedGuesser.nextParsed().statuses == [.authFailed])
            #expect(.now - feedStart >= .milliseconds(3000), "the feed's failure after four over HTTP waited \(ContinuousClock.now - feedStart)")
            await feedGuesser.close()
        }
    }

    @Test func anAddressWithAsManyDelayedAnswersAsItMayIsRefusedUnchecked() async throws {
        try await withRelay({
            $0.connectionLimits.failureDelay = .seconds(5)
            $0.connectionLimits.failuresInFlightPerAddress = 2
        }) { port in
            #expect(ask(try RawSocket(port: port), "/v1/status", key: "guess").hasPrefix("HTTP/1.1 401"), "the first is answered at once")
            // Two more wait for their answers (5 and 10 s).
            let waiting = try (0..<2).map { _ in try RawSocket(port: port) }
            for socket in waiting { _ = socket.send("GET /v1/status HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer guess\r\n\r\n") }
            // Meanwhile even the right key is refused unchecked, at once (asked until both are counted).
            let deadline = ContinuousClock.now + .seconds(2)
            var refused = ""
            while !refused.hasPrefix("HTTP/1.1 429"), ContinuousClock.now < deadline {
                // Read to the end: a refusal ends its connection (its body may come in a segment of its own).
                let socket = try RawSocket(port: port)
                _ = socket.send("GET /v1/status HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer client-key\r\n\r\n")
                let (answer, ended) = socket.readAll(within: .seconds(1))
                refused = ended ? answer : String(answer.prefix(12))
            }
            #expect(refused.hasPrefix("HTTP/1.1 429") && refused.contains("too many failed authentications"), "\(refused)")
            // So is the portfolio stream's upgrade, whatever key it presents.
            let stream = try RawSocket(port: port)
            _ = stream.send(
                "GET /v1/portfolio/stream HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                    + "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\nAuthorization: Bearer client-key\r\n\r\n")
            let (upgrade, _) = stream.readAll(within: .seconds(5))
            #expect(upgrade.hasPrefix("HTTP/1.1 429") && upgrade.lowercased().contains("retry-after: 5"), "\(upgrade)")
            // Once they are answered, the right key gets in.
            for socket in waiting { #expect(socket.readAll(within: .seconds(15)).0.hasPrefix("HTTP/1.1 401")) }
            #expect(ask(try RawSocket(port: port), "/v1/status").hasPrefix("HTTP/1.1 200"))
        }
    }
}
