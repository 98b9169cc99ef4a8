import AlpacaWire
import MarketCore
import NIOCore
import Testing

/// Alpaca's news stream: an item is read into one event per symbol sharing its bytes, a connection is
/// sent each item once however many of its symbols it holds, and the feed's session takes `news`.
@Suite("Alpaca news")
struct AlpacaNewsTests {
    func item(id: Int64 = 7, symbols: [String], content: String = "<p>Body</p>", updated: Int64? = nil) -> ByteBuffer {
        AlpacaNews.item(
            id: id, headline: "Headline \(id)", summary: "Summary", author: "Desk", content: content, url: "https://example.com/\(id)", symbols: symbols,
            createdNanoseconds: 1_764_000_000_123_456_789, updatedNanoseconds: updated)
    }

    func frame(_ items: [ByteBuffer]) -> ByteBuffer {
        var writer = MessagePack.Writer()
        writer.arrayHeader(items.count)
        for item in items { writer.raw(item.readableBytesView) }
        return ByteBuffer(bytes: writer.bytes)
    }

    /// A whole WebSocket frame's payload (the header as the relay writes it: never masked).
    func payload(_ frame: ByteBuffer) -> [UInt8] {
        let bytes = Array(frame.readableBytesView)
        var offset = 2
        switch bytes[1] & 0x7F {
        case 126: offset = 4
        case 127: offset = 10
        default: break
        }
        return Array(bytes[offset...])
    }

    func framed(_ events: [MarketEvent], _ framing: any DownstreamFraming) -> [[UInt8]] {
        let turn = framing.frames(
            payloadBytes: events.reduce(0) { $0 + $1.bytes.readableBytes },
            events: { body in events.withUnsafeBufferPointer { for index in $0.indices { body($0.baseAddress! + index) } } },
            converted: { convert, body in for event in events { body(event, convert(event)) } })
        guard let turn else { return [] }
        return ([turn.first] + turn.more).map(payload)
    }

    @Test func anItemIsOneEventPerSymbolAllSharingItsOneCopy() throws {
        let wire = AlpacaWireProtocol(feed: .news)
        let big = String(repeating: "x", count: 40_000)
        // Beside another item in the same message, and large enough to be compacted: one copy for both routes.
        let message = frame([item(id: 1, symbols: ["AAPL", "TSLA", "AAPL", "not a ticker"], content: big), item(id: 2, symbols: [], content: big + big)])
        let reading = try wire.readUpstream(message, receivedAt: 5, market: .news)
        #expect(reading.events.map(\.topic.description) == ["n.AAPL", "n.TSLA", "n._"], "each symbol once, a bad one passed over, none: `_`")
        let first = reading.events[0].bytes.withUnsafeReadableBytes { $0.baseAddress }
        let second = reading.events[1].bytes.withUnsafeReadableBytes { $0.baseAddress }
        #expect(first == second, "the routes share the item's slice")
        // Compacted (a large message's events are), they share one copy of it, not one each.
        let compacted = MarketEvent.compacted(reading.events)
        let copies = Set(compacted.map { $0.bytes.withUnsafeReadableBytes { UInt(bitPattern: $0.baseAddress) } })
        #expect(copies.count == 2, "one copy for the two routes of the first item; the second, most of its message, kept as it is")
        #expect(compacted[0].bytes.withUnsafeReadableBytes { $0.baseAddress } != first, "bytes of their own")
        #expect(compacted.map(\.topic) == reading.events.map(\.topic))
        #expect(reading.events.allSatisfy { $0.receivedAt == 5 })
        let decoded = try MessagePack.decode(reading.events[1].bytes.readableBytesView)
        #expect(decoded["id"]?.integer == 1 && decoded["content"]?.string == big && decoded["symbols"]?.array?.count == 4)
        #expect(AlpacaNews.id(of: reading.events[2]) == 2)
    }

