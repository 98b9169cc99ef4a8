import MarketCore
import NIOCore

/// Alpaca's market-data protocol behind the relay's seam, for one of its feeds: MessagePack maps (JSON
/// to a client that asks for it), the feed's paths, notices as `{"T":"relay","status":…,"msg":…}` maps
/// (a `T` the SDKs pass over), a refusal as Alpaca's own error with its code. Value type, `Sendable`.
public struct AlpacaWireProtocol: WireProtocol {
    /// The feed this market is served as (its paths and channels).
    public let feed: AlpacaFeed

    public init(feed: AlpacaFeed) {
        self.feed = feed
    }

    public var name: String { "alpaca" }

    /// A MessagePack map, as Alpaca's events are: framed like them, alone in its frame. A refusal whose
    /// code is one of Alpaca's errors is that error (the SDKs log it, as they would Alpaca's).
    public func render(_ notice: Notice) -> MarketEvent {
        .notice(notice.kind, bytes: ByteBuffer(bytes: MessagePack.encode(Self.map(notice))))
    }

    static func map(_ notice: Notice) -> MessagePack.Value {
        if notice.kind == .refused, case .number(let code)? = notice.details["code"], let error = AlpacaError(rawValue: Int(code)) {
            return error.message(detail: notice.message)
        }
        let status = notice.kind == .refused ? "error" : notice.kind.rawValue
        var entries: [MessagePack.Value.Entry] = [
            .init(.string("T"), .string(AlpacaControl.noticeType)), .init(.string("status"), .string(status)),
            .init(.string("msg"), .string(notice.message)),
        ]
        for detail in notice.orderedDetails { entries.append(.init(.string(detail.key), value(detail.value))) }
        return .map(entries)
    }

    private static func value(_ value: Notice.Value) -> MessagePack.Value {
        switch value {
        case .number(let number): .int(number)
        case .text(let text): .string(text)
        case .flag(let flag): .bool(flag)
        case .list(let values): .array(values.map { Self.value($0) })
        case .object(let details): .map(details.map { .init(.string($0.key), Self.value($0.value)) })
        }
    }

    public func eventTypes(of market: Market) -> Set<String> { feed.eventTypes }

    /// Alpaca's events are ordered by their time; the relay has no REST history of them to fill (gap
    /// fill runs on Polygon's markets), so none is read.
    public func recoveryOrder(of eventType: String) -> RecoveryOrder { .time }

    public func orderValue(_ order: RecoveryOrder, of event: MarketEvent) -> Int64? { nil }

    /// Alpaca caps no channel by a ticker count per connection that the relay must keep.
    public func cappedEventTypes(of market: Market) -> Set<String> { [] }

    /// Exactly one MessagePack map whose `T` and `S` name `topic`.
    public func checkedEvent(_ payload: UnsafeRawBufferPointer, topic: Topic, market: Market, receivedAt: UInt64) -> Result<MarketEvent, WireRejection> {
        let item: AlpacaFrame.Item
        do {
            item = try AlpacaFrame.readOne(payload)
        } catch {
            return .failure(WireRejection("malformed MessagePack: \(error)"))
        }
        switch item {
        case .event(let type, let symbol, _):
            guard type == topic.eventType, symbol == topic.ticker else {
                return .failure(WireRejection("an event of \(type).\(symbol) on the subject of \(topic)"))
            }
            return .success(MarketEvent(eventType: type, ticker: symbol, bytes: ByteBuffer(bytes: payload), receivedAt: receivedAt))
        case .news(let symbols, _):
            // A news item travels once per symbol it is routed by: this subject's must be one of them.
            guard topic.eventType == AlpacaNews.eventType, AlpacaNews.routes(symbols).contains(topic.ticker) else {
                return .failure(WireRejection("a news item of \(symbols.prefix(5).joined(separator: ",")) on the subject of \(topic)"))
            }
            return .success(MarketEvent(eventType: AlpacaNews.eventType, ticker: topic.ticker, bytes: ByteBuffer(bytes: payload), receivedAt: receivedAt))
        default:
            return .failure(WireRejection("not one Alpaca event (\(payload.count) bytes)"))
        }
    }

    /// Corrections and cancel errors (one-off events a new subscriber would take for new ones) and order
    /// book updates (changes that mean nothing alone).
    public func snapshotless(of market: Market) -> Set<String> { AlpacaChannel.snapshotless.intersection(eventTypes(of: market)) }

    /// Crypto order books (`o`): each carried book is kept from its increments (``AlpacaOrderBook``), so
    /// a subscriber that joins after the vendor's whole book (`"r":true`) went by gets the book first.
    /// A stock or crypto feed's trades make derived bars.
    public func barRules(of market: Market) -> (any BarRules)? { AlpacaBarRules(feed: feed) }

