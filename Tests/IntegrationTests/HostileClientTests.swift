#if canImport(Glibc)
    import Glibc
#endif
import Foundation
import PolygonWire
import RelayComposition
import RelayConfiguration
import RelayServer
import Testing

/// Clients that misbehave on purpose, over real sockets: what each can make the relay hold is bounded,
/// and the well-behaved clients beside them are served.
@Suite("Hostile clients meet bounds", .timeLimit(.minutes(2)))
struct HostileClientTests {
    func withRelay(
        _ adjust: (inout RelaySettings) throws -> Void = { _ in }, _ body: @Sendable (_ port: Int, _ url: String) async throws -> Void
    ) async throws {
        var settings = RelaySettings(listen: .init(host: "127.0.0.1", port: 0), clientKeys: ["client-key"], demoRate: 500)
        try adjust(&settings)
        let relay = Relay(settings: settings, logger: testLogger)
        try await withServices([relay]) {
            let parts = try await within(.seconds(10), "the relay to start") { try await relay.ready() }
            try await body(parts.port, "ws://127.0.0.1:\(parts.port)/stocks")
        }
    }

    /// How many broken sessions the stocks market keeps (`/v1/status`; -1: not told).
    func sessionsKept(port: Int) async -> Int {
        guard let status = try? await httpGet("http://127.0.0.1:\(port)/v1/status", key: "client-key"),
            let markets = jsonObject(status.body)["markets"] as? [[String: Any]],
            let history = markets.first?["history"] as? [String: Any]
        else { return -1 }
        return (history["sessionsKept"] as? NSNumber)?.intValue ?? -1
    }

