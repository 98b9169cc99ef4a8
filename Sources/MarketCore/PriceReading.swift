/// What an event says about a price, read by its protocol (``WireProtocol/price(in:)``): a trade's (or an
/// index value's) price, or a quote's bid and ask. Numbers are exact decimal text (`187.25`), never a
/// binary floating point value in between; times are Unix nanoseconds where the event has one.
public enum PriceReading: Sendable, Equatable {
    case trade(price: String, size: String?, unixNanoseconds: Int64?)
    case quote(bid: String, bidSize: String?, ask: String, askSize: String?, unixNanoseconds: Int64?)
}

/// The topics that price a held symbol on a market (``WireProtocol/priceTopics(of:market:)``): its
/// trades (or index values), read as ``PriceReading/trade(price:size:unixNanoseconds:)``, and its
/// quotes, read as ``PriceReading/quote(bid:bidSize:ask:askSize:unixNanoseconds:)``. A market priced by
/// one kind only has the other `nil` (Polygon's forex: quotes; its indices: values). Value type, `Sendable`.
public struct PriceTopics: Sendable, Equatable {
    public var trade: Topic?
    public var quote: Topic?

    public init(trade: Topic?, quote: Topic?) {
        (self.trade, self.quote) = (trade, quote)
    }

    /// Every topic, the trades' first.
    public var all: [Topic] { [trade, quote].compactMap { $0 } }
}
