import PortfolioDomain
import PortfolioData
import MarketREST
import Foundation
import MarketDataHub
import MarketCore

/// Loads a security's detail: its four groups concurrently, each succeeding or failing on its own.
///
/// `Sendable`. Live values come from the hub's last-value cache first (no request at all); the rest
/// from the upstream's REST API, at background priority when the calling task runs at low priority
/// (a prefetch), so a detail somebody waits for goes first. Transactions and tax lots come from the
/// portfolio's database.
public struct SecurityDetailLoader: Sendable {
    public let store: PortfolioStore
    /// Each served market's hub (a symbol's live values come from the market its ticker names).
    package let hubs: MarketHubs?
    public let rest: (any MarketReference)?
    public let calendar: DayCalendar
    private let marketStatus: MarketStatusMemo

    public init(store: PortfolioStore, hub: MarketDataHub?, rest: (any MarketReference)?, calendar: DayCalendar = .utc) {
        self.init(store: store, hubs: hub.map(MarketHubs.init(stocks:)), rest: rest, calendar: calendar)
    }

    package init(store: PortfolioStore, hubs: MarketHubs?, rest: (any MarketReference)?, calendar: DayCalendar = .utc) {
        self.store = store
        self.hubs = hubs
        self.rest = rest
        self.calendar = calendar
        self.marketStatus = MarketStatusMemo(rest: rest)
    }

    public func load(_ symbol: String) async -> SecurityDetail {
        let priority: RequestGate.Priority = Task.currentPriority <= .low ? .background : .foreground
        async let details = details(symbol, priority: priority)
        async let history = priceHistory(symbol, priority: priority)
        let today = calendar.day(of: .now)
        // Both database groups come from one read of the brokerage accounts and their transactions of the
        // symbol (its lots are made of those alone).
        let ledger: Result<SymbolLedger, any Error>
        do { ledger = .success(try await store.brokerageTransactions(of: symbol)) } catch { ledger = .failure(error) }
        let transactions = self.transactions(symbol, ledger: ledger, today: today)
        let lots = taxLots(symbol, ledger: ledger, today: today)
        return SecurityDetail(
            symbol: symbol, details: await details, priceHistory: await history, transactions: transactions, taxLots: lots,
            loadedAt: .now)
    }

    // MARK: details

    func details(_ symbol: String, priority: RequestGate.Priority) async -> DetailGroup<SecurityDetail.Details> {
        var trade = await liveTrade(symbol)
        var quote = await liveQuote(symbol)
        async let status = marketStatus.current(priority: priority)
        var errors: [String] = []
        if let rest, trade == nil || quote == nil {
            async let restTrade = trade == nil ? rest.lastTrade(symbol, priority: priority) : nil
            async let restQuote = quote == nil ? rest.lastQuote(symbol, priority: priority) : nil
            switch await restTrade {
            case .success(let last)?:
                trade = .init(price: last.price, size: last.size, at: Self.date(nanoseconds: last.timestamp), source: .rest)
            case .failure(let error)?: errors.append("last trade: \(error)")
            case nil: break
            }
            switch await restQuote {
            case .success(let last)?:
                quote = .init(
                    bid: last.bid, bidSize: last.bidSize, ask: last.ask, askSize: last.askSize, at: Self.date(nanoseconds: last.timestamp),
                    source: .rest)
            case .failure(let error)?: errors.append("last quote: \(error)")
            case nil: break
            }
        }
        var market: MarketStatus?
        switch await status {
        case .success(let value): market = value
        case .failure(let error): errors.append("market status: \(error)")
        }
        // Loaded when the market's status and at least a trade or a quote are known; what is missing
        // beyond that is `nil`, and the live overlay fills it in as the stream delivers.
        guard let market, trade != nil || quote != nil else {
            if trade == nil, quote == nil, errors.isEmpty { errors.append("no trade or quote known for \(symbol)") }
            return .failed(errors.joined(separator: "; "))
        }
        return .loaded(.init(lastTrade: trade, lastQuote: quote, marketStatus: market))
    }

    /// The hub's last trade of `symbol`, if the relay has seen one.
    func liveTrade(_ symbol: String) async -> SecurityDetail.Trade? {
        for reading in await liveReadings(of: symbol) {
            guard case .trade(let text, let size, let at) = reading, let price = EventPrices.decimal(text) else { continue }
            return .init(price: price, size: size.flatMap(EventPrices.decimal), at: EventPrices.date(at) ?? .now, source: .live)
        }
        return nil
    }

    /// The hub's last quote of `symbol`, if the relay has seen one.
    func liveQuote(_ symbol: String) async -> SecurityDetail.Quote? {
        for reading in await liveReadings(of: symbol) {
            guard case .quote(let bidText, let bidSize, let askText, let askSize, let at) = reading, let bid = EventPrices.decimal(bidText),
                let ask = EventPrices.decimal(askText)
            else { continue }
            return .init(
                bid: bid, bidSize: bidSize.flatMap(EventPrices.decimal), ask: ask, askSize: askSize.flatMap(EventPrices.decimal),
                at: EventPrices.date(at) ?? .now, source: .live)
        }
        return nil
    }

    /// What the last events of `symbol`'s price topics say, read by its market's protocol, in the
    /// protocol's order of those topics.
    private func liveReadings(of symbol: String) async -> [PriceReading] {
        guard let hubs, let (_, hub) = hubs.hub(for: symbol) else { return [] }
        var readings: [PriceReading] = []
        for topic in hubs.priceTopics(of: symbol).all {
            if let event = await hub.lastEvent(for: topic), let reading = hub.wire.price(in: event) { readings.append(reading) }
        }
        return readings
    }

