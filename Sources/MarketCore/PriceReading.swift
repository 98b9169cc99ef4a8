/// What an event says about a price, read by its protocol (``WireProtocol/price(in:)``): a trade's (or an
/// index value's) price, or a quote's bid and ask. Numbers are exact decimal text (`187.25`), never a
/// binary floating point value in between; times are Unix nanoseconds where the event has one.
public enum PriceReading: Sendable, Equatable {
    case trade(price: String, size: String?, unixNanoseconds: Int64?)
    case quote(bid: String, bidSize: String?, ask: String, askSize: String?, unixNanoseconds: Int64?)
}
