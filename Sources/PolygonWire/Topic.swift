/// A Polygon subscription topic: an event type and a ticker, written `Q.AAPL`, or a wildcard `Q.*`.
///
/// Value type, `Sendable`. Tickers may contain dots (`T.BRK.B`), so the event type ends at the first dot.
public struct Topic: Hashable, Sendable, Comparable, CustomStringConvertible {
    /// The ticker that stands for every ticker of an event type.
    public static let wildcardTicker = "*"

    /// The event type, e.g. `Q`, `T`, `AM`, `XQ`.
    public let eventType: String
    /// The ticker, e.g. `AAPL`, `EUR/USD`, `O:SPY241220P00720000`, or `*`.
    public let ticker: String

    public init(eventType: String, ticker: String) {
        self.eventType = eventType
        self.ticker = ticker
    }

    /// Parses `EV.TICKER`, trimming surrounding white space; `nil` when either part is missing.
    public init?(parsing text: some StringProtocol) {
        let trimmed = text.trimmingWhitespace()
        guard let dot = trimmed.firstIndex(of: ".") else { return nil }
        let eventType = trimmed[..<dot]
        let ticker = trimmed[trimmed.index(after: dot)...]
        guard !eventType.isEmpty, !ticker.isEmpty,
            !eventType.contains(where: { $0 == " " || $0 == "," }),
            !ticker.contains(where: { $0 == " " || $0 == "," })
        else { return nil }
        self.init(eventType: String(eventType), ticker: String(ticker))
    }

    /// The wildcard topic of an event type, `EV.*`.
    public static func wildcard(_ eventType: String) -> Topic {
        Topic(eventType: eventType, ticker: wildcardTicker)
    }

    /// Whether this topic is `EV.*`.
    public var isWildcard: Bool { ticker == Topic.wildcardTicker }

    /// Whether an event of this type and ticker belongs to this topic.
    public func matches(eventType: String, ticker: String) -> Bool {
        self.eventType == eventType && (isWildcard || self.ticker == ticker)
    }

    public var description: String { "\(eventType).\(ticker)" }

    public static func < (lhs: Topic, rhs: Topic) -> Bool { lhs.description < rhs.description }
}

extension Topic {
    /// Splits a Polygon `params` list (`"T.AAPL, Q.MSFT"`) into topics, trimming each entry.
    /// Empty entries are ignored; entries that are not `EV.TICKER` are returned in `invalid`.
    public static func parseList(_ params: String) -> (topics: [Topic], invalid: [String]) {
        var topics: [Topic] = []
        var invalid: [String] = []
        for part in params.split(separator: ",", omittingEmptySubsequences: false) {
            let entry = part.trimmingWhitespace()
            if entry.isEmpty { continue }
            if let topic = Topic(parsing: entry) {
                topics.append(topic)
            } else {
                invalid.append(String(entry))
            }
        }
        return (topics, invalid)
    }

    /// Joins topics into one `params` string, the form Polygon's `subscribe` action takes.
    public static func joinList(_ topics: some Sequence<Topic>) -> String {
        topics.map(\.description).joined(separator: ",")
    }
}

extension StringProtocol {
    func trimmingWhitespace() -> SubSequence {
        var start = startIndex
        var end = endIndex
        while start < end, self[start].isWhitespace { start = index(after: start) }
        while end > start, self[index(before: end)].isWhitespace { end = index(before: end) }
        return self[start..<end]
    }
}