    /// A REST answer's time, never past now (as a live event's: ``EventPrices/seen(_:now:)``): a time a
    /// REST host gave in the future would keep every live trade and quote after it from replacing it.
    static func date(nanoseconds: Int64) -> Date { EventPrices.seen(nanoseconds, now: Date()) }

    // MARK: price history

    func priceHistory(_ symbol: String, priority: RequestGate.Priority) async -> DetailGroup<SecurityDetail.PriceHistory> {
        guard let rest else { return .failed("no REST source configured (upstream.restURL)") }
        let to = DayCalendar.utc.day(of: .now)
        let from = DayCalendar.utc.day(to, addingYears: -1)
        switch await rest.dailyBars(symbol, from: from, to: to, priority: priority) {
        case .failure(let error):
            return .failed("\(error)")
        case .success(let bars):
            let atr = AverageTrueRange.series(
                high: bars.map(\.high), low: bars.map(\.low), close: bars.map(\.close), period: SecurityDetail.PriceHistory.atrPeriod)
            let rows = zip(bars, atr).map { bar, atr in
                SecurityDetail.HistoryBar(
                    day: DayCalendar.utc.day(of: Date(timeIntervalSince1970: Double(bar.start) / 1000)), open: bar.open, high: bar.high,
                    low: bar.low, close: bar.close, volume: bar.volume, atr: atr)
            }
            return .loaded(.init(from: from, to: to, bars: rows, atr: atr.last ?? nil))
        }
    }

    // MARK: from the database

    /// Every brokerage account with its transactions of one symbol.
    typealias SymbolLedger = [(account: Account, transactions: [Transaction])]

    /// The most transactions and tax lots a detail lists (the newest transactions, the oldest lots: the
    /// next a sell takes). An account may hold 100,000 transactions of one symbol, and every reader of the
    /// detail would be answered all of them, each encoded anew; the totals count every lot.
    static let maxListed = 1_000

    func transactions(_ symbol: String, ledger: Result<SymbolLedger, any Error>, today: Day) -> DetailGroup<[SymbolTransaction]> {
        do {
            let since = calendar.day(today, addingYears: -1)
            var rows: [SymbolTransaction] = []
            for (account, transactions) in try ledger.get() {
                for transaction in transactions where transaction.symbol == symbol && transaction.date >= since {
                    rows.append(SymbolTransaction(transaction: transaction, accountName: account.name))
                }
            }
            // Newest first.
            let sorted = rows.sorted { ($0.transaction.date, $0.transaction.id) > ($1.transaction.date, $1.transaction.id) }
            return .loaded(Array(sorted.prefix(Self.maxListed)))
        } catch {
            return .failed("\(error)")
        }
    }

    /// `lots` as they are, or past ``maxListed`` the oldest of them (in their order, a day's by account).
    static func oldest(_ lots: [SecurityDetail.TaxLot]) -> [SecurityDetail.TaxLot] {
        guard lots.count > maxListed else { return lots }
        return lots.enumerated().sorted { ($0.element.acquired, $0.offset) < ($1.element.acquired, $1.offset) }.prefix(maxListed).map(\.element)
    }

    func taxLots(_ symbol: String, ledger: Result<SymbolLedger, any Error>, today: Day) -> DetailGroup<SecurityDetail.TaxLots> {
        do {
            let longTermFrom = calendar.day(today, addingYears: -1)
            var lots: [SecurityDetail.TaxLot] = []
            for (account, transactions) in try ledger.get() where account.isActive {
                let book = try PositionBook(transactions: transactions)
                for lot in book.positions[symbol]?.lots ?? [] where lot.quantity > 0 {
                    lots.append(
                        .init(
                            accountID: account.id, accountName: account.name, acquired: lot.acquired, quantity: lot.quantity,
                            unitCost: lot.unitCost, costBasis: lot.cost, term: lot.acquired < longTermFrom ? "long" : "short"))
                }
            }
            let shares = lots.reduce(Decimal(0)) { $0 + $1.quantity }
            let basis = lots.reduce(Decimal(0)) { $0 + $1.costBasis }
            return .loaded(
                .init(
                    lots: Self.oldest(lots), sharesAvailable: shares, costBasis: basis,
                    averageCost: shares == 0 ? nil : DecimalText.rounded(basis / shares, scale: 6)))
        } catch {
            return .failed("\(error)")
        }
    }
}

/// The market's status, asked for at most once a minute whatever the number of details loading.
actor MarketStatusMemo {
    private let rest: (any MarketReference)?
    private var last: (value: MarketStatus, at: ContinuousClock.Instant)?
    private var inFlight: Task<Result<MarketStatus, RESTError>, Never>?
    /// The last failure, told again for ``failureLifetime``: a REST host that fails does not cost a request
    /// per detail loaded.
    private var lastFailure: (error: RESTError, at: ContinuousClock.Instant)?
    static let lifetime: Duration = .seconds(60)
    static let failureLifetime: Duration = .seconds(10)

    init(rest: (any MarketReference)?) { self.rest = rest }

    func current(priority: RequestGate.Priority) async -> Result<MarketStatus, RESTError> {
        guard let rest else { return .failure(.transport("no REST source configured")) }
        if let last, ContinuousClock.now - last.at < Self.lifetime { return .success(last.value) }
        if let lastFailure, ContinuousClock.now - lastFailure.at < Self.failureLifetime { return .failure(lastFailure.error) }
        let task: Task<Result<MarketStatus, RESTError>, Never>
        if let inFlight {
            task = inFlight
        } else {
            task = Task { await rest.marketStatus(priority: priority) }
            inFlight = task
        }
        let result = await task.value
        if inFlight == task { inFlight = nil }
        switch result {
        case .success(let value): last = (value, .now)
        case .failure(.cancelled): break
        case .failure(let error): lastFailure = (error, .now)
        }
        return result
    }
}