    public func folding(of market: Market, limits: FoldLimits) -> TopicFolding? {
        let type = AlpacaChannel.orderbooks.eventType
        guard eventTypes(of: market).contains(type) else { return nil }
        let levels = limits.bookLevels
        return TopicFolding(eventTypes: [type]) { topic in AlpacaOrderBook(symbol: topic.ticker, levels: levels) }
    }

    /// Quotes and bars (minute, updated, daily); not trades, statuses, LULD bands, corrections or order
    /// book updates (increments).
    public var stateEventTypes: Set<String> {
        Set([AlpacaChannel.quotes, .bars, .updatedBars, .dailyBars].map(\.eventType))
    }

    /// Trades and quotes (`t`/`q`) of the symbol as Alpaca names it (`X:BTC-USD` is `BTC/USD`,
    /// `O:SPY251219C00650000` is `SPY251219C00650000`).
    public func priceTopics(of symbol: String, market: Market) -> PriceTopics {
        let ticker = AlpacaSymbol.of(symbol, market: market)
        return PriceTopics(trade: Topic(eventType: "t", ticker: ticker), quote: Topic(eventType: "q", ticker: ticker))
    }

    /// The relay's ticker for the event's Alpaca symbol.
    public func heldSymbol(of event: MarketEvent, market: Market) -> String { AlpacaSymbol.ticker(of: event.ticker, market: market) }

    /// A trade (`t`: `p`, `s`) or a quote (`q`: `bp`, `bs`, `ap`, `as`), its doubles at their shortest
    /// decimal text (`187.25`, not `187.2500000001`), `t` a MessagePack timestamp.
    public func price(in event: MarketEvent) -> PriceReading? {
        guard event.eventType == "t" || event.eventType == "q",
            let value = try? MessagePack.decode(event.bytes.readableBytesView), case .map = value
        else { return nil }
        func number(_ field: String) -> String? {
            switch value[field] {
            case .double(let number)?: number.isFinite ? "\(number)" : nil
            case let other?: other.integer.map { "\($0)" }
            case nil: nil
            }
        }
        var at: Int64?
        if case .timestamp(let seconds, let nanoseconds)? = value["t"] { at = seconds &* 1_000_000_000 &+ Int64(nanoseconds) }
        if event.eventType == "t" {
            return number("p").map { .trade(price: $0, size: number("s"), unixNanoseconds: at) }
        }
        guard let bid = number("bp"), let ask = number("ap") else { return nil }
        return .quote(bid: bid, bidSize: number("bs"), ask: ask, askSize: number("as"), unixNanoseconds: at)
    }

    // MARK: the upstream

    public func upstreamSession(key: String, secret: String?) -> any UpstreamSession {
        AlpacaClientSession(key: key, secret: secret ?? "")
    }

    /// A MessagePack array of maps (``AlpacaFrame``): each event kept as its own bytes in the message.
    public func readUpstream(_ message: ByteBuffer, receivedAt: UInt64, market: Market) throws -> UpstreamReading {
        var reading = UpstreamReading()
        let items = try message.withUnsafeReadableBytes { try AlpacaFrame.read($0) }
        var routedBytes = AlpacaNews.routedBytes(ofMessage: message.readableBytes)
        for item in items {
            switch item {
            case .event(let type, let symbol, let range):
                guard let bytes = message.getSlice(at: message.readerIndex + range.lowerBound, length: range.count) else { continue }
                reading.events.append(MarketEvent(eventType: type, ticker: symbol, bytes: bytes, receivedAt: receivedAt))
            case .news(let symbols, let range):
                // Its routes share the item's slice (and, where a large message is compacted, one copy).
                guard let bytes = message.getSlice(at: message.readerIndex + range.lowerBound, length: range.count) else { continue }
                reading.events += AlpacaNews.events(bytes, symbols: symbols, receivedAt: receivedAt, routedBytes: &routedBytes)
            case .control(let value): reading.controls.append(UpstreamControl(value))
            case .unknown: break
            }
        }
        return reading
    }

    /// Alpaca's client messages are MessagePack, in binary frames.
    public var upstreamSendsBinary: Bool { true }
    /// MessagePack frames, please.
    public var upstreamUpgradeHeader: (name: String, value: String)? { ("content-type:", "application/msgpack") }
}

extension WireProtocol where Self == AlpacaWireProtocol {
    /// Alpaca's protocol, served as `feed`.
    public static func alpaca(_ feed: AlpacaFeed) -> AlpacaWireProtocol { AlpacaWireProtocol(feed: feed) }
}

extension WireVendor {
    /// Alpaca: its hosts, its feed paths (`/v2/iex` names stocks), a key id and a secret, and the protocol
    /// of the feed an upstream's path names, else the market's usual feed.
    public static let alpaca = WireVendor(
        name: "alpaca", signsInWithSecret: true, ownsHost: { $0.hasSuffix("alpaca.markets") },
        marketOfPath: { AlpacaFeed(path: $0)?.market },
        wireProtocol: { market, path in AlpacaWireProtocol(feed: path.flatMap(AlpacaFeed.init(path:)) ?? .standard(for: market)) })
}
