import Foundation
import MarketDataHub
import NIOCore
import PolygonWire
import Synchronization
import RelayTestSupport
import Testing

@testable import Portfolio
@testable import PortfolioData
@testable import PortfolioDomain

func dec(_ text: String) -> Decimal { DecimalText.parse(text) ?? .nan }
func day(_ text: String) -> Day { Day(text) ?? Day(year: 1970, month: 1, day: 1) }
func instant(_ text: String) -> Date { (try? Date.ISO8601FormatStyle().parse(text)) ?? Date(timeIntervalSince1970: 0) }

@Suite("Money and days")
struct MoneyAndDayTests {
    @Test func decimalsAreExact() {
        #expect(dec("0.1") + dec("0.2") == dec("0.3"))
        #expect(DecimalText.format(dec("123456789012345678.123456789")) == "123456789012345678.123456789")
        #expect(DecimalText.format(dec("1.10") * 3) == "3.3")
    }

    @Test(arguments: [
        "", "1e5", "1,000", "NaN", "--1", "1.", ".5", "0x10", "1 000", "-", "-.5", "1.2.3", "1-", "+1",
        String(repeating: "9", count: 31), "1." + String(repeating: "1", count: 19),
    ])
    func onlyPlainDecimalsAreAccepted(text: String) {
        #expect(DecimalText.parse(text) == nil)
    }

    @Test func plainDecimalsParse() {
        #expect(DecimalText.parse("-0.5") == dec("-0.5"))
        #expect(DecimalText.parse(" 12 ") == 12)
        #expect(DecimalText.parse(String(repeating: "9", count: 30)) != nil)
        #expect(DecimalText.parse("0." + String(repeating: "1", count: 18)) != nil)
    }

    @Test func daysAreRealCalendarDates() {
        #expect(Day("2024-02-29") != nil)
        #expect(Day("2023-02-29") == nil)
        #expect(Day("2024-13-01") == nil)
        #expect(day("2024-03-09") < day("2024-03-10"))
    }

    @Test func localDaysFollowTheTimeZoneAcrossDST() throws {
        let newYork = try #require(DayCalendar(timeZone: "America/New_York"))
        // 03:30 UTC on 10 March is still 9 March in New York (22:30 EST).
        #expect(newYork.day(of: instant("2024-03-10T03:30:00Z")) == day("2024-03-09"))
        // The 23-hour day of the spring change and the 25-hour day of the autumn one are one day each.
        #expect(newYork.next(day("2024-03-10")) == day("2024-03-11"))
        #expect(newYork.next(day("2024-11-03")) == day("2024-11-04"))
        #expect(newYork.days(from: day("2024-03-09"), through: day("2024-03-12")).count == 4)
    }
}

@Suite("FIFO lots")
struct PositionBookTests {
    func tx(_ kind: TransactionKind, _ date: String, _ quantity: String, _ price: String, fees: String = "0", symbol: String = "AAPL")
        -> Transaction
    {
        Transaction(
            id: 0, accountID: 1, date: day(date), kind: kind, symbol: symbol, quantity: dec(quantity), price: dec(price), fees: dec(fees))
    }

    @Test func partialSellsConsumeTheOldestLotsFirst() throws {
        let book = try PositionBook(transactions: [
            tx(.buy, "2024-01-02", "10", "100", fees: "1"),
            tx(.buy, "2024-02-01", "5", "110"),
            tx(.sell, "2024-03-01", "12", "120", fees: "2"),
        ])
        let position = try #require(book.positions["AAPL"])
        #expect(position.lots == [PositionBook.Lot(acquired: day("2024-02-01"), quantity: dec("3"), cost: dec("330"))])
        #expect(position.quantity == dec("3"))
        #expect(position.costBasis == dec("330"))
        // Proceeds 1440 − 2 fees, against 1001 (first lot, fee included) + 2 × 110.
        #expect(position.realizedPnL == dec("217"))
    }

    @Test func aLotSplitKeepsTheRestOfItsCostExactly() throws {
        let book = try PositionBook(transactions: [tx(.buy, "2024-01-02", "3", "10", fees: "1"), tx(.sell, "2024-01-03", "1", "12")])
        let lot = try #require(book.positions["AAPL"]?.lots.first)
        #expect(lot.quantity == dec("2"))
        #expect(lot.cost + dec("10.3333333333") == dec("31"))
    }

