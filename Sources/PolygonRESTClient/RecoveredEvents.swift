import Foundation
import NIOCore
import MarketCore

/// Which REST history fills which WebSocket event type, per market, and how a REST result becomes that
/// event: trades (`/v3/trades`), quotes (`/v3/quotes`) and minute bars (`range/1/minute`). Pure, `Sendable`.
///
/// REST times are Unix ns (`sip_timestamp`, or `participant_timestamp` where there is no SIP), the
/// WebSocket's ms; REST `sequence_number` is the WebSocket's `q`. Fields the REST answer lacks (a bar's
/// `av`, `op`, `a`) are left out rather than invented, and so is a bar's `z`: on the WebSocket it is the
/// average trade size, while REST gives the trade count `n`, whose quotient `v/n` is not what the
/// vendor's own bar says when volume was adjusted. Every value is checked before it is copied (a JSON number, a
/// valid string, a plausible time): a REST answer can never put invalid JSON into a client's frame. Every event ends with `"_r":1`, the recovered flag.
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
    /// A field the result has but whose value is not of its kind makes the whole event malformed.
    struct Builder {
        var buffer: ByteBuffer
        var malformed = false

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

        /// A number field, when the result has it.
        mutating func field(_ name: String, _ result: RESTPage.Result, _ field: RESTPage.Field) {
            copy(name, result, field, result.number(field))
        }

        /// A string field, when the result has it.
        mutating func string(_ name: String, _ result: RESTPage.Result, _ field: RESTPage.Field) {
            copy(name, result, field, result.string(field))
        }

        /// A list of numbers, when the result has it.
        mutating func numbers(_ name: String, _ result: RESTPage.Result, _ field: RESTPage.Field) {
            copy(name, result, field, result.numbers(field))
        }

        private mutating func copy(_ name: String, _ result: RESTPage.Result, _ field: RESTPage.Field, _ text: ArraySlice<UInt8>?) {
            guard result.has(field) else { return }
            if let text { raw(name, text) } else { malformed = true }
        }

        /// The tail of a stock-shaped trade or quote: `t`, `q`, `z`.
        mutating func timeSequenceTape(_ time: Int64, _ result: RESTPage.Result) {
            raw("t", "\(time)")
            field("q", result, .sequenceNumber)
            field("z", result, .tape)
        }

        /// The event, or `nil` when a field was malformed.
        mutating func finish() -> ByteBuffer? {
            guard !malformed else { return nil }
            buffer.writeString(",\"_r\":1}")
            return buffer
        }
    }

    /// The ticker field and its value as the market's events carry it.
    static func tickerField(_ ticker: String, in market: Market, bar: Bool = false) -> (String, String) {
        switch market {
        case .crypto: ("pair", quoted(ticker.hasPrefix("X:") ? String(ticker.dropFirst(2)) : ticker))
        case .forex:
            (bar ? "pair" : "p", quoted((ticker.hasPrefix("C:") ? String(ticker.dropFirst(2)) : ticker).replacingOccurrences(of: "-", with: "/")))
        default: ("sym", quoted(ticker))
        }
    }

    /// The times a REST result may carry, Unix ms: 1970 to 2100. Anything else is refused before any
    /// arithmetic is done on it (a bar's end is its start plus a minute).
    public static let plausibleMilliseconds: ClosedRange<Int64> = 0...4_102_444_800_000

    /// Unix ms of a trade or quote: SIP time, or the participant's where there is no SIP; `nil` when
    /// neither is a plausible time.
    /// A JSON string value.
    private static func quoted(_ text: String) -> String { "\"" + JSONText.escape(text) + "\"" }

    static func milliseconds(_ result: RESTPage.Result) -> Int64? {
        guard let nanoseconds = result.integer(.sipTimestamp) ?? result.integer(.participantTimestamp), nanoseconds > 0 else { return nil }
        let milliseconds = nanoseconds / 1_000_000
        return plausibleMilliseconds.contains(milliseconds) ? milliseconds : nil
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
            event.numbers("c", result, .conditions)
            event.string("i", result, .id)
            event.field("x", result, .exchange)
        } else {
            event.string("i", result, .id)
            event.field("x", result, .exchange)
            event.raw("p", price)
            event.field("s", result, .size)
            event.numbers("c", result, .conditions)
            event.timeSequenceTape(time, result)
        }
        return event.finish().map { (MarketEvent(eventType: type, ticker: ticker, bytes: $0), time) }
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
            if result.has(.conditions) {
                if let conditions = result.numbers(.conditions) {
                    if let first = conditions.dropFirst().split(whereSeparator: { $0 == UInt8(ascii: ",") || $0 == UInt8(ascii: "]") }).first {
                        event.raw("c", RESTPage.trimmed(first))
                    }
                } else {
                    event.malformed = true
                }
            }
            event.numbers("i", result, .indicators)
            event.timeSequenceTape(time, result)
        }
        return event.finish().map { (MarketEvent(eventType: type, ticker: ticker, bytes: $0), time) }
    }

    static func bar(_ result: RESTPage.Result, type: String, ticker: String, market: Market) -> (MarketEvent, Int64)? {
        guard let start = result.integer(.time), plausibleMilliseconds.contains(start), let open = result.number(.open), let high = result.number(.high), let low = result.number(.low),
            let close = result.number(.close)
        else { return nil }
        var event = Builder(type: type)
        let (name, value) = tickerField(ticker, in: market, bar: true)
        event.raw(name, value)
        event.field("v", result, .volume)
        event.field("vw", result, .vwap)
        event.raw("o", open)
        event.raw("c", close)
        event.raw("h", high)
        event.raw("l", low)
        event.raw("s", "\(start)")
        event.raw("e", "\(start + 60_000)")
        return event.finish().map { (MarketEvent(eventType: type, ticker: ticker, bytes: $0), start) }
    }
}
