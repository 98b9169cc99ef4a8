import MarketCore
import MarketREST
import NIOCore

/// One market's history from Polygon's REST API, for gap fill: trades (`/v3/trades`), quotes
/// (`/v3/quotes`) and minute bars (`range/1/minute`), each result made into the WebSocket event it
/// stands for (``RecoveredEvents``), `next_url` paging. Polygon's ``MarketHistory``. `Sendable`.
public struct PolygonHistory: MarketHistory {
    public let market: Market
    public let rest: PolygonREST

    public init(market: Market, rest: PolygonREST) {
        self.market = market
        self.rest = rest
    }

    /// Results asked for per REST page: a page of quotes stays a few MB.
    static let pageLimit = 10_000

    public func kind(of eventType: String) -> HistoryKind? {
        switch RecoveredEvents.source(of: eventType, in: market) {
        case .trades, .quotes: .ticks
        case .minuteBars: .minuteBars
        case nil: nil
        }
    }

    public func page(
        of topic: Topic, window: Range<Int64>, cursor: String?, room: Int, priority: RequestGate.Priority
    ) async -> Result<HistoryPage, RESTError> {
        guard let source = RecoveredEvents.source(of: topic.eventType, in: market) else { return .success(HistoryPage()) }
        let answer: Result<ByteBuffer, RESTError>
        if let cursor {
            answer = await rest.get(nextURL: cursor, priority: priority)
        } else {
            let ticker = PolygonREST.escaped(RecoveredEvents.restTicker(topic.ticker, in: market))
            switch source {
            case .trades, .quotes:
                answer = await rest.get(
                    source == .trades ? "/v3/trades/\(ticker)" : "/v3/quotes/\(ticker)",
                    query: [
                        ("timestamp.gte", "\(window.lowerBound * 1_000_000)"), ("timestamp.lt", "\(window.upperBound * 1_000_000)"),
                        ("order", "asc"), ("sort", "timestamp"), ("limit", "\(Self.pageLimit)"),
                    ], priority: priority)
            case .minuteBars:
                answer = await rest.get(
                    "/v2/aggs/ticker/\(ticker)/range/1/minute/\(window.lowerBound)/\(window.upperBound)",
                    query: [("adjusted", "true"), ("sort", "asc"), ("limit", "\(Self.pageLimit)")], priority: priority)
            }
        }
        return answer.flatMap { body in
            do {
                return .success(try read(body, source: source, topic: topic, window: window, room: room))
            } catch {
                return .failure(.malformed("\(error)"))
            }
        }
    }

    /// A page's events that fall in `window`, at most `room + 1` of them (past that the caller stops:
    /// a page of tiny results costs no more than its limit), and its `next_url`.
    private func read(_ body: ByteBuffer, source: RecoveredEvents.Source, topic: Topic, window: Range<Int64>, room: Int) throws -> HistoryPage {
        var page = HistoryPage()
        page.next = try RESTPage.read(Array(body.readableBytesView)) { result in
            guard page.events.count <= room else { return }
            let event: (MarketEvent, Int64)?
            switch source {
            case .trades: event = RecoveredEvents.trade(result, type: topic.eventType, ticker: topic.ticker, market: market)
            case .quotes: event = RecoveredEvents.quote(result, type: topic.eventType, ticker: topic.ticker, market: market)
            case .minuteBars: event = RecoveredEvents.bar(result, type: topic.eventType, ticker: topic.ticker, market: market)
            }
            guard let event else {
                page.refused += 1
                return
            }
            if window.contains(event.1) { page.events.append(event) }
        }
        return page
    }
}
