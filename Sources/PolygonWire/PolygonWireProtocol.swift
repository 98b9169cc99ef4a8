import MarketCore
import NIOCore

/// Polygon's (Massive's) protocol behind the relay's seam: JSON frames of event objects, each market at
/// its own path, notices as status objects (`{"ev":"status","status":…,"message":…}`). Value type,
/// `Sendable`; market-independent.
public struct PolygonWireProtocol: WireProtocol {
    public init() {}

    public var name: String { "polygon" }

    /// A status object: the notice's kind as `status` (a refusal is Polygon's own `error`), its sentence
    /// as `message`, then its details (numbers first, each group by key).
    public func render(_ notice: Notice) -> MarketEvent {
        let status = notice.kind == .refused ? StatusMessage.Kind.error : notice.kind.rawValue
        var text = #"{"ev":"status","status":"\#(JSONText.escape(status))","message":"\#(JSONText.escape(notice.message))""#
        for detail in notice.orderedDetails {
            text += #","\#(JSONText.escape(detail.key))":"#
            Self.write(detail.value, to: &text)
        }
        return .notice(notice.kind, bytes: ByteBuffer(string: text + "}"))
    }

    /// A notice detail as JSON.
    static func write(_ value: Notice.Value, to text: inout String) {
        switch value {
        case .number(let number): text += String(number)
        case .text(let string): text += "\"" + JSONText.escape(string) + "\""
        case .flag(let flag): text += flag ? "true" : "false"
        case .list(let values):
            text += "["
            for (index, value) in values.enumerated() {
                if index > 0 { text += "," }
                write(value, to: &text)
            }
            text += "]"
        case .object(let details):
            text += "{"
            for (index, detail) in details.enumerated() {
                if index > 0 { text += "," }
                text += "\"" + JSONText.escape(detail.key) + "\":"
                write(detail.value, to: &text)
            }
            text += "}"
        }
    }

    public func eventTypes(of market: Market) -> Set<String> { market.eventTypes }

    public func cappedEventTypes(of market: Market) -> Set<String> { market.cappedEventTypes }

    /// Exactly one JSON object (no array, nothing after it): a market event whose `ev` and ticker field
    /// name `topic` (the ticker in `market`'s topic form: a crypto `pair` `BTC-USD` names `X:BTC-USD`).
    public func checkedEvent(_ payload: UnsafeRawBufferPointer, topic: Topic, market: Market, receivedAt: UInt64) -> Result<MarketEvent, WireRejection> {
        guard let first = payload.first(where: { !JSONText.isSpace($0) }), first == UInt8(ascii: "{") else {
            return .failure(WireRejection("not one JSON object (\(payload.count) bytes)"))
        }
        let parsed: ParsedFrame
        do {
            parsed = try FrameParser.parse(ByteBuffer(bytes: payload), receivedAt: receivedAt, market: market)
        } catch {
            return .failure(WireRejection("malformed JSON: \(error)"))
        }
        guard parsed.statuses.isEmpty, parsed.events.count == 1, let event = parsed.events.first else {
            return .failure(WireRejection("not a market event"))
        }
        guard event.eventType == topic.eventType, event.ticker == topic.ticker else {
            return .failure(WireRejection("an event of \(event.topic) on the subject of \(topic)"))
        }
        return .success(event)
    }

    /// Polygon's last values are all snapshots.
    public func snapshotless(of market: Market) -> Set<String> { [] }

    /// None: Polygon's one book, crypto `XL2`, sends up to 100 levels per side in every message (each one
    /// the top of the book, not a change to it), so its last event is already a whole book.
    public func folding(of market: Market, limits: FoldLimits) -> TopicFolding? { nil }

    /// Stocks' and crypto's trades make derived bars.
    public func barRules(of market: Market) -> (any BarRules)? { PolygonBarRules(market: market) }

    /// Quotes (`Q`, `XQ`, `C`), aggregates (`A`, `AM`, `XA`, `CA`), index values (`V`), fair market values
    /// (`FMV`) and last values (`LV`); not trades, LULD bands or imbalances.
    public var stateEventTypes: Set<String> { ["Q", "XQ", "C", "A", "AM", "XA", "CA", "V", "FMV", "LV"] }

