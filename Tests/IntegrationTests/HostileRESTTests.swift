#if canImport(Glibc)
    import Glibc
#endif
import Foundation
import PolygonWire
import RelayConfiguration
import Synchronization
import Testing

/// A REST API that misbehaves on purpose, over a real loopback socket: each request's line and
/// `Authorization` header are recorded, and `answer` says what goes back.
final class HostileREST: Sendable {
    enum Answer: Sendable {
        /// A 200 with this JSON body.
        case json(String)
        /// A 200 whose body (of `length` bytes claimed) comes one byte per `every`.
        case trickle(length: Int, every: Duration)
        /// An answer of `status` whose body (of `length` bytes claimed) stops after `sent` bytes, held
        /// until the peer goes.
        case held(sent: Int, length: Int, status: Int = 200)
        /// A 302 to `location`.
        case redirect(to: String)
        /// Another status, with this body.
        case status(Int, String)
        /// A 200 of this content type and body.
        case typed(String, String)
        /// A 429 with this `Retry-After`.
        case limited(retryAfter: String)
    }

    struct Request: Sendable {
        var target: String
        var authorization: String?

        /// The value of `name` in the query.
        func query(_ name: String) -> String? {
            URLComponents(string: "http://x\(target)")?.queryItems?.first { $0.name == name }?.value
        }
    }

    let port: Int
    private let fd: Int32
    let requests = Mutex<[Request]>([])
    private let answer: @Sendable (Request, Int) -> Answer

    init(_ answer: @escaping @Sendable (Request, _ port: Int) -> Answer) throws {
        (fd, port) = try listeningSocket()
        self.answer = answer
        Thread.detachNewThread { [self] in
            while true {
                let connection = accept(fd, nil, nil)
                if connection < 0 {
                    // A connection that went before it was taken, or a signal: accept the next one.
                    if errno == EINTR || errno == ECONNABORTED { continue }
                    // Shut down by `close()` (or failing): the socket goes with its thread.
                    Glibc.close(fd)
                    return
                }
                Thread.detachNewThread { [self] in serve(connection) }
            }
        }
    }