    @Test func sellingMoreThanHeldIsRefused() {
        #expect(throws: PositionBook.BookError.self) {
            try PositionBook(transactions: [tx(.buy, "2024-01-02", "1", "10"), tx(.sell, "2024-01-03", "2", "10")])
        }
    }

    @Test func sameDayTransactionsApplyInTheirOrder() throws {
        let book = try PositionBook(transactions: [tx(.buy, "2024-01-02", "1", "10"), tx(.sell, "2024-01-02", "1", "11")])
        #expect(book.open.isEmpty)
        #expect(book.positions["AAPL"]?.realizedPnL == dec("1"))
    }
}

@Suite("Valuation")
struct ValuationTests {
    @Test func aMissingAndAStalePriceStayOutOfTheTotalAndAreNamed() throws {
        let now = instant("2024-05-01T15:00:00Z")
        let book = try PositionBook(transactions: [
            Transaction(
                id: 1, accountID: 1, date: day("2024-01-02"), kind: .buy, symbol: "AAPL", quantity: dec("10"), price: dec("150"),
                fees: dec("0")),
            Transaction(
                id: 2, accountID: 1, date: day("2024-01-02"), kind: .buy, symbol: "MSFT", quantity: dec("2"), price: dec("300"),
                fees: dec("0")),
            Transaction(
                id: 3, accountID: 1, date: day("2024-01-02"), kind: .buy, symbol: "NVDA", quantity: dec("1"), price: dec("100"),
                fees: dec("0")),
        ])
        let prices: [String: SymbolPrices] = [
            "AAPL": SymbolPrices(
                lastTrade: PriceObservation(value: dec("189.5"), at: now.addingTimeInterval(-5), source: .trade), previousClose: dec("188")),
            "MSFT": SymbolPrices(
                lastQuoteMid: PriceObservation(value: dec("410.25"), at: now.addingTimeInterval(-3600), source: .quoteMid)),
        ]
        let valuation = Valuation.of(book.open, prices: prices, rule: PriceRule(staleAfter: 900), now: now)
        #expect(valuation.total == dec("1895"))
        #expect(valuation.costBasis == dec("1500"))
        #expect(valuation.unrealizedPnL == dec("395"))
        #expect(valuation.dayChange == dec("15"))
        #expect(valuation.hasPartialFailures)
        #expect(valuation.unpricedSymbols == ["NVDA"])
        #expect(valuation.staleSymbols == ["MSFT"])
        let msft = try #require(valuation.positions.first { $0.symbol == "MSFT" })
        #expect(msft.status == .stale)
        #expect(msft.marketValue == dec("820.5"))
        let nvda = try #require(valuation.positions.first { $0.symbol == "NVDA" })
        #expect(nvda.status == .unavailable)
        #expect(nvda.marketValue == nil)
        #expect(nvda.costBasis == dec("100"))
    }