    /// A raw client, upgraded and authenticated.
    func rawClient(port: Int, receiveBuffer: Int? = nil) throws -> RawSocket {
        let socket = try RawSocket(port: port, receiveBuffer: receiveBuffer)
        let rest = try socket.upgrade()
        #expect(socket.readUntil("connected", initial: rest).found)
        socket.send(RawSocket.text(#"{"action":"auth","params":"client-key"}"#))
        #expect(socket.readUntil("auth_success").found)
        return socket
    }

    /// A client that closes its side of TCP without a close frame is gone at once: its key's only
    /// connection slot is free for the next connection right away, not after a missed ping (30 s).
    @Test func aClientThatHalfClosesTCPIsGoneAtOnce() async throws {
        try await withRelay({ settings in
            settings.clientKeys = []
            settings.clientKeyRights = [try ClientKey(name: "single", secret: "client-key", maxConnections: 1)]
        }) { port, url in
            let first = try rawClient(port: port)
            first.send(RawSocket.text(#"{"action":"subscribe","params":"Q.AAPL"}"#))
            #expect(first.readUntil("Q.AAPL").found)
            shutdown(first.fd, Int32(SHUT_WR))
            #expect(first.readsToEOF(within: .seconds(5)), "the relay closes its side too")
            // The key's one slot is free again.
            let second = try await subscribedClient(url, "Q.MSFT")
            await second.close()
        }
    }

    /// Broken tagged sessions keep their topics in their key's budget: parking sessions does not make
    /// room for more topics upstream (one key once had 494,000 subscribed, limit 50,000).
    @Test func parkedTaggedSessionsCountAgainstTheKeysTopicLimit() async throws {
        try await withRelay({ settings in
            settings.connectionLimits.topicsPerKey = 20
        }) { port, url in
            for session in 0..<2 {
                let client = try await WSTestClient.authenticated(url: url, key: "client-key#s\(session)")
                client.send(ClientAction(.subscribe, params: (0..<10).map { "T.J\(session)X\($0)" }.joined(separator: ",")))
                _ = try await client.waitForStatus(StatusMessage.Kind.success)
                await client.close()
                try await eventually("session \(session) to be kept") { await sessionsKept(port: port) == session + 1 }
            }
            // Two parked sessions hold the key's 20 topics: a third connection's new topics are refused.
            let third = try await WSTestClient.authenticated(url: url, key: "client-key#s2")
            third.send(ClientAction(.subscribe, params: "T.J2X0"))
            let refused = try await third.waitForStatus(StatusMessage.Kind.error)
            #expect((refused.fields["message"] as? String)?.contains("topic limit reached") == true, "\(refused.fields)")
            // Taking a session back gives its topics to the new connection without counting them twice.
            let back = try await WSTestClient.authenticated(url: url, key: "client-key#s0")
            back.send(ClientAction(.subscribe, params: (0..<10).map { "T.J0X\($0)" }.joined(separator: ",")))
            _ = try await back.waitForStatus(StatusMessage.Kind.success)
            await third.close()
            await back.close()
        }
    }

    @Test func aPingFloodFromAClientThatNeverReadsCostsNoMemory() async throws {
        try await withRelay { port, url in
            let honest = try await subscribedClient(url, "Q.AAPL")
            // 64 MB of pings from a client that never reads its pongs. Before, the relay queued a pong
            // for each (150 MB of pings made RSS grow by 370 MB); now at most one pong waits, and the
            // client is not read while its socket does not take what we write.
            let flooder = try rawClient(port: port, receiveBuffer: 4096)
            flooder.setTimeout(.seconds(2))
            let ping = RawSocket.frame(opcode: 0x9, payload: Array(repeating: 0x41, count: 125))
            let chunk = Array((0..<500).map { _ in ping }.joined())
            let before = residentBytes()
            var sent = 0
            let deadline = ContinuousClock.now + .seconds(30)
            while sent < 64 << 20, ContinuousClock.now < deadline {
                let n = flooder.send(chunk)
                sent += n
                if n < chunk.count { break }
            }
            let grown = residentBytes() - before
            #expect(grown < 48 << 20, "RSS grew by \(grown >> 20) MB for \(sent >> 20) MB of pings")
            // The others are still served.
            #expect(try await honest.nextEvents(3).count >= 3)
            await honest.close()
        }
    }

    @Test func aClientThatLeavesTooMuchUnreadIsToldAndClosed() async throws {
        try await withRelay({
            $0.connectionLimits.outboundBytes = 8192
            $0.limits.messageBurst = 100_000
            $0.limits.messagesPerSecond = 100_000
        }) { port, url in
            let honest = try await subscribedClient(url, "Q.AAPL")
            let hoarder = try rawClient(port: port, receiveBuffer: 4096)
            // Each message is answered (ten invalid topics: an error naming them, about as long as the
            // message); the answers pile up unread, past the kernel's buffers and then past the cap.
            var messages: [UInt8] = []
            for index in 0..<10_000 {
                let junk = (0..<10).map { "Q.$\(index)-\($0)" + String(repeating: "$", count: 50) }.joined(separator: ",")
                messages += RawSocket.text(#"{"action":"subscribe","params":"\#(junk)"}"#)
            }
            hoarder.setTimeout(.seconds(5))
            hoarder.send(messages)
            // The relay gives up on it: a status saying why (if it ever reads it), then the close.
            #expect(hoarder.readsToEOF(within: .seconds(60)), "the relay kept a client that reads nothing")
            #expect(try await honest.nextEvents(3).count >= 3)
            await honest.close()
        }
    }

    @Test func oneStatusPerMessageAndNoneForANoOp() async throws {
        try await withRelay { _, url in
            let client = try await WSTestClient.authenticated(url: url)
            client.send(ClientAction(.subscribe, params: (0..<1000).map { "T.MANY\($0)" }.joined(separator: ",")))
            let ack = try await client.nextParsed()
            #expect(ack.statuses.count == 1)
            #expect(ack.statuses.first?.message.hasPrefix("subscribed to 1000 topics: T.MANY0,") == true)
            #expect(ack.statuses.first?.message.hasSuffix("and 990 more") == true)
            // Unsubscribing what it never held changes nothing and gets no answer: the next frame is
            // the answer to the message after it.
            client.send(ClientAction(.unsubscribe, params: (0..<1000).map { "Q.NEVER\($0)" }.joined(separator: ",")))
            client.send(ClientAction(.unsubscribe, params: "T.MANY0"))
            #expect(try await client.nextParsed().statuses == [StatusMessage(status: "success", message: "unsubscribed to: T.MANY0")])
            await client.close()
        }
    }

    @Test func aSecondAuthIsAnErrorAndKeepsTheFirstKey() async throws {
        try await withRelay({
            $0.clientKeys = []
            $0.clientKeyRights = [
                try ClientKey(name: "narrow", secret: "narrow-key", topics: ["Q.AAPL"]),
                try ClientKey(name: "wide", secret: "wide-key"),
            ]
        }) { _, url in
            let client = try await WSTestClient.authenticated(url: url, key: "narrow-key")
            client.send(ClientAction(.auth, params: "wide-key"))
            let answer = try await client.nextParsed().statuses.first
            #expect(answer?.status == "error")
            #expect(answer?.message.contains("already authenticated as \"narrow\"") == true)
            // Still the narrow key: MSFT is refused, AAPL served.
            client.send(ClientAction(.subscribe, params: "Q.MSFT,Q.AAPL"))
            let statuses = try await client.nextParsed().statuses
            #expect(statuses.contains { $0.status == "error" && $0.message.contains("may not subscribe to Q.MSFT") })
            #expect(try await client.nextEvents(2).allSatisfy { $0.ticker == "AAPL" })
            await client.close()
        }
    }

    @Test func aLargeMessageBeforeAuthenticationClosesWith1009() async throws {
        try await withRelay { port, _ in
            let stranger = try RawSocket(port: port)
            let rest = try stranger.upgrade()
            #expect(stranger.readUntil("connected", initial: rest).found)
            stranger.send(RawSocket.text(#"{"action":"auth","params":""# + String(repeating: "x", count: 8000) + #""}"#))
            let answer = stranger.readUntil("never")
            #expect(answer.closeCode == 1009)
            // In pieces it is no better.
            let pieces = try RawSocket(port: port)
            #expect(pieces.readUntil("connected", initial: try pieces.upgrade()).found)
            var fragments = RawSocket.frame(opcode: 0x1, payload: Array(repeating: 0x20, count: 3000), fin: false)
            fragments += RawSocket.frame(opcode: 0x0, payload: Array(repeating: 0x20, count: 3000), fin: false)
            pieces.send(fragments)
            #expect(pieces.readUntil("never").closeCode == 1009)
        }
    }

    /// After authentication a message is read when it is no larger than a subscribe of the most topics a
    /// message may name, each with its resume position (128 bytes a topic: 128 KiB by default); one
    /// padded past it is answered with an error unread, and the connection goes on.
    @Test func aMessageLargerThanTheLargestSubscribeIsAnsweredUnread() async throws {
        try await withRelay { port, url in
            // 1,000 of the longest tickers, each with a position: it fits.
            let tickers = (0..<1_000).map { "Q." + String(format: "%040d", $0) }
            let since = tickers.map { #""\#($0)":123456789012"# }.joined(separator: ",")
            let largest = #"{"action":"subscribe","params":"\#(tickers.joined(separator: ","))","since":{"epoch":"e",\#(since)}}"#
            #expect(largest.utf8.count > 64 << 10 && largest.utf8.count < 128 << 10, "\(largest.utf8.count) bytes")
            let client = try await WSTestClient.authenticated(url: url)
            client.send(largest)
            let answer = try await client.nextParsed()
            #expect(!answer.statuses.isEmpty, "the largest subscribe is answered")
            await client.close()
            let padded = try RawSocket(port: port)
            #expect(padded.readUntil("connected", initial: try padded.upgrade()).found)
            padded.send(RawSocket.text(#"{"action":"auth","params":"client-key"}"#))
            #expect(padded.readUntil("authenticated").found)
            padded.send(RawSocket.text(#"{"action":"subscribe","params":"Q.AAPL","x":""# + String(repeating: "x", count: 200_000) + #""}"#))
            #expect(padded.readUntil("too much else, in one message").found)
            padded.send(RawSocket.text(#"{"action":"subscribe","params":"Q.AAPL"}"#))
            #expect(padded.readUntil(#""sym":"AAPL""#).found, "the connection went on")
        }
    }

    @Test func framesRFC6455ForbidsCloseWith1002AndTheRelayGoesOn() async throws {
        try await withRelay { port, url in
            var unmasked = RawSocket.text(#"{"action":"auth","params":"client-key"}"#)
            unmasked[1] &= 0x7F
            unmasked.removeSubrange(2..<6)
            var reservedBit = RawSocket.text(#"{"action":"auth","params":"client-key"}"#)
            reservedBit[0] |= 0x40
            for frame in [unmasked, reservedBit, RawSocket.frame(opcode: 0x3, payload: [1, 2, 3])] {
                let client = try RawSocket(port: port)
                #expect(client.readUntil("connected", initial: try client.upgrade()).found)
                client.send(frame)
                #expect(client.readUntil("auth_success").closeCode == 1002)
            }
            let honest = try await subscribedClient(url, "Q.AAPL")
            await honest.close()
        }
    }

    @Test func aLargeSubscribePipelinedRightBehindAuthIsFine() async throws {
        try await withRelay { port, _ in
            // As Go's client does: auth and a long subscribe in one write, before any answer.
            let client = try RawSocket(port: port)
            let rest = try client.upgrade()
            let topics = (0..<900).map { "T.PIPE\($0)" }.joined(separator: ",")
            client.send(
                RawSocket.text(#"{"action":"auth","params":"client-key"}"#)
                    + RawSocket.text(#"{"action":"subscribe","params":"\#(topics)"}"#))
            #expect(client.readUntil("subscribed to 900 topics", initial: rest).found)
        }
    }

    @Test func framesSentWithTheUpgradeRequestAreReadInOrderAndJudgedByTheirLimit() async throws {
        try await withRelay { port, url in
            // Auth and a subscribe in the same write as the upgrade request, before its 101.
            let eager = try RawSocket(port: port)
            let rest = try eager.upgrade(
                then: RawSocket.text(#"{"action":"auth","params":"client-key"}"#) + RawSocket.text(#"{"action":"subscribe","params":"Q.AAPL"}"#))
            // One read: the ack can arrive in the same segment as auth_success (readUntil keeps no leftovers),
            // and it is only sent to a client whose auth succeeded.
            #expect(eager.readUntil("subscribed to: Q.AAPL", timeout: .seconds(30), initial: rest).found)
            // A frame past the pre-auth limit in that write: refused with 1009, and the relay goes on.
            let greedy = try RawSocket(port: port)
            let head = try greedy.upgrade(then: RawSocket.text(String(repeating: "x", count: 8000)))
            #expect(greedy.readUntil("never", initial: head).closeCode == 1009)
            let honest = try await subscribedClient(url, "Q.AAPL")
            await honest.close()
        }
    }

    @Test func pendingConnectionsOfAnAddressAreCapped() async throws {
        try await withRelay({ $0.connectionLimits.pendingPerAddress = 5 }) { port, url in
            // Six connections that say nothing: five hold the address's pending places, one is closed at
            // once (which one depends on the event loop that accepts it first).
            let silent = try (0..<6).map { _ in try RawSocket(port: port) }
            var closed: [Int] = []
            let deadline = ContinuousClock.now + .seconds(5)
            while closed.isEmpty, ContinuousClock.now < deadline {
                for (index, socket) in silent.enumerated() where socket.readsToEOF(within: .milliseconds(50)) { closed.append(index) }
            }
            #expect(closed.count == 1, "closed at once: \(closed)")
            // One of the five says what it wants: a place frees up for an authenticated client.
            let open = try #require(silent.indices.first { !closed.contains($0) })
            silent[open].send("GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            #expect(silent[open].receive()?.isEmpty == false, "the settled connection is answered")
            let client = try await WSTestClient.authenticated(url: url)
            await client.close()
        }
    }

    /// With no client keys (loopback, anyone it reaches is served) a web page of another site may not
    /// use the relay: a WebSocket upgrade or an API request whose `Origin` is of no loopback host, that
    /// a browser says another site's page made (`Sec-Fetch-Site: cross-site`), or whose `Host` names no
    /// loopback address (a site's name rebound to 127.0.0.1) is refused 403. Pages on this machine and
    /// clients that send no `Origin` (or their own loopback one) are served.
    @Test func withNoKeysAPageOfAnotherSiteMayNotUseTheRelay() async throws {
        try await withPortfolioRelay { parts, _ in
            let port = parts.port
            func answer(_ head: String) throws -> String {
                let socket = try RawSocket(port: port)
                _ = socket.send(head)
                return String(decoding: socket.receive() ?? [], as: UTF8.self)
            }
            let upgrade = "Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
            for path in ["/stocks", "/v1/portfolio/stream"] {
                for (headers, refused) in [
                    ("Host: 127.0.0.1:\(port)\r\nOrigin: https://evil.example\r\n", true),
                    ("Host: evil.example:\(port)\r\nOrigin: http://evil.example:\(port)\r\n", true),
                    ("Host: 127.0.0.1:\(port)\r\nOrigin: null\r\n", true),
                    ("Host: 127.0.0.1:\(port)\r\nOrigin: http://127.0.0.1.evil.example\r\n", true),
                    ("Host: 127.0.0.1:\(port)\r\nOrigin: http://127.0.0.1:\(port)\r\n", false),
                    ("Host: 127.0.0.1:\(port)\r\nOrigin: ws://localhost\r\n", false),
                    ("Host: 127.0.0.1:\(port)\r\nSec-Fetch-Site: cross-site\r\n", true),
                    ("Host: 127.0.0.1:\(port)\r\nSec-Fetch-Site: same-site\r\n", false),
                    ("Host: 127.0.0.1:\(port)\r\nOrigin: http://localhost:5173\r\nSec-Fetch-Site: cross-site\r\n", false),
                    ("Host: [::ffff:127.0.0.1]:\(port)\r\n", false),
                    ("Host: localhost:\(port)\r\n", false),
                ] {
                    let told = try answer("GET \(path) HTTP/1.1\r\n\(headers)\(upgrade)\r\n")
                    #expect(told.hasPrefix(refused ? "HTTP/1.1 403" : "HTTP/1.1 101"), "\(path) \(headers): \(told.prefix(200))")
                }
            }
            // An HTTP write from another site's page (a form, or fetch without CORS) does nothing.
            let body = #"{"name":"planted","kind":"brokerage"}"#
            let post = "POST /v1/accounts HTTP/1.1\r\nHost: 127.0.0.1:\(port)\r\nContent-Type: text/plain\r\nContent-Length: \(body.utf8.count)\r\n"
            let socket = try RawSocket(port: port)
            _ = socket.send(post + "Origin: https://evil.example\r\n\r\n" + body)
            let (planted, _) = socket.readAll(within: .seconds(5))
            #expect(planted.hasPrefix("HTTP/1.1 403") && planted.contains("another origin"), "\(planted.prefix(300))")
            let accounts = try await httpGet("http://127.0.0.1:\(port)/v1/accounts")
            #expect(!accounts.body.contains("planted"), "\(accounts.body)")
        }
    }

    /// A WebSocket upgrade that says a body follows is refused at once (400) and closed: NIO makes an
    /// upgrade at its request's end, and a body declared and never sent held the connection for good.
    @Test func anUpgradeThatDeclaresABodyIsRefusedAndClosed() async throws {
        try await withRelay({ $0.connectionLimits.headTimeout = .seconds(1) }) { port, _ in
            for declared in ["Content-Length: 1", "Transfer-Encoding: chunked", "Content-Length: 5"] {
                let socket = try RawSocket(port: port)
                var request = RawSocket.upgradeRequest()
                request.removeLast(2)
                _ = socket.send(request + Array("\(declared)\r\n\r\n\(declared.hasSuffix("5") ? "x" : "")".utf8))
                let (answer, closed) = socket.readAll(within: .seconds(5))
                #expect(answer.hasPrefix("HTTP/1.1 400") && answer.contains("has no body"), "\(declared): \(answer.prefix(120))")
                #expect(closed, "\(declared): closed after its answer")
            }
            // With no body declared (or a length of 0), the same upgrade is made.
            let plain = try RawSocket(port: port)
            var request = RawSocket.upgradeRequest()
            request.removeLast(2)
            _ = plain.send(request + Array("Content-Length: 0\r\n\r\n".utf8))
            let answer = String(decoding: plain.receive() ?? [], as: UTF8.self)
            #expect(answer.hasPrefix("HTTP/1.1 101"), "\(answer.prefix(120))")
        }
    }

    @Test func aConnectionThatNeverFinishesItsHeadIsClosed() async throws {
        try await withRelay({
            $0.connectionLimits.headTimeout = .seconds(1)
            $0.connectionLimits.keepAliveTimeout = .seconds(1)
        }) { port, _ in
            // A byte of a request head every 200 ms never makes a head.
            let slow = try RawSocket(port: port)
            let start = ContinuousClock.now
            var closed = false
            for byte in "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ".utf8 {
                if slow.send([byte]) == 0 || slow.readsToEOF(within: .milliseconds(200)) {
                    closed = true
                    break
                }
            }
            #expect(closed, "a head sent a byte at a time was still being read after \(ContinuousClock.now - start)")
            // A kept-alive connection that asks again within its timeout stays open past it (the one
            // timer moves with each request).
            let busy = try RawSocket(port: port)
            let busySince = ContinuousClock.now
            while ContinuousClock.now - busySince < .milliseconds(2500) {
                busy.send("GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
                #expect(busy.receive()?.isEmpty == false, "a connection asking every 400 ms was closed after \(ContinuousClock.now - busySince)")
                #expect(!busy.readsToEOF(within: .milliseconds(400)), "a connection asking every 400 ms was closed")
            }
            // A kept-alive connection idle past its timeout is closed too.
            let idle = try RawSocket(port: port)
            idle.send("GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            #expect(idle.readsToEOF(within: .seconds(5)))
            // And one answered before it sent its whole body (401: no key), idle after the body.
            let early = try RawSocket(port: port)
            early.send("POST /v1/accounts HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n\r\n1\r\n{\r\n")
            #expect(early.receive()?.isEmpty == false, "the 401 comes before the body ends")
            early.send("0\r\n\r\n")
            #expect(early.readsToEOF(within: .seconds(5)), "a connection answered before its body ended was never timed out")
            // So is a request whose body trickles (a byte every 2 s against a 1 s timeout).
            let trickle = try RawSocket(port: port)
            trickle.send("POST /v1/accounts HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{")
            #expect(trickle.readsToEOF(within: .seconds(5)), "a trickling body held its connection")
            // Or a byte every 400 ms, each inside the timeout: a body comes 64 KiB a timeout, or whole.
            let dripping = try RawSocket(port: port)
            let dripSince = ContinuousClock.now
            dripping.send("POST /v1/accounts HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n")
            var dripped = false
            while ContinuousClock.now - dripSince < .seconds(8) {
                if dripping.send(" ") == 0 || dripping.readsToEOF(within: .milliseconds(400)) {
                    dripped = true
                    break
                }
            }
            #expect(dripped, "a body sent a byte every 400 ms held its connection for \(ContinuousClock.now - dripSince)")
        }
    }

    /// A client that asks and never reads its answers (pipelined requests behind a tiny receive buffer)
    /// is closed within the keep-alive timeout of its last taking anything: it holds neither the answers
    /// nor the requests' handling for as long as it keeps its socket open.
    @Test func aClientThatStopsReadingItsAnswersIsClosed() async throws {
        try await withRelay({ $0.connectionLimits.keepAliveTimeout = .seconds(1) }) { port, _ in
            let asked = 5_000
            let client = try RawSocket(port: port, receiveBuffer: 2048)
            let sent = client.send(String(repeating: "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", count: asked))
            #expect(sent > 0)
            // Reads nothing for three timeouts (the time passing is what is tested), then everything.
            try await Task.sleep(for: .seconds(3))
            var received: [UInt8] = []
            let deadline = ContinuousClock.now + .seconds(20)
            client.setTimeout(.milliseconds(200))
            var ended = false
            while ContinuousClock.now < deadline, !ended {
                if let bytes = client.receive() {
                    received += bytes
                    ended = bytes.isEmpty
                } else if errno != EAGAIN, errno != EWOULDBLOCK, errno != EINTR {
                    ended = true
                }
            }
            let answers = String(decoding: received, as: UTF8.self).components(separatedBy: "HTTP/1.1 ").count - 1
            #expect(ended, "the connection was never closed")
            #expect(answers < asked, "\(answers) of \(asked) answered: the relay waited for a client that did not read")
        }
    }

    /// A request that ends HTTP on the connection (`CONNECT`, or an `Upgrade` the relay does not make,
    /// on a kept-alive connection) is its last: HTTP's codec would keep whatever follows unparsed (a
    /// client could fill the relay's memory at the speed it sends), so the relay reads nothing past it,
    /// answers it with `Connection: close`, and ends its side once the answer is written.
    @Test func aRequestThatEndsHTTPIsTheConnectionsLast() async throws {
        try await withRelay { port, _ in
            let requests = [
                "CONNECT 127.0.0.1:80 HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
                "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\nGET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: upgrade\r\nUpgrade: h2c\r\n\r\n",
                // A first request offering h2c (curl --http2, Java's HttpClient over http://), with a body
                // or not: answered as HTTP/1.1 (NIO's upgrade handler lost it: an empty reply).
                "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQCAAAAAAIAAAAA\r\n\r\n",
                "POST /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQCAAAAAAIAAAAA\r\nContent-Length: 5\r\n\r\nhello",
                // The codec takes `Proxy-Connection` as it takes `Connection`.
                "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\nGET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nProxy-Connection: upgrade\r\nUpgrade: x\r\n\r\n",
                // A WebSocket request NIO's upgrader would not take (no key): answered too.
                "GET /stocks HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n",
            ]
            for request in requests {
                let client = try RawSocket(port: port, timeout: .seconds(1))
                #expect(client.send(request) > 0)
                // 64 MiB after it: taken only as far as the sockets' buffers hold.
                let flood = client.send([UInt8](repeating: 65, count: 64 << 20))
                #expect(flood < 16 << 20, "the relay read \(flood) bytes past the connection's last request")
                let (answer, ended) = client.readAll(within: .seconds(10))
                #expect(ended, "the relay's side ended after its answer")
                #expect(answer.hasPrefix("HTTP/1.1 ") && answer.lowercased().contains("connection: close"), "answered, saying so: \(answer.prefix(400))")
            }
        }
    }

    /// A client that asks with `Connection: close` and sends another request behind it gets its answer
    /// and the end, and the connection is closed within the keep-alive timeout even though the client
    /// never closes it (the request behind is never answered).
    @Test func aRequestBehindConnectionCloseHoldsNothing() async throws {
        try await withRelay({ $0.connectionLimits.keepAliveTimeout = .seconds(1) }) { port, _ in
            let client = try RawSocket(port: port, timeout: .seconds(1))
            client.send("GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\nGET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            let (answer, ended) = client.readAll(within: .seconds(10))
            #expect(ended && answer.components(separatedBy: "HTTP/1.1 ").count == 2, "one answer, then the end: \(answer.prefix(300))")
            // Three timeouts later (the time passing is what is tested), the relay has closed the socket:
            // a write gets its reset, the next fails. (The start of a request, so that an open
            // connection takes it without an error of its own.)
            try await Task.sleep(for: .seconds(3))
            client.send("G")
            try await Task.sleep(for: .milliseconds(200))
            #expect(client.send("E") == 0, "the connection is still open on the relay's side")
        }
    }

    /// Subscriptions, not only distinct topics: a key's connections holding the same topics again and
    /// again are capped (what the relay's memory grows with), and a kept session of a key at its limit
    /// still resumes whole: its hold moves to the shelf and back, never counted twice.
    @Test func aKeysSubscriptionsAreCappedAcrossItsConnectionsAndAKeptSessionAtTheLimitResumesWhole() async throws {
        try await withRelay({ settings in
            settings.connectionLimits.subscriptionsPerKey = 20
        }) { port, url in
            let ten = (0..<10).map { "T.SUB\($0)" }.joined(separator: ",")
            let tagged = try await WSTestClient.authenticated(url: url, key: "client-key#mine")
            tagged.send(ClientAction(.subscribe, params: ten))
            _ = try await tagged.waitForStatus(StatusMessage.Kind.success)
            let plain = try await WSTestClient.authenticated(url: url)
            plain.send(ClientAction(.subscribe, params: ten))
            _ = try await plain.waitForStatus(StatusMessage.Kind.success)
            // Twenty held: the same topic on a third connection is one too many.
            let third = try await WSTestClient.authenticated(url: url)
            third.send(ClientAction(.subscribe, params: "T.SUB0"))
            let refused = try await third.waitForStatus("error")
            #expect((refused.fields["message"] as? String)?.contains("at most 20 subscriptions") == true, "\(refused.fields)")
            await third.close()
            // The tagged connection breaks: its session is kept and holds its ten, and is taken back.
            await tagged.close()
            try await eventually("the session to be kept") { await sessionsKept(port: port) == 1 }
            let back = try await WSTestClient.authenticated(url: url, key: "client-key#mine")
            back.send(ClientAction(.subscribe, params: ten))
            let statuses = try await back.nextParsed().statuses
            #expect(!statuses.contains { $0.status == "error" }, "\(statuses)")
            #expect(statuses.contains { $0.status == "success" }, "\(statuses)")
            // A connection taking the session over while it is still open subscribes its topics too.
            let takeOver = try await WSTestClient.authenticated(url: url, key: "client-key#mine")
            takeOver.send(ClientAction(.subscribe, params: ten))
            let overStatuses = try await takeOver.nextParsed().statuses
            #expect(!overStatuses.contains { $0.status == "error" }, "\(overStatuses)")
            #expect(try await back.waitForClose() == 4000)
            // Its holds moved, not doubled: once the plain connection is gone, ten more fit.
            await plain.close()
            let more = (0..<10).map { "T.MORE\($0)" }.joined(separator: ",")
            var fitted = false
            for _ in 0..<50 where !fitted {
                let fresh = try await WSTestClient.authenticated(url: url)
                fresh.send(ClientAction(.subscribe, params: more))
                fitted = try await !fresh.nextParsed().statuses.contains { $0.status == "error" }
                await fresh.close()
                if !fitted { try await Task.sleep(for: .milliseconds(100)) }
            }
            #expect(fitted, "the taken-over session's holds were counted twice")
            await takeOver.close()
        }
    }

    @Test func distinctTopicsPerKeyAreCapped() async throws {
        try await withRelay({
            $0.clientKeys = ["client-key", "other-key"]
            $0.connectionLimits.topicsPerKey = 5
        }) { _, url in
            let first = try await WSTestClient.authenticated(url: url)
            first.send(ClientAction(.subscribe, params: "Q.A1,Q.A2,Q.A3"))
            _ = try await first.nextParsed()
            // A second connection of the same key shares the key's five.
            let second = try await WSTestClient.authenticated(url: url)
            second.send(ClientAction(.subscribe, params: "Q.A1,Q.A4,Q.A5,Q.A6,Q.A7"))
            let statuses = try await second.nextParsed().statuses
            #expect(statuses.contains { $0.status == "success" && $0.message.contains("3 topics") })
            #expect(statuses.contains { $0.status == "error" && $0.message.contains("at most 5 distinct topics") && $0.message.contains("Q.A6,Q.A7") })
            // Another key has its own.
            let other = try await WSTestClient.authenticated(url: url, key: "other-key")
            other.send(ClientAction(.subscribe, params: "Q.B1,Q.B2"))
            #expect(try await other.nextParsed().statuses.first?.status == "success")
            // A topic given up frees its place.
            await second.close()
            var freed = false
            for attempt in 0..<50 where !freed {
                first.send(ClientAction(.subscribe, params: "Q.C\(attempt)"))
                freed = try await first.nextParsed().statuses.first?.status == "success"
                if !freed { try await Task.sleep(for: .milliseconds(100)) }
            }
            #expect(freed, "the places of a closed connection's topics were not freed")
            await first.close()
            await other.close()
        }
    }

    @Test func theBuiltInFeedKeepsItsPortAndItsFaultsToItself() async throws {
        var settings = RelaySettings(listen: .init(host: "127.0.0.1", port: 0), clientKeys: ["client-key"], demoRate: 200)
        settings.portfolio = nil
        let relay = Relay(settings: settings, logger: testLogger)
        try await withServices([relay]) {
            let parts = try await within(.seconds(10), "the relay to start") { try await relay.ready() }
            let demoPort = try #require(parts.demoFeedPort)
            try await waitFor(try parts.upstreamClient.stateUpdates(), "the upstream to authenticate") { $0 == .authenticated }
            let health = try await httpGet("http://127.0.0.1:\(parts.port)/healthz")
            #expect(!health.body.contains("\(demoPort)"), "/healthz tells the demo feed's port: \(health.body)")
            #expect(health.body.contains("built-in demo feed"))
            // Anyone on the machine could reset the feed before; now only the holder of its key.
            let fault = try await httpSend("POST", "http://127.0.0.1:\(demoPort)/faults/drop")
            #expect(fault.status == 401)
            #expect(try parts.upstreamClient.state == .authenticated)
        }
    }
}

/// This process's resident memory (the relay under test runs in it).
func residentBytes() -> Int {
    guard let status = try? String(contentsOfFile: "/proc/self/status", encoding: .utf8),
        let line = status.split(separator: "\n").first(where: { $0.hasPrefix("VmRSS:") }),
        let kilobytes = Int(line.split(separator: " ").dropFirst().first ?? "")
    else { return 0 }
    return kilobytes * 1024
}
