/// How large an event taken from outside the process may be, and how long its ticker. An upstream's
/// events (`UpstreamEventCheck`) and a cluster's (`ClusterChecks`) keep the same bounds: past them the
/// hub would keep, as a topic's last value and in its history, what nobody bounded in bytes. Value
/// type, `Sendable`.
public struct EventBounds: Sendable, Equatable {
    /// The largest event, in bytes.
    public var maxBytes: Int
    /// The longest ticker, in bytes (a client could name no longer one: ``SessionLimits/maxTickerLength``).
    public var maxTickerLength: Int

    public init(maxBytes: Int, maxTickerLength: Int = SessionLimits().maxTickerLength) {
        self.maxBytes = maxBytes
        self.maxTickerLength = maxTickerLength
    }

    /// Why an event of `bytes` bytes under `ticker` is out of bounds, or `nil` when it is not.
    /// `maxBytes` replaces the byte bound for this one event (a whole order book may take a message).
    public func problem(bytes: Int, ticker: String, maxBytes limit: Int? = nil) -> String? {
        let limit = limit ?? maxBytes
        if bytes > limit { return "an event of \(bytes) bytes (at most \(limit))" }
        let length = ticker.utf8.count
        return length > maxTickerLength ? "a ticker of \(length) bytes (at most \(maxTickerLength))" : nil
    }
}