    /// A client that may read a symbol's quotes but not its trades is valued from the quote mid (no last
    /// trade, REST price or previous close); one that may read neither sees the row `withheld`, outside
    /// every total, named in `withheldSymbols`.
    @Test func pricesAClientMayNotReadAreLeftOutAndNamed() throws {
        let now = instant("2024-05-01T15:00:00Z")
        let book = try PositionBook(transactions: ["AAPL", "MSFT"].enumerated().map { index, symbol in
            Transaction(
                id: Int64(index + 1), accountID: 1, date: day("2024-01-02"), kind: .buy, symbol: symbol, quantity: dec("10"), price: dec("100"),
                fees: dec("0"))
        })
        let both = SymbolPrices(
            lastTrade: PriceObservation(value: dec("120"), at: now.addingTimeInterval(-5), source: .trade),
            lastQuoteMid: PriceObservation(value: dec("119"), at: now.addingTimeInterval(-5), source: .quoteMid),
            reference: PriceObservation(value: dec("118"), at: now.addingTimeInterval(-5), source: .restLastTrade), previousClose: dec("110"))
        let prices = ["AAPL": both, "MSFT": both]
        let rule = PriceRule(staleAfter: 900)
        let whole = Valuation.of(book.open, cash: dec("5"), prices: prices, rule: rule, now: now)
        #expect(whole.total == dec("2405") && whole.withheldSymbols.isEmpty && !whole.hasPartialFailures)

        let readability: (String) -> PriceReadability = { $0 == "AAPL" ? PriceReadability(trade: false, quote: true) : .none }
        let cut = Valuation.of(book.open, cash: dec("5"), prices: prices, rule: rule, now: now, readability: readability)
        let aapl = try #require(cut.positions.first { $0.symbol == "AAPL" })
        #expect(aapl.price == dec("119") && aapl.priceSource == .quoteMid && aapl.status == .priced)
        #expect(aapl.dayChange == nil, "the previous close is a trade")
        let msft = try #require(cut.positions.first { $0.symbol == "MSFT" })
        #expect(msft.status == .withheld && msft.price == nil && msft.marketValue == nil && msft.priceTime == nil && msft.dayChange == nil)
        #expect(msft.costBasis == dec("1000"), "the book's own figures stay")
        #expect(cut.total == dec("1195") && cut.positionsValue == dec("1190") && cut.costBasis == dec("1000"))
        #expect(cut.withheldSymbols == ["MSFT"] && cut.unpricedSymbols.isEmpty && cut.hasPartialFailures)
        // Trades only: no quote mid, so a stale trade stays stale rather than the fresh quote standing in.
        var staleTrade = both
        staleTrade.lastTrade?.at = now.addingTimeInterval(-3600)
        staleTrade.reference = nil
        let tradesOnly = Valuation.of(
            book.open, prices: ["AAPL": staleTrade], rule: rule, now: now, readability: { _ in PriceReadability(trade: true, quote: false) })
        #expect(tradesOnly.positions.first { $0.symbol == "AAPL" }?.status == .stale)
        #expect(tradesOnly.positions.first { $0.symbol == "AAPL" }?.price == dec("120"))
    }

    @Test func theRulePrefersAFreshTradeThenAFreshQuoteMid() {
        let now = instant("2024-05-01T15:00:00Z")
        let rule = PriceRule(staleAfter: 60)
        let trade = PriceObservation(value: dec("10"), at: now.addingTimeInterval(-120), source: .trade)
        let quote = PriceObservation(value: dec("11"), at: now.addingTimeInterval(-10), source: .quoteMid)
        #expect(rule.pick(SymbolPrices(lastTrade: trade, lastQuoteMid: quote), now: now).0 == quote)
        let freshTrade = PriceObservation(value: dec("12"), at: now, source: .trade)
        #expect(rule.pick(SymbolPrices(lastTrade: freshTrade, lastQuoteMid: quote), now: now).0 == freshTrade)
        #expect(rule.pick(SymbolPrices(), now: now).1 == .unavailable)
    }
}

@Suite("Daily snapshots")
struct SnapshotTests {
    let planner = SnapshotPlanner(calendar: .utc)

    func savings(created: String, closed: String? = nil, id: Int64 = 1) -> Account {
        Account(id: id, name: "S\(id)", kind: .savings, currency: "USD", createdAt: instant(created), closedAt: closed.map(instant))
    }

    func update(_ at: String, _ value: String) -> SnapshotPlanner.Observation {
        .init(at: instant(at), value: dec(value), source: .update)
    }

    @Test func theLatestValueOfADayWins() {
        let snapshots = planner.accountSnapshots(
            for: savings(created: "2024-01-01T09:00:00Z"),
            observations: [
                update("2024-01-01T18:00:00Z", "300"), update("2024-01-01T10:00:00Z", "100"), update("2024-01-01T12:00:00Z", "200"),
            ],
            today: day("2024-01-01"))
        #expect(snapshots.map(\.value) == [dec("300")])
        #expect(snapshots.first?.source == .update)
    }

    @Test func daysWithoutAValueCarryThePreviousOneWithNoGaps() {
        let snapshots = planner.accountSnapshots(
            for: savings(created: "2024-01-01T09:00:00Z"),
            observations: [update("2024-01-01T10:00:00Z", "100"), update("2024-01-04T10:00:00Z", "150")],
            today: day("2024-01-06"))
        #expect(snapshots.map(\.day.description) == ["2024-01-01", "2024-01-02", "2024-01-03", "2024-01-04", "2024-01-05", "2024-01-06"])
        #expect(snapshots.map(\.value) == ["100", "100", "100", "150", "150", "150"].map(dec))
        #expect(snapshots.map(\.source) == [.update, .carried, .carried, .update, .carried, .carried])
    }

