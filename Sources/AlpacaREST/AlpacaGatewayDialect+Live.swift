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
        let symbols = topics.map(\.ticker)
        // A stock's own routes (`/v2/stocks/AAPL/trades/latest`, `/v2/stocks/AAPL/snapshot`) answer one record.
        let path = route.upstream.prefix { $0 != "?" }.split(separator: "/")
        let single = path.first == "v2" && (path.count == 5 || path.last == "snapshot")
        if route.name == "snapshots" {
            var entries: [String] = []
            for symbol in symbols {
                guard let snapshot = await snapshot(symbol, market: market, values: values, fetch: fetch) else { return nil }
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
        guard let event = await values.held(Topic(checkedEventType: kind.eventType, ticker: symbol), in: market),
            let json = AlpacaDelivery.elementBytes(event, codec: .json), let members = JSONText.members(of: Substring(String(buffer: json)))
        else { return nil }
        return record(kind, members)
    }

    static func record(_ kind: Kind, _ members: [String: Substring]) -> String {
        let fields = kind.fields.compactMap { name -> String? in
            if let value = members[name] { return "\"\(name)\":\(value)" }
            return kind == .bars && (name == "n" || name == "vw") ? "\"\(name)\":null" : nil
        }
        return "{" + fields.joined(separator: ",") + "}"
    }

    /// A snapshot from the held trade and quote (required), minute and daily bars, and the previous
    /// daily bar from the daily bars of the week before today (a closed window: cached).
    func snapshot(_ symbol: String, market: Market, values: any LiveValues, fetch: @Sendable (String) async -> GatewayAnswer) async -> String? {
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
        if let previous = await previousDailyBar(symbol, market: market, fetch: fetch) { members.append(#""prevDailyBar":\#(previous)"#) }
        return "{" + members.joined(separator: ",") + "}"
    }

    /// The last daily bar before today, from `/bars` of the week before (one upstream call a symbol a day).
    func previousDailyBar(_ symbol: String, market: Market, fetch: @Sendable (String) async -> GatewayAnswer) async -> String? {
        let today = WallClock.nowMilliseconds() / GatewayCalendar.dayMs
        let start = Self.date(today - 7)
        let end = Self.date(today - 1)
        let base = market == .crypto ? "/v1beta3/crypto/us/bars" : "/v2/stocks/bars"
        let encoded = symbol.addingPercentEncoding(withAllowedCharacters: .alphanumerics) ?? symbol
        let answer = await fetch("\(base)?symbols=\(encoded)&timeframe=1Day&start=\(start)&end=\(end)")
        guard answer.status == 200, let body = JSONText.members(of: Substring(String(buffer: answer.body))), let bars = body["bars"],
            let bySymbol = JSONText.members(of: bars), let list = bySymbol[symbol], list.count > 2
        else { return nil }
        // The last element of the list.
        var depth = 0
        var lastStart = list.startIndex
        for index in list.indices {
            switch list[index] {
            case "{":
                if depth == 0 { lastStart = index }
                depth += 1
            case "}": depth -= 1
            default: break
            }
        }
        guard let last = list[lastStart...].firstIndex(of: "}").map({ list[lastStart...$0] }), let members = JSONText.members(of: last) else { return nil }
        return Self.record(.bars, members)
    }

    /// Days since 1970-01-01 as `YYYY-MM-DD`.
    static func date(_ days: Int64) -> String {
        String(AlpacaJSON.rfc3339(seconds: days * 86_400, nanoseconds: 0).prefix(10))
    }
}
