import NIOCore
import MarketCore

/// Alpaca's events as its stream sends them (MessagePack maps, `t` a timestamp), for the demo feed and
/// tests: the fields Alpaca's SDKs read into their models. Pure.
public enum AlpacaEvents {
    /// A timestamp from Unix nanoseconds.
    public static func time(nanoseconds: Int64) -> MessagePack.Value {
        let seconds = nanoseconds >= 0 ? nanoseconds / 1_000_000_000 : (nanoseconds - 999_999_999) / 1_000_000_000
        return .timestamp(seconds: seconds, nanoseconds: UInt32(nanoseconds - seconds * 1_000_000_000))
    }

    /// A stock trade (`T` `t`): id, exchange, price, size, conditions, tape; a crypto trade has a
    /// fractional size and the taker side (`tks`) instead of exchange, conditions and tape.
    public static func trade(
        _ symbol: String, id: Int64, price: Double, size: Double, nanoseconds: Int64, crypto: Bool = false, extra: [(String, MessagePack.Value)] = []
    ) -> MarketEvent {
        var fields: [(String, MessagePack.Value)] = [("T", .string("t")), ("S", .string(symbol)), ("i", .int(id))]
        if crypto {
            fields += [("p", .double(price)), ("s", .double(size)), ("t", time(nanoseconds: nanoseconds)), ("tks", .string(id % 2 == 0 ? "B" : "S"))]
        } else {
            fields += [
                ("x", .string("V")), ("p", .double(price)), ("s", .int(Int64(size))), ("c", .array([.string("@")])), ("z", .string("C")),
                ("t", time(nanoseconds: nanoseconds)),
            ]
        }
        return event("t", symbol, fields + extra)
    }

    /// An option trade (`T` `t`, symbol in OCC form `SPY251219C00650000`): exchange, price, contracts,
    /// one condition letter.
    public static func optionTrade(
        _ symbol: String, price: Double, size: Int64, nanoseconds: Int64, extra: [(String, MessagePack.Value)] = []
    ) -> MarketEvent {
        event(
            "t", symbol,
            [
                ("T", .string("t")), ("S", .string(symbol)), ("t", time(nanoseconds: nanoseconds)), ("x", .string("C")), ("p", .double(price)),
                ("s", .int(size)), ("c", .string("I")),
            ] + extra)
    }

    /// An option quote (`T` `q`): bid and ask with their exchanges and sizes, one condition letter.
    public static func optionQuote(
        _ symbol: String, bid: Double, ask: Double, bidSize: Int64, askSize: Int64, nanoseconds: Int64, extra: [(String, MessagePack.Value)] = []
    ) -> MarketEvent {
        event(
            "q", symbol,
            [
                ("T", .string("q")), ("S", .string(symbol)), ("t", time(nanoseconds: nanoseconds)), ("bx", .string("C")), ("bp", .double(bid)),
                ("bs", .int(bidSize)), ("ax", .string("C")), ("ap", .double(ask)), ("as", .int(askSize)), ("c", .string("A")),
            ] + extra)
    }

    /// A quote (`T` `q`): bid and ask price and size (stocks also their exchanges, conditions and tape).
    public static func quote(
        _ symbol: String, bid: Double, ask: Double, size: Double, nanoseconds: Int64, crypto: Bool = false, extra: [(String, MessagePack.Value)] = []
    ) -> MarketEvent {
        var fields: [(String, MessagePack.Value)] = [("T", .string("q")), ("S", .string(symbol))]
        if crypto {
            fields += [("bp", .double(bid)), ("bs", .double(size)), ("ap", .double(ask)), ("as", .double(size)), ("t", time(nanoseconds: nanoseconds))]
        } else {
            fields += [
                ("bx", .string("V")), ("bp", .double(bid)), ("bs", .int(Int64(size))), ("ax", .string("V")), ("ap", .double(ask)),
                ("as", .int(Int64(size))), ("c", .array([.string("R")])), ("z", .string("C")), ("t", time(nanoseconds: nanoseconds)),
            ]
        }
        return event("q", symbol, fields + extra)
    }

    /// A minute bar (`T` `b`; `d` daily, `u` updated): open, high, low, close, volume, start, trades,
    /// volume-weighted price.
    public static func bar(
        _ symbol: String, type: String = "b", open: Double, high: Double, low: Double, close: Double, volume: Double, trades: Int64,
        startNanoseconds: Int64
    ) -> MarketEvent {
        event(
            type, symbol,
            [
                ("T", .string(type)), ("S", .string(symbol)), ("o", .double(open)), ("h", .double(high)), ("l", .double(low)),
                ("c", .double(close)), ("v", volume.rounded() == volume ? .int(Int64(volume)) : .double(volume)),
                ("t", time(nanoseconds: startNanoseconds)), ("n", .int(trades)), ("vw", .double((open + high + low + close) / 4)),
            ])
    }

    public static func event(_ type: String, _ symbol: String, _ fields: [(String, MessagePack.Value)]) -> MarketEvent {
        var writer = MessagePack.Writer(capacity: 96)
        writer.mapHeader(fields.count)
        for (key, value) in fields {
            writer.string(key)
            writer.value(value)
        }
        return MarketEvent(
            eventType: type, ticker: symbol, bytes: ByteBuffer(bytes: writer.bytes), receivedAt: MonotonicClock.nanoseconds())
    }
}