    @Test func historyStartsAtCreationEvenBeforeTheFirstValue() {
        let snapshots = planner.accountSnapshots(
            for: savings(created: "2024-01-01T09:00:00Z"), observations: [update("2024-01-03T10:00:00Z", "50")], today: day("2024-01-03"))
        #expect(snapshots.map(\.source) == [.none, .none, .update])
        #expect(snapshots.map(\.partial) == [true, true, false])
        #expect(snapshots.first?.value == 0)
    }

    @Test func aClosedAccountLeavesTotalsFromItsClosingDayButKeepsThePast() {
        let open = savings(created: "2024-01-01T00:00:00Z", id: 1)
        let closing = savings(created: "2024-01-01T00:00:00Z", closed: "2024-01-03T12:00:00Z", id: 2)
        let a = planner.accountSnapshots(for: open, observations: [update("2024-01-01T10:00:00Z", "100")], today: day("2024-01-05"))
        let b = planner.accountSnapshots(for: closing, observations: [update("2024-01-01T10:00:00Z", "40")], today: day("2024-01-05"))
        #expect(b.map(\.day.description) == ["2024-01-01", "2024-01-02"])
        let totals = planner.portfolioSnapshots(
            accounts: [open, closing], snapshots: a + b, from: day("2024-01-01"), through: day("2024-01-05"))
        #expect(totals.map(\.total) == ["140", "140", "100", "100", "100"].map(dec))
        #expect(totals.allSatisfy { !$0.partial })
    }

    @Test func aDSTChangeInANonUTCZoneMovesNoValueToTheWrongDay() throws {
        let newYork = SnapshotPlanner(calendar: try #require(DayCalendar(timeZone: "America/New_York")))
        let account = savings(created: "2024-03-09T15:00:00Z")
        let snapshots = newYork.accountSnapshots(
            for: account,
            observations: [
                update("2024-03-10T04:30:00Z", "100"),  // 23:30 EST on 9 March
                update("2024-03-10T07:30:00Z", "200"),  // 03:30 EDT on 10 March, after the clocks jumped
                update("2024-03-11T03:59:00Z", "300"),  // 23:59 EDT on 10 March
            ],
            today: day("2024-03-11"))
        #expect(snapshots.map(\.day.description) == ["2024-03-09", "2024-03-10", "2024-03-11"])
        #expect(snapshots.map(\.value) == ["100", "300", "300"].map(dec))
    }

    @Test func thousandsOfDaysAreFilledExactly() {
        let snapshots = planner.accountSnapshots(
            for: savings(created: "2016-01-01T00:00:00Z"),
            observations: [update("2016-01-01T10:00:00Z", "1"), update("2020-02-29T10:00:00Z", "2")],
            today: day("2025-12-31"))
        #expect(snapshots.count == 3653)
        #expect(snapshots.filter { $0.source == .update }.count == 2)
        #expect(snapshots.last?.value == dec("2"))
    }
}

@Suite("Store")
struct PortfolioStoreTests {
    @Test func concurrentSellsNeverSellMoreThanIsHeld() async throws {
        let dir = scratchDirectory("portfolio")
        defer { try? FileManager.default.removeItem(atPath: dir) }
        // Two pools on one file, like `relay serve` and `relay portfolio import` in two processes.
        let first = try PortfolioStore(directory: dir)
        let second = try PortfolioStore(directory: dir)
        let account = try await first.createAccount(name: "B", kind: .brokerage, currency: "USD", createdAt: instant("2024-01-01T00:00:00Z"))
        let day = try #require(Day("2024-01-02"))
        _ = try await first.addTransaction(accountID: account.id, date: day, kind: .buy, symbol: "AAPL", quantity: 10, price: 100, fees: 0)
        let sold = await withTaskGroup(of: Bool.self) { group in
            for index in 0..<40 {
                let store = index.isMultiple(of: 2) ? first : second
                group.addTask {
                    (try? await store.addTransaction(
                        accountID: account.id, date: day, kind: .sell, symbol: "AAPL", quantity: 1, price: 101, fees: 0)) != nil
                }
            }
            return await group.reduce(0) { $0 + ($1 ? 1 : 0) }
        }
        #expect(sold == 10, "exactly the ten shares held could be sold")
        let book = try PositionBook(transactions: try await first.transactions(accountID: account.id))
        #expect(book.positions.values.allSatisfy { $0.quantity >= 0 })
    }

