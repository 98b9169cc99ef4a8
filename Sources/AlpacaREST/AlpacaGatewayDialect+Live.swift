import AlpacaWire
import Foundation
import MarketCore
import NIOCore
import RESTGateway

/// Live answers in Alpaca's REST shapes from the events the relay holds: the stream's trade, quote and
/// bar carry the REST record's fields under the same names (RFC 3339 times included), without the
/// message type and symbol, which the answer's map holds instead. Numbers are copied as their text.
extension AlpacaGatewayDialect {
    public func live(_ route: GatewayRoute, values: any LiveValues, fetch: @Sendable (String) async -> GatewayAnswer) async -> ByteBuffer? {
        guard case .topics(let market, let topics) = route.scope, !topics.isEmpty else { return nil }
        // Each symbol once (a snapshot's scope names three topics of each).
        var symbols: [String] = []
        for topic in topics where !symbols.contains(topic.ticker) { symbols.append(topic.ticker) }
        // A stock's own routes (`/v2/stocks/AAPL/trades/latest`, `/v2/stocks/AAPL/snapshot`) answer one record.
        let path = route.upstream.prefix { $0 != "?" }.split(separator: "/")
        let single = path.first == "v2" && (path.count == 5 || path.last == "snapshot")
        if route.name == "snapshots" {
            // Held first (no upstream call for what is not); then the previous daily bars in one call.
            for symbol in symbols {
                guard await values.held(Topic(checkedEventType: Kind.trades.eventType, ticker: symbol), in: market) != nil,
                    await values.held(Topic(checkedEventType: Kind.quotes.eventType, ticker: symbol), in: market) != nil
                else { return nil }
            }
            let previous = await previousDailyBars(symbols, market: market, fetch: fetch)
            var entries: [String] = []
            for symbol in symbols {
                guard let snapshot = await snapshot(symbol, market: market, values: values, previous: previous[symbol]) else { return nil }
                entries.append(single ? snapshot : "\"\(JSONText.escape(symbol))\":\(snapshot)")
            }
            if single { return entries.first.map { ByteBuffer(string: #"{"symbol":"\#(JSONText.escape(symbols[0]))",\#($0.dropFirst())"#) } }
            // Stocks: the symbols at the top; crypto: under "snapshots".
            return ByteBuffer(string: market == .crypto ? #"{"snapshots":{\#(entries.joined(separator: ","))}}"# : "{\(entries.joined(separator: ","))}")
        }
        guard route.name.hasPrefix("latest-"), let kind = Kind(rawValue: String(route.name.dropFirst("latest-".count))) else { return nil }
        var entries: [String] = []
        for symbol in symbols {
            guard let record = await Self.record(kind, symbol, market: market, values: values) else { return nil }
            entries.append(single ? record : "\"\(JSONText.escape(symbol))\":\(record)")
        }
        if single, let record = entries.first {
            let key = String(kind.rawValue.dropLast())
            return ByteBuffer(string: #"{"symbol":"\#(JSONText.escape(symbols[0]))","\#(key)":\#(record)}"#)
        }
        return ByteBuffer(string: #"{"\#(kind.rawValue)":{\#(entries.joined(separator: ","))}}"#)
    }

    /// A held event as Alpaca's REST record (its fields only; a bar's `n` and `vw` present, `null` if the
    /// stream left them out, as alpaca-py requires them).
    static func record(_ kind: Kind, _ symbol: String, market: Market, values: any LiveValues) async -> String? {
        let topic = Topic(checkedEventType: kind.eventType, ticker: symbol)
        guard let event = await values.held(topic, in: market) else { return nil }
        // Rendered once per held event, however many clients ask for it.
        return memo.answer(kind.rawValue, market: market, topic: topic, event: event) {
            guard let json = AlpacaDelivery.elementBytes(event, codec: .json), let members = JSONText.members(of: Substring(String(buffer: json)))
            else { return nil }
            return record(kind, members)
        }
    }

    /// The records rendered, by kind and topic (``LiveAnswerMemo``).
    static let memo = LiveAnswerMemo<String>()

    static func record(_ kind: Kind, _ members: [String: Substring]) -> String {
        let fields = kind.fields.compactMap { name -> String? in
            if let value = members[name] { return "\"\(name)\":\(value)" }
            return kind == .bars && (name == "n" || name == "vw") ? "\"\(name)\":null" : nil
        }
        return "{" + fields.joined(separator: ",") + "}"
    }

    /// A snapshot from the held trade and quote (required), minute and daily bars, and the previous
    /// daily bar (``previousDailyBars(_:market:fetch:)``).
    func snapshot(_ symbol: String, market: Market, values: any LiveValues, previous: String?) async -> String? {
        guard let trade = await Self.record(.trades, symbol, market: market, values: values),
            let quote = await Self.record(.quotes, symbol, market: market, values: values)
        else { return nil }
        var members = [#""latestTrade":\#(trade)"#, #""latestQuote":\#(quote)"#]
        if let minute = await Self.record(.bars, symbol, market: market, values: values) { members.append(#""minuteBar":\#(minute)"#) }
        if let event = await values.held(Topic(checkedEventType: "d", ticker: symbol), in: market),
            let json = AlpacaDelivery.elementBytes(event, codec: .json), let daily = JSONText.members(of: Substring(String(buffer: json)))
        {
            members.append(#""dailyBar":\#(Self.record(.bars, daily))"#)
        }
        if let previous { members.append(#""prevDailyBar":\#(previous)"#) }
        return "{" + members.joined(separator: ",") + "}"
    }

    /// Each symbol's last daily bar through the last closed day, from one `/bars` call over the week
    /// before it (a closed window, cached: one upstream call a day for a given set of symbols, in
    /// whatever order a client names them).
    func previousDailyBars(_ symbols: [String], market: Market, fetch: @Sendable (String) async -> GatewayAnswer) async -> [String: String] {
        let end = GatewayCalendar.lastClosedDay(now: WallClock.nowMilliseconds())
        let base = market == .crypto ? "/v1beta3/crypto/us/bars" : "/v2/stocks/bars"
        let list = symbols.sorted().joined(separator: ",").addingPercentEncoding(withAllowedCharacters: .alphanumerics.union(CharacterSet(charactersIn: ","))) ?? ""
        let answer = await fetch("\(base)?symbols=\(list)&timeframe=1Day&start=\(Self.date(end - 7))&end=\(Self.date(end))&limit=10000")
        guard answer.status == 200, let found = JSONText.member("bars", of: Substring(String(buffer: answer.body))), let bars = found,
            let bySymbol = JSONText.members(of: bars)
        else { return [:] }
        var previous: [String: String] = [:]
        for (symbol, list) in bySymbol {
            if let last = Self.lastObject(in: list), let members = JSONText.members(of: last) { previous[symbol] = Self.record(.bars, members) }
        }
        return previous
    }

    /// The last element of a JSON array of flat objects.
    static func lastObject(in list: Substring) -> Substring? {
        guard let close = list.lastIndex(of: "}"), let open = list[..<close].lastIndex(of: "{") else { return nil }
        return list[open...close]
    }

    /// Days since 1970-01-01 as `YYYY-MM-DD`.
    static func date(_ days: Int64) -> String {
        String(AlpacaJSON.rfc3339(seconds: days * 86_400, nanoseconds: 0).prefix(10))
    }
}
