import AlpacaWire
import Foundation
import MarketCore
import NIOCore
import PolygonWire
import Testing

/// What the conformance specs need to know of one protocol that the seam itself does not say: how to
/// write a server's message in it and how to read its bytes back. Everything asserted goes through the
/// ``WireProtocol`` value.
struct Conformance: Sendable, CustomTestStringConvertible {
    /// A server's control message the specs send.
    enum Control: Sendable { case connected, authenticated }

    let wire: any WireProtocol
    /// The markets it is tried on (the first is its main one).
    let markets: [Market]
    /// A trade's event type.
    let tradeType: String
    /// The field a notice's sentence is in.
    let messageKey: String
    /// One event of `type` and `ticker` on its own (as a cluster node receives it).
    let event: @Sendable (_ type: String, _ ticker: String) -> [UInt8]
    /// One upstream message: the events, then the controls.
    let message: @Sendable (_ events: [(String, String)], _ controls: [Control]) -> ByteBuffer
    /// A map's bytes (a notice, a client message) as JSON-like values.
    let decode: @Sendable (_ bytes: [UInt8]) -> [String: Any]?

    var testDescription: String { wire.name }

    static let polygon = Conformance(
        wire: PolygonWireProtocol(), markets: [.stocks, .crypto, .options], tradeType: "T", messageKey: "message",
        event: { type, ticker in Array(polygonEvent(type, ticker).utf8) },
        message: { events, controls in
            let items =
                events.map { polygonEvent($0.0, $0.1) }
                + controls.map { control in
                    switch control {
                    case .connected: StatusMessage.connected.json
                    case .authenticated: StatusMessage.authSuccess.json
                    }
                }
            return ByteBuffer(string: "[" + items.joined(separator: ",") + "]")
        },
        decode: { bytes in (try? JSONSerialization.jsonObject(with: Data(bytes))) as? [String: Any] })

    static let alpaca = Conformance(
        wire: AlpacaWireProtocol(feed: .iex), markets: [.stocks], tradeType: "t", messageKey: "msg",
        event: { type, ticker in Array(alpacaEvent(type, ticker).bytes.readableBytesView) },
        message: { events, controls in
            var writer = MessagePack.Writer(capacity: 256)
            writer.arrayHeader(events.count + controls.count)
            for (type, ticker) in events { writer.raw(alpacaEvent(type, ticker).bytes.readableBytesView) }
            for control in controls {
                writer.value(control == .connected ? AlpacaControl.connected : AlpacaControl.authenticated)
            }
            return ByteBuffer(bytes: writer.bytes)
        },
        decode: { bytes in
            guard let value = try? MessagePack.decode(bytes) else { return nil }
            return (try? JSONSerialization.jsonObject(with: Data(AlpacaJSON.text(value)))) as? [String: Any]
        })

    static let all: [Conformance] = [.polygon, .alpaca]

    /// Polygon's event: its ticker in the field its market routes by.
    private static func polygonEvent(_ type: String, _ ticker: String) -> String {
        let field = Market.of(ticker: ticker) == .crypto ? "pair" : "sym"
        let shown = Market.of(ticker: ticker) == .crypto ? String(ticker.dropFirst(2)) : ticker
        return #"{"ev":"\#(type)","\#(field)":"\#(shown)","p":187.25,"s":100,"t":1700000000000}"#
    }

    private static func alpacaEvent(_ type: String, _ ticker: String) -> MarketEvent {
        AlpacaEvents.event(type, ticker, [("T", .string(type)), ("S", .string(ticker)), ("p", .double(187.25)), ("s", .int(100))])
    }
}

/// The same specs against every protocol behind the seam: a new protocol is added to
/// ``Conformance/all`` and must pass them unchanged.
@Suite("Wire protocol conformance")
struct ConformanceTests {
    // MARK: notices

    /// Every kind renders as a notice event of that kind, framed as the protocol's events are, saying
    /// its sentence and every detail in the protocol's own words.
    @Test(arguments: Conformance.all)
    func everyNoticeSaysItsKindSentenceAndDetails(_ spec: Conformance) throws {
        let details: [String: Notice.Value] = [
            "dropped": .number(42), "epoch": .text("e-1"), "complete": .flag(false),
            "gaps": .list([.text("T.AAPL"), .text("Q.*")]), "replayed": .object([Notice.Detail("T.AAPL", .number(3))]),
        ]
        for kind in Notice.Kind.allCases where kind != .refused {
            let event = spec.wire.render(Notice(kind, message: "what happened: \(kind)", details: details))
            #expect(event.isNotice && event.noticeKind == kind, "\(spec.wire.name) \(kind)")
            let fields = try #require(spec.decode(Array(event.bytes.readableBytesView)), "\(spec.wire.name) \(kind): \(event.json)")
            #expect(fields["status"] as? String == kind.rawValue)
            #expect(fields[spec.messageKey] as? String == "what happened: \(kind)")
            #expect((fields["dropped"] as? NSNumber)?.int64Value == 42)
            #expect(fields["epoch"] as? String == "e-1")
            #expect((fields["complete"] as? NSNumber)?.boolValue == false)
            #expect(fields["gaps"] as? [String] == ["T.AAPL", "Q.*"])
            #expect(((fields["replayed"] as? [String: Any])?["T.AAPL"] as? NSNumber)?.intValue == 3)
        }
    }

