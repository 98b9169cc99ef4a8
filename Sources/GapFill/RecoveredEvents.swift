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

    /// What orders a type's events against the live ones: `q` where the WebSocket carries it.
    public static func order(of eventType: String) -> RecoveryOrder {
        switch eventType {
        case "T", "Q": .sequence
        case "AM", "XA", "CA": .barStart
        default: .time
        }
    }

    /// The ticker as the REST API spells it: crypto and forex pairs without their dash (`X:BTCUSD`).
    public static func restTicker(_ ticker: String, in market: Market) -> String {
        market == .crypto || market == .forex ? ticker.filter { $0 != "-" && $0 != "/" } : ticker
    }

    /// A page of REST results and where the next one is.
    struct Page<Result: Decodable>: Decodable {
        var results: [Result]?
        var next_url: String?
    }

    struct Trade: Decodable {
        var conditions: [Int]?
        var exchange: Int?
        var id: String?
        var price: Double
        var sequence_number: Int64?
        var sip_timestamp: Int64?
        var participant_timestamp: Int64?
        var size: Double?
        var tape: Int?
    }

    struct Quote: Decodable {
        var ask_exchange: Int?
        var ask_price: Double?
        var ask_size: Double?
        var bid_exchange: Int?
        var bid_price: Double?
        var bid_size: Double?
        var conditions: [Int]?
        var indicators: [Int]?
        var sequence_number: Int64?
        var sip_timestamp: Int64?
        var participant_timestamp: Int64?
        var tape: Int?
    }

    struct Bar: Decodable {
        var o: Double
        var h: Double
        var l: Double
        var c: Double
        var v: Double?
        var vw: Double?
        var t: Int64
        var n: Int?
    }

    /// A JSON number as short as it reads: integers without a fraction, others as Swift prints a
    /// `Double` (the shortest text that reads back the same: `189.05`).
    static func number(_ value: Double) -> String {
        if value == value.rounded(), abs(value) < 1e15 { return String(Int64(value)) }
        return "\(value)"
    }

    /// The ticker field and its value as the market's events carry it.
    static func tickerField(_ ticker: String, in market: Market) -> String {
        switch market {
        case .crypto: #""pair":"\#(ticker.hasPrefix("X:") ? String(ticker.dropFirst(2)) : ticker)""#
        case .forex: #""p":"\#((ticker.hasPrefix("C:") ? String(ticker.dropFirst(2)) : ticker).replacingOccurrences(of: "-", with: "/"))""#
        default: #""sym":"\#(ticker)""#
        }
    }

    static func milliseconds(_ sip: Int64?, _ participant: Int64?) -> Int64? { (sip ?? participant).map { $0 / 1_000_000 } }

    static func event(_ type: String, _ ticker: String, _ fields: [String]) -> MarketEvent {
        let json = "{\"ev\":\"\(type)\"," + fields.joined(separator: ",") + ",\"_r\":1}"
        return MarketEvent(eventType: type, ticker: ticker, bytes: ByteBuffer(string: json))
    }

    static func trade(_ trade: Trade, type: String, ticker: String, market: Market) -> (MarketEvent, Int64)? {
        guard let time = milliseconds(trade.sip_timestamp, trade.participant_timestamp) else { return nil }
        var fields = [tickerField(ticker, in: market)]
        if market == .crypto {
            fields.append("\"p\":\(number(trade.price))")
            fields.append("\"t\":\(time)")
            if let size = trade.size { fields.append("\"s\":\(number(size))") }
            if let conditions = trade.conditions { fields.append("\"c\":[\(conditions.map(String.init).joined(separator: ","))]") }
            if let id = trade.id { fields.append("\"i\":\(StatusMessage.quoted(id))") }
            if let exchange = trade.exchange { fields.append("\"x\":\(exchange)") }
        } else {
            if let id = trade.id { fields.append("\"i\":\(StatusMessage.quoted(id))") }
            if let exchange = trade.exchange { fields.append("\"x\":\(exchange)") }
            fields.append("\"p\":\(number(trade.price))")
            if let size = trade.size { fields.append("\"s\":\(number(size))") }
            if let conditions = trade.conditions { fields.append("\"c\":[\(conditions.map(String.init).joined(separator: ","))]") }
            fields.append("\"t\":\(time)")
            if let sequence = trade.sequence_number { fields.append("\"q\":\(sequence)") }
            if let tape = trade.tape { fields.append("\"z\":\(tape)") }
        }
        return (event(type, ticker, fields), time)
    }

    static func quote(_ quote: Quote, type: String, ticker: String, market: Market) -> (MarketEvent, Int64)? {
        guard let time = milliseconds(quote.sip_timestamp, quote.participant_timestamp) else { return nil }
        var fields = [tickerField(ticker, in: market)]
        if market == .forex {
            if let exchange = quote.ask_exchange ?? quote.bid_exchange { fields.append("\"x\":\(exchange)") }
            if let ask = quote.ask_price { fields.append("\"a\":\(number(ask))") }
            if let bid = quote.bid_price { fields.append("\"b\":\(number(bid))") }
            fields.append("\"t\":\(time)")
        } else {
            if let exchange = quote.bid_exchange { fields.append("\"bx\":\(exchange)") }
            if let bid = quote.bid_price { fields.append("\"bp\":\(number(bid))") }
            if let size = quote.bid_size { fields.append("\"bs\":\(number(size))") }
            if let exchange = quote.ask_exchange { fields.append("\"ax\":\(exchange)") }
            if let ask = quote.ask_price { fields.append("\"ap\":\(number(ask))") }
            if let size = quote.ask_size { fields.append("\"as\":\(number(size))") }
            if let condition = quote.conditions?.first { fields.append("\"c\":\(condition)") }
            if let indicators = quote.indicators { fields.append("\"i\":[\(indicators.map(String.init).joined(separator: ","))]") }
            fields.append("\"t\":\(time)")
            if let sequence = quote.sequence_number { fields.append("\"q\":\(sequence)") }
            if let tape = quote.tape { fields.append("\"z\":\(tape)") }
        }
        return (event(type, ticker, fields), time)
    }

    static func bar(_ bar: Bar, type: String, ticker: String, market: Market) -> (MarketEvent, Int64) {
        var fields = [market == .forex ? #""pair":"\#(String(ticker.dropFirst(2)).replacingOccurrences(of: "-", with: "/"))""# : tickerField(ticker, in: market)]
        if let volume = bar.v { fields.append("\"v\":\(number(volume))") }
        if let vwap = bar.vw { fields.append("\"vw\":\(number(vwap))") }
        if market == .crypto, let trades = bar.n { fields.append("\"z\":\(trades)") }
        fields += ["\"o\":\(number(bar.o))", "\"c\":\(number(bar.c))", "\"h\":\(number(bar.h))", "\"l\":\(number(bar.l))"]
        if market != .crypto, market != .forex, let trades = bar.n { fields.append("\"z\":\(trades)") }
        fields += ["\"s\":\(bar.t)", "\"e\":\(bar.t + 60_000)"]
        return (event(type, ticker, fields), bar.t)
    }
}
