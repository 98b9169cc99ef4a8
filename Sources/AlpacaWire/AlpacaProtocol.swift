import MarketCore

/// The codec a connection speaks: Alpaca's SDKs ask for MessagePack on the upgrade
/// (`Content-Type: application/msgpack`); a plain WebSocket client gets JSON.
public enum AlpacaCodec: String, Sendable, Codable {
    case json
    case messagePack = "msgpack"

    /// The codec an upgrade's `Content-Type` asks for.
    public init(contentType: String?) {
        self = contentType?.lowercased().contains("msgpack") == true ? .messagePack : .json
    }

    /// One frame holding `messages` as an array.
    public func frame(_ messages: [MessagePack.Value]) -> [UInt8] {
        switch self {
        case .messagePack: MessagePack.encode(.array(messages))
        case .json: AlpacaJSON.text(.array(messages))
        }
    }

    /// The most maps and arrays in a client message: one takes a map and a list per channel, and each
    /// costs a value and an allocation (a message of nested one-element lists would cost some 40 times
    /// its size).
    public static let maxClientContainers = 64

    /// One value in this codec, whole (`nil`: not one value, or more than `maxContainers` maps and
    /// arrays; a client's message is read with ``maxClientContainers``).
    public func decode(_ bytes: [UInt8], maxContainers: Int = .max) -> MessagePack.Value? {
        switch self {
        case .messagePack: try? MessagePack.decode(bytes, maxContainers: maxContainers)
        case .json: AlpacaJSONReader.value(bytes, maxContainers: maxContainers)
        }
    }
}

/// Alpaca's subscription channels, the message type (`T`) of each one's events, and the event types a
/// hub topic carries: a topic is `<T>.<symbol>` (`t.AAPL`, `q.*`, `o.BTC/USD`).
public enum AlpacaChannel: String, Sendable, CaseIterable, Comparable {
    case trades, quotes, bars, dailyBars, updatedBars, statuses, lulds, corrections, cancelErrors, orderbooks
    /// The news stream's one channel (`/v1beta1/news`): an item is `n`, routed by each of its `symbols`.
    case news

    public var eventType: String {
        switch self {
        case .trades: "t"
        case .quotes: "q"
        case .bars: "b"
        case .dailyBars: "d"
        case .updatedBars: "u"
        case .statuses: "s"
        case .lulds: "l"
        case .corrections: "c"
        case .cancelErrors: "x"
        case .orderbooks: "o"
        case .news: "n"
        }
    }

    public init?(eventType: String) {
        guard let channel = Self.allCases.first(where: { $0.eventType == eventType }) else { return nil }
        self = channel
    }

    /// Channels whose last event is no snapshot for a new subscriber: corrections and cancel errors
    /// are one-off events, an order book update means nothing without the book.
    public static let snapshotless: Set<String> = [Self.corrections.eventType, Self.cancelErrors.eventType, Self.orderbooks.eventType]

    public static func < (lhs: Self, rhs: Self) -> Bool {
        (allCases.firstIndex(of: lhs) ?? 0) < (allCases.firstIndex(of: rhs) ?? 0)
    }
}

/// How Alpaca names a relay ticker, and back: a crypto pair `X:BTC-USD` is `BTC/USD`, an option
/// contract `O:SPY251219C00650000` is `SPY251219C00650000`, a stock is itself. Pure.
public enum AlpacaSymbol {
    /// Alpaca's symbol for a ticker of `market` (as the relay writes it, or already Alpaca's).
    public static func of(_ ticker: String, market: Market) -> String {
        switch market {
        case .crypto: String((ticker.hasPrefix("X:") ? ticker.dropFirst(2) : ticker[...]).map { $0 == "-" ? "/" : $0 })
        case .options: ticker.hasPrefix("O:") ? String(ticker.dropFirst(2)) : ticker
        default: ticker
        }
    }

    /// The relay's ticker for an Alpaca symbol of `market`.
    public static func ticker(of symbol: String, market: Market) -> String {
        switch market {
        case .crypto: "X:" + String(symbol.map { $0 == "/" ? "-" : $0 })
        case .options: "O:" + symbol
        default: symbol
        }
    }
}

/// One of Alpaca's streams: its path, its market, and the channels it has. Value type, `Sendable`.
public enum AlpacaFeed: String, Sendable, CaseIterable {
    case iex, sip, delayedSIP = "delayed_sip", test, crypto
    /// Options: the indicative feed and OPRA's (Alpaca sends them in MessagePack only).
    case indicative, opra
    /// Alpaca's news stream (Benzinga's stories), a connection of its own.
    case news

