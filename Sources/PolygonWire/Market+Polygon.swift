import MarketCore

/// Polygon's (Massive's) markets ("clusters"), each a connection of its own at `wss://HOST/<market>`:
/// its event types, the syntax of its topic tickers, and how an event's ticker field becomes a topic
/// ticker. Topic tickers carry the market's prefix (`O:SPY251219C00650000`, `C:EUR-USD`, `X:BTC-USD`,
/// `I:SPX`; stocks and futures have none). Events name some of them otherwise: crypto events carry
/// `pair` `BTC-USD`, forex quotes `p` `EUR/USD`; ``topicTicker(_:)`` maps both to the topic's form.
extension Market {
    /// The event types the market carries, from Polygon's published spec.
    public var eventTypes: Set<String> { Self.polygonEventTypes[self] ?? [] }

    /// Made once: every connection's session holds its market's set (shared, not a copy each).
    private static let polygonEventTypes: [Market: Set<String>] = [
        .stocks: ["T", "Q", "A", "AM", "LULD", "NOI", "FMV", "LV"],
        .options: ["T", "Q", "A", "AM", "FMV", "LV"],
        .forex: ["C", "CA", "CAS", "FMV", "LV"],
        .crypto: ["XT", "XQ", "XL2", "XA", "XAS", "FMV", "LV"],
        .indices: ["A", "AM", "V"],
        .futures: ["T", "Q", "A", "AM"],
    ]

    /// The prefix of the market's topic tickers (`X:`), `nil` for stocks, futures and news.
    public var tickerPrefix: String? {
        switch self {
        case .stocks, .futures, .news: nil
        case .options: "O:"
        case .forex: "C:"
        case .crypto: "X:"
        case .indices: "I:"
        }
    }

    /// The event types Polygon allows for at most a fixed number of tickers per connection (options
    /// `Q` and `FMV`: 1,000 contracts).
    public var cappedEventTypes: Set<String> {
        self == .options ? ["Q", "FMV"] : []
    }

    /// An example topic of the market, for messages.
    public var exampleTopic: String {
        switch self {
        case .stocks: "Q.AAPL"
        case .options: "Q.O:SPY251219C00650000"
        case .forex: "C.C:EUR-USD"
        case .crypto: "XT.X:BTC-USD"
        case .indices: "V.I:SPX"
        case .futures: "T.ESZ5"
        case .news: "n.AAPL"
        }
    }

    /// A ticker in the form the market's topics use: the prefix added where it is missing, and a forex
    /// pair's `/` (or none, `EURUSD`) written `-` (`C:EUR-USD`). Stocks and futures tickers, and tickers
    /// already in form, come back unchanged (without allocating).
    @inlinable
    public func topicTicker(_ ticker: String) -> String {
        guard let prefix = tickerPrefix, ticker != Topic.wildcardTicker else { return ticker }
        var body = Substring(ticker)
        if ticker.utf8.starts(with: prefix.utf8) {
            guard self == .forex, !Self.isForexPairInForm(body.dropFirst(2)) else { return ticker }
            body = body.dropFirst(2)
        }
        if self == .forex {
            let letters = body.filter { $0 != "/" && $0 != "-" }
            if letters.utf8.count == 6, letters.utf8.allSatisfy({ $0 >= UInt8(ascii: "A") && $0 <= UInt8(ascii: "Z") }) {
                return prefix + letters.prefix(3) + "-" + letters.suffix(3)
            }
            return prefix + body.replacingSlashes()
        }
        return prefix + body
    }

    @usableFromInline
    static func isForexPairInForm(_ body: Substring) -> Bool {
        let bytes = Array(body.utf8)
        return bytes.count == 7 && bytes[3] == UInt8(ascii: "-")
    }

    /// Why a topic does not belong to this market (naming the market it belongs to), or `nil`. Short: a
    /// refusal names each refused entry with it.
    public func problem(with topic: Topic) -> String? {
        if !eventTypes.contains(topic.eventType) {
            guard let owner = Market.allCases.first(where: { $0.eventTypes.contains(topic.eventType) }) else {
                return "no \(topic.eventType) events on \(self)"
            }
            return "\(owner) topic: use /\(owner)"
        }
        if topic.isWildcard { return nil }
        if topic.isDerived {
            guard let rules = PolygonBarRules(market: self) else { return "no derived bars on \(self)" }
            if let problem = rules.problem(with: topic) { return problem }
        }
        let owner = Market.of(ticker: topic.derivedBar?.symbol ?? topic.ticker)
        // A plain ticker is any market's (a prefixed market writes it in its form); a prefixed one is its market's.
        if owner != self, owner != .stocks {
            return "\(owner) ticker: use /\(owner)"
        }
        return nil
    }

    /// The topic in the market's form (``topicTicker(_:)``).
    public func normalized(_ topic: Topic) -> Topic {
        let ticker = topicTicker(topic.ticker)
        return ticker == topic.ticker ? topic : Topic(checkedEventType: topic.eventType, ticker: ticker)
    }
}

extension Substring {
    @usableFromInline
    func replacingSlashes() -> String {
        String(map { $0 == "/" ? "-" : $0 })
    }
}
