import Foundation
import MarketDataHub
import NIOCore
import PolygonWire

/// Which REST history fills which WebSocket event type, per market, and how a REST result becomes that
/// event: trades (`/v3/trades`), quotes (`/v3/quotes`) and minute bars (`range/1/minute`). Pure, `Sendable`.
///
/// REST times are Unix ns (`sip_timestamp`, or `participant_timestamp` where there is no SIP), the
/// WebSocket's ms; REST `sequence_number` is the WebSocket's `q`. Fields the REST answer lacks (a bar's
/// `av`, `op`, `a`) are left out rather than invented. Every event ends with `"_r":1`, the recovered flag.
public enum RecoveredEvents {
    public enum Source: Sendable, Equatable {
        case trades, quotes, minuteBars
    }

    /// How `eventType` of `market` is filled, or `nil` when REST has no history of it (second bars,
    /// crypto quotes and books, index values, LULD, NOI, FMV …: those get the outage notice only).
    public static func source(of eventType: String, in market: Market) -> Source? {
        switch (market, eventType) {
        case (.stocks, "T"), (.options, "T"), (.futures, "T"), (.crypto, "XT"): .trades
        case (.stocks, "Q"), (.options, "Q"), (.futures, "Q"), (.forex, "C"): .quotes
        case (.stocks, "AM"), (.options, "AM"), (.futures, "AM"), (.indices, "AM"), (.crypto, "XA"), (.forex, "CA"): .minuteBars
        default: nil
        }
    }

    /// The ticker as the REST API spells it: crypto and forex pairs without their dash (`X:BTCUSD`).
    public static func restTicker(_ ticker: String, in market: Market) -> String {
        market == .crypto || market == .forex ? ticker.filter { $0 != "-" && $0 != "/" } : ticker
    }

    /// An event of `type` built field by field, each value's text copied as it came, ending with the flag.
    struct Builder {
        var buffer: ByteBuffer
        var first = true

        init(type: String, capacity: Int = 256) {
            buffer = ByteBufferAllocator().buffer(capacity: capacity)
            buffer.writeString("{\"ev\":\"\(type)\"")
        }

        mutating func raw(_ name: String, _ text: some Collection<UInt8>) {
            buffer.writeString(",\"\(name)\":")
            buffer.writeBytes(text)
        }

        mutating func raw(_ name: String, _ text: String) {
            buffer.writeString(",\"\(name)\":\(text)")
        }

        mutating func field(_ name: String, _ result: RESTPage.Result, _ field: RESTPage.Field) {
            if let text = result.number(field) { raw(name, text) }
        }

        /// The tail of a stock-shaped trade or quote: `t`, `q`, `z`.
        mutating func timeSequenceTape(_ time: Int64, _ result: RESTPage.Result) {
            raw("t", "\(time)")
            field("q", result, .sequenceNumber)
            field("z", result, .tape)
        }

        mutating func finish() -> ByteBuffer {
            buffer.writeString(",\"_r\":1}")
            return buffer
        }
    }

    /// The ticker field and its value as the market's events carry it.
    static func tickerField(_ ticker: String, in market: Market, bar: Bool = false) -> (String, String) {
        switch market {
        case .crypto: ("pair", StatusMessage.quoted(ticker.hasPrefix("X:") ? String(ticker.dropFirst(2)) : ticker))
        case .forex:
            (bar ? "pair" : "p", StatusMessage.quoted((ticker.hasPrefix("C:") ? String(ticker.dropFirst(2)) : ticker).replacingOccurrences(of: "-", with: "/")))
        default: ("sym", StatusMessage.quoted(ticker))
        }
    }

    /// Unix ms of a trade or quote: SIP time, or the participant's where there is no SIP.
    static func milliseconds(_ result: RESTPage.Result) -> Int64? {
        (result.integer(.sipTimestamp) ?? result.integer(.participantTimestamp)).map { $0 / 1_000_000 }
    }

    static func trade(_ result: RESTPage.Result, type: String, ticker: String, market: Market) -> (MarketEvent, Int64)? {
        guard let time = milliseconds(result), let price = result.number(.price) else { return nil }
        var event = Builder(type: type)
        let (name, value) = tickerField(ticker, in: market)
        event.raw(name, value)
        if market == .crypto {
            event.raw("p", price)
            event.raw("t", "\(time)")
            event.field("s", result, .size)
            if let conditions = result.numbers(.conditions) { event.raw("c", conditions) }
            if let id = result.string(.id) { event.raw("i", id) }
            event.field("x", result, .exchange)
        } else {
            if let id = result.string(.id) { event.raw("i", id) }
            event.field("x", result, .exchange)
            event.raw("p", price)
            event.field("s", result, .size)
            if let conditions = result.numbers(.conditions) { event.raw("c", conditions) }
            event.timeSequenceTape(time, result)
        }
        return (MarketEvent(eventType: type, ticker: ticker, bytes: event.finish()), time)
    }

    static func quote(_ result: RESTPage.Result, type: String, ticker: String, market: Market) -> (MarketEvent, Int64)? {
        guard let time = milliseconds(result) else { return nil }
        var event = Builder(type: type)
        let (name, value) = tickerField(ticker, in: market)
        event.raw(name, value)
        if market == .forex {
            if result.number(.askExchange) != nil { event.field("x", result, .askExchange) } else { event.field("x", result, .bidExchange) }
            event.field("a", result, .askPrice)
            event.field("b", result, .bidPrice)
            event.raw("t", "\(time)")
        } else {
            event.field("bx", result, .bidExchange)
            event.field("bp", result, .bidPrice)
            event.field("bs", result, .bidSize)
            event.field("ax", result, .askExchange)
            event.field("ap", result, .askPrice)
            event.field("as", result, .askSize)
            // The WebSocket's `c` is one condition; REST lists them.
            if let conditions = result.numbers(.conditions), let first = conditions.dropFirst().split(whereSeparator: { $0 == UInt8(ascii: ",") || $0 == UInt8(ascii: "]") }).first {
                event.raw("c", first.filter { $0 != UInt8(ascii: " ") })
            }
            if let indicators = result.numbers(.indicators) { event.raw("i", indicators) }
            event.timeSequenceTape(time, result)
        }
        return (MarketEvent(eventType: type, ticker: ticker, bytes: event.finish()), time)
    }

    static func bar(_ result: RESTPage.Result, type: String, ticker: String, market: Market) -> (MarketEvent, Int64)? {
        guard let start = result.integer(.time), let open = result.number(.open), let high = result.number(.high), let low = result.number(.low),
            let close = result.number(.close)
        else { return nil }
        var event = Builder(type: type)
        let (name, value) = tickerField(ticker, in: market, bar: true)
        event.raw(name, value)
        event.field("v", result, .volume)
        event.field("vw", result, .vwap)
        if market == .crypto { event.field("z", result, .trades) }
        event.raw("o", open)
        event.raw("c", close)
        event.raw("h", high)
        event.raw("l", low)
        if market != .crypto, market != .forex { event.field("z", result, .trades) }
        event.raw("s", "\(start)")
        event.raw("e", "\(start + 60_000)")
        return (MarketEvent(eventType: type, ticker: ticker, bytes: event.finish()), start)
    }
}