    /// A refusal carries the upstream's code where the client reads errors.
    @Test(arguments: Conformance.all)
    func aRefusalCarriesTheUpstreamsCode(_ spec: Conformance) throws {
        let event = spec.wire.render(Notice(.refused, message: "the upstream refused T.AAPL", details: ["code": .number(409)]))
        #expect(event.isNotice && event.noticeKind == .refused)
        let fields = try #require(spec.decode(Array(event.bytes.readableBytesView)))
        #expect((fields["code"] as? NSNumber)?.intValue == 409, "\(fields)")
        #expect((fields[spec.messageKey] as? String)?.contains("the upstream refused T.AAPL") == true, "\(fields)")
    }

    // MARK: the upstream

    /// A server message's events come out as events of their topics (slices of the message), its
    /// control messages as controls, in order.
    @Test(arguments: Conformance.all)
    func anUpstreamMessageIsReadIntoEventsAndControls(_ spec: Conformance) throws {
        let message = spec.message([(spec.tradeType, "AAPL"), (spec.tradeType, "MSFT")], [.connected])
        let reading = try spec.wire.readUpstream(message, receivedAt: 7, market: spec.markets[0])
        #expect(reading.events.map(\.topic.description) == ["\(spec.tradeType).AAPL", "\(spec.tradeType).MSFT"])
        #expect(reading.events.allSatisfy { $0.receivedAt == 7 && !$0.isNotice })
        #expect(reading.controls.count == 1)
        #expect(throws: (any Error).self) { try spec.wire.readUpstream(ByteBuffer(string: "\u{1}garbage"), receivedAt: 0, market: .stocks) }
    }

    /// The login follows the greeting; nothing is subscribed before the login is accepted, then the
    /// whole wanted set; a lost connection forgets the server's subscriptions, not the wanted set.
    @Test(arguments: Conformance.all)
    func theSessionLogsInThenSubscribesTheWantedSet(_ spec: Conformance) throws {
        var session = spec.wire.upstreamSession(key: "the-key", secret: "the-secret")
        let wanted: Set<Topic> = [Topic(eventType: spec.tradeType, ticker: "AAPL")].compactMap { $0 }.reduce(into: []) { $0.insert($1) }
        #expect(session.want(wanted).isEmpty, "nothing is sent before the login")
        let controls = try spec.wire.readUpstream(spec.message([], [.connected, .authenticated]), receivedAt: 0, market: spec.markets[0]).controls
        try #require(controls.count == 2)
        let greeted = session.react(to: controls[0])
        #expect(greeted.signal == .connected)
        let login = try #require(greeted.send.first.flatMap(spec.decode), "one login message")
        #expect(login["action"] as? String == "auth")
        #expect(String(decoding: greeted.send[0], as: UTF8.self).contains("the-key"))
        let accepted = session.react(to: controls[1])
        #expect(accepted.signal == .authenticated && !accepted.signal.closes)
        let subscribe = try #require(accepted.send.first.flatMap(spec.decode), "the wanted set is subscribed")
        #expect(subscribe["action"] as? String == "subscribe")
        #expect(String(decoding: accepted.send[0], as: UTF8.self).contains("AAPL"))
        #expect(session.subscribed == wanted)
        session.connectionEnded()
        #expect(session.subscribed.isEmpty)
        // Another protocol's control message is no command.
        let other = Conformance.all.first { $0.wire.name != spec.wire.name }
        if let other {
            let foreign = try other.wire.readUpstream(other.message([], [.connected]), receivedAt: 0, market: other.markets[0]).controls
            #expect(session.react(to: try #require(foreign.first)).send.isEmpty)
        }
    }