    /// Accounts, an account's transactions and the symbols named are bounded: a write past one is a
    /// conflict naming the setting and writes nothing; an import past one writes none of its rows.
    @Test func accountsTransactionsAndSymbolsAreBoundedAndAWritePastThemWritesNothing() async throws {
        let dir = scratchDirectory("portfolio")
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let store = try PortfolioStore(directory: dir, limits: PortfolioLimits(accounts: 2, transactionsPerAccount: 4, updatesPerAccount: 2, symbols: 2))
        let created = instant("2024-01-01T00:00:00Z")
        let broker = try await store.createAccount(name: "B", kind: .brokerage, currency: "USD", createdAt: created)
        let savings = try await store.createAccount(name: "S", kind: .savings, currency: "USD", createdAt: created)
        await #expect { _ = try await store.createAccount(name: "C", kind: .savings, currency: "USD", createdAt: created) } throws: { error in
            (error as? ConflictError)?.message.contains("at most 2 accounts (portfolio.maxAccounts)") == true
        }
        for month in [2, 3] {
            _ = try await store.addUpdate(accountID: savings.id, at: instant("2024-0\(month)-01T00:00:00Z"), value: 10)
        }
        await #expect { _ = try await store.addUpdate(accountID: savings.id, at: instant("2024-04-01T00:00:00Z"), value: 10) } throws: { error in
            (error as? ConflictError)?.message.contains("at most 2 value updates (portfolio.maxUpdatesPerAccount)") == true
        }
        #expect(try await store.updates(accountID: savings.id).count == 2)
        for symbol in ["AAPL", "MSFT"] {
            _ = try await store.addTransaction(accountID: broker.id, date: day("2024-01-02"), kind: .buy, symbol: symbol, quantity: 1, price: 10)
        }
        // A fee is the account's: the symbol it names is not kept, and takes no place.
        _ = try await store.addTransaction(accountID: broker.id, date: day("2024-01-02"), kind: .fee, symbol: "ZZZ", fees: 1)
        #expect(try await store.transactions(accountID: broker.id).last?.symbol == "")
        // A third symbol has no place (not one a fee named either); one already named does.
        await #expect { _ = try await store.addTransaction(accountID: broker.id, date: day("2024-01-02"), kind: .buy, symbol: "ZZZ", quantity: 1, price: 10) } throws: { error in
            (error as? ConflictError)?.field == "symbol"
        }
        await #expect { _ = try await store.addTransaction(accountID: broker.id, date: day("2024-01-02"), kind: .buy, symbol: "NVDA", quantity: 1, price: 10) } throws: { error in
            (error as? ConflictError)?.field == "symbol"
        }
        _ = try await store.addTransaction(accountID: broker.id, date: day("2024-01-03"), kind: .buy, symbol: "AAPL", quantity: 1, price: 10)
        // Four (the fee's among them): the account is full.
        await #expect { _ = try await store.addTransaction(accountID: broker.id, date: day("2024-01-04"), kind: .sell, symbol: "MSFT", quantity: 1, price: 11) } throws: { error in
            (error as? ConflictError)?.message.contains("at most 4 transactions") == true
        }
        #expect(try await store.transactions(accountID: broker.id).count == 4)
        // An import into a new account past the account bound: nothing written.
        #expect(throws: PortfolioStore.ImportError.self) {
            _ = try store.importTransactions(
                [("New", PortfolioStore.NewTransaction(date: day("2024-01-05"), kind: .buy, symbol: "AAPL", quantity: 1, price: 10))], newAccounts: "USD")
        }
        #expect(try await store.accounts().count == 2)
    }

    @Test func everythingSurvivesAReopenExactly() async throws {
        let dir = scratchDirectory("portfolio")
        defer { try? FileManager.default.removeItem(atPath: dir) }
        var store: PortfolioStore? = try PortfolioStore(directory: dir)
        let brokerage = try #require(
            try await store?.createAccount(name: "Broker", kind: .brokerage, currency: "USD", createdAt: instant("2024-01-01T00:00:00Z")))
        _ = try await store?.addTransaction(
            accountID: brokerage.id, date: day("2024-01-02"), kind: .buy, symbol: "aapl", quantity: dec("0.1"), price: dec("189.123456789"),
            fees: dec("0.01"))
        let savings = try #require(
            try await store?.createAccount(name: "Savings", kind: .savings, currency: "USD", createdAt: instant("2024-01-01T00:00:00Z")))
        _ = try await store?.addUpdate(accountID: savings.id, at: instant("2024-01-02T10:00:00Z"), value: dec("1000000000000.01"))
        store = nil

        let reopened = try PortfolioStore(directory: dir)
        let transactions = try await reopened.transactions(accountID: brokerage.id)
        #expect(transactions.first?.symbol == "AAPL")
        #expect(transactions.first?.price == dec("189.123456789"))
        #expect(try await reopened.updates(accountID: savings.id).first?.value == dec("1000000000000.01"))
        #expect(try await reopened.accounts().map(\.name) == ["Broker", "Savings"])
    }

    @Test func deletingAnAccountRemovesItsRowsClosingKeepsThem() async throws {
        let dir = scratchDirectory("portfolio")
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let store = try PortfolioStore(directory: dir)
        let a = try await store.createAccount(name: "A", kind: .savings, currency: "USD", createdAt: instant("2024-01-01T00:00:00Z"))
        let b = try await store.createAccount(name: "B", kind: .savings, currency: "USD", createdAt: instant("2024-01-01T00:00:00Z"))
        for account in [a, b] {
            _ = try await store.addUpdate(accountID: account.id, at: instant("2024-01-01T10:00:00Z"), value: dec("5"))
            try await store.saveSnapshots(
                [AccountSnapshot(accountID: account.id, day: day("2024-01-01"), value: dec("5"), partial: false, source: .update)],
                portfolio: [])
        }
        _ = try await store.closeAccount(b.id, at: instant("2024-01-02T00:00:00Z"))
        try await store.deleteAccount(a.id)
        #expect(try await store.updates(accountID: a.id).isEmpty)
        #expect(try await store.accountSnapshots(accountID: a.id, from: day("2024-01-01"), through: day("2024-01-31")).isEmpty)
        #expect(try await store.accountSnapshots(accountID: b.id, from: day("2024-01-01"), through: day("2024-01-31")).count == 1)
        #expect(try await store.account(b.id).closedAt != nil)
    }

    /// Issue 22 item 11: the bounds, 1970-01-01 and tomorrow, are themselves allowed; a second past either is not.
    @Test func datesFrom1970ThroughTomorrowAreAllowed() async throws {
        let dir = scratchDirectory("portfolio")
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let store = try PortfolioStore(directory: dir)
        let account = try await store.createAccount(name: "Epoch", kind: .brokerage, currency: "USD", createdAt: instant("1970-01-01T00:00:00Z"))
        let tomorrow = DayCalendar.utc.next(DayCalendar.utc.day(of: .now))
        _ = try await store.addTransaction(accountID: account.id, date: day("1970-01-01"), kind: .deposit, amount: 1)
        _ = try await store.addTransaction(accountID: account.id, date: tomorrow, kind: .deposit, amount: 1)
        await #expect(throws: PortfolioStore.ValidationError.self) {
            try await store.createAccount(name: "Before", kind: .brokerage, currency: "USD", createdAt: instant("1969-12-31T23:59:59Z"))
        }
        await #expect(throws: PortfolioStore.ValidationError.self) {
            try await store.addTransaction(accountID: account.id, date: DayCalendar.utc.next(tomorrow), kind: .deposit, amount: 1)
        }
        #expect(try await store.transactions(accountID: account.id).count == 2)
    }

    @Test func invalidInputNamesTheField() async throws {
        let dir = scratchDirectory("portfolio")
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let store = try PortfolioStore(directory: dir)
        let broker = try await store.createAccount(name: "B", kind: .brokerage, currency: "USD", createdAt: instant("2024-01-01T00:00:00Z"))
        func field(_ body: () async throws -> Void) async -> String? {
            do {
                try await body()
                return nil
            } catch let error as PortfolioStore.ValidationError {
                return error.field
            } catch {
                return "\(error)"
            }
        }
        #expect(await field { _ = try await store.createAccount(name: " ", kind: .savings, currency: "USD", createdAt: .now) } == "name")
        #expect(await field { _ = try await store.createAccount(name: "X", kind: .savings, currency: "usd", createdAt: .now) } == "currency")
        #expect(
            await field {
                _ = try await store.addTransaction(
                    accountID: broker.id, date: day("2024-01-02"), kind: .buy, symbol: "A", quantity: 0, price: 1, fees: 0)
            }
                == "quantity")
        #expect(
            await field {
                _ = try await store.addTransaction(
                    accountID: broker.id, date: day("2024-01-02"), kind: .sell, symbol: "A", quantity: 1, price: 1, fees: 0)
            }
                == "quantity")
        #expect(await field { _ = try await store.addUpdate(accountID: broker.id, at: .now, value: 1) } == "accountID")
    }
}

