import Foundation
import PolygonWire
import PortfolioDomain
import RelayComposition
import RelayConfiguration
import RelayServer
import Testing

#if canImport(FoundationNetworking)
    import FoundationNetworking
#endif

/// A `sqlite3` process holding a database's write lock (`BEGIN IMMEDIATE`), as `relay portfolio
/// import` does beside `relay serve`, until ``release()``.
final class SQLiteLockHolder {
    private let process: Process
    private let input: FileHandle

    /// Starts `sqlite3` on `path` and returns once it holds the write lock (it says so on stdout).
    static func lock(_ path: String) async throws -> SQLiteLockHolder {
        let candidates = ["/usr/bin/sqlite3", "/usr/local/bin/sqlite3", "/bin/sqlite3"]
        let executable = try #require(
            candidates.first { FileManager.default.isExecutableFile(atPath: $0) }, "these tests need the sqlite3 command (apt-get install sqlite3)")
        let process = Process()
        process.executableURL = URL(fileURLWithPath: executable)
        process.arguments = [path]
        let input = Pipe()
        let output = Pipe()
        process.standardInput = input
        process.standardOutput = output
        try process.run()
        let holder = SQLiteLockHolder(process: process, input: input.fileHandleForWriting)
        // It waits for a write of the relay's under way (sqlite3 fails at once by default, then said
        // `locked` without holding the lock: seen once in a full run), and says `locked` only once its
        // BEGIN succeeded (`.bail on` ends it at an error).
        input.fileHandleForWriting.write(Data(".timeout 5000\n.bail on\nBEGIN IMMEDIATE;\nSELECT 'locked';\n".utf8))
        let reader = output.fileHandleForReading
        let said = try await within(.seconds(10), "sqlite3 to take the write lock") {
            // On a thread of its own: a blocking read must not take one of the cooperative pool's.
            await withCheckedContinuation { continuation in
                Thread.detachNewThread { continuation.resume(returning: String(decoding: reader.availableData, as: UTF8.self)) }
            }
        }
        guard said.contains("locked") else {
            holder.release()
            throw TimeoutError(description: "sqlite3 did not take the lock: \(said)")
        }
        return holder
    }

    private init(process: Process, input: FileHandle) {
        self.process = process
        self.input = input
    }

    /// Commits (nothing) and quits: the lock is free once this returns.
    func release() {
        guard process.isRunning else { return }
        input.write(Data("COMMIT;\n.quit\n".utf8))
        try? input.close()
        process.waitUntilExit()
    }
}

/// Runs `sql` through the `sqlite3` command on the database at `path` (another process, as an older
/// relay or a hand edit would have written it); returns its output.
func sqlite3(_ path: String, _ sql: String) async throws -> String {
    let candidates = ["/usr/bin/sqlite3", "/usr/local/bin/sqlite3", "/bin/sqlite3"]
    let executable = try #require(
        candidates.first { FileManager.default.isExecutableFile(atPath: $0) }, "these tests need the sqlite3 command (apt-get install sqlite3)")
    let process = Process()
    process.executableURL = URL(fileURLWithPath: executable)
    process.arguments = ["-cmd", ".timeout 5000", path, sql]
    let output = Pipe()
    process.standardOutput = output
    let exited = AsyncStream.makeStream(of: Int32.self)
    process.terminationHandler = { process in
        exited.continuation.yield(process.terminationStatus)
        exited.continuation.finish()
    }
    try process.run()
    let status = try await waitFor(exited.stream, "sqlite3 to finish", timeout: .seconds(15)) { _ in true }
    let text = String(decoding: output.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
    try #require(status == 0, "sqlite3 \(sql) failed: \(text)")
    return text
}

/// A request on loopback with its status, `Retry-After` header and body.
func httpAnswer(_ method: String, _ url: String, json: String) async throws -> (status: Int, retryAfter: String?, body: String) {
    guard let target = URL(string: url) else { throw TimeoutError(description: "bad URL \(url)") }
    var request = URLRequest(url: target)
    request.httpMethod = method
    request.timeoutInterval = 30
    request.httpBody = Data(json.utf8)
    request.setValue("application/json", forHTTPHeaderField: "Content-Type")
    let (data, response) = try await URLSession.shared.data(for: request)
    let http = response as? HTTPURLResponse
    return (http?.statusCode ?? 0, http?.value(forHTTPHeaderField: "Retry-After"), String(decoding: data, as: UTF8.self))
}

