import Foundation
import MarketCore
import NIOCore
import RESTGateway

/// Live answers in Polygon's REST shapes, built from the WebSocket events the relay holds. The field
/// names differ between the two (REST last trade and quote carry `t` in nanoseconds, the WebSocket in
/// milliseconds: multiplied, so the digits below the millisecond are zero); numbers are copied as their
/// text, never through `Double`.
extension PolygonGatewayDialect {
    public func live(_ route: GatewayRoute, values: any LiveValues, fetch: @Sendable (String) async -> GatewayAnswer) async -> ByteBuffer? {
        guard case .topics(let market, let topics) = route.scope, let topic = topics.first else { return nil }
        switch route.name {
        case "last-trade", "last-quote", "last-crypto":
            guard let event = await values.held(topic, in: market) else { return nil }
            // Rendered once per held event, however many clients ask for it.
            return Self.memo.answer(route.name, market: market, topic: topic, event: event) {
                Self.fields(event).map { Self.lastAnswer(route.name, $0, ticker: topic.ticker) }
            }
        case "snapshot-ticker":
            return await snapshot(topic.ticker, market: market, values: values, fetch: fetch)
        default:
            return nil
        }
    }

    /// The live answers rendered, by route and topic (``LiveAnswerMemo``).
    static let memo = LiveAnswerMemo<ByteBuffer>()

