import Foundation
import MarketCore
import NIOCore
import PortfolioDomain

/// Why a REST request gave no answer: the vendor's status and body (never the key), an answer that
/// could not be read, the transport, or the caller's cancellation. Value type, `Sendable`.
public enum RESTError: Error, Sendable, Equatable, CustomStringConvertible {
    case status(Int, String)
    case malformed(String)
    case transport(String)
    case cancelled

    /// The most UTF-8 bytes of what the REST host chose (its body, or a decoder's words about its answer)
    /// that a description carries.
    public static let describedBytes = 200

    /// One line a log, a client or a gap's reason may carry: what the host chose (a body, a number's text,
    /// a key the decoder names) made visible and cut to ``describedBytes``.
    public var description: String {
        switch self {
        case .status(let code, let body): "HTTP \(code): \(VisibleText.visible(body, limit: Self.describedBytes))"
        case .malformed(let what): "unreadable answer: \(VisibleText.visible(what, limit: Self.describedBytes))"
        case .transport(let error): "request failed: \(VisibleText.visible(error, limit: Self.describedBytes))"
        case .cancelled: "cancelled"
        }
    }
}

/// One daily bar. Prices as decimals (parsed from the answer's text, not through `Double`).
public struct DailyBar: Sendable, Equatable {
    /// The bar's start, Unix milliseconds.
    public var start: Int64
    public var open, high, low, close: Decimal
    public var volume: Decimal

    public init(start: Int64, open: Decimal, high: Decimal, low: Decimal, close: Decimal, volume: Decimal) {
        self.start = start
        self.open = open
        self.high = high
        self.low = low
        self.close = close
        self.volume = volume
    }
}

/// The market's status now (the fields the security detail shows).
public struct MarketStatus: Sendable, Equatable, Codable {
    public var market: String
    public var serverTime: String?
    public var earlyHours: Bool?
    public var afterHours: Bool?
    public var exchanges: [String: String]?

    public init(market: String, serverTime: String? = nil, earlyHours: Bool? = nil, afterHours: Bool? = nil, exchanges: [String: String]? = nil) {
        self.market = market
        self.serverTime = serverTime
        self.earlyHours = earlyHours
        self.afterHours = afterHours
        self.exchanges = exchanges
    }
}

extension MarketStatus {
    /// The most exchanges kept, and the longest text (a name, a status, the server's time).
    public static let maxExchanges = 32
    public static let maxText = 64

    /// As a vendor's answer may be kept and shown: at most ``maxExchanges`` exchanges (the first by
    /// name), each name and status at most ``maxText`` bytes (longer ones left out), likewise the
    /// server's time; `nil` when the market's own name is longer.
    public func bounded() -> MarketStatus? {
        guard market.utf8.count <= Self.maxText else { return nil }
        var status = self
        status.serverTime = serverTime.flatMap { $0.utf8.count <= Self.maxText ? $0 : nil }
        status.exchanges = exchanges.map { all in
            let kept = all.filter { $0.key.utf8.count <= Self.maxText && $0.value.utf8.count <= Self.maxText }
            return Dictionary(uniqueKeysWithValues: kept.sorted { $0.key < $1.key }.prefix(Self.maxExchanges).map { ($0.key, $0.value) })
        }
        return status
    }
}

/// A last trade: price, size, the trade's time in Unix nanoseconds.
public struct LastTrade: Sendable, Equatable {
    public var price: Decimal
    public var size: Decimal?
    public var timestamp: Int64

    public init(price: Decimal, size: Decimal? = nil, timestamp: Int64) {
        self.price = price
        self.size = size
        self.timestamp = timestamp
    }
}

/// A last quote (the NBBO): bid and ask with sizes, its time in Unix nanoseconds.
public struct LastQuote: Sendable, Equatable {
    public var bid: Decimal
    public var bidSize: Decimal?
    public var ask: Decimal
    public var askSize: Decimal?
    public var timestamp: Int64

    public init(bid: Decimal, bidSize: Decimal? = nil, ask: Decimal, askSize: Decimal? = nil, timestamp: Int64) {
        self.bid = bid
        self.bidSize = bidSize
        self.ask = ask
        self.askSize = askSize
        self.timestamp = timestamp
    }
}

/// The REST seam the portfolio reads through: a vendor's REST API as the answers the relay needs of it
/// (a symbol's last trade and quote, its previous close and daily bars, the market's status). Each
/// vendor's REST client conforms (`PolygonREST`); the portfolio holds `any MarketReference` and names
/// no vendor. Requests wait their turn by `priority` (``RequestGate``).
public protocol MarketReference: Sendable {
    func lastTrade(_ symbol: String, priority: RequestGate.Priority) async -> Result<LastTrade, RESTError>
    func lastQuote(_ symbol: String, priority: RequestGate.Priority) async -> Result<LastQuote, RESTError>
    /// The previous session's close.
    func previousClose(_ symbol: String, priority: RequestGate.Priority) async -> Result<Decimal, RESTError>
    /// Daily bars from `from` through `to`, oldest first: at most one a day, none outside the range
    /// (whatever the vendor sent), so their count is bounded by the days asked for.
    func dailyBars(_ symbol: String, from: Day, to: Day, priority: RequestGate.Priority) async -> Result<[DailyBar], RESTError>
    func marketStatus(priority: RequestGate.Priority) async -> Result<MarketStatus, RESTError>
}

/// How a type's history is read back after an outage: one event per trade or quote, or one bar per
/// minute (asked for from the start of the minute the outage began in; the minute still running is
/// left to the live stream).
public enum HistoryKind: Sendable, Equatable {
    case ticks
    case minuteBars
}

/// One page of a topic's history: the events read (each with its time, Unix ms; a bar by its start),
/// the results refused (a value missing, implausible or not valid JSON: counted, not copied), and where
/// the next page is (`nil`: this was the last).
public struct HistoryPage: Sendable {
    public var events: [(MarketEvent, Int64)]
    public var refused: Int
    public var next: String?

    public init(events: [(MarketEvent, Int64)] = [], refused: Int = 0, next: String? = nil) {
        self.events = events
        self.refused = refused
        self.next = next
    }
}

/// The REST seam gap fill reads through: one market's history from a vendor's REST API, page by page,
/// as events in the market's own wire protocol. Each vendor's REST client provides one
/// (`PolygonHistory`); the gap filler holds `any MarketHistory` and names no vendor.
public protocol MarketHistory: Sendable {
    /// How a type's events are read back, `nil`: the type has no history (its holders get the outage
    /// notice only).
    func kind(of eventType: String) -> HistoryKind?
    /// A page of `topic`'s events from `window` (Unix ms): the first when `cursor` is `nil`, else the
    /// page it names (a previous page's ``HistoryPage/next``). Events outside the window are left out;
    /// reading stops once `room + 1` events are in hand (the caller's limit is passed).
    func page(of topic: Topic, window: Range<Int64>, cursor: String?, room: Int, priority: RequestGate.Priority) async -> Result<HistoryPage, RESTError>
}
