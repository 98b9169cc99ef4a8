/// A Polygon subscription topic: an event type and a ticker, written `Q.AAPL`, or a wildcard `Q.*`.
///
/// Value type, `Sendable`. Tickers may contain dots (`T.BRK.B`), so the event type ends at the first dot.
///
/// A topic cannot carry a separator of Polygon's `params` list, whatever path it comes from (a client
/// message, a portfolio symbol, NATS): the event type is letters and digits, the ticker is `*` or
/// letters, digits and `. : / - _` (``isTickerByte(_:)``); anything else is no topic (`nil`), so no
/// `","`, `"*"` or white space can be joined into an upstream `subscribe`.
public struct Topic: Hashable, Sendable, Comparable, CustomStringConvertible {
    /// The ticker that stands for every ticker of an event type.
    public static let wildcardTicker = "*"

    /// The event type, e.g. `Q`, `T`, `AM`, `XQ`.
    public let eventType: String
    /// The ticker, e.g. `AAPL`, `EUR/USD`, `O:SPY241220P00720000`, or `*`.
    public let ticker: String

    /// A topic of `eventType` and `ticker`, or `nil` when either part is empty or has a byte topics may
    /// not have.
    public init?(eventType: String, ticker: String) {
        guard Self.isEventType(eventType), ticker == Self.wildcardTicker || Self.isTicker(ticker) else { return nil }
        self.init(checkedEventType: eventType, ticker: ticker)
    }

    /// For parts already checked (or an event's own type and ticker, looked up, never sent upstream).
    package init(checkedEventType eventType: String, ticker: String) {
        self.eventType = eventType
        self.ticker = ticker
    }

    /// Whether `byte` may stand in a ticker: ASCII letters, digits and `. : / - _`.
    @inlinable
    public static func isTickerByte(_ byte: UInt8) -> Bool {
        switch byte {
        case UInt8(ascii: "A")...UInt8(ascii: "Z"), UInt8(ascii: "a")...UInt8(ascii: "z"), UInt8(ascii: "0")...UInt8(ascii: "9"),
            UInt8(ascii: "."), UInt8(ascii: ":"), UInt8(ascii: "/"), UInt8(ascii: "-"), UInt8(ascii: "_"), UInt8(ascii: "@"):
            true
        default: false
        }
    }

    /// A ticker of ticker bytes only, a letter or digit among them (not the wildcard; not `.` or `..`,
    /// which a vendor's path would read as a step up).
    public static func isTicker(_ text: String) -> Bool {
        isTicker(text.utf8)
    }

    static func isTicker(_ bytes: some Sequence<UInt8>) -> Bool {
        var named = false
        for byte in bytes {
            guard isTickerByte(byte) else { return false }
            if !named, isLetterOrDigit(byte) { named = true }
        }
        return named
    }

    private static func isLetterOrDigit(_ byte: UInt8) -> Bool {
        switch byte {
        case UInt8(ascii: "A")...UInt8(ascii: "Z"), UInt8(ascii: "a")...UInt8(ascii: "z"), UInt8(ascii: "0")...UInt8(ascii: "9"): true
        default: false
        }
    }

    /// Whether a ticker names one of the relay's own topics rather than a vendor's symbol: the wildcard's
    /// `*`, or a derived bar's `@` (`AAPL@5m`). An upstream's events may name neither.
    public static func namesRelayTopic(_ ticker: String) -> Bool {
        ticker.utf8.contains { $0 == UInt8(ascii: "*") || $0 == UInt8(ascii: "@") }
    }

    /// A non-empty event type of ASCII letters and digits.
    public static func isEventType(_ text: String) -> Bool {
        !text.utf8.isEmpty && text.utf8.allSatisfy(isEventTypeByte)
    }

    /// Parses `EV.TICKER`, trimming surrounding white space; `nil` when either part is missing or has a
    /// byte topics may not have.
    public init?(parsing text: some StringProtocol) {
        let trimmed = text.trimmingWhitespace()
        guard let dot = trimmed.firstIndex(of: ".") else { return nil }
        self.init(eventType: String(trimmed[..<dot]), ticker: String(trimmed[trimmed.index(after: dot)...]))
    }

    /// The wildcard topic of an event type, `EV.*` (`eventType` is one a topic already has).
    public static func wildcard(_ eventType: String) -> Topic {
        Topic(checkedEventType: eventType, ticker: wildcardTicker)
    }