@Suite("Portfolio under hostile and heavy use")
struct PortfolioHardeningTests {
    /// Issue 22 item 10: another process holds the SQLite write lock. Portfolio writes wait on GRDB's
    /// queues, not on the cooperative pool, and give up after the short busy timeout with 503; the
    /// market feed and `/healthz` carry on meanwhile.
    @Test func aLockedDatabaseAnswers503AndStopsNothingElse() async throws {
        try await withPortfolioRelay { parts, base in
            let store = try #require(parts.portfolio).store
            let account = try await createBrokerageAccount(base)
            let market = try await WSTestClient.authenticated(url: "ws://127.0.0.1:\(parts.port)/stocks")
            market.send(ClientAction(.subscribe, params: "Q.*"))
            _ = try await market.nextEvents(1, timeout: .seconds(10))

            let lock = try await SQLiteLockHolder.lock(store.path)
            defer { lock.release() }
            // More writers than the machine has cores: each would have taken a thread of the pool.
            let writers = max(4, ProcessInfo.processInfo.activeProcessorCount * 2)
            let started = ContinuousClock.now
            let writes = Task {
                try await withThrowingTaskGroup(of: (status: Int, retryAfter: String?, body: String).self) { group in
                    for index in 0..<writers {
                        group.addTask {
                            try await httpAnswer(
                                "POST", "\(base)/v1/accounts/\(account)/transactions",
                                json: #"{"kind":"deposit","date":"2024-01-0\#(2 + index % 7)","amount":"10"}"#)
                        }
                    }
                    return try await group.reduce(into: []) { $0.append($1) }
                }
            }
            // While they wait: the feed keeps coming and /healthz answers, every time, promptly.
            var healthChecks = 0
            var events = 0
            while ContinuousClock.now - started < .milliseconds(1500) {
                let health = try await within(.seconds(3), "/healthz while the database is locked") { try await httpGet("\(base)/healthz") }
                #expect(health.status == 200 || health.status == 503, "\(health)")
                healthChecks += 1
                events += try await market.nextEvents(1, timeout: .seconds(3)).count
            }
            #expect(healthChecks > 0 && events > 0)

            let answers = try await within(.seconds(15), "the portfolio writes to give up") { try await writes.value }
            let waited = ContinuousClock.now - started
            #expect(waited < .seconds(6), "each write waits at most the short busy timeout (2 s) from its arrival, not 10 s, nor 2 s per write queued before it: \(waited)")
            for answer in answers {
                #expect(answer.status == 503, "\(answer)")
                #expect(answer.retryAfter != nil, "\(answer)")
                let body = jsonObject(answer.body)
                #expect(body["status"] as? Int == 503)
                #expect((body["error"] as? String ?? "").contains("busy"), "\(answer.body)")
            }
            // Nothing was written, and once the lock is gone a write goes through.
            #expect(try await store.transactions(accountID: Int64(account)).isEmpty)
            lock.release()
            let after = try await httpAnswer(
                "POST", "\(base)/v1/accounts/\(account)/transactions", json: #"{"kind":"deposit","date":"2024-01-02","amount":"10"}"#)
            #expect(after.status == 201, "\(after)")
            await market.close()
        }
    }

    /// Issue 22 item 7: a portfolio symbol becomes the sidecar's upstream `T.`/`Q.` topics, so it is held
    /// to the ticker rules of a market-feed subscription; refused with 422 `field: symbol`.
    @Test func symbolsThatWouldNameOtherTopicsAreRefused() async throws {
        try await withPortfolioRelay { parts, base in
            let portfolio = try #require(parts.portfolio)
            let account = try await createBrokerageAccount(base)
            let refused = ["*", "ZZZQ,AM.*", "ZZZQ,Q.AAPL", "Q.*", "A B", "AAPL\\u0000", String(repeating: "A", count: 41), "ZZ\\nQ"]
            for symbol in refused {
                let answer = try await httpSend(
                    "POST", "\(base)/v1/accounts/\(account)/transactions",
                    json: #"{"kind":"buy","date":"2024-01-02","symbol":"\#(symbol)","quantity":"1","price":"1"}"#)
                #expect(answer.status == 422, "\(symbol): \(answer)")
                #expect(jsonObject(answer.body)["field"] as? String == "symbol", "\(symbol): \(answer)")
            }
            for symbol in ["BRK.B", "X:BTCUSD", "C:EUR/USD", String(repeating: "A", count: 40)] {
                let answer = try await httpSend(
                    "POST", "\(base)/v1/accounts/\(account)/transactions",
                    json: #"{"kind":"buy","date":"2024-01-02","symbol":"\#(symbol)","quantity":"1","price":"1"}"#)
                #expect(answer.status == 201, "\(symbol): \(answer)")
            }
            let followed = await portfolio.followedTopics()
            #expect(followed.allSatisfy { !$0.isWildcard && !$0.ticker.contains(",") }, "\(followed)")
            #expect(followed.contains(Topic(eventType: "Q", ticker: "BRK.B")!))
            let transactions = try await portfolio.store.transactions(accountID: Int64(account))
            #expect(transactions.count == 4)
        }
    }

    /// Symbols bought and let go in turn leave nothing behind: a sold symbol's topics are no longer
    /// followed and its prices are dropped (they were kept for ever), and an event of it still under way
    /// does not bring them back.
    @Test func aSymbolLetGoTakesItsPricesAlong() async throws {
        try await withPortfolioRelay(demoRate: 400) { parts, base in
            let portfolio = try #require(parts.portfolio)
            let account = try await createBrokerageAccount(base)
            for symbol in ["AAPL", "MSFT"] {
                let bought = try await httpSend(
                    "POST", "\(base)/v1/accounts/\(account)/transactions",
                    json: #"{"kind":"buy","date":"2024-01-02","symbol":"\#(symbol)","quantity":"1","price":"1"}"#)
                #expect(bought.status == 201, "\(bought)")
            }
            try await eventually("both symbols priced") { await portfolio.pricedSymbols.isSuperset(of: ["AAPL", "MSFT"]) }
            let sold = try await httpSend(
                "POST", "\(base)/v1/accounts/\(account)/transactions",
                json: #"{"kind":"sell","date":"2024-01-03","symbol":"MSFT","quantity":"1","price":"1"}"#)
            #expect(sold.status == 201, "\(sold)")
            #expect(await portfolio.pricedSymbols == ["AAPL"])
            #expect(await portfolio.followedTopics() == [Topic(eventType: "T", ticker: "AAPL")!, Topic(eventType: "Q", ticker: "AAPL")!])
            // The feed goes on (AAPL's price moves: events after the sale were taken); MSFT's stays gone.
            @Sendable func aaplPriceTime() async -> String? {
                let positions = jsonObject((try? await httpGet("\(base)/v1/portfolio").body) ?? "")["positions"] as? [[String: Any]]
                return positions?.first { $0["symbol"] as? String == "AAPL" }?["priceTime"] as? String
            }
            let then = await aaplPriceTime()
            try await eventually("AAPL's price to move") { await aaplPriceTime() != then }
            #expect(await portfolio.pricedSymbols == ["AAPL"])
        }
    }

    /// Issue 22 item 7: a database written before symbols were checked may hold one that is no ticker;
    /// the sidecar follows the good symbols and builds no topic from it.
    @Test func theSidecarFollowsNoUncheckedSymbolFromTheDatabase() async throws {
        try await withPortfolioRelay { parts, base in
            let portfolio = try #require(parts.portfolio)
            let account = try await createBrokerageAccount(base)
            #expect(
                try await httpSend(
                    "POST", "\(base)/v1/accounts/\(account)/transactions",
                    json: #"{"kind":"buy","date":"2024-01-02","symbol":"AAPL","quantity":"1","price":"1"}"#
                ).status == 201)
            for symbol in ["*", "ZZZQ,AM.*"] {
                _ = try await sqlite3(
                    portfolio.store.path,
                    #"INSERT INTO "transaction" (accountID, date, kind, symbol, quantity, price, fees) VALUES (\#(account), '2024-01-02', 'buy', '\#(symbol)', '1', '1', '0');"#
                )
            }
            try await portfolio.holdingsChanged()
            let followed = await portfolio.followedTopics()
            #expect(followed == [Topic(eventType: "T", ticker: "AAPL")!, Topic(eventType: "Q", ticker: "AAPL")!], "\(followed)")
        }
    }

    /// Issue 22 item 11: every date is bounded, 1970-01-01 through tomorrow (a change recomputes the
    /// history from its day on; the year 1 cost 739,945 rows). Refused with 422 naming the field.
    @Test func datesOutsideTheHistoryAreRefusedNamingTheField() async throws {
        try await withPortfolioRelay { parts, base in
            let calendar = DayCalendar.utc
            let today = calendar.day(of: .now)
            let tomorrow = calendar.next(today)
            let afterTomorrow = calendar.next(tomorrow)
            func iso(_ day: Day) -> String { calendar.startOfDay(day).formatted(Date.ISO8601FormatStyle()) }
            for createdAt in ["0001-01-01T00:00:00Z", "1969-12-31T23:59:59Z", iso(afterTomorrow), "9999-12-31T00:00:00Z"] {
                let answer = try await httpSend(
                    "POST", "\(base)/v1/accounts", json: #"{"name":"Old","kind":"brokerage","createdAt":"\#(createdAt)"}"#)
                #expect(answer.status == 422, "\(createdAt): \(answer)")
                #expect(jsonObject(answer.body)["field"] as? String == "createdAt", "\(createdAt): \(answer)")
            }
            let account = try #require(
                jsonObject(
                    try await httpSend("POST", "\(base)/v1/accounts", json: #"{"name":"Core","kind":"brokerage","createdAt":"2024-01-01T00:00:00Z"}"#)
                        .body)["id"] as? Int)
            for date in ["0001-01-01", "1969-12-31", afterTomorrow.description] {
                let answer = try await httpSend(
                    "POST", "\(base)/v1/accounts/\(account)/transactions", json: #"{"kind":"deposit","date":"\#(date)","amount":"1"}"#)
                #expect(answer.status == 422, "\(date): \(answer)")
                #expect(jsonObject(answer.body)["field"] as? String == "date", "\(date): \(answer)")
            }
            #expect(
                try await httpSend(
                    "POST", "\(base)/v1/accounts/\(account)/transactions", json: #"{"kind":"deposit","date":"\#(tomorrow)","amount":"1"}"#
                ).status == 201)
            let savings = try #require(
                jsonObject(try await httpSend("POST", "\(base)/v1/accounts", json: #"{"name":"S","kind":"savings","createdAt":"2024-01-01T00:00:00Z"}"#).body)[
                    "id"] as? Int)
            let update = try await httpSend(
                "POST", "\(base)/v1/accounts/\(savings)/updates", json: #"{"at":"\#(iso(afterTomorrow))","value":"1"}"#)
            #expect(update.status == 422, "\(update)")
            #expect(jsonObject(update.body)["field"] as? String == "at")
            let close = try await httpSend("POST", "\(base)/v1/accounts/\(savings)/close", json: #"{"closedAt":"3000-01-01T00:00:00Z"}"#)
            #expect(close.status == 422, "\(close)")
            #expect(jsonObject(close.body)["field"] as? String == "closedAt")
            // A malformed close body is refused, not taken for none (which would close the account now).
            let malformed = try await httpSend("POST", "\(base)/v1/accounts/\(savings)/close", json: #"{"closedAt":"#)
            #expect(malformed.status == 400, "\(malformed)")
            // A body past the bound is 413, not an internal error.
            let huge = try await httpSend("POST", "\(base)/v1/accounts", json: #"{"name":""# + String(repeating: "x", count: 2 << 20) + #""}"#)
            #expect(huge.status == 413, "\(huge.status)")
            // Nothing of it was written: two accounts, one transaction.
            #expect((try JSONSerialization.jsonObject(with: Data(try await httpGet("\(base)/v1/accounts").body.utf8)) as? [Any])?.count == 2)
            #expect(try await #require(parts.portfolio).store.transactions(accountID: Int64(account)).count == 1)
        }
    }

    /// Issue 22 item 12: closing on a day the account still has transactions on or after is refused
    /// with 409 (a new transaction there would be); the account stays open and unchanged.
    @Test func closingBeforeTheLastTransactionIsAConflict() async throws {
        try await withPortfolioRelay { _, base in
            let account = try await createBrokerageAccount(base)
            for body in [#"{"kind":"deposit","date":"2024-01-02","amount":"100"}"#, #"{"kind":"withdrawal","date":"2024-03-01","amount":"10"}"#] {
                #expect(try await httpSend("POST", "\(base)/v1/accounts/\(account)/transactions", json: body).status == 201)
            }
            for closedAt in ["2024-02-01T00:00:00Z", "2024-03-01T12:00:00Z"] {
                let answer = try await httpSend("POST", "\(base)/v1/accounts/\(account)/close", json: #"{"closedAt":"\#(closedAt)"}"#)
                #expect(answer.status == 409, "\(closedAt): \(answer)")
                #expect(jsonObject(answer.body)["field"] as? String == "closedAt")
                #expect((jsonObject(answer.body)["error"] as? String ?? "").contains("2024-03-01"), "\(answer)")
            }
            let still = jsonObject(try await httpGet("\(base)/v1/accounts/\(account)").body)
            #expect(still["isActive"] as? Bool == true, "\(still)")
            #expect(still["closedAt"] == nil)
            let closed = try await httpSend("POST", "\(base)/v1/accounts/\(account)/close", json: #"{"closedAt":"2024-03-02T00:00:00Z"}"#)
            #expect(closed.status == 200, "\(closed)")

            // A savings account with an update after the close asked for: the same.
            let savings = try #require(
                jsonObject(try await httpSend("POST", "\(base)/v1/accounts", json: #"{"name":"S","kind":"savings","createdAt":"2024-01-01T00:00:00Z"}"#).body)[
                    "id"] as? Int)
            #expect(
                try await httpSend("POST", "\(base)/v1/accounts/\(savings)/updates", json: #"{"at":"2024-02-01T10:00:00Z","value":"5"}"#).status == 201)
            let early = try await httpSend("POST", "\(base)/v1/accounts/\(savings)/close", json: #"{"closedAt":"2024-01-15T00:00:00Z"}"#)
            #expect(early.status == 409, "\(early)")
        }
    }

    /// Issue 22 item 12: after a back-dated transaction, the history rows it changes are right when the
    /// write answers, not after the next recomputation.
    @Test func aBackDatedTransactionIsInTheHistoryWhenTheWriteAnswers() async throws {
        try await withPortfolioRelay { _, base in
            let account = try await createBrokerageAccount(base)
            #expect(
                try await httpSend(
                    "POST", "\(base)/v1/accounts/\(account)/transactions", json: #"{"kind":"deposit","date":"2024-01-10","amount":"100"}"#
                ).status == 201)
            for (body, cash) in [
                (#"{"kind":"deposit","date":"2024-01-05","amount":"50"}"#, ["2024-01-04": "0", "2024-01-05": "50", "2024-01-10": "150"]),
                (#"{"kind":"withdrawal","date":"2024-01-07","amount":"20"}"#, ["2024-01-06": "50", "2024-01-07": "30", "2024-01-10": "130"]),
            ] {
                #expect(try await httpSend("POST", "\(base)/v1/accounts/\(account)/transactions", json: body).status == 201)
                let rows =
                    try JSONSerialization.jsonObject(
                        with: Data(try await httpGet("\(base)/v1/accounts/\(account)/history?from=2024-01-01&to=2024-01-31").body.utf8))
                    as? [[String: Any]] ?? []
                let byDay = Dictionary(uniqueKeysWithValues: rows.compactMap { row in (row["day"] as? String).map { ($0, row["cash"] as? String) } })
                for (day, expected) in cash { #expect(byDay[day] == expected, "\(body): \(day) in \(rows.prefix(12))") }
                let total = try JSONSerialization.jsonObject(
                    with: Data(try await httpGet("\(base)/v1/portfolio/history?from=2024-01-10&to=2024-01-10").body.utf8)) as? [[String: Any]]
                #expect(total?.first?["cash"] as? String == cash["2024-01-10"], "\(String(describing: total))")
            }
        }
    }

    /// Issue 22 item 9: a key's topics hold on `/v1/securities/{symbol}` as on `/v1/last/**`: a key
    /// that may read neither T.MSFT nor Q.MSFT is refused (403), one that may read only T.MSFT gets the
    /// detail without the last quote (named in `withheld`), a key with every topic gets both.
    @Test func aKeysTopicsHoldOnTheSecurityDetail() async throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("relay-entitled-\(UUID().uuidString)").path
        defer { try? FileManager.default.removeItem(atPath: directory) }
        var settings = RelaySettings(
            listen: .init(host: "127.0.0.1", port: 0), demoRate: 200, portfolio: .init(dataDirectory: directory, closeHistory: false))
        settings.clientKeyRights = [
            try ClientKey(name: "aapl-trades", secret: "aapl-secret", topics: ["T.AAPL"], portfolio: .read),
            try ClientKey(name: "msft-trades", secret: "msft-secret", topics: ["T.MSFT"], portfolio: .read),
            try ClientKey(name: "msft-quotes", secret: "quotes-secret", topics: ["Q.MSFT"], portfolio: .read),
            try ClientKey(name: "everything", secret: "all-secret", portfolio: .read),
        ]
        let relay = Relay(settings: settings, logger: testLogger)
        try await withServices([relay]) {
            let parts = try await within(.seconds(10), "the relay to start") { try await relay.ready() }
            let base = "http://127.0.0.1:\(parts.port)"
            func detail(_ key: String) async throws -> (status: Int, json: [String: Any]) {
                let answer = try await httpSend("GET", "\(base)/v1/securities/MSFT", headers: ["Authorization": "Bearer \(key)"])
                return (answer.status, jsonObject(answer.body))
            }
            func values(_ json: [String: Any]) -> [String: Any] {
                ((json["details"] as? [String: Any])?["data"] as? [String: Any]) ?? [:]
            }

            let refused = try await detail("aapl-secret")
            #expect(refused.status == 403, "\(refused)")
            #expect(refused.json["field"] as? String == "symbol")
            let message = refused.json["error"] as? String ?? ""
            #expect(message.contains("T.MSFT") && message.contains("Q.MSFT"), "\(message)")
            #expect(try await httpSend("GET", "\(base)/v1/last/Q.MSFT", headers: ["Authorization": "Bearer aapl-secret"]).status == 403)

            let everything = try await detail("all-secret")
            #expect(everything.status == 200, "\(everything)")
            #expect(values(everything.json)["lastTrade"] != nil, "\(everything.json)")
            #expect(values(everything.json)["lastQuote"] != nil, "\(everything.json)")
            #expect(values(everything.json)["withheld"] == nil)

            // The same cached detail, cut for this key.
            let tradesOnly = try await detail("msft-secret")
            #expect(tradesOnly.status == 200, "\(tradesOnly)")
            #expect(values(tradesOnly.json)["lastTrade"] != nil, "\(tradesOnly.json)")
            #expect(values(tradesOnly.json)["lastQuote"] == nil, "\(tradesOnly.json)")
            #expect(values(tradesOnly.json)["withheld"] as? [String] == ["Q.MSFT"])
            #expect((tradesOnly.json["priceHistory"] as? [String: Any])?["status"] as? String == (everything.json["priceHistory"] as? [String: Any])?["status"] as? String)
            // Without the trades, no last trade and no daily bars (they are trades).
            let quotesOnly = try await detail("quotes-secret")
            #expect(quotesOnly.status == 200, "\(quotesOnly)")
            #expect(values(quotesOnly.json)["lastTrade"] == nil && values(quotesOnly.json)["lastQuote"] != nil, "\(quotesOnly.json)")
            let history = quotesOnly.json["priceHistory"] as? [String: Any]
            #expect(history?["status"] as? String == "failed" && (history?["error"] as? String)?.contains("T.MSFT") == true, "\(String(describing: history))")
        }
    }

    /// A key's topics hold on the valuation as on the market feed: a key that may read AAPL's trades and
    /// quotes but not MSFT's sees MSFT's row `withheld` (no price, no value) and left out of every total,
    /// on `/v1/portfolio`, an account's valuation, the holdings and the live stream; a key with every
    /// topic sees MSFT priced on the same book. A writing key limited to AAPL may not buy MSFT (else
    /// holding it would show its price); it may buy AAPL.
    @Test func aKeySeesOnlyThePricesItMayRead() async throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("relay-withheld-\(UUID().uuidString)").path
        defer { try? FileManager.default.removeItem(atPath: directory) }
        var settings = RelaySettings(
            listen: .init(host: "127.0.0.1", port: 0), demoRate: 200, portfolio: .init(dataDirectory: directory, closeHistory: false))
        settings.clientKeyRights = [
            try ClientKey(name: "owner", secret: "owner-secret"),
            try ClientKey(name: "aapl", secret: "aapl-secret", topics: ["T.AAPL", "Q.AAPL"], portfolio: .write),
        ]
        let relay = Relay(settings: settings, logger: testLogger)
        try await withServices([relay]) {
            let parts = try await within(.seconds(10), "the relay to start") { try await relay.ready() }
            let base = "http://127.0.0.1:\(parts.port)"
            @Sendable func send(_ method: String, _ path: String, _ key: String, json: String? = nil) async throws -> (status: Int, body: String) {
                try await httpSend(method, base + path, json: json, headers: ["Authorization": "Bearer \(key)-secret"])
            }
            let created = try await send(
                "POST", "/v1/accounts", "owner", json: #"{"name":"Core","kind":"brokerage","createdAt":"2024-01-01T00:00:00Z"}"#)
            let account = try #require(jsonObject(created.body)["id"] as? Int, "\(created)")
            for symbol in ["AAPL", "MSFT"] {
                let bought = try await send(
                    "POST", "/v1/accounts/\(account)/transactions", "owner",
                    json: #"{"kind":"buy","date":"2024-01-02","symbol":"\#(symbol)","quantity":"10","price":"100"}"#)
                #expect(bought.status == 201, "\(bought)")
            }
            @Sendable func rows(_ json: [String: Any], _ field: String = "positions") -> [String: [String: Any]] {
                let list = json[field] as? [[String: Any]] ?? []
                return Dictionary(list.map { ($0["symbol"] as? String ?? "", $0) }, uniquingKeysWith: { first, _ in first })
            }
            // The owner's valuation prices both once the feed has.
            try await eventually("both symbols priced for the owner") {
                let rows = rows(jsonObject((try? await send("GET", "/v1/portfolio", "owner").body) ?? ""))
                return rows["AAPL"]?["status"] as? String == "priced" && rows["MSFT"]?["status"] as? String == "priced"
            }
            for path in ["/v1/portfolio", "/v1/accounts/\(account)/valuation"] {
                let answer = try await send("GET", path, "aapl")
                #expect(answer.status == 200, "\(answer)")
                let json = jsonObject(answer.body)
                let positions = rows(json)
                #expect(positions["AAPL"]?["status"] as? String == "priced", "\(path): \(answer.body)")
                #expect(positions["MSFT"]?["status"] as? String == "withheld", "\(path): \(answer.body)")
                for field in ["price", "marketValue", "priceTime", "unrealizedPnL", "dayChange"] {
                    #expect(positions["MSFT"]?[field] == nil, "\(path): MSFT's \(field) is withheld: \(answer.body)")
                }
                #expect(json["withheldSymbols"] as? [String] == ["MSFT"], "\(path)")
                #expect(json["hasPartialFailures"] as? Bool == true, "\(path)")
                // The totals are AAPL's alone (and the cash).
                let aapl = Decimal(string: positions["AAPL"]?["marketValue"] as? String ?? "")
                #expect(aapl != nil && Decimal(string: json["positionsValue"] as? String ?? "") == aapl, "\(path): \(answer.body)")
                let accounts = json["accounts"] as? [[String: Any]] ?? []
                #expect(accounts.first?["partial"] as? Bool == true, "\(path): \(accounts)")
            }
            let holdings = try await send("GET", "/v1/holdings", "aapl")
            #expect(holdings.status == 200, "\(holdings)")
            let held = rows(jsonObject(holdings.body), "holdings")
            #expect(held["MSFT"]?["status"] as? String == "withheld" && held["MSFT"]?["price"] == nil, "\(holdings.body)")
            #expect(held["AAPL"]?["status"] as? String == "priced", "\(holdings.body)")
            #expect(rows(jsonObject(try await send("GET", "/v1/holdings", "owner").body), "holdings")["MSFT"]?["status"] as? String == "priced")

            // A view sorted by value is ordered for each key's rights: the owner's MSFT (about 4,150)
            // before AAPL (1,895); the limited key's AAPL before the MSFT it has no value for. Neither
            // list replaces the other's order.
            let byValue = "/v1/holdings?sort=marketValue"
            let ownerView = try #require(jsonObject(try await send("GET", byValue, "owner").body)["view"] as? [String: Any])
            let viewID = try #require(ownerView["id"] as? String)
            _ = try await send("GET", byValue, "aapl")
            func place(_ symbol: String, _ key: String) async throws -> Int? {
                let answer = try await send("GET", "/v1/securities/\(symbol)?view=\(viewID)", key)
                return (jsonObject(answer.body)["view"] as? [String: Any])?["position"] as? Int
            }
            #expect(try await place("MSFT", "owner") == 0)
            #expect(try await place("AAPL", "aapl") == 0)

            // A history valued from MSFT's prices is not the limited key's; one of AAPL alone is.
            for path in ["/v1/accounts/\(account)/history", "/v1/portfolio/history"] {
                let refused = try await send("GET", path, "aapl")
                #expect(refused.status == 403 && refused.body.contains("MSFT"), "\(path): \(refused)")
                #expect(try await send("GET", path, "owner").status == 200, "\(path)")
            }

            // The live stream: each key's frames carry what it may read.
            let ws = base.replacingOccurrences(of: "http://", with: "ws://") + "/v1/portfolio/stream?apiKey="
            let owner = WSTestClient(url: ws + "owner-secret")
            let limited = WSTestClient(url: ws + "aapl-secret")
            #expect(rows(jsonObject(try await owner.nextFrame()))["MSFT"]?["status"] as? String == "priced")
            for _ in 0..<2 {
                let frame = jsonObject(try await limited.nextFrame())
                #expect(rows(frame)["MSFT"]?["status"] as? String == "withheld", "\(frame)")
                #expect(rows(frame)["MSFT"]?["price"] == nil && frame["withheldSymbols"] as? [String] == ["MSFT"], "\(frame)")
            }
            await owner.close()
            await limited.close()

            // Writing: not a symbol the key may not read; its own, yes. An account that is not there is 404.
            let nowhere = try await send(
                "POST", "/v1/accounts/9999/transactions", "aapl", json: #"{"kind":"buy","date":"2024-01-03","symbol":"NVDA","quantity":"1","price":"100"}"#)
            #expect(nowhere.status == 404, "\(nowhere)")
            let refused = try await send(
                "POST", "/v1/accounts/\(account)/transactions", "aapl", json: #"{"kind":"buy","date":"2024-01-03","symbol":"nvda","quantity":"1","price":"100"}"#)
            #expect(refused.status == 403, "\(refused)")
            #expect(jsonObject(refused.body)["field"] as? String == "symbol" && refused.body.contains("T.NVDA"), "\(refused.body)")
            let allowed = try await send(
                "POST", "/v1/accounts/\(account)/transactions", "aapl", json: #"{"kind":"buy","date":"2024-01-03","symbol":"AAPL","quantity":"1","price":"100"}"#)
            #expect(allowed.status == 201, "\(allowed)")
            // A fee names no symbol (the store drops one sent): not refused for it.
            let fee = try await send(
                "POST", "/v1/accounts/\(account)/transactions", "aapl", json: #"{"kind":"fee","date":"2024-01-03","symbol":"NVDA","fees":"1"}"#)
            #expect(fee.status == 201, "\(fee)")
            let own = try #require(
                jsonObject(
                    try await send("POST", "/v1/accounts", "aapl", json: #"{"name":"Apple","kind":"brokerage","createdAt":"2024-01-01T00:00:00Z"}"#).body
                )["id"] as? Int)
            #expect(
                try await send(
                    "POST", "/v1/accounts/\(own)/transactions", "aapl", json: #"{"kind":"buy","date":"2024-01-03","symbol":"AAPL","quantity":"1","price":"100"}"#
                ).status == 201)
            #expect(try await send("GET", "/v1/accounts/\(own)/history", "aapl").status == 200)
        }
    }

    /// Issue 22 item 3 (the portfolio part): every `/v1/portfolio/stream` connection is fed from one
    /// valuation stream, each valuation encoded once, not one stream and one encoding per connection.
    @Test func streamConnectionsShareOneEncodedValuation() async throws {
        try await withPortfolioRelay { parts, base in
            let portfolio = try #require(parts.portfolio)
            let account = try await createBrokerageAccount(base)
            #expect(
                try await httpSend(
                    "POST", "\(base)/v1/accounts/\(account)/transactions", json: #"{"kind":"deposit","date":"2024-01-02","amount":"1000"}"#
                ).status == 201)
            let streams = (0..<3).map { _ in WSTestClient(url: "ws://127.0.0.1:\(parts.port)/v1/portfolio/stream") }
            var first: [String] = []
            for stream in streams { first.append(try await stream.nextFrame()) }
            for frame in first { #expect(jsonObject(frame)["cash"] as? String == "1000", "\(frame)") }
            #expect(await portfolio.valuationWatchers == 1, "three connections, one valuation stream")

            // A change: every connection gets the same bytes.
            #expect(
                try await httpSend(
                    "POST", "\(base)/v1/accounts/\(account)/transactions", json: #"{"kind":"deposit","date":"2024-01-03","amount":"1"}"#
                ).status == 201)
            var next: [String] = []
            for stream in streams {
                var frame = try await stream.nextFrame()
                while jsonObject(frame)["cash"] as? String != "1001" { frame = try await stream.nextFrame() }
                next.append(frame)
            }
            #expect(Set(next).count == 1, "\(next)")
            #expect(await portfolio.valuationWatchers == 1)

            for stream in streams { await stream.close() }
            try await eventually("the shared stream to stop with its last connection") { await portfolio.valuationWatchers == 0 }
        }
    }
}
