import Foundation
import Portfolio
import PortfolioDomain
import Testing

/// Cash and the live total across account kinds, over HTTP against a relay with a real SQLite file.
@Suite("Portfolio cash and live total")
struct PortfolioCashTests {
    @Test func cashMovesWithEveryKindAndAWithdrawalBeyondItIsRefused() async throws {
        try await withPortfolioRelay { _, base in
            let id = try await createBrokerageAccount(base)
            func add(_ body: String) async throws -> (status: Int, json: [String: Any]) {
                let answer = try await httpSend("POST", "\(base)/v1/accounts/\(id)/transactions", json: body)
                return (answer.status, jsonObject(answer.body))
            }
            // Each kind and what it does to the cash.
            let steps: [(String, String)] = [
                (#"{"kind":"deposit","date":"2024-01-02","amount":"10000"}"#, "10000"),
                (#"{"kind":"buy","date":"2024-01-03","symbol":"ZZTEST","quantity":"10","price":"100","fees":"1"}"#, "-1001"),
                (#"{"kind":"sell","date":"2024-01-04","symbol":"ZZTEST","quantity":"5","price":"120","fees":"1"}"#, "599"),
                (#"{"kind":"dividend","date":"2024-01-05","symbol":"ZZTEST","quantity":"5","price":"2"}"#, "10"),
                (#"{"kind":"fee","date":"2024-01-06","fees":"3"}"#, "-3"),
                (#"{"kind":"withdrawal","date":"2024-01-07","amount":"500"}"#, "-500"),
            ]
            for (body, change) in steps {
                let answer = try await add(body)
                #expect(answer.status == 201, "\(body): \(answer.json)")
                #expect(answer.json["cashChange"] as? String == change, "\(body): \(answer.json)")
            }
            let valuation = jsonObject(try await httpGet("\(base)/v1/accounts/\(id)/valuation").body)
            #expect(valuation["cash"] as? String == "9105", "\(valuation)")
            // ZZTEST has no price: the total is the cash alone, and says it is partial.
            #expect(valuation["total"] as? String == "9105")
            #expect(valuation["hasPartialFailures"] as? Bool == true)

            // More than the cash: refused, naming the field, nothing written.
            let overdrawn = try await add(#"{"kind":"withdrawal","date":"2024-01-08","amount":"9105.01"}"#)
            #expect(overdrawn.status == 422)
            #expect(overdrawn.json["field"] as? String == "amount")
            #expect((overdrawn.json["error"] as? String ?? "").contains("9105"), "\(overdrawn.json)")
            // A withdrawal dated before the deposit is checked against the cash of its own day.
            let early = try await add(#"{"kind":"withdrawal","date":"2024-01-01","amount":"1"}"#)
            #expect(early.status == 422, "\(early.json)")
            // Missing amount: named.
            let missing = try await add(#"{"kind":"deposit","date":"2024-01-08"}"#)
            #expect(missing.status == 422)
            #expect(missing.json["field"] as? String == "amount")
            let transactions = try JSONSerialization.jsonObject(with: Data(try await httpGet("\(base)/v1/accounts/\(id)/transactions").body.utf8))
            #expect((transactions as? [Any])?.count == steps.count)

            // A margin account may go below zero.
            let margin = try await httpSend(
                "POST", "\(base)/v1/accounts",
                json: #"{"name":"Margin","kind":"brokerage","createdAt":"2024-01-01T00:00:00Z","allowNegativeCash":true}"#)
            #expect(margin.status == 201)
            #expect(jsonObject(margin.body)["allowNegativeCash"] as? Bool == true)
            let marginID = try #require(jsonObject(margin.body)["id"] as? Int)
            let borrowed = try await httpSend(
                "POST", "\(base)/v1/accounts/\(marginID)/transactions", json: #"{"kind":"withdrawal","date":"2024-01-02","amount":"50"}"#)
            #expect(borrowed.status == 201)
            #expect(jsonObject(try await httpGet("\(base)/v1/accounts/\(marginID)/valuation").body)["cash"] as? String == "-50")

            // History carries the cash of each day, back-dated deposits included.
            let history = try JSONSerialization.jsonObject(
                with: Data(try await httpGet("\(base)/v1/accounts/\(id)/history?from=2024-01-01&to=2024-01-08").body.utf8)) as? [[String: Any]] ?? []
            let cashByDay = Dictionary(uniqueKeysWithValues: history.compactMap { row in
                (row["day"] as? String).map { ($0, row["cash"] as? String ?? "-") }
            })
            #expect(cashByDay["2024-01-01"] == "0", "\(history)")
            #expect(cashByDay["2024-01-02"] == "10000", "\(history)")
            #expect(cashByDay["2024-01-08"] == "9105", "\(history)")
        }
    }

    @Test func savingsAccountsAreInTheLiveTotalAtTheirLastUpdate() async throws {
        try await withPortfolioRelay { _, base in
            let brokerage = try await createBrokerageAccount(base)
            #expect(
                try await httpSend(
                    "POST", "\(base)/v1/accounts/\(brokerage)/transactions", json: #"{"kind":"deposit","date":"2024-01-02","amount":"1000"}"#
                ).status == 201)
            let created = try await httpSend(
                "POST", "\(base)/v1/accounts", json: #"{"name":"Rainy day","kind":"savings","createdAt":"2024-01-01T00:00:00Z"}"#)
            let savings = try #require(jsonObject(created.body)["id"] as? Int)

            // No update yet: listed, without a value, and the total says it is partial.
            var portfolio = jsonObject(try await httpGet("\(base)/v1/portfolio").body)
            #expect(portfolio["total"] as? String == "1000")
            #expect(portfolio["hasPartialFailures"] as? Bool == true)
            var accounts = portfolio["accounts"] as? [[String: Any]] ?? []
            #expect(accounts.count == 2)
            #expect(accounts.first { $0["id"] as? Int == savings }?["value"] == nil)

            for (at, value) in [("2024-02-01T00:00:00Z", "2000"), ("2024-03-01T09:30:00Z", "2500")] {
                #expect(
                    try await httpSend("POST", "\(base)/v1/accounts/\(savings)/updates", json: #"{"at":"\#(at)","value":"\#(value)"}"#).status
                        == 201)
            }
            portfolio = jsonObject(try await httpGet("\(base)/v1/portfolio").body)
            #expect(portfolio["total"] as? String == "3500", "\(portfolio)")
            #expect(portfolio["cash"] as? String == "1000")
            #expect(portfolio["hasPartialFailures"] as? Bool == false)
            accounts = portfolio["accounts"] as? [[String: Any]] ?? []
            let row = try #require(accounts.first { $0["id"] as? Int == savings })
            #expect(row["kind"] as? String == "savings")
            #expect(row["basis"] as? String == "last_update")
            #expect(row["value"] as? String == "2500")
            #expect(row["asOf"] as? String == "2024-03-01T09:30:00Z")
            let live = try #require(accounts.first { $0["id"] as? Int == brokerage })
            #expect(live["basis"] as? String == "live")
            #expect(live["value"] as? String == "1000")

            // Closed: out of the live total.
            #expect(try await httpSend("POST", "\(base)/v1/accounts/\(savings)/close", json: "{}").status == 200)
            portfolio = jsonObject(try await httpGet("\(base)/v1/portfolio").body)
            #expect(portfolio["total"] as? String == "1000")
            #expect((portfolio["accounts"] as? [[String: Any]])?.count == 1)
        }
    }
}

/// The history of days before the relay first valued an account, from the upstream's daily closes.
@Suite("Portfolio history from closes")
struct PortfolioHistoryTests {
    @Test func pastDaysAreValuedFromStoredDailyClosesAndMissingOnesAreNamed() async throws {
        try await withPortfolioRelay { parts, base in
            let calendar = DayCalendar.utc
            let today = calendar.day(of: .now)
            @Sendable func daysAgo(_ count: Int) -> Day {
                var day = today
                for _ in 0..<count { day = calendar.previous(day) }
                return day
            }
            let created = calendar.startOfDay(daysAgo(40)).formatted(Date.ISO8601FormatStyle())
            let account = try #require(
                jsonObject(
                    try await httpSend("POST", "\(base)/v1/accounts", json: #"{"name":"Past","kind":"brokerage","createdAt":"\#(created)"}"#).body
                )["id"] as? Int)
            for body in [
                #"{"kind":"deposit","date":"\#(daysAgo(30))","amount":"2000"}"#,
                #"{"kind":"buy","date":"\#(daysAgo(30))","symbol":"AAPL","quantity":"10","price":"100"}"#,
                // The demo feed has no such ticker: no close can be had.
                #"{"kind":"buy","date":"\#(daysAgo(10))","symbol":"ZZNOPE","quantity":"1","price":"5"}"#,
            ] {
                #expect(try await httpSend("POST", "\(base)/v1/accounts/\(account)/transactions", json: body).status == 201, "\(body)")
            }
            // Any write recomputes the history; the closes come in the background, then the next tick uses them.
            _ = try await httpSend("POST", "\(base)/v1/accounts", json: #"{"name":"Nudge","kind":"savings"}"#)
            @Sendable func history() async throws -> [String: [String: Any]] {
                let answer = try await httpGet("\(base)/v1/accounts/\(account)/history?from=\(daysAgo(40))&to=\(daysAgo(1))")
                let rows = try JSONSerialization.jsonObject(with: Data(answer.body.utf8)) as? [[String: Any]] ?? []
                return Dictionary(uniqueKeysWithValues: rows.compactMap { row in (row["day"] as? String).map { ($0, row) } })
            }
            try await eventually("the days AAPL was held alone to be valued from closes", timeout: .seconds(30)) {
                let row = (try? await history())?[daysAgo(12).description]
                return row?["source"] as? String == "close" && row?["partial"] as? Bool == false
            }
            let rows = try await history()
            let store = try #require(parts.portfolio).store
            let closes = try await store.closes(of: ["AAPL"], from: daysAgo(40), through: daysAgo(1))["AAPL"] ?? []
            #expect(closes.count >= 15, "about 28 weekdays of AAPL closes stored: \(closes.count)")
            // Each day while AAPL was held alone: 10 × that day's close (or the last before it) plus 1000 cash.
            for offset in 11...30 {
                let day = daysAgo(offset)
                let row = try #require(rows[day.description])
                #expect(row["source"] as? String == "close")
                #expect(row["partial"] as? Bool == false, "\(day): \(row)")
                let close = try #require(closes.last { $0.day <= day }?.close, "a close on or before \(day)")
                #expect(row["value"] as? String == DecimalText.format(10 * close + 1000), "\(day): \(row)")
            }
            // Before the buy: nothing held, complete.
            #expect(rows[daysAgo(35).description]?["value"] as? String == "0")
            #expect(rows[daysAgo(35).description]?["partial"] as? Bool == false)
            // From the ZZNOPE buy on: partial, naming it.
            let partialRow = try #require(rows[daysAgo(5).description])
            #expect(partialRow["partial"] as? Bool == true)
            #expect(partialRow["unpriced"] as? [String] == ["ZZNOPE"], "\(partialRow)")

            // Fetched once: more recomputations ask the feed for nothing more.
            let feed = try #require(parts.demoFeed)
            let asked = feed.restCount("aggs", "AAPL").started
            #expect(asked == 1, "\(feed.restCountsByKey)")
            _ = try await httpSend("POST", "\(base)/v1/accounts", json: #"{"name":"Nudge 2","kind":"savings"}"#)
            #expect(feed.restCount("aggs", "AAPL").started == asked)
        }
    }
}