    /// Whether this topic is `EV.*`.
    public var isWildcard: Bool { ticker == Topic.wildcardTicker }

    /// Whether an event of this type and ticker belongs to this topic. A wildcard is the vendor's events
    /// of its type, not the relay's derived bars (`AM.AAPL@5m`): those belong to who names them (a key
    /// may hold `AM.*` without the trades a bar is made of).
    public func matches(eventType: String, ticker: String) -> Bool {
        self.eventType == eventType && (isWildcard ? !Topic.isDerivedTicker(ticker) : self.ticker == ticker)
    }

    public var description: String { "\(eventType).\(ticker)" }

    public static func < (lhs: Topic, rhs: Topic) -> Bool { lhs.description < rhs.description }
}

extension Set where Element == Topic {
    /// Whether this set covers `topic`: holds it, or holds its type's wildcard `EV.*`.
    public func covers(_ topic: Topic) -> Bool {
        contains(topic) || contains(.wildcard(topic.eventType))
    }
}

extension Topic {
    /// Splits a Polygon `params` list (`"T.AAPL, Q.MSFT"`) into topics, trimming each entry of ASCII
    /// white space. Empty entries are ignored; entries that are not `EV.TICKER` are returned in `invalid`.
    /// Works on the UTF-8 bytes: a client's list of a thousand entries costs microseconds.
    public static func parseList(_ params: String) -> (topics: [Topic], invalid: [String]) {
        var topics: [Topic] = []
        var invalid: [String] = []
        var params = params
        params.withUTF8 { bytes in
            var start = 0
            while start <= bytes.count {
                var end = start
                while end < bytes.count, bytes[end] != UInt8(ascii: ",") { end += 1 }
                var first = start
                var last = end
                while first < last, isASCIIWhitespace(bytes[first]) { first += 1 }
                while last > first, isASCIIWhitespace(bytes[last - 1]) { last -= 1 }
                if first < last {
                    let entry = UnsafeBufferPointer(rebasing: bytes[first..<last])
                    if let topic = Topic(entry) { topics.append(topic) } else { invalid.append(String(decoding: entry, as: UTF8.self)) }
                }
                start = end + 1
            }
        }
        return (topics, invalid)
    }

    /// How many entries a `params` list has (empty ones too), counted without parsing them.
    public static func entryCount(_ params: String) -> Int {
        params.utf8.reduce(1) { $1 == UInt8(ascii: ",") ? $0 + 1 : $0 }
    }

    /// `EV.TICKER` from trimmed bytes, or `nil`.
    private init?(_ entry: UnsafeBufferPointer<UInt8>) {
        guard let dot = entry.firstIndex(of: UInt8(ascii: ".")), dot > 0, dot < entry.count - 1 else { return nil }
        let type = UnsafeBufferPointer(rebasing: entry[..<dot])
        let ticker = UnsafeBufferPointer(rebasing: entry[(dot + 1)...])
        let isWildcard = ticker.count == 1 && ticker[0] == UInt8(ascii: "*")
        guard type.allSatisfy(Self.isEventTypeByte), isWildcard || Self.isTicker(ticker) else { return nil }
        self.init(checkedEventType: String(decoding: type, as: UTF8.self), ticker: String(decoding: ticker, as: UTF8.self))
    }

    private static func isASCIIWhitespace(_ byte: UInt8) -> Bool {
        byte == 0x20 || byte == 0x09 || byte == 0x0A || byte == 0x0D
    }

    static func isEventTypeByte(_ byte: UInt8) -> Bool {
        switch byte {
        case UInt8(ascii: "A")...UInt8(ascii: "Z"), UInt8(ascii: "a")...UInt8(ascii: "z"), UInt8(ascii: "0")...UInt8(ascii: "9"): true
        default: false
        }
    }

    /// Joins topics into one `params` string, the form Polygon's `subscribe` action takes.
    public static func joinList(_ topics: some Sequence<Topic>) -> String {
        topics.map(\.description).joined(separator: ",")
    }
}

extension StringProtocol {
    package func trimmingWhitespace() -> SubSequence {
        var start = startIndex
        var end = endIndex
        while start < end, self[start].isWhitespace { start = index(after: start) }
        while end > start, self[index(before: end)].isWhitespace { end = index(before: end) }
        return self[start..<end]
    }
}