    /// A last trade, last quote (NBBO) or last crypto trade answer from the held event's members.
    static func lastAnswer(_ route: String, _ event: [String: String], ticker: String) -> ByteBuffer {
        switch route {
        case "last-trade":
            return envelope("results", restTrade(event, ticker: ticker))
        case "last-quote":
            return envelope("results", restQuote(event, ticker: ticker))
        default:
            let last = object([
                ("conditions", event["c"]), ("exchange", event["x"]), ("price", event["p"]), ("size", event["s"]), ("timestamp", event["t"]),
            ])
            return ByteBuffer(string: #"{"last":\#(last),"request_id":"relay","status":"success","symbol":"\#(JSONText.escape(ticker))"}"#)
        }
    }

    /// `/v2/snapshot/locale/us/markets/stocks/tickers/{t}` from the held trade (required), quote and
    /// minute bar, and the previous day's bar (cached until the next 08:00 UTC: one upstream call per
    /// ticker a day). The stream carries no day high and low: `day` has the official open, volume and
    /// VWAP of the latest minute bar and the last trade as its close.
    func snapshot(_ ticker: String, market: Market, values: any LiveValues, fetch: @Sendable (String) async -> GatewayAnswer) async -> ByteBuffer? {
        guard let trade = await Self.fields(values.held(Topic(checkedEventType: "T", ticker: ticker), in: market)) else { return nil }
        let quote = await Self.fields(values.held(Topic(checkedEventType: "Q", ticker: ticker), in: market))
        let minute = await Self.fields(values.held(Topic(checkedEventType: "AM", ticker: ticker), in: market))
        let previous = await fetch("/v2/aggs/ticker/\(PolygonREST.escaped(ticker))/prev?adjusted=true")
        var previousBar: [String: String]?
        if previous.status == 200, let found = JSONText.member("results", of: Substring(String(buffer: previous.body))),
            let results = found, results.hasPrefix("["), results.count > 2
        {
            previousBar = JSONText.members(of: Self.firstElement(results))?.mapValues { String($0) }
        }
        var members: [(String, String?)] = [("ticker", "\"\(JSONText.escape(ticker))\"")]
        if let minute {
            members.append(("day", Self.object([("o", minute["op"]), ("c", trade["p"]), ("v", minute["av"]), ("vw", minute["a"])])))
            members.append(("min", Self.object([
                ("av", minute["av"]), ("o", minute["o"]), ("h", minute["h"]), ("l", minute["l"]), ("c", minute["c"]), ("v", minute["v"]),
                ("vw", minute["vw"]), ("t", minute["s"]),
            ])))
        }
        if let quote {
            members.append(("lastQuote", Self.object([
                ("P", quote["ap"]), ("S", quote["as"]), ("p", quote["bp"]), ("s", quote["bs"]), ("t", Self.nanoseconds(quote["t"])),
            ])))
        }
        members.append(("lastTrade", Self.object([
            ("c", trade["c"]), ("i", trade["i"]), ("p", trade["p"]), ("s", trade["s"]), ("t", Self.nanoseconds(trade["t"])), ("x", trade["x"]),
        ])))
        if let previousBar {
            members.append(("prevDay", Self.object([
                ("o", previousBar["o"]), ("h", previousBar["h"]), ("l", previousBar["l"]), ("c", previousBar["c"]), ("v", previousBar["v"]),
                ("vw", previousBar["vw"]),
            ])))
            if let (change, percent) = Self.todaysChange(last: trade["p"], close: previousBar["c"]) {
                members.append(("todaysChange", change))
                members.append(("todaysChangePerc", percent))
            }
        }
        let updated = [trade["t"], quote?["t"]].compactMap { $0.flatMap { Int64($0) } }.max()
        members.append(("updated", Self.nanoseconds(updated.map(String.init))))
        return ByteBuffer(string: #"{"request_id":"relay","status":"OK","ticker":\#(Self.object(members))}"#)
    }

    /// The change from the previous close to the last trade and its percentage (6 places), as JSON
    /// numbers; `nil` without both, or when the ratio overflows (a REST host's tiny close: NaN is no JSON).
    static func todaysChange(last: String?, close: String?) -> (change: String, percent: String)? {
        guard let close = close.flatMap({ Decimal(string: $0) }), close > 0, let last = last.flatMap({ Decimal(string: $0) }) else { return nil }
        let change = last - close
        var percent = change / close * 100
        var rounded = Decimal()
        NSDecimalRound(&rounded, &percent, 6, .plain)
        guard !change.isNaN, !rounded.isNaN else { return nil }
        return ("\(change)", "\(rounded)")
    }

    /// REST last trade's `results` from a WebSocket trade.
    static func restTrade(_ trade: [String: String], ticker: String) -> String {
        object([
            ("T", "\"\(JSONText.escape(ticker))\""), ("c", trade["c"]), ("f", nanoseconds(trade["trft"])), ("i", trade["i"]), ("p", trade["p"]),
            ("q", trade["q"]), ("r", trade["trfi"]), ("s", trade["s"]), ("t", nanoseconds(trade["t"])), ("x", trade["x"]), ("z", trade["z"]),
        ])
    }

    /// REST last quote's `results` (the NBBO) from a WebSocket quote: its one condition as a list.
    static func restQuote(_ quote: [String: String], ticker: String) -> String {
        object([
            ("T", "\"\(JSONText.escape(ticker))\""), ("P", quote["ap"]), ("S", quote["as"]), ("X", quote["ax"]),
            ("c", quote["c"].map { $0.hasPrefix("[") ? $0 : "[\($0)]" }), ("i", quote["i"]), ("p", quote["bp"]), ("q", quote["q"]),
            ("s", quote["bs"]), ("t", nanoseconds(quote["t"])), ("x", quote["bx"]), ("z", quote["z"]),
        ])
    }

    /// The members of a held event, `nil` when none is held or it is not one JSON object.
    static func fields(_ event: MarketEvent?) -> [String: String]? {
        guard let event else { return nil }
        return JSONText.members(of: Substring(String(buffer: event.bytes)))?.mapValues { String($0) }
    }

    static func envelope(_ key: String, _ results: String) -> ByteBuffer {
        ByteBuffer(string: #"{"request_id":"relay","status":"OK","\#(key)":\#(results)}"#)
    }

    /// A JSON object of the members that have a value.
    static func object(_ members: [(String, String?)]) -> String {
        "{" + members.compactMap { name, value in value.map { "\"\(name)\":\($0)" } }.joined(separator: ",") + "}"
    }

    /// Milliseconds as nanoseconds (a whole number of milliseconds only); `nil` when the nanoseconds
    /// would not fit in an Int64 (the time came from the upstream as it sent it: left out, never a trap).
    static func nanoseconds(_ milliseconds: String?) -> String? {
        guard let milliseconds = milliseconds.flatMap({ Int64($0) }) else { return nil }
        let (nanoseconds, overflow) = milliseconds.multipliedReportingOverflow(by: 1_000_000)
        return overflow ? nil : String(nanoseconds)
    }

    /// The first element of a JSON array's text.
    static func firstElement(_ array: Substring) -> Substring {
        var depth = 0
        var inString = false
        var escaped = false
        let start = array.index(after: array.startIndex)
        var index = start
        while index < array.endIndex {
            let character = array[index]
            if inString {
                if escaped { escaped = false } else if character == "\\" { escaped = true } else if character == "\"" { inString = false }
            } else if character == "\"" {
                inString = true
            } else if character == "{" || character == "[" {
                depth += 1
            } else if character == "}" || character == "]" {
                if depth == 0 { return array[start..<index] }
                depth -= 1
                if depth == 0 { return array[start...index] }
            } else if character == ",", depth == 0 {
                return array[start..<index]
            }
            index = array.index(after: index)
        }
        return array[start..<index]
    }
}