    /// A ticker's trades and quotes (`T`/`Q`; crypto `XT`/`XQ`; forex quotes `C`; index values `V`).
    public func priceTopics(of symbol: String, market: Market) -> PriceTopics {
        let (trade, quote): (String?, String?) =
            switch market {
            case .crypto: ("XT", "XQ")
            case .forex: (nil, "C")
            case .indices: ("V", nil)
            default: ("T", "Q")
            }
        return PriceTopics(trade: trade.flatMap { Topic(eventType: $0, ticker: symbol) }, quote: quote.flatMap { Topic(eventType: $0, ticker: symbol) })
    }

    /// Polygon's events carry the relay's ticker itself.
    public func heldSymbol(of event: MarketEvent, market: Market) -> String { event.ticker }

    /// Trades (`T`, crypto `XT`) and index values (`V`, `val`) are prices; quotes (`Q`, crypto `XQ`, forex
    /// `C` with `b`/`a` and no sizes) bids and asks. Each number is its own text in the event; `t` is ms.
    public func price(in event: MarketEvent) -> PriceReading? {
        let text = String(buffer: event.bytes)
        let at = Self.numberText("t", in: text).flatMap { Int64($0) }.map { $0 &* 1_000_000 }
        switch event.eventType {
        case "T", "XT", "V":
            guard let price = Self.numberText(event.eventType == "V" ? "val" : "p", in: text) else { return nil }
            return .trade(price: price, size: Self.numberText("s", in: text), unixNanoseconds: at)
        case "Q", "XQ", "C":
            let forex = event.eventType == "C"
            guard let bid = Self.numberText(forex ? "b" : "bp", in: text), let ask = Self.numberText(forex ? "a" : "ap", in: text) else {
                return nil
            }
            return .quote(
                bid: bid, bidSize: forex ? nil : Self.numberText("bs", in: text), ask: ask, askSize: forex ? nil : Self.numberText("as", in: text),
                unixNanoseconds: at)
        default:
            return nil
        }
    }

    /// The raw text of a top-level numeric field (`"p":189.05` → `189.05`), or `nil`: in an event or a
    /// REST answer.
    public static func numberText(_ field: String, in text: String) -> String? {
        guard let key = text.range(of: "\"\(field)\":") else { return nil }
        var end = key.upperBound
        while end < text.endIndex, "-0123456789.eE+".contains(text[end]) { end = text.index(after: end) }
        return end > key.upperBound ? String(text[key.upperBound..<end]) : nil
    }

    // MARK: the upstream

    public func upstreamSession(key: String, secret: String?) -> any UpstreamSession { ClientSession(apiKey: key) }

    /// A JSON array of event objects and status objects (``FrameParser``).
    public func readUpstream(_ message: ByteBuffer, receivedAt: UInt64, market: Market) throws -> UpstreamReading {
        let parsed = try FrameParser.parse(message, receivedAt: receivedAt, market: market)
        // The vendor's words, bounded and printable: they reach logs, `/healthz` and clients' notices.
        let controls = parsed.statuses.map {
            UpstreamControl(
                StatusMessage(status: VisibleText.visible($0.status, limit: 64), message: VisibleText.visible($0.message, limit: VisibleText.vendorBytes)))
        }
        return UpstreamReading(events: parsed.events, controls: controls)
    }

    public var upstreamSendsBinary: Bool { false }
    public var upstreamUpgradeHeader: (name: String, value: String)? { nil }
}

extension WireProtocol where Self == PolygonWireProtocol {
    /// Polygon's protocol.
    public static var polygon: PolygonWireProtocol { PolygonWireProtocol() }
}

extension WireVendor {
    /// Polygon (Massive): its hosts, its protocol on every market.
    public static let polygon = WireVendor(
        name: "polygon", ownsHost: { $0.hasSuffix("polygon.io") || $0.hasSuffix("massive.com") },
        wireProtocol: { _, _ in PolygonWireProtocol() })
}