    @Test func routesAreBoundedInCountAndInTheBytesTheirCopiesHold() {
        let many = (0..<150).map { "S\($0)" }
        #expect(AlpacaNews.routes(many).count == AlpacaNews.maxSymbols)
        #expect(AlpacaNews.routes(many, itemBytes: 3 << 20) == Array(many.prefix(10)), "32 MiB of copies: 10 of a 3 MiB item")
        #expect(AlpacaNews.routes(["AAPL"], itemBytes: 64 << 20) == ["AAPL"], "always the first")
        #expect(AlpacaNews.routes([" ", ""]) == [AlpacaNews.noSymbol])
        // A symbol longer than any topic's ticker is not routed (the upstream's check would drop its copy).
        let long = String(repeating: "L", count: 41)
        #expect(AlpacaNews.routes([long, "AAPL"]) == ["AAPL"])
        #expect(AlpacaNews.routes([long]) == [AlpacaNews.noSymbol], "the item still reaches the holders of every item")
    }

    /// A message of many items each naming many symbols: its copies together hold at most the message's
    /// bound (32 MiB, or eight times the message), each item routed by one symbol at least.
    @Test func aMessagesItemsAreRoutedWithinTheMessagesBound() throws {
        let wire = AlpacaWireProtocol(feed: .news)
        let symbols = (0..<100).map { "S\($0)" }
        let body = String(repeating: "x", count: 64 << 10)
        let message = frame((0..<20).map { item(id: Int64($0), symbols: symbols, content: body) })
        let reading = try wire.readUpstream(message, receivedAt: 5, market: .news)
        let routedBytes = reading.events.reduce(0) { $0 + $1.bytes.readableBytes }
        // The bound, and past it one route per item (each item is about 64 KiB).
        let itemBytes = reading.events[0].bytes.readableBytes
        #expect(routedBytes <= AlpacaNews.routedBytes(ofMessage: message.readableBytes) + 20 * itemBytes, "\(routedBytes) bytes of copies")
        #expect(routedBytes < 20 * 100 * itemBytes / 2, "the bound cut them")
        #expect(Set(reading.events.compactMap { AlpacaNews.id(of: $0) }).count == 20, "every item routed")
        #expect(reading.events.count < 20 * 100)
    }

    @Test func theIdIsFoundWhereverItStandsAndNotInAMapWithout() {
        var writer = MessagePack.Writer()
        writer.value(.map([.init(.string("T"), .string("n")), .init(.string("content"), .string("…")), .init(.string("id"), .int(42))]))
        #expect(writer.bytes.withUnsafeBytes { AlpacaNews.id(in: $0) } == 42)
        let without = MessagePack.encode(.map([.init(.string("T"), .string("n")), .init(.int(3), .array([.int(1)]))]))
        #expect(without.withUnsafeBytes { AlpacaNews.id(in: $0) } == nil)
        #expect([UInt8]([0x93, 1, 2, 3]).withUnsafeBytes { AlpacaNews.id(in: $0) } == nil, "no map")
    }