    private func serve(_ connection: Int32) {
        defer { Glibc.close(connection) }
        var buffer = [UInt8](repeating: 0, count: 65_536)
        var received: [UInt8] = []
        while true {
            // One request per connection: read its head, answer, close.
            guard let end = received.firstRange(of: Array("\r\n\r\n".utf8)) else {
                let count = buffer.withUnsafeMutableBytes { recv(connection, $0.baseAddress, $0.count, 0) }
                if count <= 0 { return }
                received += buffer[0..<count]
                continue
            }
            let head = String(decoding: received[..<end.lowerBound], as: UTF8.self).split(separator: "\r\n")
            let target = head.first?.split(separator: " ").dropFirst().first.map(String.init) ?? ""
            let authorization = head.dropFirst().first { $0.lowercased().hasPrefix("authorization:") }
                .map { String($0.dropFirst("authorization:".count)).trimmingCharacters(in: .whitespaces) }
            let request = Request(target: target, authorization: authorization)
            let number = requests.withLock {
                $0.append(request)
                return $0.count
            }
            _ = number
            switch answer(request, port) {
            case .json(let body):
                send(connection, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: \(body.utf8.count)\r\nConnection: close\r\n\r\n\(body)")
            case .trickle(let length, let every):
                guard send(connection, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: \(length)\r\nConnection: close\r\n\r\n{")
                else { return }
                for _ in 1..<length {
                    Thread.sleep(forTimeInterval: Double(every.components.attoseconds) / 1e18 + Double(every.components.seconds))
                    guard send(connection, " ") else { return }
                }
            case .typed(let type, let body):
                send(connection, "HTTP/1.1 200 OK\r\nContent-Type: \(type)\r\nContent-Length: \(body.utf8.count)\r\nConnection: close\r\n\r\n\(body)")
            case .limited(let retryAfter):
                let body = #"{"status":"ERROR","error":"slow down"}"#
                send(connection, "HTTP/1.1 429 Too Many\r\nContent-Type: application/json\r\nRetry-After: \(retryAfter)\r\nContent-Length: \(body.utf8.count)\r\nConnection: close\r\n\r\n\(body)")
            case .status(let code, let body):
                send(connection, "HTTP/1.1 \(code) No\r\nContent-Type: application/json\r\nContent-Length: \(body.utf8.count)\r\nConnection: close\r\n\r\n\(body)")
            case .redirect(let location):
                send(connection, "HTTP/1.1 302 Found\r\nLocation: \(location)\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            case .held(let sent, let length, let status):
                guard send(connection, "HTTP/1.1 \(status) Held\r\nContent-Type: application/json\r\nContent-Length: \(length)\r\nConnection: close\r\n\r\n{")
                else { return }
                guard send(connection, String(repeating: " ", count: sent - 1)) else { return }
                // Until the relay gives up on it (its request timeout) and closes.
                while buffer.withUnsafeMutableBytes({ recv(connection, $0.baseAddress, $0.count, 0) }) > 0 {}
            }
            return
        }
    }

    @discardableResult
    private func send(_ connection: Int32, _ text: String) -> Bool {
        let bytes = Array(text.utf8)
        return bytes.withUnsafeBytes { Glibc.send(connection, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) } == bytes.count
    }

    /// Stops taking connections: the accept thread wakes, closes the socket and ends (each connection
    /// being served ends when its peer goes).
    func close() { shutdown(fd, Int32(SHUT_RDWR)) }
}

private func int(_ value: Any?) -> Int64? { (value as? NSNumber)?.int64Value }

/// Gap fill against a REST API that answers what no real one should: values that are not JSON, times
/// that overflow, endless paging, a body trickled a byte at a time. The relay stays up, copies nothing
/// invalid into a client's frame, ends every fill in bounded time and never sends the upstream's
/// WebSocket key to the REST host.
@Suite("Gap fill against a hostile REST API", .serialized, .timeLimit(.minutes(3)))
struct HostileRESTTests {
    /// Every frame `client` reads until a `recovered` status, each checked to be valid JSON.
    static func framesUntilRecovered(_ client: WSTestClient, timeout: Duration = .seconds(60)) async throws -> [[String: Any]] {
        var objects: [[String: Any]] = []
        let deadline = ContinuousClock.now + timeout
        while true {
            let left = deadline - .now
            guard left > .zero else { throw TimeoutError(description: "no recovered status within \(timeout)") }
            let frame = try await client.nextFrame(timeout: left)
            let parsed = try #require(
                try? JSONSerialization.jsonObject(with: Data(frame.utf8)) as? [[String: Any]], "every frame is a JSON array: \(frame.prefix(300))")
            objects += parsed
            if parsed.contains(where: { $0["status"] as? String == StatusMessage.Kind.recovered }) { return objects }
        }
    }

    /// The body of `GET target` from a loopback HTTP server (blocking; `Connection: close`).
    static func fetch(port: Int, _ target: String) -> String {
        guard let socket = try? RawSocket(port: port, timeout: .seconds(10)) else { return "" }
        _ = socket.send(Array("GET \(target) HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".utf8))
        var bytes: [UInt8] = []
        while let chunk = socket.receive(), !chunk.isEmpty { bytes += chunk }
        guard let split = bytes.firstRange(of: Array("\r\n\r\n".utf8)) else { return "" }
        let head = String(decoding: bytes[..<split.lowerBound], as: UTF8.self).lowercased()
        var body = Array(bytes[split.upperBound...])
        if head.contains("transfer-encoding: chunked") {
            var joined: [UInt8] = []
            while let line = body.firstRange(of: Array("\r\n".utf8)), let size = Int(String(decoding: body[..<line.lowerBound], as: UTF8.self), radix: 16),
                size > 0, body.count >= line.upperBound + size
            {
                joined += body[line.upperBound..<(line.upperBound + size)]
                body = Array(body[min(body.count, line.upperBound + size + 2)...])
            }
            body = joined
        }
        return String(decoding: body, as: UTF8.self)
    }

    /// Each field set to a value that must never reach a client, appended after the result's own
    /// fields (a repeated key: the last one is read).
    static let corruptions = [
        #""price":1nullfalse"#, #""size":-"#, #""id":"\q\u""#, #""conditions":[1,null]"#, #""price":01"#,
        #""sip_timestamp":9223372036854775807"#, #""sip_timestamp":-5"#, #""exchange":"4""#,
        #""conditions":["# + Array(repeating: "1", count: 20_000).joined(separator: ",") + "]",
    ]

    @Test func invalidValuesOverflowingTimesAndEndlessPagingEndInABoundedFillWithNothingInvalidDelivered() async throws {
        let feedPort = Mutex(0)
        let rest = try HostileREST { request, port in
            if request.target.hasPrefix("/v3/trades/") {
                // The feed's own page, each of its results preceded by corrupt copies of it.
                let truth = Self.fetch(port: feedPort.withLock { $0 }, request.target + "&apiKey=upstream-secret")
                let results = ((try? JSONSerialization.jsonObject(with: Data(truth.utf8))) as? [String: Any])?["results"] as? [[String: Any]] ?? []
                var items: [String] = []
                for result in results {
                    guard let data = try? JSONSerialization.data(withJSONObject: result, options: [.sortedKeys]) else { continue }
                    let text = String(decoding: data, as: UTF8.self)
                    for corruption in Self.corruptions { items.append(String(text.dropLast()) + "," + corruption + "}") }
                    items.append(text)
                }
                return .json(#"{"results":["# + items.joined(separator: ",") + #"],"status":"OK"}"#)
            }
            if request.target.hasPrefix("/v3/quotes/") {
                // Endless: every page names another.
                let page = Int(request.query("cursor") ?? "0") ?? 0
                return .json(#"{"results":[],"next_url":"http://127.0.0.1:\#(port)/v3/quotes/MSFT?cursor=\#(page + 1)"}"#)
            }
            // Minute bars: one whose start overflows when its end is computed.
            return .json(#"{"results":[{"t":9223372036854775807,"o":1,"h":1,"l":1,"c":1,"v":1,"n":3}],"status":"OK"}"#)
        }
        defer { rest.close() }
        try await withFaultyFeedRelay(configure: { settings in
            settings.upstreamRESTURL = "http://127.0.0.1:\(rest.port)"
            settings.upstreamRESTKey = "rest-only-key"
            settings.gapFill?.pagesPerTopic = 6
        }) { parts, feed, url in
            let port = try await feed.listeningPort()
            feedPort.withLock { $0 = port }
            let client = try await subscribedClient(url, "T.AAPL,Q.MSFT,AM.AAPL")
            // Live trades before the outage too, so the seam on both sides is checked.
            let reader = GapFillTests.Reader(client)
            try await reader.read(for: .milliseconds(500))
            #expect(feed.inject(.drop, refusingFor: .seconds(1)) == 1)
            var objects = try await reader.objects + Self.framesUntilRecovered(client)
            for _ in 0..<20 {
                // Live trades past the seam.
                let frame = try await client.nextFrame()
                objects += (try? JSONSerialization.jsonObject(with: Data(frame.utf8)) as? [[String: Any]]) ?? []
            }
            let recovered = try #require(objects.first { $0["status"] as? String == StatusMessage.Kind.recovered })
            #expect(recovered["complete"] as? Bool == false, "\(recovered)")
            let missing = recovered["missing"] as? [String: String] ?? [:]
            #expect(missing["Q.MSFT"]?.contains("more than 6 REST pages") == true, "\(recovered)")
            #expect(missing["T.AAPL"] == nil, "\(recovered)")
            // Exactly the feed's trades, none of their corrupt copies: every value as the feed gave it.
            let back = try #require(objects.first { $0["status"] as? String == StatusMessage.Kind.upstreamReconnected })
            let outage = try #require(int(back["last_event_before_ms"]))...(try #require(int(back["first_event_after_ms"])))
            let trades = objects.filter { $0["ev"] as? String == "T" && $0["sym"] as? String == "AAPL" }
            let span = "timestamp.gte=\((trades.compactMap { int($0["t"]) }.min() ?? 0) * 1_000_000)&order=asc&limit=50000"
            GapFillTests.expectExact(trades, truth: try await GapFillTests.truth(feed, "/v3/trades/AAPL", span), topic: "T.AAPL", outage: outage)
            for trade in trades where int(trade["_r"]) == 1 {
                #expect(trade["i"] is String && (trade["c"] as? [Any])?.allSatisfy({ $0 is NSNumber }) == true && trade["x"] is NSNumber, "\(trade)")
            }
            #expect(objects.allSatisfy { !($0["ev"] as? String == "AM" && int($0["_r"]) == 1) }, "the overflowing bar is refused")
            // The quotes' paging stopped at the cap.
            let requests = rest.requests.withLock { $0 }
            #expect(requests.filter { $0.target.hasPrefix("/v3/quotes/") }.count == 6)
            // The REST host got the REST key only, never the upstream's WebSocket key.
            #expect(!requests.isEmpty && requests.allSatisfy { $0.authorization == "Bearer rest-only-key" }, "\(requests.map(\.authorization))")
            #expect(await parts.hub.gapFillStatistics.incomplete == 1)
            await client.close()
        }
    }

    /// A relay whose REST host is `rest` (and `configure`d) fills an outage of T.AAPL's: what the
    /// `recovered` status says is missing of it, the status, and how long the fill took from the drop.
    static func fillOfADrop(
        from rest: HostileREST, configure: @escaping (inout RelaySettings) -> Void = { _ in }
    ) async throws -> (missing: String, recovered: [String: Any], took: Duration) {
        var outcome: (String, [String: Any], Duration) = ("", [:], .zero)
        try await withFaultyFeedRelay(configure: { settings in
            settings.upstreamRESTURL = "http://127.0.0.1:\(rest.port)"
            configure(&settings)
        }) { _, feed, url in
            let client = try await subscribedClient(url, "T.AAPL")
            #expect(feed.inject(.drop, refusingFor: .seconds(1)) == 1)
            let started = ContinuousClock.now
            let objects = try await Self.framesUntilRecovered(client, timeout: .seconds(30))
            let recovered = try #require(objects.first { $0["status"] as? String == StatusMessage.Kind.recovered })
            outcome = ((recovered["missing"] as? [String: String])?["T.AAPL"] ?? "", recovered, ContinuousClock.now - started)
            await client.close()
        }
        return outcome
    }

    @Test func anErrorThatEchoesTheUpstreamKeyReachesClientsWithoutIt() async throws {
        let rest = try HostileREST { request, _ in .status(403, #"{"status":"ERROR","error":"key \#(request.authorization ?? "") is not entitled"}"#) }
        defer { rest.close() }
        let (reason, recovered, _) = try await Self.fillOfADrop(from: rest)
        #expect(reason.contains("HTTP 403") && reason.contains("is not entitled"), "\(recovered)")
        #expect(!reason.contains("upstream-secret") && reason.contains("<relay-upstream-key>"), "\(reason)")
    }

    @Test func aVendorsPausesEndTheFillAtItsTimeLimit() async throws {
        // 429s asking for two seconds each: the account pauses, the call tries again (within its time), and
        // the fill ends at its own limit, not after the vendor's pauses.
        let rest = try HostileREST { _, _ in .limited(retryAfter: "2") }
        defer { rest.close() }
        let (reason, recovered, took) = try await Self.fillOfADrop(from: rest) { settings in
            settings.gapFill?.maxDuration = .seconds(3)
            // The account's budget (the gateway's) is what a vendor's 429 pauses.
            settings.gateway = GatewaySettings()
        }
        #expect(reason.contains("the fill took longer than 3 s"), "\(recovered)")
        #expect(took < .seconds(15), "ended at its limit, not after the vendor's pauses")
    }

    @Test func aVendorsPauseLongerThanTheCallsTimeEndsTheCallAtOnceWithItsReason() async throws {
        // A 429 asking for a minute: the account pauses (two minutes at most, for later calls), and this
        // call gives up at once, its reason the vendor's.
        let rest = try HostileREST { _, _ in .limited(retryAfter: "60") }
        defer { rest.close() }
        let (reason, recovered, took) = try await Self.fillOfADrop(from: rest) { settings in
            settings.gapFill?.maxDuration = .seconds(30)
            settings.gateway = GatewaySettings()
        }
        #expect(reason.contains("HTTP 429") && reason.contains("slow down"), "\(recovered)")
        #expect(took < .seconds(15), "not after the vendor's pause")
        #expect(rest.requests.withLock { $0.count } == 1, "not asked again within the pause")
    }

    @Test func aBodyTrickledAByteAtATimeEndsWithinTheRequestTimeout() async throws {
        let rest = try HostileREST { _, _ in .trickle(length: 1_000, every: .milliseconds(300)) }
        defer { rest.close() }
        let (reason, recovered, took) = try await Self.fillOfADrop(from: rest) { $0.gapFill?.requestTimeout = .seconds(1) }
        // One attempt of at most a second (a request that timed out is not tried again): far less than
        // the 75 s a trickled body used to hold a fill.
        #expect(reason.contains("no whole answer within 1 s"), "\(recovered)")
        #expect(took < .seconds(10))
        #expect(rest.requests.withLock { $0.count } == 1, "not retried")
    }
}
