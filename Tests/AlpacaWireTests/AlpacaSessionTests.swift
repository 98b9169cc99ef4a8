import AlpacaWire
import MarketCore
import NIOCore

import Testing

private func json(_ text: String) -> [UInt8] { Array(text.utf8) }
private func read(_ frame: [UInt8], _ codec: AlpacaCodec) -> [MessagePack.Value] { codec.decode(frame)?.array ?? [] }

/// Alpaca's conversation, server side: connected, auth with the relay's key, subscriptions by channel
/// answered with the whole subscription, errors in Alpaca's codes, in either codec.
@Suite("Alpaca server session")
struct AlpacaSessionTests {
    func session(_ codec: AlpacaCodec = .json, feed: AlpacaFeed = .iex) -> AlpacaServerSession {
        AlpacaServerSession(codec: codec, feed: feed) { key in key == "good" ? ClientGrant(name: "k") : nil }
    }

    @Test func connectAuthSubscribeAndTheWholeSubscriptionBack() throws {
        var session = session()
        #expect(String(buffer: session.connectedFrame) == #"[{"T":"success","msg":"connected"}]"#)
        let auth = session.receive(json(#"{"action":"auth","key":"good","secret":"anything"}"#))
        #expect(auth.frames.map { String(decoding: $0, as: UTF8.self) } == [#"[{"T":"success","msg":"authenticated"}]"#])
        let subscribe = session.receive(json(#"{"action":"subscribe","trades":["AAPL"],"quotes":["*","MSFT"],"bars":["AAPL"]}"#))
        #expect(Set(subscribe.added.map(\.description)) == ["t.AAPL", "c.AAPL", "x.AAPL", "q.*", "q.MSFT", "b.AAPL"])
        let frame = try #require(subscribe.frames.first)
        let reply = try #require(read(frame, .json).first)
        #expect(read(subscribe.frames[0], .json).count == 1, "alone in its array")
        #expect(reply["T"] == .string("subscription"))
        #expect(reply["trades"] == .array([.string("AAPL")]) && reply["quotes"] == .array([.string("*"), .string("MSFT")]))
        #expect(reply["corrections"] == .array([.string("AAPL")]) && reply["cancelErrors"] == .array([.string("AAPL")]))
        #expect(reply["lulds"] == .array([]), "every channel of the feed listed")
        let unsubscribe = session.receive(json(#"{"action":"unsubscribe","quotes":["*"]}"#))
        #expect(unsubscribe.removed.map(\.description) == ["q.*"])
        #expect(read(unsubscribe.frames[0], .json).first?["quotes"] == .array([.string("MSFT")]))
    }

    /// Every change is answered with the whole subscription (Alpaca's own behaviour), but a change that
    /// changes nothing costs no new listing: the frame is the one already made, byte for byte.
    @Test func aChangeThatChangesNothingIsAnsweredWithTheSubscriptionAlreadyMade() throws {
        var session = session()
        _ = session.receive(json(#"{"action":"auth","key":"good","secret":"anything"}"#))
        let symbols = (0..<500).map { "\"S\($0)\"" }.joined(separator: ",")
        let first = session.receive(json(#"{"action":"subscribe","quotes":["# + symbols + "]}"))
        let again = session.receive(json(#"{"action":"subscribe","quotes":["S1"]}"#))
        let absent = session.receive(json(#"{"action":"unsubscribe","quotes":["NOPE"]}"#))
        #expect(again.added.isEmpty && absent.removed.isEmpty)
        #expect(again.frames == first.frames && absent.frames == first.frames)
        let removed = session.receive(json(#"{"action":"unsubscribe","quotes":["S1","S1"]}"#))
        #expect(removed.removed.map(\.description) == ["q.S1"])
        #expect(removed.frames != first.frames, "a real change is listed anew")
    }

    /// A reply listing a large subscription costs the client more of its message rate (past 64 KB, a
    /// message per 16 KB): changing one topic of many again and again is held to a few replies a second,
    /// not megabytes; a small subscription's changes cost one message each.
    @Test func aLargeSubscriptionsReplyCostsMoreOfTheMessageRate() throws {
        let now = ContinuousClock.now
        var large = session()
        _ = large.receive(json(#"{"action":"auth","key":"good","secret":"anything"}"#), at: now)
        for part in 0..<3 {
            let symbols = (0..<1_000).map { "\"SYMBOL\(part)\(String(repeating: "X", count: 20))\($0)\"" }.joined(separator: ",")
            let reply = large.receive(json(#"{"action":"subscribe","quotes":["# + symbols + "]}"), at: now)
            #expect(reply.added.count == 1_000)
        }
        var changes = 0
        while changes < 1_000 {
            let reply = large.receive(json(#"{"action":"\#(changes % 2 == 0 ? "subscribe" : "unsubscribe")","quotes":["ONE"]}"#), at: now)
            guard reply.added.count + reply.removed.count == 1 else { break }
            #expect(reply.frames[0].count > 64 << 10)
            changes += 1
        }
        #expect(changes < 500, "each reply of about 100 KB costs three messages of the burst: \(changes) changes")
        var small = session()
        _ = small.receive(json(#"{"action":"auth","key":"good","secret":"anything"}"#), at: now)
        for change in 0..<998 {
            let reply = small.receive(json(#"{"action":"\#(change % 2 == 0 ? "subscribe" : "unsubscribe")","quotes":["ONE"]}"#), at: now)
            #expect(reply.added.count + reply.removed.count == 1, "change \(change) of a small subscription")
        }
    }

    /// What a client sent is shown in an error within a few bytes, whatever it was: a symbol that is a
    /// huge array, a channel name of one character 120 KB long.
    @Test func anErrorShowsAtMostAFewBytesOfWhatWasSent() throws {
        var session = session()
        _ = session.receive(json(#"{"action":"auth","key":"good","secret":"anything"}"#))
        let array = "[" + Array(repeating: "0", count: 40_000).joined(separator: ",") + "]"
        let nested = session.receive(json(#"{"action":"subscribe","quotes":["# + array + "]}"))
        let told = try #require(nested.frames.first.map { String(decoding: $0, as: UTF8.self) })
        #expect(told.contains("not a symbol: a value that is no text") && told.utf8.count < 200, "\(told.prefix(300))")
        let name = "a" + String(repeating: "\u{301}", count: 60_000)
        let channel = session.receive(json(#"{"action":"subscribe",""# + name + #"":["AAPL"]}"#))
        let toldChannel = try #require(channel.frames.first.map { String(decoding: $0, as: UTF8.self) })
        #expect(toldChannel.contains("unknown channel") && toldChannel.utf8.count < 200, "\(toldChannel.utf8.count) bytes")
    }

    /// The lists are kept sorted as topics come and go (one by one, and in bulk) rather than sorted per
    /// change: after each of 300 random changes, every channel's list is exactly its symbols, sorted.
    @Test func eachReplyListsEveryChannelsSymbolsSortedAfterRandomChanges() throws {
        var session = session()
        _ = session.receive(json(#"{"action":"auth","key":"good","secret":"anything"}"#))
        var random = SplitMix64(seed: 33)
        var model: [String: Set<String>] = ["trades": [], "quotes": [], "bars": []]
        for round in 0..<300 {
            let channel = ["trades", "quotes", "bars"][Int(random.next() % 3)]
            // Mostly one to three symbols, now and then a bulk change past the one-by-one bound.
            let count = round % 10 == 0 ? 40 : 1 + Int(random.next() % 3)
            let symbols = (0..<count).map { _ in "S\(random.next() % 120)" }
            let subscribe = random.next() % 3 != 0
            let list = symbols.map { "\"\($0)\"" }.joined(separator: ",")
            let reaction = session.receive(json(#"{"action":""# + (subscribe ? "subscribe" : "unsubscribe") + #"",""# + channel + #"":["# + list + "]}"))
            if subscribe { model[channel]?.formUnion(symbols) } else { model[channel]?.subtract(symbols) }
            // A trades subscription brings corrections and cancel errors with it, and takes them away.
            let reply = try #require(reaction.frames.first.flatMap { read($0, .json).first })
            for (name, symbols) in model {
                #expect(reply[name] == .array(symbols.sorted().map { .string($0) }), "round \(round): \(name)")
            }
            #expect(reply["corrections"] == reply["trades"] && reply["cancelErrors"] == reply["trades"], "round \(round)")
        }
    }

    @Test func theMessagePackCodecAnswersInMessagePack() throws {
        var session = session(.messagePack, feed: .crypto)
        #expect(try MessagePack.decode(Array(session.connectedFrame.readableBytesView)) == .array([AlpacaControl.connected]))
        let auth = MessagePack.encode(.map([.init(.string("action"), .string("auth")), .init(.string("key"), .string("good")), .init(.string("secret"), .string("s"))]))
        let authenticated = try #require(session.receive(auth).frames.first)
        #expect(try MessagePack.decode(authenticated) == .array([AlpacaControl.authenticated]))
        let subscribe = MessagePack.encode(.map([.init(.string("action"), .string("subscribe")), .init(.string("orderbooks"), .array([.string("BTC/USD")]))]))
        let reaction = session.receive(subscribe)
        #expect(reaction.added.map(\.description) == ["o.BTC/USD"])
        let reply = try #require(reaction.frames.first)
        #expect(try MessagePack.decode(reply).array?.first?["orderbooks"] == .array([.string("BTC/USD")]))
    }

    @Test func errorsComeInAlpacasCodes() {
        func code(_ reaction: AlpacaServerSession.Reaction) -> Int64? {
            read(reaction.frames.first ?? [], .json).first?["code"]?.integer
        }
        var session = session()
        #expect(code(session.receive(json(#"{"action":"subscribe","trades":["AAPL"]}"#))) == 401)
        #expect(code(session.receive(json("not json"))) == 400)
        var wrong = self.session()
        let refused = wrong.receive(json(#"{"action":"auth","key":"bad","secret":"x"}"#))
        #expect(code(refused) == 402 && refused.close)
        _ = session.receive(json(#"{"action":"auth","key":"good","secret":"x"}"#))
        #expect(code(session.receive(json(#"{"action":"auth","key":"good","secret":"x"}"#))) == 403)
        #expect(code(session.receive(json(#"{"action":"subscribe","orderbooks":["AAPL"]}"#))) == 410, "no order books on a stock feed")
        #expect(code(session.receive(json(#"{"action":"subscribe","trades":"AAPL"}"#))) == 400)
        #expect(code(session.receive(json(#"{"action":"subscribe","trades":["bad symbol!"]}"#))) == 400)
        let many = (0..<1_001).map { "\"S\($0)\"" }.joined(separator: ",")
        #expect(code(session.receive(json(#"{"action":"subscribe","trades":[\#(many)]}"#))) == 405)
        #expect(session.topics.isEmpty, "no error changed anything")
    }

    /// A client's message has a map and a list per channel: one of many lists (each costing a value and
    /// an allocation) is refused unread past the bound, in either codec, and the session goes on.
    @Test func aClientMessageOfManyListsIsRefusedAndTheSessionGoesOn() throws {
        let bound = AlpacaCodec.maxClientContainers
        for codec in [AlpacaCodec.json, .messagePack] {
            var session = session(codec, feed: codec == .json ? .iex : .crypto)
            func message(_ entries: [(String, MessagePack.Value)]) -> [UInt8] {
                let value = MessagePack.Value.map(entries.map { .init(.string($0.0), $0.1) })
                return codec == .json ? AlpacaJSON.text(value) : MessagePack.encode(value)
            }
            func answer(_ reaction: AlpacaServerSession.Reaction) -> (code: Int64?, text: String) {
                let reply = codec.decode(reaction.frames.first ?? [])?.array?.first
                return (reply?["code"]?.integer, reply?["msg"]?.string ?? "")
            }
            let symbol = codec == .json ? "AAPL" : "BTC/USD"
            _ = session.receive(message([("action", .string("auth")), ("key", .string("good")), ("secret", .string("s"))]))
            // The map, the channel's list and lists in it: `bound` in all is read (and is no list of
            // symbols); one more is not read at all.
            let lists = { (count: Int) in MessagePack.Value.array(Array(repeating: .array([]), count: count)) }
            let within = answer(session.receive(message([("action", .string("subscribe")), ("trades", lists(bound - 2))])))
            let past = answer(session.receive(message([("action", .string("subscribe")), ("trades", lists(bound - 1))])))
            #expect(within.code == 400 && within.text.contains("not a symbol"), "\(codec): read within the bound: \(within)")
            #expect(past.code == 400 && !past.text.contains("not a symbol"), "\(codec): not read past it: \(past)")
            let after = session.receive(message([("action", .string("subscribe")), ("trades", .array([.string(symbol)]))]))
            #expect(after.added.map(\.description).contains("t.\(symbol)"), "\(codec): the session goes on")
        }
    }

    @Test func aKeyOutsideTheMarketIsRefusedAtAuthAndATradeNeedsNoRightToItsCorrections() {
        var crypto = AlpacaServerSession(codec: .json, feed: .crypto, market: .crypto) { _ in
            ClientGrant(name: "k", entitlement: Entitlement(patterns: nil, markets: [.stocks]))
        }
        let refused = crypto.receive(json(#"{"action":"auth","key":"k","secret":"x"}"#))
        #expect(refused.close && refused.marketRefused && read(refused.frames[0], .json).first?["code"] == .int(409))
        var stocks = AlpacaServerSession(codec: .json, feed: .iex, market: .stocks) { _ in
            ClientGrant(name: "k", entitlement: Entitlement(patterns: [Topic(eventType: "t", ticker: "AAPL")!]))
        }
        _ = stocks.receive(json(#"{"action":"auth","key":"k","secret":"x"}"#))
        let trades = stocks.receive(json(#"{"action":"subscribe","trades":["AAPL"]}"#))
        #expect(trades.added.map(\.description) == ["t.AAPL"], "corrections and cancel errors only where the key allows them")
    }

    @Test func anEntitlementThatDoesNotCoverASymbolIsInsufficientSubscription() {
        var session = AlpacaServerSession(codec: .json, feed: .iex) { _ in
            ClientGrant(name: "k", entitlement: Entitlement(patterns: [Topic(eventType: "t", ticker: "AAPL")!]))
        }
        _ = session.receive(json(#"{"action":"auth","key":"k","secret":"x"}"#))
        let reaction = session.receive(json(#"{"action":"subscribe","quotes":["AAPL"]}"#))
        #expect(read(reaction.frames[0], .json).first?["code"] == .int(409))
        #expect(reaction.added.isEmpty)
    }

    @Test func feedsAreKnownByTheirPaths() {
        #expect(AlpacaFeed(path: "/v2/iex") == .iex && AlpacaFeed(path: "/v2/sip/") == .sip && AlpacaFeed(path: "/v2/delayed_sip") == .delayedSIP)
        #expect(AlpacaFeed(path: "/v1beta3/crypto/us") == .crypto && AlpacaFeed(path: "/v1beta2/crypto") == .crypto)
        #expect(AlpacaFeed(path: "/v2/crypto") == nil && AlpacaFeed(path: "/stocks") == nil)
        // Options: both feeds, trades and quotes only, MessagePack only at Alpaca.
        #expect(AlpacaFeed(path: "/v1beta1/indicative") == .indicative && AlpacaFeed(path: "/v1beta1/opra") == .opra)
        #expect(AlpacaFeed(path: "/v2/opra") == nil && AlpacaFeed(path: "/v2/indicative") == nil)
        #expect(AlpacaFeed.opra.market == .options && AlpacaFeed.opra.channels == [.trades, .quotes] && AlpacaFeed.opra.isMessagePackOnly)
        #expect(AlpacaFeed.standard(for: .options) == .indicative && AlpacaFeed.standard(for: .crypto) == .crypto)
    }

    @Test func anOptionsFeedRefusesChannelsItHasNot() {
        var session = AlpacaServerSession(codec: .json, feed: .opra) { key in key == "good" ? ClientGrant(name: "k") : nil }
        _ = session.receive(json(#"{"action":"auth","key":"good","secret":"x"}"#))
        let bars = session.receive(json(#"{"action":"subscribe","bars":["SPY251219C00650000"]}"#))
        #expect(bars.frames.map { String(decoding: $0, as: UTF8.self) } == [#"[{"T":"error","code":410,"msg":"invalid subscribe action for this feed"}]"#])
        let trades = session.receive(json(#"{"action":"subscribe","trades":["SPY251219C00650000"]}"#))
        // No corrections or cancel errors implied: options have none.
        #expect(trades.frames.map { String(decoding: $0, as: UTF8.self) } == [#"[{"T":"subscription","trades":["SPY251219C00650000"],"quotes":[]}]"#])
    }

    /// A control message is read whole, with few maps and arrays: one of a hundred thousand empty maps
    /// (some 40 times its size once read) is refused; a subscription's lists of many symbols are read.
    @Test func aControlMessageIsReadWithFewMapsAndArrays() throws {
        let flood = MessagePack.Value.map([
            .init(.string("T"), .string("error")), .init(.string("x"), .array(Array(repeating: .map([]), count: 100_000))),
        ])
        let hostile = MessagePack.encode(.array([flood]))
        #expect(throws: MessagePack.ReadError.self) { try hostile.withUnsafeBytes { try AlpacaFrame.read($0) } }
        let symbols = MessagePack.Value.array((0..<20_000).map { .string("SYM\($0)") })
        let channels = ["trades", "quotes", "bars", "dailyBars", "updatedBars", "statuses", "lulds", "corrections", "cancelErrors"]
        let subscription = MessagePack.Value.map([.init(.string("T"), .string("subscription"))] + channels.map { .init(.string($0), symbols) })
        let items = try MessagePack.encode(.array([subscription])).withUnsafeBytes { try AlpacaFrame.read($0) }
        #expect(items == [.control(subscription)])
    }

    @Test func aFrameOfEventsIsReadWithoutDecodingTheEvents() throws {
        let trade = MessagePack.Value.map([
            .init(.string("T"), .string("t")), .init(.string("S"), .string("AAPL")), .init(.string("p"), .double(1.5)),
            .init(.string("t"), .timestamp(seconds: 1, nanoseconds: 2)),
        ])
        let frame = MessagePack.encode(.array([trade, AlpacaControl.connected, .int(3), .map([.init(.string("T"), .string("zz"))])]))
        let items = try frame.withUnsafeBytes { try AlpacaFrame.read($0) }
        guard case .event(let type, let symbol, let range) = items[0] else {
            Issue.record("not an event: \(items)")
            return
        }
        #expect(type == "t" && symbol == "AAPL")
        #expect(try MessagePack.decode(frame[range]) == trade, "the event's own bytes")
        #expect(items[1] == .control(AlpacaControl.connected))
        #expect(items.count == 4)
    }

    @Test func positionsGoIntoAnAlpacaEventAsTwoMoreEntriesAndReadBack() throws {
        // 14 fields: with the two positions the map needs the 16-bit header.
        var fields: [MessagePack.Value.Entry] = [.init(.string("T"), .string("t")), .init(.string("S"), .string("AAPL"))]
        for index in 0..<12 { fields.append(.init(.string("f\(index)"), .int(Int64(index)))) }
        let plain = MarketEvent(eventType: "t", ticker: "AAPL", bytes: ByteBuffer(bytes: MessagePack.encode(.map(fields))))
        let small = AlpacaEvents.trade("MSFT", id: 1, price: 2.5, size: 1, nanoseconds: 0)
        let stamped = EventPosition.stamp([plain, small], [EventPosition(topic: 7, market: 70), EventPosition(topic: 1, market: 71)])
        #expect(EventPosition.read(from: stamped[0].bytes) == EventPosition(topic: 7, market: 70))
        #expect(EventPosition.read(from: stamped[1].bytes) == EventPosition(topic: 1, market: 71))
        let decoded = try MessagePack.decode(stamped[0].bytes.readableBytesView)
        #expect(decoded["_s"]?.integer == 7 && decoded["_m"]?.integer == 70 && decoded["f11"]?.integer == 11 && decoded["S"]?.string == "AAPL")
        #expect(try MessagePack.decode(stamped[1].bytes.readableBytesView)["p"] == .double(2.5))
        #expect(EventPosition.read(from: small.bytes) == nil, "no positions in an event without them")
        // A map32 header (any writer may use it, whatever the size) is stamped too.
        var wide: [UInt8] = [0xDF, 0, 0, 0, 2]
        wide += MessagePack.encode(.string("T")) + MessagePack.encode(.string("t"))
        wide += MessagePack.encode(.string("S")) + MessagePack.encode(.string("AAPL"))
        let map32 = MarketEvent(eventType: "t", ticker: "AAPL", bytes: ByteBuffer(bytes: wide))
        let stampedWide = EventPosition.stamp([map32], [EventPosition(topic: 3, market: 30)])
        #expect(EventPosition.read(from: stampedWide[0].bytes) == EventPosition(topic: 3, market: 30))
        #expect(try MessagePack.decode(stampedWide[0].bytes.readableBytesView)["S"]?.string == "AAPL")
    }

    @Test func aTaggedKeyNamesItsSession() {
        var session = self.session()
        _ = session.receive(json(#"{"action":"auth","key":"good#desk-1","secret":"x"}"#))
        #expect(session.isAuthenticated && session.sessionTag == "desk-1")
        var bad = self.session()
        let refused = bad.receive(json(#"{"action":"auth","key":"good#no spaces","secret":"x"}"#))
        #expect(refused.close && !bad.isAuthenticated)
    }
}

/// Alpaca's conversation, client side (the relay's upstream): auth, the wanted set by channel, and
/// errors read by the message they answer.
@Suite("Alpaca client session")
struct AlpacaClientSessionTests {
    static func control(_ type: String, msg: String? = nil, code: Int? = nil) -> MessagePack.Value {
        var entries: [MessagePack.Value.Entry] = [.init(.string("T"), .string(type))]
        if let code { entries.append(.init(.string("code"), .int(Int64(code)))) }
        if let msg { entries.append(.init(.string("msg"), .string(msg))) }
        return .map(entries)
    }

    static func topics(_ list: String...) -> Set<Topic> { Set(list.compactMap { Topic(parsing: $0) }) }

    func authenticated(wanting wanted: Set<Topic>) -> AlpacaClientSession {
        var session = AlpacaClientSession(key: "k", secret: "s")
        _ = session.setWanted(wanted)
        let auth = session.receive(Self.control("success", msg: "connected"))
        #expect(auth.event == .connected && auth.send.count == 1)
        let subscribed = session.receive(Self.control("success", msg: "authenticated"))
        #expect(subscribed.event == .authenticated)
        // Trades by channel; their corrections and cancel errors are never asked for.
        let sent = subscribed.send.compactMap { try? MessagePack.decode($0) }
        #expect(sent.first?["trades"] == .array(wanted.filter { $0.eventType == "t" }.sorted().map { .string($0.ticker) }))
        #expect(sent.first?["corrections"] == nil)
        return session
    }

    /// The vendor's words are bounded and printable before they reach a log, `/healthz` or a client.
    @Test func aVendorsLongOrUnprintableMessageIsCutAndCleaned() throws {
        var session = authenticated(wanting: Self.topics("t.AAPL"))
        _ = session.setWanted(Self.topics("t.AAPL", "t.MSFT"))
        let long = "limit\u{07}\u{1B}[31m " + String(repeating: "x", count: 100_000)
        let refused = session.receive(Self.control("error", msg: long, code: 405))
        guard case .refused(_, let message, _) = refused.event else { return #expect(Bool(false), "\(refused.event)") }
        #expect(message.utf8.count <= VisibleText.vendorBytes && message.hasPrefix("limit [31m x"), "\(message.prefix(40))")
    }

    @Test func aRefusedSubscribeNamesItsTopicsWhichAreNotAskedAgainWhileWanted() throws {
        var session = authenticated(wanting: Self.topics("t.AAPL", "c.AAPL"))
        // The first message answered; the second (MSFT) refused with 405.
        let more = session.setWanted(Self.topics("t.AAPL", "c.AAPL", "t.MSFT"))
        #expect(more.count == 1)
        #expect(session.receive(Self.control("subscription")).event == .acknowledged(#"{"T":"subscription"}"#))
        let refused = session.receive(Self.control("error", msg: "symbol limit exceeded", code: 405))
        #expect(refused.event == .refused(code: 405, message: "symbol limit exceeded", topics: Self.topics("t.MSFT")))
        #expect(session.subscribed == Self.topics("t.AAPL", "c.AAPL") && session.refused == Self.topics("t.MSFT"))
        // Another change asks only for what it adds; no unsubscribe of what the server never took.
        let change = session.setWanted(Self.topics("t.AAPL", "c.AAPL", "t.MSFT", "q.AAPL"))
        #expect(change.compactMap { try? MessagePack.decode($0)["quotes"] } == [.array([.string("AAPL")])])
        #expect(change.compactMap { try? MessagePack.decode($0)["trades"] }.isEmpty)
        // No longer wanted, it is forgotten; wanted again, asked again.
        #expect(session.setWanted(Self.topics("t.AAPL", "c.AAPL", "q.AAPL")).isEmpty)
        let again = session.setWanted(Self.topics("t.AAPL", "c.AAPL", "q.AAPL", "t.MSFT"))
        #expect(again.compactMap { try? MessagePack.decode($0)["trades"] } == [.array([.string("MSFT")])])
        // A new connection asks for everything wanted.
        session.connectionEnded()
        #expect(session.refused.isEmpty)
    }

    @Test func aServerThatNeverAnswersDoesNotGrowTheListOfMessagesAwaitingAnswers() {
        var session = authenticated(wanting: Self.topics("t.AAPL"))
        // Ten thousand changes, none answered: past a thousand messages waiting, answers can no longer
        // be matched to their messages, so errors are only logged until the connection ends.
        for index in 0..<10_000 { _ = session.setWanted(Self.topics("t.AAPL", "t.S\(index)")) }
        #expect(session.lostTrack)
        let error = session.receive(Self.control("error", msg: "symbol limit exceeded", code: 405))
        #expect(error.event == .error("405 symbol limit exceeded"))
        session.connectionEnded()
        #expect(!session.lostTrack)
    }

    @Test func errorsAlpacaSendsUnaskedAnswerNoMessage() {
        var session = authenticated(wanting: Self.topics("t.AAPL"))
        // The subscribe waits for its answer; a 407 or a 500 meanwhile is not it.
        #expect(session.receive(Self.control("error", msg: "slow client", code: 407)).event == .error("407 slow client"))
        #expect(session.receive(Self.control("error", msg: "internal error", code: 500)).event == .error("500 internal error"))
        #expect(session.refused.isEmpty && session.subscribed == Self.topics("t.AAPL"))
        // The answer that then comes is still matched to it.
        let refused = session.receive(Self.control("error", msg: "symbol limit exceeded", code: 405))
        #expect(refused.event == .refused(code: 405, message: "symbol limit exceeded", topics: Self.topics("t.AAPL")))
    }

    @Test func insufficientSubscriptionBeforeAuthIsAFeedOutsideThePlanAndAfterItARefusal() {
        var outside = AlpacaClientSession(key: "k", secret: "s")
        _ = outside.receive(Self.control("success", msg: "connected"))
        #expect(outside.receive(Self.control("error", msg: "insufficient subscription", code: 409)).event == .authFailed("409 insufficient subscription"))
        var session = authenticated(wanting: Self.topics("t.AAPL"))
        let refused = session.receive(Self.control("error", msg: "insufficient subscription", code: 409))
        #expect(refused.event == .refused(code: 409, message: "insufficient subscription", topics: Self.topics("t.AAPL")))
        // An error answering nothing outstanding is only logged.
        #expect(session.receive(Self.control("error", msg: "invalid syntax", code: 400)).event == .error("400 invalid syntax"))
    }
}

@Suite("Alpaca delivery")
struct AlpacaDeliveryTests {
    @Test func framesStayWithinTheLimitInBothCodecsAndANoticeIsAloneInItsFrame() throws {
        let trades = (0..<40).map { AlpacaEvents.trade("AAPL", id: Int64($0), price: 187.25, size: 100, nanoseconds: 1_700_000_000_000_000_000) }
        let notice = AlpacaWireProtocol(feed: .iex).render(Notice(.lagging, message: "behind"))
        let events = Array(trades[..<20]) + [notice] + Array(trades[20...])
        for codec in [AlpacaCodec.json, .messagePack] {
            let one = try #require(AlpacaDelivery.payloads([trades[0]], codec: codec).first).readableBytes
            let limit = one * 3
            let payloads = AlpacaDelivery.payloads(events, codec: codec, maxFrameBytes: limit)
            #expect(payloads.allSatisfy { $0.readableBytes <= limit }, "\(codec): \(payloads.map(\.readableBytes)) over \(limit)")
            let decoded = payloads.map { codec.decode(Array($0.readableBytesView))?.array ?? [] }
            #expect(decoded.reduce(0) { $0 + $1.count } == 41)
            let alone = decoded.filter { $0.contains { $0["T"]?.string == AlpacaControl.noticeType } }
            #expect(alone.count == 1 && alone[0].count == 1, "\(codec)")
        }
    }
}

/// The relay's notices in Alpaca's words: `{"T":"relay","status":…,"msg":…}` maps, details as they were
/// when the notices were Polygon JSON read back (numbers first, then the rest, each by key); a refusal
/// with one of Alpaca's codes is that error.
@Suite("Alpaca: notices rendered")
struct AlpacaNoticeRenderingTests {
    let alpaca = AlpacaWireProtocol(feed: .iex)

    func json(_ notice: Notice) throws -> String {
        let value = try MessagePack.decode(Array(alpaca.render(notice).bytes.readableBytesView))
        return String(decoding: AlpacaJSON.text(value), as: UTF8.self)
    }

    @Test func aNoticeIsARelayMapWithItsDetails() throws {
        let gap = Notice(.gap, message: "Q.A: gone", details: ["topic": .text("q.A"), "from": .number(3), "complete": .flag(true)])
        #expect(try json(gap) == #"{"T":"relay","status":"gap","msg":"Q.A: gone","from":3,"complete":true,"topic":"q.A"}"#)
    }

    @Test func aRefusalWithAlpacasCodeIsItsError() throws {
        let refused = Notice(.refused, message: "the upstream refused t.AAPL", details: ["code": .number(409)])
        #expect(try json(refused) == #"{"T":"error","code":409,"msg":"insufficient subscription: the upstream refused t.AAPL"}"#)
        let unknown = Notice(.refused, message: "no", details: ["code": .number(999)])
        #expect(try json(unknown) == #"{"T":"relay","status":"error","msg":"no","code":999}"#)
    }
}
