import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
import RelayComposition
import RelayConfiguration
import Testing

/// The valuation sidecar driven by the relay's own stream, over loopback.
@Suite("Portfolio end to end")
struct PortfolioEndToEndTests {
    @Test func closingOrDeletingAnAccountTakesItOutOfEveryDayItNoLongerCountsOn() async throws {
        try await withPortfolioRelay { _, base in
            let formatter = ISO8601DateFormatter()
            let threeDaysAgo = formatter.string(from: Date.now.addingTimeInterval(-3 * 86_400))
            let day = DateFormatter()
            day.dateFormat = "yyyy-MM-dd"
            day.timeZone = TimeZone(identifier: "UTC")
            let today = day.string(from: .now)
            let earlier = day.string(from: Date.now.addingTimeInterval(-3 * 86_400))
            @Sendable func totals() async throws -> [String: Decimal] {
                let answer = try await httpGet("\(base)/v1/portfolio/history?from=\(earlier)&to=\(today)")
                let rows = try JSONSerialization.jsonObject(with: Data(answer.body.utf8)) as? [[String: Any]] ?? []
                var byDay: [String: Decimal] = [:]
                for row in rows {
                    if let day = row["day"] as? String, let value = (row["value"] as? String).flatMap({ Decimal(string: $0) }) {
                        byDay[day] = value
                    }
                }
                return byDay
            }
            func savings(_ name: String, value: String) async throws -> Int {
                let created = try await httpSend(
                    "POST", "\(base)/v1/accounts", json: #"{"name":"\#(name)","kind":"savings","createdAt":"\#(threeDaysAgo)"}"#)
                #expect(created.status == 201)
                let id = try #require(jsonObject(created.body)["id"] as? Int)
                let update = try await httpSend(
                    "POST", "\(base)/v1/accounts/\(id)/updates", json: #"{"at":"\#(threeDaysAgo)","value":"\#(value)"}"#)
                #expect(update.status == 201)
                return id
            }

            // Close the only account: today counts nothing, the days before its close still count it.
            let only = try await savings("Only", value: "100")
            #expect(try await totals()[today] == 100)
            #expect(try await httpSend("POST", "\(base)/v1/accounts/\(only)/close", json: "{}").status == 200)
            var after = try await totals()
            #expect(after[today] == 0, "today's total after closing the only account: \(after)")
            #expect(after[earlier] == 100, "the days before the close keep it")

            // A second account, deleted: gone from every day, as if it had never been.
            let deleted = try await savings("Del", value: "250")
            #expect(try await totals()[today] == 250)
            #expect(try await httpSend("DELETE", "\(base)/v1/accounts/\(deleted)").status == 204)
            after = try await totals()
            #expect(after[today] == 0, "today's total after deleting: \(after)")
            #expect(after[earlier] == 100, "only the closed account is left on the earlier days: \(after)")
            #expect(!after.values.contains(250) && !after.values.contains(350), "no day keeps the deleted account: \(after)")
        }
    }

    @Test func datesOutsideAnAccountsLifeAreRefusedWith409AndTheReason() async throws {
        try await withPortfolioRelay { _, base in
            let id = try await createBrokerageAccount(base)  // created 2024-01-01
            func buy(_ date: String) async throws -> (status: Int, body: [String: Any]) {
                let answer = try await httpSend(
                    "POST", "\(base)/v1/accounts/\(id)/transactions",
                    json: #"{"date":"\#(date)","kind":"buy","symbol":"AAPL","quantity":"1","price":"100"}"#)
                return (answer.status, jsonObject(answer.body))
            }
            let early = try await buy("2023-12-31")
            #expect(early.status == 409)
            #expect(early.body["field"] as? String == "date")
            #expect((early.body["error"] as? String ?? "").contains("before the account was created"), "\(early.body)")
            #expect(try await buy("2024-01-01").status == 201, "the creation day itself is fine")
            let closed = try await httpSend("POST", "\(base)/v1/accounts/\(id)/close", json: #"{"closedAt":"2024-06-01T12:00:00Z"}"#)
            #expect(closed.status == 200)
            let late = try await buy("2024-06-02")
            #expect(late.status == 409)
            #expect((late.body["error"] as? String ?? "").contains("closed on 2024-06-01"), "\(late.body)")
            #expect(try await buy("2024-05-31").status == 201, "before the close is fine")

            let savings = try await httpSend(
                "POST", "\(base)/v1/accounts", json: #"{"name":"Cash","kind":"savings","createdAt":"2024-01-01T00:00:00Z"}"#)
            let savingsID = try #require(jsonObject(savings.body)["id"] as? Int)
            _ = try await httpSend("POST", "\(base)/v1/accounts/\(savingsID)/close", json: #"{"closedAt":"2024-06-01T00:00:00Z"}"#)
            let update = try await httpSend(
                "POST", "\(base)/v1/accounts/\(savingsID)/updates", json: #"{"at":"2024-07-01T00:00:00Z","value":"10"}"#)
            #expect(update.status == 409)
            #expect(jsonObject(update.body)["field"] as? String == "at")
        }
    }

    @Test func accountsTransactionsLiveValuationStreamAndHistory() async throws {
        try await withPortfolioRelay(demoRate: 2000) { parts, base in
            let id = try await createBrokerageAccount(base)

            // Validation names the field; nothing is written.
            let malformed = try await httpSend(
                "POST", "\(base)/v1/accounts/\(id)/transactions",
                json: #"{"date":"2024-01-02","kind":"buy","symbol":"AAPL","quantity":"ten","price":"150"}"#)
            #expect(malformed.status == 400)
            #expect(jsonObject(malformed.body)["field"] as? String == "quantity")
            let oversell = try await httpSend(
                "POST", "\(base)/v1/accounts/\(id)/transactions",
                json: #"{"date":"2024-01-02","kind":"sell","symbol":"AAPL","quantity":"1","price":"150"}"#)
            #expect(oversell.status == 422)
            #expect(jsonObject(oversell.body)["field"] as? String == "quantity")

            let deposited = try await httpSend(
                "POST", "\(base)/v1/accounts/\(id)/transactions", json: #"{"date":"2024-01-02","kind":"deposit","amount":"2000"}"#)
            #expect(deposited.status == 201)
            let bought = try await httpSend(
                "POST", "\(base)/v1/accounts/\(id)/transactions",
                json: #"{"date":"2024-01-02","kind":"buy","symbol":"aapl","quantity":"10","price":"150.10","fees":"1"}"#)
            #expect(bought.status == 201)
            #expect(jsonObject(bought.body)["price"] as? String == "150.1")

            // The stream pushes a valuation once AAPL is priced from the live feed.
            let stream = WSTestClient(url: "ws://127.0.0.1:\(parts.port)/v1/portfolio/stream")
            var priced: [String: Any] = [:]
            let deadline = ContinuousClock.now + .seconds(20)
            while ContinuousClock.now < deadline {
                let valuation = jsonObject(try await stream.nextFrame())
                let positions = valuation["positions"] as? [[String: Any]] ?? []
                if positions.first?["status"] as? String == "priced" {
                    priced = valuation
                    break
                }
            }
            let position = try #require((priced["positions"] as? [[String: Any]])?.first)
            #expect(position["symbol"] as? String == "AAPL")
            #expect(position["quantity"] as? String == "10")
            #expect(position["costBasis"] as? String == "1502")
            let total = try #require((priced["total"] as? String).flatMap { Decimal(string: $0) })
            let positionsValue = try #require((priced["positionsValue"] as? String).flatMap { Decimal(string: $0) })
            #expect(positionsValue > 0)
            #expect(priced["cash"] as? String == "498", "2000 deposited less 1502 for the buy")
            #expect(total == positionsValue + 498)
            #expect(priced["hasPartialFailures"] as? Bool == false)
            await stream.close()

            let valuation = try await httpGet("\(base)/v1/portfolio")
            #expect(valuation.status == 200)
            #expect((jsonObject(valuation.body)["positions"] as? [[String: Any]])?.count == 1)

            // Today's snapshot follows the live valuation by itself (no manual backfill).
            try await eventually("today's history row to carry the live total", timeout: .seconds(15)) {
                guard let history = try? await httpGet("\(base)/v1/portfolio/history"),
                    let rows = try? JSONSerialization.jsonObject(with: Data(history.body.utf8)) as? [[String: Any]],
                    let today = rows.last
                else { return false }
                return today["partial"] as? Bool == false
                    && (today["value"] as? String).flatMap { Decimal(string: $0) }.map { $0 > 0 } == true
            }
            // History is gap-free from the account's creation to today.
            let history = try await httpGet("\(base)/v1/accounts/\(id)/history?from=2024-01-01&to=2024-01-10")
            let days = try JSONSerialization.jsonObject(with: Data(history.body.utf8)) as? [[String: Any]] ?? []
            #expect(days.count == 10)
            #expect(days.first?["day"] as? String == "2024-01-01")
            let portfolio = try await httpGet("\(base)/v1/portfolio/history")
            let totals = try JSONSerialization.jsonObject(with: Data(portfolio.body.utf8)) as? [[String: Any]] ?? []
            #expect((totals.last?["value"] as? String) != nil)
            #expect(try await httpGet("\(base)/v1/accounts/999/history").status == 404)
            #expect(try await httpGet("\(base)/v1/portfolio/history?from=2024-13-01").status == 422)
        }
    }

    @Test func aListIsPagedInItsOrderWithALinkToTheNextPage() async throws {
        try await withPortfolioRelay { _, base in
            let id = try await createBrokerageAccount(base)
            // Dated out of the order they are written in: a page follows the list's order (by date, then id).
            var written: [(date: String, id: Int)] = []
            for date in ["2024-01-05", "2024-01-02", "2024-01-02", "2024-01-03", "2024-01-04"] {
                let answer = try await httpSend(
                    "POST", "\(base)/v1/accounts/\(id)/transactions", json: #"{"kind":"deposit","date":"\#(date)","amount":"10"}"#)
                #expect(answer.status == 201)
                written.append((date, try #require(jsonObject(answer.body)["id"] as? Int)))
            }
            let inOrder = written.sorted { ($0.date, $0.id) < ($1.date, $1.id) }.map(\.id)
            /// A page's ids and its `Link` header.
            func page(_ path: String) async throws -> (ids: [Int], next: String?) {
                let url = try #require(URL(string: base + path))
                let (data, response) = try await URLSession.shared.data(from: url)
                let http = try #require(response as? HTTPURLResponse)
                #expect(http.statusCode == 200, "\(path): \(String(decoding: data, as: UTF8.self))")
                let rows = (try? JSONSerialization.jsonObject(with: data)) as? [[String: Any]] ?? []
                let next = http.value(forHTTPHeaderField: "Link").flatMap { link in
                    link.hasSuffix(#">; rel="next""#) && link.hasPrefix("<") ? String(link.dropFirst().dropLast(#">; rel="next""#.count)) : nil
                }
                return (rows.compactMap { $0["id"] as? Int }, next)
            }
            var seen: [Int] = []
            var next: String? = "/v1/accounts/\(id)/transactions?limit=2"
            var pages = 0
            while let path = next {
                let answer = try await page(path)
                #expect(answer.ids.count == (answer.next == nil ? 1 : 2), "\(path)")
                seen += answer.ids
                next = answer.next
                pages += 1
                try #require(pages <= 3, "the pages did not end")
            }
            #expect(seen == inOrder)
            // One at a time: each page boundary falls between two rows, two of them of the same date.
            var single: [Int] = []
            var link: String? = "/v1/accounts/\(id)/transactions?limit=1"
            while let path = link, single.count <= inOrder.count {
                let answer = try await page(path)
                single += answer.ids
                link = answer.next
            }
            #expect(single == inOrder)
            // Without a limit: the first 1,000, all of these, and no link.
            let all = try await page("/v1/accounts/\(id)/transactions")
            #expect(all.ids == inOrder)
            #expect(all.next == nil)

            // Value updates are paged the same way (by time, then id).
            let savings = jsonObject(
                try await httpSend("POST", "\(base)/v1/accounts", json: #"{"name":"S","kind":"savings","createdAt":"2024-01-01T00:00:00Z"}"#).body)["id"] as? Int
            let savingsID = try #require(savings)
            for at in ["2024-03-01T00:00:00Z", "2024-02-01T00:00:00Z"] {
                #expect(try await httpSend("POST", "\(base)/v1/accounts/\(savingsID)/updates", json: #"{"at":"\#(at)","value":"5"}"#).status == 201)
            }
            let first = try await page("/v1/accounts/\(savingsID)/updates?limit=1")
            let second = try await page(try #require(first.next))
            #expect(second.next == nil)
            #expect(first.ids.count == 1 && second.ids.count == 1 && first.ids[0] > second.ids[0], "February's update (written second) comes first")

            // What cannot be asked is refused naming its field, and the connection's next request is answered.
            for (query, field) in [("limit=0", "limit"), ("limit=10001", "limit"), ("limit=x", "limit"), ("after=x", "after"), ("after=999999", "after")] {
                let refused = try await httpSend("GET", "\(base)/v1/accounts/\(id)/transactions?\(query)")
                #expect(refused.status == 422, "\(query)")
                #expect(jsonObject(refused.body)["field"] as? String == field, "\(query): \(refused.body)")
            }
            #expect(try await httpSend("GET", "\(base)/v1/accounts/999/transactions?limit=1").status == 404)
        }
    }

    @Test func errorsNameTheirFieldAndListValidValues() async throws {
        try await withPortfolioRelay { _, base in
            let id = try await createBrokerageAccount(base)

            // A number with an exponent is refused like such a string: money is exact.
            let exponent = try await httpSend(
                "POST", "\(base)/v1/accounts/\(id)/transactions",
                json: #"{"date":"2024-01-02","kind":"buy","symbol":"AAPL","quantity":"1","price":1e3}"#)
            #expect(exponent.status == 422)
            #expect(jsonObject(exponent.body)["field"] as? String == "price")
            #expect(try await httpSend("GET", "\(base)/v1/accounts/\(id)/transactions").body == "[]", "nothing was written")

            // An unknown kind lists the valid ones.
            let kind = try await httpSend(
                "POST", "\(base)/v1/accounts/\(id)/transactions",
                json: #"{"date":"2024-01-02","kind":"gift","symbol":"AAPL","quantity":"1","price":"1"}"#)
            #expect(kind.status == 400)
            #expect(jsonObject(kind.body)["field"] as? String == "kind")
            #expect((jsonObject(kind.body)["error"] as? String)?.contains("buy, sell, dividend, fee") == true)

            // An unknown account is 404 on its sub-routes, not an empty list.
            #expect(try await httpSend("GET", "\(base)/v1/accounts/999/transactions").status == 404)
            #expect(try await httpSend("GET", "\(base)/v1/accounts/999/updates").status == 404)
        }
    }
}
