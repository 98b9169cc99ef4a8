import PortfolioDomain
import PortfolioData
import MarketREST
import Foundation
import Logging
import MarketDataHub
import MarketCore
import ServiceLifecycle

/// The valuation sidecar: values holdings off the relay's own stream and keeps the daily history.
///
/// An actor. It is an ordinary hub subscriber (quotes and trades of every held symbol, following the
/// holdings as they change); prices come from those events and, at start, from the hub's last-value
/// cache. Valuations are pushed to stream watchers at most every `pushInterval`; today's snapshots are
/// written at most every `snapshotInterval`, and the whole history is backfilled at start and at each
/// day boundary.
public actor PortfolioService: Service {
    public nonisolated let store: PortfolioStore
    public nonisolated let calendar: DayCalendar
    public nonisolated let rule: PriceRule
    /// Each served market's hub: a holding is priced from the market its ticker names.
    private let hubs: MarketHubs
    private let planner: SnapshotPlanner
    private let logger: Logger
    private let referencePrices: ReferencePrices?
    /// Whether past days are valued from daily closes fetched over REST.
    private let closeHistory: Bool
    private let pushInterval: Duration
    private let snapshotInterval: Duration
    /// What is known of the price of each symbol held (``held``): a symbol let go takes its prices along
    /// (a closed account's positions are then unpriced: it is followed no more). ``setReference(_:previousClose:for:)``
    /// sets one for any symbol (tests).
    private var prices: [String: SymbolPrices] = [:]
    /// The sidecar's subscription on each market's hub.
    private var subscriptions: [Market: HubSubscription] = [:]
    private var held: Set<String> = []
    private var watchers: [UUID: AsyncStream<Valuation>.Continuation] = [:]
    private var lastPush = ContinuousClock.now - .seconds(3600)
    private var pushPending = false
    private var lastSnapshotWrite = ContinuousClock.now - .seconds(3600)
    private var lastBackfillDay: Day?
    /// A symbol got its first price since the last snapshot: today's value changed in kind, not just
    /// in amount, so it is written at the next tick rather than at the next interval.
    private var snapshotDue = false
    /// What the last backfill wrote (tests check it touches only the days that changed).
    public private(set) var lastHistoryWrite = PortfolioStore.HistoryWrite()
    /// The fetch of daily closes under way, if any.
    private var closeFetch: Task<Void, Never>?
    /// How many close fetches have ended: a recomputation that read the store's coverage before the
    /// latest one ended asks for nothing (its coverage is stale).
    private(set) var closeFetchesEnded = 0
    /// The first day of the closes a recomputation needed while it could not ask for them (a fetch was
    /// under way, or ended meanwhile): the fetch's end recomputes from it, which asks again.
    private var closesNeededFrom: Day?
    /// When a symbol's closes from a day last failed to come, and how long to wait from then before
    /// asking again (``closeRetryWait(after:)``): each range on its own (an old one the vendor has no
    /// bars for keeps failing while the new days come).
    /// `asked`: its wait passed and the history was recomputed from its first day (which asks again).
    private var closeFailures: [CloseRange: (at: ContinuousClock.Instant, wait: Duration, asked: Bool)] = [:]
    /// Symbols newly held whose reference prices are to be asked for, and the one loader asking.
    private var referencesWanted: Set<String> = []
    private var referenceLoader: Task<Void, Never>?

    /// A symbol's closes from a day on: what a fetch asks for.
    struct CloseRange: Hashable {
        let symbol: String
        let from: Day
    }

    /// One fetch of closes: a symbol's days, and whether they all come before what the store covers.
    private typealias CloseWork = (symbol: String, days: ClosedRange<Day>, beforeCoverage: Bool)
    static let closeRetry: ClosedRange<Duration> = .seconds(600)...(.seconds(86_400))
    /// The latest `holdingsChanged` (the next waits for it).
    private var holdingsSync: Task<Void, any Error>?
    /// Brokerage accounts valued with every price since the relay started.
    private var completeSinceStart: Set<Int64> = []
    /// The earliest day whose history a change touched and no recomputation has covered yet (a write
    /// whose recomputation failed, closes fetched in the background); `nil`: only today is due.
    private var dirtyFrom: Day?
    /// The store's newest rows when the history was last recomputed: rows added after them (by another
    /// process too: `relay portfolio import`) are recomputed from their day at the next recomputation.
    private var changeMarks: PortfolioStore.ChangeMarks?
    /// The latest history recomputation (the next waits for it).
    private var recomputation: Task<Void, any Error>?
    /// The recomputation waiting for the one running to end, and the first day it recomputes (`nil`:
    /// every day): writes arriving meanwhile join it, so a burst of writes costs two recomputations,
    /// not one each.
    private var waiting: (task: Task<Void, any Error>, from: Day?)?
    /// Recomputations run so far (tests).
    public private(set) var recomputations = 0
    /// The books the live valuation reads, kept while the store's ledger revision stays the same.
    private var ledgerBooks: LedgerBooks?
    /// The books being built for a revision: requests that found the same revision wait for them rather
    /// than each read the ledger again.
    private var building: (revision: Int64, task: Task<LedgerBooks, any Error>)?
    /// Times the books were built from the store (tests: a valuation of an unchanged ledger reads none).
    public private(set) var ledgerReads = 0

    private func markDirty(from day: Day) {
        dirtyFrom = dirtyFrom.map { min($0, day) } ?? day
        snapshotDue = true
    }

    package init(
        store: PortfolioStore, hubs: MarketHubs, calendar: DayCalendar = .utc, rule: PriceRule = PriceRule(),
        pushInterval: Duration = .milliseconds(500), snapshotInterval: Duration = .seconds(60),
        referencePrices: ReferencePrices? = nil, closeHistory: Bool = true, logger: Logger = Logger(label: "relay.portfolio")
    ) {
        self.closeHistory = closeHistory
        self.referencePrices = referencePrices
        self.store = store
        self.hubs = hubs
        self.calendar = calendar
        self.rule = rule
        self.planner = SnapshotPlanner(calendar: calendar)
        self.pushInterval = pushInterval
        self.snapshotInterval = snapshotInterval
        self.logger = logger
    }

    /// A sidecar on one stocks hub (a one-market relay, tests).
    public init(
        store: PortfolioStore, hub: MarketDataHub, calendar: DayCalendar = .utc, rule: PriceRule = PriceRule(),
        pushInterval: Duration = .milliseconds(500), snapshotInterval: Duration = .seconds(60),
        referencePrices: ReferencePrices? = nil, closeHistory: Bool = true, logger: Logger = Logger(label: "relay.portfolio")
    ) {
        self.init(
            store: store, hubs: MarketHubs(stocks: hub), calendar: calendar, rule: rule, pushInterval: pushInterval,
            snapshotInterval: snapshotInterval, referencePrices: referencePrices, closeHistory: closeHistory, logger: logger)
    }

    // MARK: running

    public func run() async throws {
        var joined: [Market: HubSubscription] = [:]
        for (market, hub) in hubs.hubs { joined[market] = await hub.subscribe() }
        let subscriptions = joined
        self.subscriptions = subscriptions
        try await holdingsChanged()
        do {
            try await backfill()
        } catch {
            // The relay serves on; the next tick tries every day again.
            logger.error("portfolio history not recomputed at start: \(error)")
            markDirty(from: PortfolioStore.earliestDay)
        }
        await cancelWhenGracefulShutdown {
            await withTaskGroup(of: Void.self) { group in
                for (market, subscription) in subscriptions {
                    group.addTask { await self.consume(subscription.events, on: market) }
                }
                group.addTask { await self.tick() }
                await group.next()
                group.cancelAll()
            }
        }
        closeFetch?.cancel()
        for (market, subscription) in subscriptions { await hubs.hubs[market]?.remove(subscription.id) }
        for watcher in watchers.values { watcher.finish() }
    }

    private func consume(_ events: HubSubscription.Events, on market: Market) async {
        let wire = hubs.hubs[market]?.wire
        for await event in events where !event.isNotice {
            let symbol = hubs.heldSymbol(of: event, on: market)
            // One sent before the symbol was let go (its price went with it).
            guard held.contains(symbol) else { continue }
            let hadPrice = prices[symbol].map { $0.lastTrade != nil || $0.lastQuoteMid != nil } ?? false
            prices[symbol, default: SymbolPrices()].apply(wire?.price(in: event), now: .now)
            if !hadPrice { snapshotDue = true }
            await valuationChanged()
        }
    }

    /// The accounts whose transactions make no book, logged a line a minute.
    private let brokenBooks = ThrottledLog(every: .seconds(60))

    /// When the tick's last recomputation failed (`nil`: it did not).
    private var lastTickFailure: ContinuousClock.Instant?
    static let retryAfterFailure: Duration = .seconds(10)

    /// Once a second: pushes a pending valuation, writes today's snapshot, backfills on a new day.
    private func tick() async {
        while !Task.isCancelled {
            do {
                try await Task.sleep(for: .seconds(1))
                if pushPending { await valuationChanged() }
                askFailedClosesAgain()
                let today = calendar.day(of: .now)
                // After a failure, the next try waits ``retryAfterFailure`` (a database that stays busy or
                // broken is not asked every second, nor logged every second).
                let retrying = lastTickFailure.map { ContinuousClock.now - $0 >= Self.retryAfterFailure } ?? true
                if retrying, snapshotDue || ContinuousClock.now - lastSnapshotWrite >= snapshotInterval || lastBackfillDay != today {
                    snapshotDue = false
                    // Only the days that can have changed: today, the day last recomputed (yesterday's
                    // live value after midnight), and what a change left due.
                    var from = min(today, lastBackfillDay ?? today)
                    if let dirty = dirtyFrom { from = min(from, dirty) }
                    dirtyFrom = nil
                    do {
                        try await backfill(from: from)
                        lastTickFailure = nil
                    } catch {
                        markDirty(from: from)
                        lastTickFailure = .now
                        throw error
                    }
                }
            } catch is CancellationError {
                return
            } catch {
                logger.warning("portfolio snapshot failed: \(error)")
            }
        }
    }

    /// Re-reads which symbols are held and subscribes to exactly their quotes and trades.
    ///
    /// Calls run one after another (each waits for the one before it): the actor is reentrant at every
    /// `await` on the hub, and two interleaved updates could otherwise apply an older holding's `add`
    /// after a newer one's `remove`. Each reads the store afresh and changes the hub by the difference
    /// to what the hub was last given (`held`), so the last one to finish leaves the hub following
    /// exactly the current holdings.
    public func holdingsChanged() async throws {
        let previous = holdingsSync
        let sync = Task {
            _ = await previous?.result
            try await self.followHoldings()
        }
        holdingsSync = sync
        try await sync.value
    }

    /// Whether an account holds `symbol` now (the portfolio follows it, and loads its detail, anyway).
    public func holds(_ symbol: String) async -> Bool {
        (try? await currentBooks().heldSymbols().symbols.contains(symbol)) ?? false
    }

    private func followHoldings() async throws {
        let holding = try await currentBooks().heldSymbols()
        var symbols = holding.symbols
        if !holding.broken.isEmpty {
            // Each write follows the holdings again: a line a minute, not one per write.
            brokenBooks.log(
                .error, "broken-books", "accounts whose transactions make no book (a database edited by hand): their symbols are not followed",
                metadata: ["accounts": "\(holding.broken)"], to: logger)
        }
        // Never a topic from an unchecked symbol: a database written before symbols were checked may
        // hold one that would name other topics upstream (`*`, `X,AM.*`).
        for symbol in symbols {
            if let problem = HeldSymbol.problem(with: symbol) {
                symbols.remove(symbol)
                logger.warning("held symbol not followed", metadata: ["symbol": "\(symbol)", "reason": "\(problem)"])
            }
        }
        guard !subscriptions.isEmpty else { return }
        let added = symbols.subtracting(held)
        let removed = held.subtracting(symbols)
        // Before any wait: events of the symbols let go are dropped from now on, and their prices go, so
        // that symbols bought and sold in turn leave nothing behind (the map holds what is held).
        held = symbols
        for symbol in removed { prices[symbol] = nil }
        // Each symbol on the hub of the market its ticker names (`X:BTC-USD` on crypto); a symbol of a
        // market this relay does not serve is priced from REST references only.
        func byMarket(_ symbols: Set<String>) -> [Market: [Topic]] {
            var topics: [Market: [Topic]] = [:]
            for symbol in symbols {
                guard let (market, _) = hubs.hub(for: symbol) else { continue }
                topics[market, default: []] += hubs.priceTopics(of: symbol).all
            }
            return topics
        }
        for symbol in added {
            guard let (_, hub) = hubs.hub(for: symbol) else { continue }
            for topic in hubs.priceTopics(of: symbol).all {
                if let last = await hub.lastEvent(for: topic) { prices[symbol, default: SymbolPrices()].apply(hub.wire.price(in: last), now: .now) }
            }
        }
        for (market, topics) in byMarket(added) {
            if let id = subscriptions[market]?.id { await hubs.hubs[market]?.add(topics, to: id) }
        }
        for (market, topics) in byMarket(removed) {
            if let id = subscriptions[market]?.id { await hubs.hubs[market]?.remove(topics, from: id) }
        }
        if let referencePrices, !added.isEmpty {
            // Without waiting: the live stream may well be first. One loader at a time, asking only for
            // what is still held when it comes to it (a buy and sell in a row asked for each buy).
            referencesWanted.formUnion(added)
            if referenceLoader == nil { referenceLoader = Task { await self.loadWantedReferences(from: referencePrices) } }
        }
        logger.debug("portfolio follows \(held.count) symbols")
        await valuationChanged()
    }

    /// The symbols whose prices are kept (tests: those held, not every symbol ever held).
    public var pricedSymbols: Set<String> { Set(prices.keys) }

    /// The quote and trade topics the sidecar's hub subscription follows now (tests compare them with
    /// the holdings).
    public func followedTopics() async -> Set<Topic> {
        var topics: Set<Topic> = []
        for (market, subscription) in subscriptions {
            topics.formUnion(await hubs.hubs[market]?.topics(of: subscription.id) ?? [])
        }
        return topics
    }

    /// Whether reference prices are being asked for (tests wait for it to end).
    public var isLoadingReferences: Bool { referenceLoader != nil }

    /// Asks for the reference prices of the symbols newly held, those still held when it comes to them,
    /// until none is left to ask for.
    private func loadWantedReferences(from source: ReferencePrices) async {
        while true {
            let symbols = referencesWanted.intersection(held).sorted()
            referencesWanted = []
            guard !symbols.isEmpty else {
                referenceLoader = nil
                return
            }
            await loadReferences(symbols, from: source)
        }
    }

    /// Fetches REST prices for symbols, each on its own: one failure leaves the others priced.
    public func loadReferences(_ symbols: [String], from source: ReferencePrices) async {
        for (symbol, result) in await source.fetch(symbols) {
            switch result {
            case .success(let reference):
                // Let go while it was asked for: not kept.
                guard held.contains(symbol) else { continue }
                snapshotDue = true
                if let trade = reference.lastTrade { prices[symbol, default: SymbolPrices()].reference = trade }
                if let close = reference.previousClose { prices[symbol, default: SymbolPrices()].previousClose = close }
            case .failure(let error):
                logger.warning("no reference price for \(symbol): \(error)")
            }
        }
        await valuationChanged()
    }

    /// A price from elsewhere (e.g. the upstream's REST API) for a symbol with no live one yet.
    public func setReference(_ observation: PriceObservation, previousClose: Decimal?, for symbol: String) async {
        prices[symbol, default: SymbolPrices()].reference = observation
        if let previousClose { prices[symbol, default: SymbolPrices()].previousClose = previousClose }
        await valuationChanged()
    }

    // MARK: valuation

    /// What a client key with `entitlement` may read of the prices a valuation shows.
    public nonisolated func priceAccess(for entitlement: Entitlement) -> PriceAccess {
        PriceAccess(entitlement: entitlement, hubs: hubs)
    }

    /// The valuation of one account, or of the whole portfolio: every active account, brokerage ones
    /// valued live (positions plus cash), savings ones at their last update, each listed in `accounts`.
    /// Prices `access` may not read are left out (the rows `withheld`), as are the totals they would make.
    public func valuation(accountID: Int64? = nil, access: PriceAccess = .everything) async throws -> Valuation {
        let ledger = try await currentBooks()
        let now = Date.now
        let readability = access.perSymbol
        let accounts = ledger.accounts.filter { account in accountID.map { account.id == $0 } ?? account.isActive }
        var merged: [String: PositionBook.Position] = [:]
        var cash: Decimal = 0
        var values: [AccountValue] = []
        var savings: Decimal = 0
        var savingsMissing = false
        for account in accounts {
            switch account.kind {
            case .brokerage:
                let book = try ledger.book(of: account.id)
                let own = Valuation.of(book.open, cash: book.cash, prices: prices, rule: rule, now: now, readability: readability)
                values.append(
                    AccountValue(
                        id: account.id, name: account.name, kind: .brokerage, value: own.total, cash: book.cash, asOf: now, basis: .live,
                        partial: own.hasPartialFailures))
                if account.isActive || accountID != nil {
                    PositionBook.merge(book.open, into: &merged)
                    cash += book.cash
                }
            case .savings:
                let last = ledger.lastUpdate(of: account.id, at: now)
                values.append(
                    AccountValue(
                        id: account.id, name: account.name, kind: .savings, value: last?.value, cash: nil, asOf: last?.at,
                        basis: .lastUpdate, partial: last == nil))
                savings += last?.value ?? 0
                savingsMissing = savingsMissing || last == nil
            }
        }
        var valuation = Valuation.of(Array(merged.values), cash: cash, prices: prices, rule: rule, now: now, readability: readability)
        valuation.total += savings
        valuation.hasPartialFailures = valuation.hasPartialFailures || savingsMissing
        valuation.accounts = values
        return valuation
    }

    /// The symbols whose prices value the history of an account (of the portfolio when `nil`: every
    /// symbol its transactions name) that `access` may not read in full: a history valued from them is
    /// not for that key (its days are valued from closes, which are trades, and today's from the live
    /// price, a trade or a quote mid: its totals would give them away).
    public func withheldFromHistory(of accountID: Int64?, access: PriceAccess) async throws -> [String] {
        guard !access.isWhole else { return [] }
        return try await currentBooks().symbolsNamed(by: accountID).filter { access.readability(of: $0) != .all }.sorted()
    }

    /// The books of the store's ledger as it stands now: those kept when its revision is unchanged (a
    /// one-row read), else built once from one read of the ledger, however many requests ask meanwhile.
    private func currentBooks() async throws -> LedgerBooks {
        // Revisions only grow: books of this revision or a later one are current for this request, and so
        // is a build asked for at this revision or later (its read starts after the revision was read).
        let revision = try await store.ledgerRevision()
        if let ledgerBooks, ledgerBooks.revision >= revision { return ledgerBooks }
        if let building, building.revision >= revision { return try await building.task.value }
        // Off the actor: reading and replaying every transaction must not hold up the price stream.
        let task = Task.detached { [store] in LedgerBooks(try await store.ledger(), now: .now) }
        building = (revision, task)
        ledgerReads += 1
        defer { if building?.task == task { building = nil } }
        let books = try await task.value
        // The newest kept (a build that started later may have ended first).
        if ledgerBooks.map({ $0.revision <= books.revision }) ?? true { ledgerBooks = books }
        return books
    }

    /// The holdings of the accounts in `accounts` (every active brokerage account when empty), valued
    /// now, by symbol, with what `access` may read of their prices.
    public func holdings(accounts: Set<Int64> = [], access: PriceAccess = .everything) async throws -> [Holding] {
        let (positions, holders) = try await currentBooks().openPositions(accounts: accounts)
        let valuation = Valuation.of(
            Array(positions.values), prices: prices, rule: rule, now: .now, readability: access.perSymbol)
        return valuation.positions.map { row in
            let weight: Decimal? =
                if let value = row.marketValue, row.status == .priced, valuation.positionsValue > 0 {
                    DecimalText.rounded(value / valuation.positionsValue * 100, scale: 2)
                } else { nil }
            return Holding(valuation: row, assetType: AssetType(ticker: row.symbol), accounts: holders[row.symbol] ?? [], weight: weight)
        }
    }

    /// The current valuation, then a new one whenever it changes, at most every `pushInterval`.
    public func valuationUpdates() async -> AsyncStream<Valuation> {
        let (stream, continuation) = AsyncStream.makeStream(of: Valuation.self, bufferingPolicy: .bufferingNewest(1))
        let id = UUID()
        watchers[id] = continuation
        if let current = try? await valuation() { continuation.yield(current) }
        continuation.onTermination = { [weak self] _ in
            Task { await self?.removeWatcher(id) }
        }
        return stream
    }

    private func removeWatcher(_ id: UUID) { watchers[id] = nil }

    /// How many valuation streams are open (each is valued and encoded on its own).
    public var valuationWatchers: Int { watchers.count }

    private func valuationChanged() async {
        guard !watchers.isEmpty else { return }
        guard ContinuousClock.now - lastPush >= pushInterval else {
            pushPending = true
            return
        }
        pushPending = false
        lastPush = .now
        guard let current = try? await valuation() else { return }
        for watcher in watchers.values { watcher.yield(current) }
    }

    // MARK: snapshots

    /// Recomputes every account's snapshots from `from` (from its creation when `nil`, as at start) to
    /// today and the portfolio totals of those days, and saves what changed; the days before `from` are
    /// neither computed nor read. A brokerage account's past days are valued from daily closes (fetched in the
    /// background the first time a symbol and range is needed, then stored); today's value comes from the live valuation,
    /// except that a partial one never replaces a complete row of today until the account has been
    /// valued completely since the relay started (after a restart, before its prices are back).
    ///
    /// Recomputations run one after another (each waits for the one before it): one that read the
    /// store before a change must not write its older rows after one that read it after. One asked for
    /// while another waits joins it (from the earlier of their days).
    public func backfill(from requested: Day? = nil) async throws {
        if let joined = waiting {
            waiting?.from = joined.from.flatMap { from in requested.map { min($0, from) } }
            return try await joined.task.value
        }
        let previous = recomputation
        let next = Task {
            _ = await previous?.result
            try await self.recompute(from: self.startWaiting())
        }
        waiting = (next, requested)
        recomputation = next
        try await next.value
    }

    /// The waiting recomputation starts: the first day it recomputes; later ones wait behind it.
    private func startWaiting() -> Day? {
        defer { waiting = nil }
        return waiting?.from
    }

    private func recompute(from requested: Day?) async throws {
        recomputations += 1
        let today = calendar.day(of: .now)
        let changes = try await store.changes(after: changeMarks ?? .init(), calendar: calendar)
        // Every day when asked (`nil`) and the first time; else from the day asked, or from an earlier
        // one that rows added since the last recomputation touch (an import by another process). A
        // change dated tomorrow (allowed) touches no day there is a row for yet but today's.
        var from: Day?
        if let requested, changeMarks != nil {
            from = min(changes.earliest.map { min($0, requested) } ?? requested, today)
        }
        // The accounts with their transactions and updates in one read: one state of the ledger.
        let ledger = try await store.ledger()
        let accounts = ledger.accounts
        let fetchesEnded = closeFetchesEnded
        let coverage = try await store.closeCoverage()
        var closeNeeds: [String: ClosedRange<Day>] = [:]
        var all: [AccountSnapshot] = []
        var accountDays: [Int64: (from: Day, through: Day)] = [:]
        for account in accounts {
            var observations: [SnapshotPlanner.Observation]
            var cash: [(day: Day, cash: Decimal)]?
            let first = calendar.day(of: account.createdAt)
            let start = from.map { max($0, first) } ?? first
            switch account.kind {
            case .savings:
                observations = (ledger.updates[account.id] ?? []).map { .init(at: $0.at, value: $0.value, source: .update) }
            case .brokerage:
                let transactions = ledger.transactions[account.id] ?? []
                cash = PositionBook.cashByDay(transactions)
                let stored = try await store.accountSnapshots(accountID: account.id, from: start, through: today).filter { $0.source == .valuation }
                // A stored row's positions value: its value less its cash (older rows have no cash).
                func observation(_ row: AccountSnapshot) -> SnapshotPlanner.Observation {
                    .init(at: noon(of: row.day), value: row.value - (row.cash ?? 0), partial: row.partial, source: .valuation)
                }
                observations = try await pastObservations(
                    of: account, from: start, transactions: transactions, stored: stored.filter { $0.day < today }.map(observation), today: today,
                    coverage: coverage.mapValues(\.days), needs: &closeNeeds)
                if account.isActive {
                    let book = try PositionBook(transactions: transactions)
                    let live = Valuation.of(book.open, prices: prices, rule: rule, now: .now)
                    if !live.hasPartialFailures { completeSinceStart.insert(account.id) }
                    if live.hasPartialFailures, !completeSinceStart.contains(account.id),
                        let kept = stored.last(where: { $0.day == today && !$0.partial })
                    {
                        observations.append(observation(kept))
                    } else {
                        observations.append(
                            .init(
                                at: .now, value: live.positionsValue, partial: live.hasPartialFailures, source: .valuation,
                                unpriced: live.unpricedSymbols + live.staleSymbols))
                    }
                }
            }
            // The days it counts on (none when it closed on the day it was created: `through` < `from`).
            accountDays[account.id] = (first, planner.lastDay(of: account, today: today))
            all += planner.accountSnapshots(for: account, observations: observations, today: today, cash: cash, from: start)
        }
        let start = accounts.map { calendar.day(of: $0.createdAt) }.min()
        var totals: [PortfolioSnapshot] = []
        if let start {
            totals = planner.portfolioSnapshots(accounts: accounts, snapshots: all, from: max(start, from ?? start), through: today)
        }
        lastHistoryWrite = try await store.replaceHistory(
            all, accountDays: accountDays, portfolio: totals, portfolioDays: start.map { ($0, today) }, from: from)
        changeMarks = changes.marks
        lastSnapshotWrite = .now
        lastBackfillDay = today
        if fetchesEnded == closeFetchesEnded, closeFetch == nil {
            requestCloses(closeNeeds, coverage: coverage)
        } else if let first = closeNeeds.values.map(\.lowerBound).min() {
            closesNeededFrom = min(closesNeededFrom ?? first, first)
        }
    }

    /// Recomputes the history after a write the store has committed. A failure (the database busy with
    /// another writer) is not the write's: it is logged and the history is recomputed at the next tick.
    ///
    /// - Parameter day: the first day the write changed (a transaction's date, an update's day, the day
    ///   an account was created or closed); the days before it are left as they are.
    public func historyChanged(from day: Day) async {
        do {
            try await backfill(from: day)
        } catch {
            markDirty(from: day)
            logger.warning("portfolio history not recomputed yet (next tick): \(error)")
        }
    }

    private func noon(of day: Day) -> Date { calendar.startOfDay(day).addingTimeInterval(43_200) }

    /// An account's past days from `start` (its creation, or the first day a change touched) through
    /// yesterday, or the day before it closed: each valued
    /// from that day's closes when every symbol held had one; else from the live valuation stored that
    /// day, if any; else from the closes there are, `partial`, naming the symbols without one. Adds the
    /// closes these days need to `needs`.
    private func pastObservations(
        of account: Account, from start: Day, transactions: [Transaction], stored: [SnapshotPlanner.Observation], today: Day,
        coverage: [String: ClosedRange<Day>], needs: inout [String: ClosedRange<Day>]
    ) async throws -> [SnapshotPlanner.Observation] {
        let created = calendar.day(of: account.createdAt)
        let last = min(calendar.previous(today), planner.lastDay(of: account, today: today))
        guard start <= last else { return stored }
        // Valued from a week before `start` (from the creation at the earliest) and those days dropped:
        // a close's age is then counted exactly on every day kept.
        let first = max(created, calendar.day(start, addingDays: -CloseValuation.maxCloseAgeDays))
        let held = CloseValuation.heldRanges(transactions: transactions, from: start, through: last, calendar: calendar)
        for (symbol, range) in held {
            needs[symbol] = needs[symbol].map { min($0.lowerBound, range.lowerBound)...max($0.upperBound, range.upperBound) } ?? range
        }
        let lookBack = calendar.day(first, addingDays: -CloseValuation.maxCloseAgeDays)
        let closes = try await store.closes(of: Set(held.keys), from: lookBack, through: last)
        let values = CloseValuation.values(
            transactions: transactions, days: calendar.days(from: first, through: last), closes: closes, coverage: coverage)
        var storedByDay: [Day: SnapshotPlanner.Observation] = [:]
        for observation in stored { storedByDay[calendar.day(of: observation.at)] = observation }
        let past: [SnapshotPlanner.Observation] = values.filter { $0.day >= start }.map { value in
            if value.unpriced.isEmpty {
                return .init(at: noon(of: value.day), value: value.positionsValue, source: .close)
            }
            if let kept = storedByDay[value.day] { return kept }
            return .init(at: noon(of: value.day), value: value.positionsValue, partial: true, source: .close, unpriced: value.unpriced)
        }
        return stored.filter { calendar.day(of: $0.at) < start } + past
    }

    // MARK: daily closes

    /// Starts fetching the closes the history needs and the store does not cover (one task at a time;
    /// a range whose fetch failed is tried again later: ``closeRetryWait(after:)``). When done, the
    /// history is recomputed at the next tick from the first day stored (or needed meanwhile).
    private func requestCloses(_ needs: [String: ClosedRange<Day>], coverage: [String: PortfolioStore.CloseCoverage]) {
        guard closeHistory, let rest = referencePrices?.rest else { return }
        let now = ContinuousClock.now
        var work: [CloseWork] = []
        for (symbol, need) in needs.sorted(by: { $0.key < $1.key }) {
            // Nor a REST path from one.
            if HeldSymbol.problem(with: symbol) != nil { continue }
            let have = coverage[symbol]
            for days in Self.closesToFetch(need: need, have: have, settled: Self.settledDay(), calendar: calendar) {
                if let failed = closeFailures[CloseRange(symbol: symbol, from: days.lowerBound)], now - failed.at < failed.wait { continue }
                work.append((symbol, days, have.map { days.upperBound < $0.days.lowerBound } ?? false))
            }
        }
        guard !work.isEmpty else { return }
        logger.info(
            "fetching daily closes for the history", metadata: ["symbols": "\(Set(work.map(\.symbol)).count)", "ranges": "\(work.count)"])
        closeFetch = Task { await self.fetchCloses(work, from: rest) }
    }

    /// The days to fetch closes for, of those `need`ed, given what the store has (`have`) and the last day
    /// final now (`settled`): before its coverage; and after it from its last settled day on, with the
    /// next new day (the days fetched before they were final asked again in the same request), or once
    /// they are final when no new day is needed (a symbol sold, an account closed).
    static func closesToFetch(
        need: ClosedRange<Day>, have: PortfolioStore.CloseCoverage?, settled: Day, calendar: DayCalendar
    ) -> [ClosedRange<Day>] {
        guard let have else { return [need] }
        var ranges: [ClosedRange<Day>] = []
        if need.lowerBound < have.days.lowerBound { ranges.append(need.lowerBound...calendar.previous(have.days.lowerBound)) }
        let unsettled = min(have.days.upperBound, have.settledThrough)
        let refetch = need.upperBound > unsettled && settled > unsettled
        if need.upperBound > have.days.upperBound || refetch {
            // The first day not settled (the coverage's first when none is).
            ranges.append(max(have.days.lowerBound, calendar.next(unsettled))...need.upperBound)
        }
        return ranges
    }

    /// The last day whose daily bar is final now: the day before yesterday (UTC, the bars' days).
    static func settledDay(now: Date = .now) -> Day { DayCalendar.utc.day(of: now.addingTimeInterval(-2 * 86_400)) }

    private func fetchCloses(_ work: [CloseWork], from rest: any MarketReference) async {
        // The first day of the closes stored: the history from it on is recomputed at the next tick.
        var earliestStored: Day?
        defer {
            closeFetch = nil
            closeFetchesEnded += 1
            if let from = [earliestStored, closesNeededFrom].compactMap({ $0 }).min() { markDirty(from: from) }
            closesNeededFrom = nil
        }
        var fetched = 0
        for (index, item) in work.enumerated() {
            if Task.isCancelled { return }
            let range = CloseRange(symbol: item.symbol, from: item.days.lowerBound)
            // From a week earlier: the first day may be a holiday, valued with the close before it.
            let from = calendar.day(item.days.lowerBound, addingDays: -CloseValuation.maxCloseAgeDays)
            switch await rest.dailyBars(item.symbol, from: from, to: item.days.upperBound, priority: .bulk) {
            case .success(let bars) where bars.isEmpty && !item.beforeCoverage:
                // Not a day's bar in a week or more, where the vendor has none of later days either: it
                // does not have them yet, or not for this symbol. Covered, they would never be asked
                // again. (Before days it has bars of, the vendor's history does not reach: covered.)
                closeFailed(range, item.days, "the answer had no daily bar")
            case .success(let bars):
                let closes = bars.map { bar in
                    (day: DayCalendar.utc.day(of: Date(timeIntervalSince1970: Double(bar.start) / 1000)), close: bar.close)
                }
                do {
                    try await store.saveCloses(item.symbol, closes, covering: from...item.days.upperBound, settledThrough: Self.settledDay())
                    closeFailures[range] = nil
                    earliestStored = min(earliestStored ?? item.days.lowerBound, item.days.lowerBound)
                    fetched += 1
                } catch {
                    logger.warning("daily closes of \(item.symbol) not stored: \(error)")
                }
            case .failure(let error):
                closeFailed(range, item.days, "\(error)")
            }
            if work.count >= 10, (index + 1) % 10 == 0 {
                logger.info("daily closes: \(index + 1) of \(work.count) ranges")
            }
        }
        logger.info("daily closes fetched", metadata: ["ranges": "\(fetched)", "failed": "\(work.count - fetched)"])
    }

    /// How long to wait before asking again for closes that did not come, after waiting `previous` since
    /// the failure before (`nil`: none in a row): ten minutes, twice as long each time, a day at most.
    static func closeRetryWait(after previous: Duration?) -> Duration {
        previous.map { min(max($0 * 2, closeRetry.lowerBound), closeRetry.upperBound) } ?? closeRetry.lowerBound
    }

    /// Ranges whose wait after a failure has passed: the history is recomputed from their first day at
    /// this tick, which asks for them again (once per failure; a fetch under way then asks once it
    /// ends). One asked again that has not failed again for two days is needed no more: forgotten.
    private func askFailedClosesAgain() {
        let now = ContinuousClock.now
        closeFailures = closeFailures.filter { !$0.value.asked || now - $0.value.at < $0.value.wait + .seconds(2 * 86_400) }
        let due = closeFailures.filter { !$0.value.asked && now - $0.value.at >= $0.value.wait }.keys
        guard let from = due.map(\.from).min() else { return }
        for range in due { closeFailures[range]?.asked = true }
        markDirty(from: from)
    }

    /// A symbol's closes did not come: asked again after ``closeRetryWait(after:)``.
    private func closeFailed(_ range: CloseRange, _ days: ClosedRange<Day>, _ reason: String) {
        let wait = Self.closeRetryWait(after: closeFailures[range]?.wait)
        closeFailures[range] = (.now, wait, false)
        logger.warning("no daily closes for \(range.symbol) (\(days.lowerBound) to \(days.upperBound)): \(reason); asked again in \(wait)")
    }
}

extension SymbolPrices {
    mutating func apply(_ reading: PriceReading?, now: Date) {
        EventPrices.apply(reading, to: &self, now: now)
    }
}