    /// A server that greets and accepts the login again on the same connection gets no second login
    /// and no second subscription, and no new login is signalled; the next connection logs in anew.
    @Test(arguments: Conformance.all)
    func aRepeatedGreetingOrLoginIsNotAnswered(_ spec: Conformance) throws {
        var session = spec.wire.upstreamSession(key: "the-key", secret: "the-secret")
        _ = session.want([Topic(eventType: spec.tradeType, ticker: "AAPL")].compactMap { $0 }.reduce(into: []) { $0.insert($1) })
        let controls = try spec.wire.readUpstream(
            spec.message([], [.connected, .authenticated, .connected, .authenticated]), receivedAt: 0, market: spec.markets[0]
        ).controls
        try #require(controls.count == 4)
        #expect(session.react(to: controls[0]).send.count == 1)
        #expect(session.react(to: controls[1]).send.count == 1)
        for again in controls[2...] {
            let reaction = session.react(to: again)
            #expect(reaction.send.isEmpty, "\(spec.wire.name): \(reaction.send.map { String(decoding: $0, as: UTF8.self) })")
            #expect(reaction.signal != .connected && reaction.signal != .authenticated && !reaction.signal.closes)
        }
        session.connectionEnded()
        #expect(session.react(to: controls[0]).send.count == 1, "a new connection logs in")
        #expect(session.react(to: controls[1]).send.count == 1, "and subscribes the wanted set")
    }

    // MARK: events from elsewhere

    /// One whole event of the topic it claims is taken; another topic's, two events, or bytes that are
    /// no event are not.
    @Test(arguments: Conformance.all)
    func anEventFromElsewhereIsCheckedAgainstItsTopic(_ spec: Conformance) throws {
        let topic = try #require(Topic(eventType: spec.tradeType, ticker: "AAPL"))
        func check(_ bytes: [UInt8], _ topic: Topic) -> Result<MarketEvent, WireRejection> {
            bytes.withUnsafeBytes { spec.wire.checkedEvent($0, topic: topic, market: spec.markets[0], receivedAt: 3) }
        }
        let taken = try check(spec.event(spec.tradeType, "AAPL"), topic).get()
        #expect(taken.topic == topic && taken.receivedAt == 3)
        #expect(throws: WireRejection.self) { try check(spec.event(spec.tradeType, "MSFT"), topic).get() }
        #expect(throws: WireRejection.self) { try check(spec.event(spec.tradeType, "AAPL") + spec.event(spec.tradeType, "AAPL"), topic).get() }
        #expect(throws: WireRejection.self) { try check(Array("not an event".utf8), topic).get() }
        #expect(throws: WireRejection.self) { try check([], topic).get() }
    }

    // MARK: markets and prices

    /// A held symbol is priced from topics its market has, and each such event names the symbol back.
    @Test(arguments: Conformance.all)
    func aHeldSymbolIsPricedFromItsMarketsOwnTopics(_ spec: Conformance) throws {
        for market in spec.markets {
            let symbol = market == .crypto ? "X:BTC-USD" : market == .options ? "O:SPY251219C00650000" : "AAPL"
            let topics = spec.wire.priceTopics(of: symbol, market: market).all
            #expect(!topics.isEmpty, "\(spec.wire.name) \(market)")
            let types = spec.wire.eventTypes(of: market)
            #expect(topics.allSatisfy { types.contains($0.eventType) }, "\(topics) in \(types.sorted())")
            #expect(spec.wire.snapshotless(of: market).isSubset(of: types))
            #expect(!spec.wire.stateEventTypes.contains(spec.tradeType), "a trade is never merged")
            #expect(!spec.wire.stateEventTypes.intersection(types).isEmpty, "\(market) has state events to conflate")
            for topic in topics {
                let event = MarketEvent(eventType: topic.eventType, ticker: topic.ticker, bytes: ByteBuffer())
                #expect(spec.wire.heldSymbol(of: event, market: market) == symbol, "\(topic)")
            }
        }
    }

    /// A trade's price and size are read exactly (the decimal text, no binary double in between); an event
    /// that says no price reads as none.
    @Test(arguments: Conformance.all)
    func aTradeIsReadAsItsExactPrice(_ spec: Conformance) throws {
        let reading = try spec.wire.readUpstream(spec.message([(spec.tradeType, "AAPL")], []), receivedAt: 0, market: spec.markets[0])
        let trade = try #require(reading.events.first)
        guard case .trade(let price, let size, _)? = spec.wire.price(in: trade) else {
            Issue.record("\(spec.wire.name): no trade price in \(trade.json)")
            return
        }
        #expect(price == "187.25" && size == "100")
        let notice = spec.wire.render(Notice(.lagging, message: "behind"))
        #expect(spec.wire.price(in: notice) == nil)
    }

    @Test func everyProtocolHasItsOwnName() {
        let names = Conformance.all.map(\.wire.name)
        #expect(Set(names).count == names.count && names.allSatisfy { !$0.isEmpty })
    }
}