    @Test func aConnectionIsSentEachItemOnceInEitherCodec() throws {
        let now = MonotonicClock.nanoseconds()
        let both = AlpacaNews.events(item(id: 9, symbols: ["AAPL", "TSLA"]), symbols: ["AAPL", "TSLA"], receivedAt: now)
        let other = AlpacaNews.events(item(id: 10, symbols: ["TSLA"]), symbols: ["TSLA"], receivedAt: now)
        // The same story again, updated: new to the client.
        let updated = AlpacaNews.events(item(id: 9, symbols: ["AAPL", "TSLA"], updated: 1_764_000_060_000_000_000), symbols: ["AAPL", "TSLA"], receivedAt: now)
        for codec in [AlpacaCodec.messagePack, .json] {
            let sent = NewsSent()
            let framing = AlpacaFraming(codec: codec, newsSent: sent)
            let frames = framed(both + other, framing)
            let items = frames.flatMap { codec.decode($0)?.array ?? [] }
            #expect(items.compactMap { $0["id"]?.integer } == [9, 10], "\(codec)")
            // A later turn (a snapshot, a resume) with the same item again: still once. The framing with
            // receive times shares the memory.
            #expect(framed(both, framing.withTimes()).isEmpty)
            let again = framed(updated, framing.withTimes()).flatMap { codec.decode($0)?.array ?? [] }
            #expect(again.count == 1 && again.first?["id"]?.integer == 9 && again.first?["_r"] != nil, "the update once, stamped: \(again)")
            // Another connection's framing has its own.
            #expect(framed(both, AlpacaFraming(codec: codec, newsSent: NewsSent())).count == 1)
            // JSON: the times as Alpaca's JSON writes them, RFC 3339.
            if codec == .json { #expect(items.first?["created_at"]?.string == "2025-11-24T16:00:00.123456789Z") }
        }
        // Another feed's framing has none: a trade of two identical bytes is two trades.
        let trade = AlpacaEvents.trade("AAPL", id: 1, price: 1, size: 1, nanoseconds: 0)
        #expect(framed([trade, trade], AlpacaFraming(codec: .messagePack)).flatMap { AlpacaCodec.messagePack.decode($0)?.array ?? [] }.count == 2)
    }

    @Test func theMemoryOfSentItemsIsBounded() {
        let sent = NewsSent()
        #expect(sent.firstTime(1) && !sent.firstTime(1))
        for id in 2...(NewsSent.remembered + 1) { #expect(sent.firstTime(id)) }
        #expect(sent.firstTime(1), "forgotten after \(NewsSent.remembered) others")
        #expect(!sent.firstTime(NewsSent.remembered + 1))
    }

    @Test func aResumedConnectionRemembersWhatTheBrokenOneSentNewestLast() {
        let broken = NewsSent()
        // Past the bound, so the ring has wrapped: ids 1...10 are forgotten, 11... remembered.
        for id in 1...(NewsSent.remembered + 10) { _ = broken.firstTime(id) }
        let resumed = NewsSent()
        resumed.remember(broken)
        #expect(!resumed.firstTime(NewsSent.remembered + 10) && !resumed.firstTime(11))
        #expect(resumed.firstTime(10), "what the broken connection had forgotten")
        // Oldest first: each new id pushes out the oldest remembered (11 went for 10 above, 12 now).
        #expect(resumed.firstTime(NewsSent.remembered * 3))
        #expect(resumed.firstTime(12), "forgotten in its turn")
        #expect(!resumed.firstTime(14), "13 went for 12; 14 is still remembered")
    }

    @Test func anItemFromNATSMustNameTheSubjectsSymbol() throws {
        let wire = AlpacaWireProtocol(feed: .news)
        let bytes = item(symbols: ["AAPL", "TSLA"])
        let tsla = try #require(Topic(eventType: "n", ticker: "TSLA"))
        let checked = bytes.withUnsafeReadableBytes { wire.checkedEvent($0, topic: tsla, market: .news, receivedAt: 1) }
        #expect((try? checked.get())?.topic == tsla)
        let msft = try #require(Topic(eventType: "n", ticker: "MSFT"))
        let refused = bytes.withUnsafeReadableBytes { wire.checkedEvent($0, topic: msft, market: .news, receivedAt: 1) }
        guard case .failure(let rejection) = refused else {
            Issue.record("an item of AAPL and TSLA was taken on n.MSFT")
            return
        }
        #expect(rejection.reason.contains("news item"))
    }

    @Test func theNewsFeedTakesItsOneChannelAndRefusesTheOthers() throws {
        #expect(AlpacaFeed(path: "/v1beta1/news") == .news && AlpacaFeed.news.market == .news && AlpacaFeed.standard(for: .news) == .news)
        #expect(Market(path: "/v1beta1/news") == .news)
        var session = AlpacaServerSession(codec: .json, feed: .news) { _ in ClientGrant(name: "k") }
        _ = session.receive(Array(#"{"action":"auth","key":"k","secret":"s"}"#.utf8))
        let subscribe = session.receive(Array(#"{"action":"subscribe","news":["AAPL","*"]}"#.utf8))
        #expect(Set(subscribe.added.map(\.description)) == ["n.AAPL", "n.*"])
        #expect(subscribe.frames.map { String(decoding: $0, as: UTF8.self) } == [#"[{"T":"subscription","news":["*","AAPL"]}]"#])
        let trades = session.receive(Array(#"{"action":"subscribe","trades":["AAPL"]}"#.utf8))
        #expect(trades.frames.map { String(decoding: $0, as: UTF8.self) } == [#"[{"T":"error","code":410,"msg":"invalid subscribe action for this feed"}]"#])
        #expect(AlpacaWireProtocol(feed: .news).barRules(of: .news) == nil, "no bars from news")
    }
}