@Suite("Prices from every market's events")
struct MarketPriceTests {
    func prices(_ json: String, market: Market) throws -> SymbolPrices {
        var prices = SymbolPrices()
        for event in try FrameParser.parse(ByteBuffer(string: "[\(json)]"), market: market).events {
            EventPrices.apply(PolygonWireProtocol().price(in: event), to: &prices, now: Date(timeIntervalSince1970: 0))
        }
        return prices
    }

    /// A price in exponent form is read as the number it is (the old text scan stopped at the `e`).
    @Test func aPriceInExponentFormIsReadWhole() throws {
        let trade = try prices(#"{"ev":"XT","pair":"SHIB-USD","p":1.5e-05,"s":1000,"t":1700000000000}"#, market: .crypto)
        #expect(trade.lastTrade?.value == Decimal(string: "0.000015"))
    }

    @Test func cryptoForexAndIndexEventsPriceTheirHoldings() throws {
        let crypto = try prices(
            #"{"ev":"XT","pair":"BTC-USD","p":33021.9,"t":1610462007425,"s":0.01,"c":[2],"i":1,"x":3,"r":1},{"ev":"XQ","pair":"BTC-USD","bp":33052.79,"bs":0.48,"ap":33073.19,"as":0.6,"t":1610462411115,"x":1,"r":1}"#,
            market: .crypto)
        #expect(crypto.lastTrade?.value == dec("33021.9"))
        #expect(crypto.lastQuoteMid?.value == dec("33062.99"))
        let forex = try prices(#"{"ev":"C","p":"EUR/USD","x":48,"a":1.0844,"b":1.0842,"t":1536036818784}"#, market: .forex)
        #expect(forex.lastQuoteMid?.value == dec("1.0843"))
        #expect(forex.lastTrade == nil)
        let index = try prices(#"{"ev":"V","val":3988.5,"T":"I:SPX","t":1678220098130}"#, market: .indices)
        #expect(index.lastTrade?.value == dec("3988.5"))
    }

    @Test func eachTickerIsFollowedOnItsOwnMarketsChannels() {
        #expect(PolygonWireProtocol().priceTopics(of: "X:BTC-USD", market: Market.of(ticker: "X:BTC-USD")).all.map(\.description) == ["XT.X:BTC-USD", "XQ.X:BTC-USD"])
        #expect(PolygonWireProtocol().priceTopics(of: "C:EUR-USD", market: Market.of(ticker: "C:EUR-USD")).all.map(\.description) == ["C.C:EUR-USD"])
        #expect(PolygonWireProtocol().priceTopics(of: "I:SPX", market: Market.of(ticker: "I:SPX")).all.map(\.description) == ["V.I:SPX"])
        #expect(PolygonWireProtocol().priceTopics(of: "AAPL", market: Market.of(ticker: "AAPL")).all.map(\.description) == ["T.AAPL", "Q.AAPL"])
        #expect(PolygonWireProtocol().priceTopics(of: "O:SPY251219C00650000", market: Market.of(ticker: "O:SPY251219C00650000")).all.map(\.description) == ["T.O:SPY251219C00650000", "Q.O:SPY251219C00650000"])
    }
}