    /// The URL path of the feed (`/v2/iex`, `/v1beta3/crypto/us`, `/v1beta1/opra`).
    public var path: String {
        switch self {
        case .crypto: "/v1beta3/crypto/us"
        case .indicative, .opra, .news: "/v1beta1/\(rawValue)"
        default: "/v2/\(rawValue)"
        }
    }

    /// The relay's market the feed serves.
    public var market: Market {
        switch self {
        case .crypto: .crypto
        case .indicative, .opra: .options
        case .news: .news
        default: .stocks
        }
    }

    /// The feed a relay market is served as when nothing names one: stocks `iex`, crypto, options
    /// `indicative`, news.
    public static func standard(for market: Market) -> AlpacaFeed {
        switch market {
        case .crypto: .crypto
        case .options: .indicative
        case .news: .news
        default: .iex
        }
    }

    /// Whether Alpaca sends it in MessagePack only (its options feeds).
    public var isMessagePackOnly: Bool { market == .options }

    /// The feed a URL path names: Alpaca's paths, and `/v1beta2/crypto`, which alpaca-trade-api's crypto
    /// stream still uses.
    public init?(path: String) {
        var path = path
        while path.hasSuffix("/") { path.removeLast() }
        switch path {
        case "/v1beta3/crypto/us", "/v1beta2/crypto", "/v1beta1/crypto": self = .crypto
        case "/v1beta1/indicative": self = .indicative
        case "/v1beta1/opra": self = .opra
        case "/v1beta1/news": self = .news
        default:
            guard path.hasPrefix("/v2/"), let feed = AlpacaFeed(rawValue: String(path.dropFirst(4))), feed.market == .stocks else { return nil }
            self = feed
        }
    }

    /// Where it is served: its path, and the older one an SDK still uses for it (alpaca-trade-api's
    /// crypto stream: `/v1beta2/crypto`).
    public var paths: [String] { self == .crypto ? [path, "/v1beta2/crypto"] : [path] }

    /// The channels this feed serves, in Alpaca's order.
    public var channels: [AlpacaChannel] {
        switch market {
        case .crypto: [.trades, .quotes, .bars, .updatedBars, .dailyBars, .orderbooks]
        case .options: [.trades, .quotes]
        case .news: [.news]
        default: [.trades, .quotes, .bars, .updatedBars, .dailyBars, .statuses, .lulds, .corrections, .cancelErrors]
        }
    }

    /// The event types of its hub's topics.
    public var eventTypes: Set<String> { Self.eventTypesByFeed[self] ?? [] }

    /// Made once: every connection's session holds its feed's set (shared, not a copy each).
    private static let eventTypesByFeed = Dictionary(uniqueKeysWithValues: allCases.map { ($0, Set($0.channels.map(\.eventType))) })
}

/// Alpaca's errors, with their codes and texts as Alpaca sends them.
public enum AlpacaError: Int, Sendable, Error {
    case invalidSyntax = 400
    case notAuthenticated = 401
    case authFailed = 402
    case alreadyAuthenticated = 403
    case authTimeout = 404
    case symbolLimitExceeded = 405
    case connectionLimitExceeded = 406
    case slowClient = 407
    case insufficientSubscription = 409
    case invalidSubscribeAction = 410
    case internalError = 500

    public var text: String {
        switch self {
        case .invalidSyntax: "invalid syntax"
        case .notAuthenticated: "not authenticated"
        case .authFailed: "auth failed"
        case .alreadyAuthenticated: "already authenticated"
        case .authTimeout: "auth timeout"
        case .symbolLimitExceeded: "symbol limit exceeded"
        case .connectionLimitExceeded: "connection limit exceeded"
        case .slowClient: "slow client"
        case .insufficientSubscription: "insufficient subscription"
        case .invalidSubscribeAction: "invalid subscribe action for this feed"
        case .internalError: "internal error"
        }
    }

    /// `{"T":"error","code":N,"msg":"…"}`.
    public var message: MessagePack.Value { message(detail: nil) }

    /// The error with a detail after Alpaca's text (`"symbol limit exceeded: …"`).
    public func message(detail: String?) -> MessagePack.Value {
        .map([
            .init(.string("T"), .string("error")), .init(.string("code"), .int(Int64(rawValue))),
            .init(.string("msg"), .string(detail.map { "\(text): \($0)" } ?? text)),
        ])
    }
}

/// Alpaca's control messages.
public enum AlpacaControl {
    public static func success(_ text: String) -> MessagePack.Value {
        .map([.init(.string("T"), .string("success")), .init(.string("msg"), .string(text))])
    }

    public static let connected = success("connected")
    public static let authenticated = success("authenticated")

    /// The relay's own notices (upstream lost and back, a fill, lagging): a `T` the SDKs do not know and
    /// so pass over without a word, alone in its frame. Fields as Polygon's status carries them.
    public static let noticeType = "relay"
}
