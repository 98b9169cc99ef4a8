import Foundation
import MarketCore
import MarketDataHub
import NIOCore
import PolygonWire
import Synchronization
@testable import RelayServer
import Tape
import Testing

/// Tagged sessions (`KEY#tag`) on a market the test feeds itself, so that it can fall quiet: where a
/// session stands is read from the server's shelf, as a running relay saves it.
@Suite("Tagged sessions on a quiet market", .serialized)
struct TaggedSessionTests {
    static func trade(_ symbol: String, _ n: Int) -> MarketEvent {
        MarketEvent(
            eventType: "T", ticker: symbol,
            bytes: ByteBuffer(string: #"{"ev":"T","sym":"\#(symbol)","i":"\#(n)","x":4,"p":100.5,"s":10,"t":1700000000000,"q":\#(n)}"#))
    }

    static func marketSequences(_ events: [MarketEvent]) -> [UInt64] { events.compactMap { EventPosition.read(from: $0.bytes)?.market } }

    /// The number right after `key` (a field's name, its colon and any quote) in each of `events` that has it.
    static func numbers(_ key: String, in events: [MarketEvent]) -> [Int] {
        events.compactMap { event in
            let text = String(buffer: event.bytes)
            return text.range(of: key).flatMap { Int(text[$0.upperBound...].prefix { $0.isNumber }) }
        }
    }

    /// Publishes an AAPL and an MSFT trade into `hub` at each call, numbered from 1.
    static func pairs(into hub: MarketDataHub) -> @Sendable () async -> Void {
        let count = Mutex(0)
        return {
            let n = count.withLock {
                $0 += 1
                return $0
            }
            await hub.publish([trade("AAPL", n), trade("MSFT", n)])
        }
    }

    /// A connection of the session `tag` that subscribed each of `messages` in turn and was served MSFT:
    /// a subscription reaches the hub after its answer, so pairs are published one at a time until then.
    static func served(_ url: String, tag: String, subscribing messages: [String], publishing publish: () async -> Void) async throws -> WSTestClient {
        let client = try await WSTestClient.authenticated(url: url, key: "client-key#\(tag)")
        for params in messages {
            client.send(ClientAction(.subscribe, params: params))
            _ = try await client.waitForStatus(StatusMessage.Kind.success)
        }
        var served = false
        for _ in 0..<100 where !served {
            await publish()
            served = ((try? await client.nextEvents(1, timeout: .milliseconds(100))) ?? []).contains { $0.ticker == "MSFT" }
        }
        try #require(served, "MSFT served to the session \(tag)")
        return client
    }

    /// A raw client of the session `tag`, with a small receive buffer (a burst waits, unacknowledged, in
    /// the relay's socket until read), that subscribed AAPL and was served its `n`th trade.
    static func rawServed(port: Int, tag: String, hub: MarketDataHub) async throws -> (client: RawSocket, n: Int) {
        let client = try RawSocket(port: port, receiveBuffer: 2048)
        #expect(client.readUntil("connected", initial: try client.upgrade()).found)
        client.send(RawSocket.text(#"{"action":"auth","params":"client-key#\#(tag)"}"#))
        #expect(client.readUntil("auth_success").found)
        client.send(RawSocket.text(#"{"action":"subscribe","params":"T.AAPL"}"#))
        #expect(client.readUntil("success").found)
        // The subscription reaches the hub after its answer: a trade at a time until one arrives.
        var n = 0
        var served = false
        while !served, n < 100 {
            n += 1
            await hub.publish([trade("AAPL", n)])
            served = client.readUntil(#""i":"\#(n)""#, timeout: .milliseconds(100)).found
        }
        try #require(served, "AAPL served")
        return (client, n)
    }

    /// A tagged connection (`tag`) holding AAPL whose client answers no close (it closes 2 s after it
    /// was taken over, with `takenOverAnswer` 2 s), taken over by a reconnect whose subscribe of MSFT
    /// stopped waiting for its session (`takeOverWait` 20 ms); returned once the old connection closed
    /// and its session is kept beside the open reconnect.
    static func keptBesideAnOpenReconnect(port: Int, tag: String, hub: MarketDataHub, shelf: SessionShelf) async throws -> WSTestClient {
        let (old, _) = try await rawServed(port: port, tag: tag, hub: hub)
        let reconnect = try await WSTestClient.authenticated(url: "ws://127.0.0.1:\(port)/stocks", key: "client-key#\(tag)")
        reconnect.send(ClientAction(.subscribe, params: "T.MSFT"))
        _ = try await reconnect.waitForStatus(StatusMessage.Kind.success)
        #expect(old.readsToEOF(within: .seconds(5)), "the old connection closed")
        try await eventually("the old connection's session kept beside the reconnect") {
            shelf.openConnections("key-1#\(tag)") == 1 && shelf.count == 1
        }
        return reconnect
    }

    /// The next frame of `client` that holds `text`.
    static func frame(of client: WSTestClient, containing text: String) async throws -> String {
        var frame = try await client.nextFrame()
        while !frame.contains(text) { frame = try await client.nextFrame() }
        return frame
    }

    /// Runs `body` with a server whose stock market's hub (`hub`: by default one with a history) the test
    /// feeds, with `shelved` sessions on its shelf (and the take-over's times given), its port, where
    /// each tagged session stands (``SessionShelf/checkpoint()``), and the shelf.
    func withQuietMarket(
        window: Duration = .seconds(60), takeOverWait: Duration = .seconds(5), takenOverAnswer: Duration = .milliseconds(250),
        hub: MarketDataHub = MarketDataHub(wire: .polygon, history: HistoryLimits()),
        shelved: [(name: String, session: SessionShelf.Session)] = [], restoring: [SavedSession] = [], sessions: Int = 10_000,
        keys: [ClientKey] = [],
        _ body: (
            _ port: Int, _ hub: MarketDataHub, _ standing: @escaping @Sendable (String) -> SessionStanding.Now?, _ shelf: SessionShelf
        ) async throws -> Void
    ) async throws {
        var configuration = RelayServerConfiguration(
            host: "127.0.0.1", port: 0, authentication: try ClientAuthentication.resolve(keys: ["client-key"], withRights: keys, listenHost: "127.0.0.1"))
        // Where the client stands is what its TCP stack acknowledged, with nothing held back for a proxy.
        configuration.resume.marginBytes = 0
        configuration.resume.window = window
        configuration.resume.takeOverWait = takeOverWait
        configuration.resume.takenOverAnswer = takenOverAnswer
        configuration.resume.sessions = sessions
        let server = RelayServer(configuration: configuration, markets: [ServedMarket(market: .stocks, hub: hub, feed: TestFeed())], logger: testLogger)
        let shelf = server.markets[0].shelf
        for (name, session) in shelved { shelf.keep(session, as: name) }
        await server.restore(restoring, market: .stocks)
        try await withServices([server]) {
            try await body(try await server.listeningPort(), hub, { tag in shelf.checkpoint().first { $0.name.hasSuffix("#\(tag)") }?.standing }, shelf)
        }
    }

    /// A reconnect that takes its session back over two messages has the second one's topics replayed
    /// after what it already had of the first's, so the session stands where it broke until the client
    /// has that replay (a break during it skips none of it). On a market that then falls quiet, no
    /// later event says the client has it: the write that ended the replay does, once the client's TCP
    /// stack acknowledges it. A break after that resumes from there, not from the old break again.
    @Test func aReplayTakenBackInALaterMessageStopsHoldingOnceAcknowledgedOnAQuietMarket() async throws {
        try await withQuietMarket { port, hub, standing, _ in
            let url = "ws://127.0.0.1:\(port)/stocks"
            let publishBoth = Self.pairs(into: hub)
            // The first connection holds AAPL, then MSFT.
            let first = try await Self.served(url, tag: "quiet", subscribing: ["T.AAPL", "T.MSFT"], publishing: publishBoth)
            await first.close()

            // Missed while the session is parked: three of each.
            for _ in 0..<3 { await publishBoth() }

            // Taken back over two messages: AAPL's replay, then MSFT's after it.
            let second = try await WSTestClient.authenticated(url: url, key: "client-key#quiet")
            second.send(ClientAction(.subscribe, params: "T.AAPL"))
            let apple = try await second.waitForStatus(StatusMessage.Kind.resumed)
            second.send(ClientAction(.subscribe, params: "T.MSFT"))
            let microsoft = try await second.waitForStatus(StatusMessage.Kind.resumed)
            let replayedMSFT = microsoft.eventsBefore.filter { $0.ticker == "MSFT" }
            #expect(replayedMSFT.count >= 3, "MSFT's missed trades replayed, not a gap: \(microsoft.fields)")
            let newest = try #require((Self.marketSequences(apple.eventsBefore) + Self.marketSequences(microsoft.eventsBefore)).max())

            // Nothing more arrives. The client has every event through the newest it was written.
            try await eventually("the session to stand past its replay (at \(newest))") { (standing("quiet")?.resumeAfter ?? 0) >= newest }
            await second.close()

            // A break now resumes from there: nothing the second connection had comes again.
            let third = try await WSTestClient.authenticated(url: url, key: "client-key#quiet")
            third.send(ClientAction(.subscribe, params: "T.AAPL,T.MSFT"))
            let back = try await third.waitForStatus(StatusMessage.Kind.resumed)
            let again = Self.marketSequences(back.eventsBefore).filter { $0 <= newest }
            #expect(again.isEmpty, "replayed again after it was acknowledged: \(again)")
            await third.close()
        }
    }

    /// A tagged connection that holds a topic and then subscribes another with `sinceTime` has that
    /// topic's missed events replayed after events of the first the client has acknowledged: until the
    /// client has the replay, its session stands before it, so a break during the replay resumes it
    /// whole (before, it stood past it, and the break skipped the replay without a `gap`).
    @Test func aTopicResumedLaterWithSinceHoldsTheSessionBeforeItsReplayUntilTheClientHasIt() async throws {
        try await withQuietMarket { port, hub, standing, _ in
            // Another connection holds MSFT (wanted, its history is whole).
            let keeper = try await Self.served(
                "ws://127.0.0.1:\(port)/stocks", tag: "keeper", subscribing: ["T.MSFT"], publishing: { await hub.publish([Self.trade("MSFT", 0)]) })
            let start = WallClock.nowMilliseconds()
            let (client, n) = try await Self.rawServed(port: port, tag: "later", hub: hub)
            // MSFT trades this connection does not hold yet, then an AAPL trade it reads.
            for i in 1...200 { await hub.publish([Self.trade("MSFT", i)]) }
            await hub.publish([Self.trade("AAPL", n + 1)])
            #expect(client.readUntil(#""i":"\#(n + 1)""#).found, "AAPL's newest trade read")
            let newest = await hub.position.sequence
            try await eventually("the session to stand at AAPL's newest trade (\(newest))") { (standing("later")?.resumeAfter ?? 0) >= newest }

            // MSFT from before its trades: replayed, and not read (a small receive buffer holds it back).
            client.send(RawSocket.text(#"{"action":"subscribe","params":"T.MSFT","sinceTime":\#(start)}"#))
            try await eventually("the session to stand before MSFT's replay (\(newest))") { (standing("later")?.resumeAfter ?? .max) < newest - 199 }
            client.reset()

            // A break now: taken back, MSFT's trades come whole.
            let back = try await WSTestClient.authenticated(url: "ws://127.0.0.1:\(port)/stocks", key: "client-key#later")
            back.send(ClientAction(.subscribe, params: "T.AAPL,T.MSFT"))
            let resumed = try await back.waitForStatus(StatusMessage.Kind.resumed)
            let replayed = Set(Self.numbers(#""i":""#, in: resumed.eventsBefore.filter { $0.ticker == "MSFT" }))
            #expect(replayed.isSuperset(of: 1...200), "MSFT's trades not replayed: \(Set(1...200).subtracting(replayed).sorted().prefix(10)); \(resumed.fields)")
            await back.close()
            await keeper.close()
        }
    }

    /// A session let go before its window ended (here: restored after a restart onto a shelf that keeps
    /// two per key, so the third pushes the first off) is not resumed as if nothing was missed: its
    /// reconnect is told `gap` for its topics. One saved in another epoch is restored and told `gap`
    /// across the terms (before, it was left out, and its reconnect subscribed live with no word).
    @Test func aSessionLetGoBeforeItsWindowEndedIsToldGapAndOneOfAnotherEpochIsRestored() async throws {
        let saved = [
            SavedSession(name: "key-1#first", epoch: "former", resumeAfter: 5, topics: ["T.AAPL", " T.AAPL"]),
            SavedSession(name: "key-1#second", epoch: "former", resumeAfter: 5, topics: ["T.MSFT"]),
            SavedSession(name: "key-1#third", epoch: "former", resumeAfter: 5, topics: ["T.IBM"]),
        ]
        try await withQuietMarket(restoring: saved, sessions: 20) { port, _, _, shelf in
            #expect(shelf.count == 2 && shelf.forgotten.count == 1, "two sessions a key: the third pushed the first off")
            let url = "ws://127.0.0.1:\(port)/stocks"
            for (tag, topic, letGo) in [("second", "T.MSFT", false), ("first", "T.AAPL", true)] {
                let client = try await WSTestClient.authenticated(url: url, key: "client-key#\(tag)")
                client.send(ClientAction(.subscribe, params: topic))
                let gap = try await client.waitForStatus("gap")
                let told = "\(gap.fields)"
                #expect(told.contains(topic) && told.contains("let go before its window ended") == letGo, "\(tag): \(told)")
                #expect(shelf.forgotten.take("key-1#\(tag)") == nil, "\(tag): told once")
                await client.close()
            }
        }
    }

    /// Where a tagged client stands is what its TCP stack acknowledged. A client that reads its last
    /// events after they were written acknowledges them when nothing more is written (a quiet topic):
    /// the relay reads that again, so a break then does not send them again.
    @Test func aClientThatReadsItsLastEventsLateStandsPastThemOnAQuietMarket() async throws {
        try await withQuietMarket { port, hub, standing, _ in
            let (client, n) = try await Self.rawServed(port: port, tag: "late", hub: hub)
            // A burst of 40 KB the client does not read yet: written, and acknowledged only in part.
            await hub.publish((n + 1...n + 300).map { Self.trade("AAPL", $0) })
            let newest = await hub.position.sequence
            // Read whole; nothing more is written after it.
            #expect(client.readUntil(#""i":"\#(n + 300)""#).found)
            try await eventually("the session to stand past the burst (at \(newest))") { (standing("late")?.resumeAfter ?? 0) >= newest }
        }
    }

    /// The session's topics a reconnect has not subscribed again stay held for it: a break before they
    /// are resumes them whole too, not as a `gap`; and they are let go a window after the session was
    /// taken back, as they would have been on the shelf.
    @Test func topicsNotTakenBackYetStayHeldUntilTheWindowEnds() async throws {
        try await withQuietMarket(window: .seconds(3)) { port, hub, standing, _ in
            let url = "ws://127.0.0.1:\(port)/stocks"
            let publishBoth = Self.pairs(into: hub)
            let first = try await Self.served(url, tag: "partial", subscribing: ["T.AAPL,T.MSFT"], publishing: publishBoth)
            await first.close()
            await publishBoth()

            // Taken back with AAPL only, then broken again; MSFT goes on meanwhile.
            let second = try await WSTestClient.authenticated(url: url, key: "client-key#partial")
            second.send(ClientAction(.subscribe, params: "T.AAPL"))
            _ = try await second.waitForStatus(StatusMessage.Kind.resumed)
            await publishBoth()
            await second.close()
            await publishBoth()

            // MSFT resumes whole: every trade since the first connection's last.
            let third = try await WSTestClient.authenticated(url: url, key: "client-key#partial")
            third.send(ClientAction(.subscribe, params: "T.MSFT"))
            let resumed = try await third.waitForStatus(StatusMessage.Kind.resumed)
            #expect((resumed.fields["gaps"] as? [String] ?? []).isEmpty, "MSFT held for the session throughout: \(resumed.fields)")
            #expect(resumed.eventsBefore.filter { $0.ticker == "MSFT" }.count >= 3, "\(resumed.fields)")

            // AAPL, not subscribed again, is held for the session for a window (3 s), then let go.
            try await eventually("the third connection to hold AAPL for its session") { standing("partial")?.topics.map(\.description).sorted() == ["T.AAPL", "T.MSFT"] }
            try await eventually("AAPL let go at the window's end", timeout: .seconds(10)) { standing("partial")?.topics.map(\.description) == ["T.MSFT"] }
            await third.close()
        }
    }

    /// A connection taken over whose client is gone (it answers nothing, not even the close) is closed
    /// within a moment, not after the whole close timeout (3 s): the reconnect's first subscribe waits
    /// for its session. The reconnect resumes from what the old client last acknowledged.
    @Test func aConnectionTakenOverWhoseClientIsGoneClosesWithoutWaitingTheCloseTimeout() async throws {
        try await withQuietMarket { port, hub, standing, _ in
            let (old, n) = try await Self.rawServed(port: port, tag: "gone", hub: hub)
            // From here the old client reads and answers nothing: 40 KB of trades, acknowledged in part.
            await hub.publish((n + 1...n + 300).map { Self.trade("AAPL", $0) })

            let reconnect = try await WSTestClient.authenticated(url: "ws://127.0.0.1:\(port)/stocks", key: "client-key#gone")
            reconnect.send(ClientAction(.subscribe, params: "T.AAPL"))
            // Answered once the old connection closed: within 2.5 s, not after the close timeout (3 s).
            let resumed = try await reconnect.waitForStatus(StatusMessage.Kind.resumed, timeout: .milliseconds(2500))
            #expect(old.readsToEOF(within: .seconds(1)), "the connection taken over is closed")
            let numbers = Self.numbers(#""i":""#, in: resumed.eventsBefore)
            #expect(
                !numbers.isEmpty && numbers == Array(numbers[0]...n + 300) && numbers[0] > n,
                "the trades the old client had not acknowledged, replayed: \(numbers.prefix(3))…\(numbers.suffix(3))")
            await reconnect.close()
        }
    }

    /// A configured key's connections share its replays (`history.resumesPerKey`): its second
    /// connection's resume gets what the first left of the key's minute, here less than it missed.
    @Test func aKeysConnectionsShareItsReplaysOverTheWire() async throws {
        let hub = MarketDataHub(wire: .polygon, history: HistoryLimits(eventsPerResume: 20, resumesPerKey: 1))
        try await withQuietMarket(hub: hub) { port, hub, _, _ in
            let keeper = await hub.subscribe(to: [try #require(Topic(parsing: "T.AAPL"))])
            await hub.publish((1...18).map { Self.trade("AAPL", $0) })
            let since = #"{"action":"subscribe","params":"T.AAPL","since":{"epoch":"\#(hub.epoch ?? "")","T.AAPL":0}}"#
            let first = try await WSTestClient.authenticated(url: "ws://127.0.0.1:\(port)/stocks", key: "client-key")
            first.send(since)
            let all = try await first.waitForStatus(StatusMessage.Kind.resumed)
            #expect(all.fields["replayed"] as? [String: Int] == ["T.AAPL": 18], "the first replays all: \(all.fields)")
            await first.close()
            // 19 of the key's 20 spent (18 events and `resumed`): 1 left (an event more every 3 s), far
            // less than the 18 missed.
            let second = try await WSTestClient.authenticated(url: "ws://127.0.0.1:\(port)/stocks", key: "client-key")
            second.send(since)
            // The gap, its last value and `resumed` come in one frame.
            let frame: String = try await Self.frame(of: second, containing: #""status":"resumed""#)
            let objects: [[String: Any]] = try JSONSerialization.jsonObject(with: Data(frame.utf8)) as? [[String: Any]] ?? []
            let gapMessage: String? = objects.first(where: { ($0["status"] as? String) == "gap" })?["message"] as? String
            #expect(gapMessage?.contains("this key's connections") == true, "naming the key's budget: \(frame)")
            let gaps: [String]? = objects.last?["gaps"] as? [String]
            #expect(gaps == ["T.AAPL"], "\(frame)")
            await second.close()
            _ = keeper
        }
    }

    /// Sign-ins under one name, each taking over the one before, whose clients answer no close: the
    /// name holds a few connections still closing, and the next sign-in is refused (its client told why,
    /// then closed) rather than waiting for them all with the others.
    @Test func aNameWithAsManyConnectionsStillClosingAsItMayRefusesTheNextSignIn() async throws {
        // A key of 6 connections: the refused sign-in's place is given back.
        let crowd = try ClientKey(name: "crowd", secret: "crowd-key", maxConnections: SessionShelf.mostStillClosing + 2)
        try await withQuietMarket(takenOverAnswer: .seconds(20), keys: [crowd]) { port, _, _, shelf in
            func signIn(_ tag: String = "crowd") throws -> RawSocket {
                let client = try RawSocket(port: port)
                #expect(client.readUntil("connected", initial: try client.upgrade()).found)
                client.send(RawSocket.text(#"{"action":"auth","params":"crowd-key#\#(tag)"}"#))
                return client
            }
            var clients: [RawSocket] = []
            for _ in 0...SessionShelf.mostStillClosing {
                let client = try signIn()
                #expect(client.readUntil("auth_success").found)
                clients.append(client)
            }
            #expect(shelf.openConnections("crowd#crowd") == SessionShelf.mostStillClosing + 1)
            let refused = try signIn()
            #expect(refused.readUntil("connections taken over and still closing").found, "the refusal says why")
            #expect(refused.readsToEOF(within: .seconds(10)), "and the connection is closed")
            #expect(shelf.openConnections("crowd#crowd") == SessionShelf.mostStillClosing + 1, "the others are as they were")
            let another = try signIn("other")
            #expect(another.readUntil("auth_success").found, "the key's sixth connection is let in: the refused one's place was given back")
            _ = clients
        }
    }

    /// A reconnect whose first subscribe stopped waiting for the session of the connection it took over
    /// (still closing) goes on without it; that session, kept under the name later, joins the
    /// reconnect's own when it closes, instead of being replaced by it on the shelf. The next reconnect
    /// resumes both sessions' topics whole.
    @Test func aSessionKeptAfterTheTakeOverStoppedWaitingJoinsTheReconnectsOwn() async throws {
        // The old connection's close waits 2 s for its client; the reconnect's subscribe, 20 ms for it.
        try await withQuietMarket(takeOverWait: .milliseconds(20), takenOverAnswer: .seconds(2)) { port, hub, _, shelf in
            let url = "ws://127.0.0.1:\(port)/stocks"
            let reconnect = try await Self.keptBesideAnOpenReconnect(port: port, tag: "slow", hub: hub, shelf: shelf)
            for n in 1...3 { await hub.publish([Self.trade("AAPL", 1000 + n), Self.trade("MSFT", 1000 + n)]) }
            await reconnect.close()
            try await eventually("one session kept, none open") { shelf.openConnections("key-1#slow") == 0 && shelf.count == 1 }

            let third = try await WSTestClient.authenticated(url: url, key: "client-key#slow")
            third.send(ClientAction(.subscribe, params: "T.AAPL,T.MSFT"))
            let resumed = try await third.waitForStatus(StatusMessage.Kind.resumed)
            #expect((resumed.fields["gaps"] as? [String] ?? []).isEmpty, "\(resumed.fields)")
            #expect(resumed.eventsBefore.filter { $0.ticker == "AAPL" }.count >= 3, "AAPL's missed trades replayed: \(resumed.fields)")
            await third.close()
        }
    }

    @Test func aReconnectWhoseTakeOverStoppedWaitingIsToldTheOldConnectionsTopicsAreNotResumed() async throws {
        try await withQuietMarket(takeOverWait: .milliseconds(20), takenOverAnswer: .seconds(2)) { port, hub, _, _ in
            // The old connection holds AAPL; its client is gone from here (it answers no close).
            let (old, _) = try await Self.rawServed(port: port, tag: "late", hub: hub)
            let reconnect = try await WSTestClient.authenticated(url: "ws://127.0.0.1:\(port)/stocks", key: "client-key#late")
            reconnect.send(ClientAction(.subscribe, params: "T.AAPL,T.MSFT"))
            // Its subscribe stops waiting for the old session: AAPL, the old connection's, is told not
            // resumed (MSFT was never the session's: plainly subscribed).
            let frame = try await Self.frame(of: reconnect, containing: #""status":"gap""#)
            let statuses = try #require(try JSONSerialization.jsonObject(with: Data(frame.utf8)) as? [[String: Any]], "\(frame)")
            let message = statuses.first?["message"] as? String ?? ""
            #expect(message.hasPrefix("not resumed (T.AAPL):") && message.contains("had not closed within 20 ms"), "\(frame)")
            // Then, in the same frame, `resumed` naming it among the gaps (and AAPL's last value).
            let resumed = statuses.first { $0["status"] as? String == "resumed" }
            #expect(resumed?["gaps"] as? [String] == ["T.AAPL"], "\(frame)")
            // Both are live; a later subscribe of AAPL again is not told twice.
            await hub.publish([Self.trade("AAPL", 500), Self.trade("MSFT", 500)])
            let live = try await reconnect.nextEvents(2)
            #expect(Set(live.map(\.ticker)) == ["AAPL", "MSFT"])
            reconnect.send(ClientAction(.unsubscribe, params: "T.AAPL"))
            reconnect.send(ClientAction(.subscribe, params: "T.AAPL"))
            // Up to AAPL's last value (500), which its hub change queues: no second `gap` before it.
            var later = try await reconnect.nextFrame()
            while !(later.contains(#""sym":"AAPL","i":"500""#) && !later.contains("subscribed to")) {
                #expect(!later.contains(#""status":"gap""#), "told again: \(later)")
                later = try await reconnect.nextFrame()
            }
            #expect(!later.contains(#""status":"gap""#), "told again: \(later)")
            #expect(old.readsToEOF(within: .seconds(5)), "the old connection closed")
            await reconnect.close()
        }
    }

    @Test func aReconnectThatTakesBackAKeptSessionWhileAnotherIsOpenIsToldThatOnesTopicsAreNotResumed() async throws {
        try await withQuietMarket(takeOverWait: .milliseconds(20), takenOverAnswer: .seconds(2)) { port, hub, _, shelf in
            let second = try await Self.keptBesideAnOpenReconnect(port: port, tag: "kept", hub: hub, shelf: shelf)
            // The third takes the kept session back at sign-in, and does not wait for the open second's.
            let third = try await WSTestClient.authenticated(url: "ws://127.0.0.1:\(port)/stocks", key: "client-key#kept")
            third.send(ClientAction(.subscribe, params: "T.AAPL,T.MSFT"))
            let frame = try await Self.frame(of: third, containing: #""status":"gap""#)
            #expect(frame.contains("not resumed (T.MSFT): a session kept earlier was taken back while"), "\(frame)")
            #expect(!frame.contains("T.AAPL)"), "AAPL resumes from the kept session: \(frame)")
            await third.close()
            await second.close()
        }
    }

    /// A session that broke in a cluster's former leadership term is taken back across the terms: its
    /// replay is the former term's tail (from that term's tape), then this term's events. Until the
    /// client has it whole, the session stands where it broke, in the former term: a break during the
    /// replay resumes across the terms again. (It stood at the new term's start: a break then skipped
    /// the former term's tail it had not read, with no `gap`.)
    @Test func aBreakDuringAReplayAcrossTermsResumesAcrossThemAgain() async throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("across-terms-\(UUID().uuidString)").path
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let start: Int64 = 1_795_185_000 * 1_000_000_000
        func quote(_ n: Int) -> [UInt8] { Array(#"{"ev":"Q","sym":"AAPL","n":\#(n),"bx":4,"bp":100.5,"bs":10,"ax":7,"ap":100.6,"as":12}"#.utf8) }
        // The former term's tape: AAPL's quotes 1…1000.
        let writer = try TapeWriter(directory: directory, market: "stocks", blockBytes: 4096)
        try writer.append(.epoch("e1", at: start))
        try writer.append(.holding(["Q.AAPL"], at: start))
        for n in 1...1000 {
            try writer.append(
                .event(
                    TapeEvent(
                        receivedAt: start + Int64(n) * 1_000_000, sequence: UInt64(n), topicSequence: UInt64(n), eventType: "Q", ticker: "AAPL",
                        bytes: quote(n))))
        }
        try writer.flush()
        let hub = MarketDataHub(wire: .polygon, adoptsPositions: true)
        await hub.setArchive(TapeArchive(directory: directory, market: "stocks", check: EventCheck(market: .stocks, wire: PolygonWireProtocol(), maxBytes: 64 << 10)))
        let aapl = try #require(Topic(parsing: "Q.AAPL"))
        // Another client holds AAPL throughout: this term's is whole from its first event.
        let holder = await hub.subscribe(to: [aapl])
        await hub.startEpoch("e1")
        await hub.startEpoch("e2")
        let events = (1...5).map { MarketEvent(eventType: "Q", ticker: "AAPL", bytes: ByteBuffer(bytes: quote(1000 + $0))) }
        await hub.publish(EventPosition.stamp(events, (1...5).map { EventPosition(topic: UInt64($0), market: UInt64($0)) }))
        // The session broke at e1's 250.
        let broken = SessionShelf.Session(epoch: "e1", resumeAfter: 250, topics: [aapl], brokeAt: .now)

        try await withQuietMarket(hub: hub, shelved: [("key-1#across", broken)]) { port, hub, standing, _ in
            // A small receive buffer: the replay waits, unacknowledged, in the relay's socket until read.
            let client = try RawSocket(port: port, receiveBuffer: 2048)
            #expect(client.readUntil("connected", initial: try client.upgrade()).found)
            client.send(RawSocket.text(#"{"action":"auth","params":"client-key#across"}"#))
            #expect(client.readUntil("auth_success").found)
            client.send(RawSocket.text(#"{"action":"subscribe","params":"Q.AAPL"}"#))
            // A third of the former term's tail read, stopping inside its one frame, then the
            // connection breaks (reset: the rest of the replay is never acknowledged).
            #expect(client.readPartway(to: #""n":500,"#), "the former term's tail replayed")
            #expect(standing("across")?.epoch == "e1", "the session stands in the former term until its replay is read")
            client.reset()

            // Taken back again: the former term's tail from where the session broke, then this term's.
            let again = try await WSTestClient.authenticated(url: "ws://127.0.0.1:\(port)/stocks", key: "client-key#across")
            again.send(ClientAction(.subscribe, params: "Q.AAPL"))
            let resumed = try await again.waitForStatus(StatusMessage.Kind.resumed)
            let numbers = Self.numbers(#""n":"#, in: resumed.eventsBefore)
            #expect(
                numbers.first == 251 && numbers.contains(1000),
                "the former term's tail again, whole: \(numbers.prefix(3))…\(numbers.suffix(3)) \(resumed.fields) \(resumed.eventsBefore.count)")
            #expect(Array(numbers.suffix(5)) == Array(1001...1005), "then this term's: \(numbers.suffix(5))")
            // Read whole: the session stands in this term.
            try await eventually("the session to stand in e2 once its replay is read") {
                standing("across").map { $0.epoch == "e2" && $0.resumeAfter == 5 } == true
            }
            await again.close()
        }
        _ = holder
    }

    /// A client that signs in again while its last connection is still open, then goes before it
    /// subscribes anything (a reconnect that fails at once): its session is the one it took over, not
    /// an empty one that would replace it on the shelf. The next reconnect resumes the topics whole.
    @Test func aReconnectThatGoesBeforeItSubscribesKeepsTheSessionItTookOver() async throws {
        try await withQuietMarket { port, hub, standing, _ in
            let url = "ws://127.0.0.1:\(port)/stocks"
            let publishBoth = Self.pairs(into: hub)
            let first = try await Self.served(url, tag: "flap", subscribing: ["T.AAPL,T.MSFT"], publishing: publishBoth)
            // Signed in again: the first connection is closed (taken over), and this one goes at once.
            let second = try await WSTestClient.authenticated(url: url, key: "client-key#flap")
            await second.close()
            await first.close()
            try await eventually("the session held for both topics (kept, or by the connections closing)") { standing("flap")?.topics.count == 2 }
            for _ in 0..<3 { await publishBoth() }

            let third = try await WSTestClient.authenticated(url: url, key: "client-key#flap")
            third.send(ClientAction(.subscribe, params: "T.AAPL,T.MSFT"))
            let resumed = try await third.waitForStatus(StatusMessage.Kind.resumed)
            #expect((resumed.fields["gaps"] as? [String] ?? []).isEmpty, "\(resumed.fields)")
            #expect(resumed.eventsBefore.filter { $0.ticker == "MSFT" }.count >= 3, "MSFT's missed trades replayed: \(resumed.fields)")
            #expect(resumed.eventsBefore.filter { $0.ticker == "AAPL" }.count >= 3, "AAPL's missed trades replayed: \(resumed.fields)")
            await third.close()
        }
    }
}
