import PortfolioDomain
import MarketCore
import PortfolioData
import Foundation
import Logging

/// Serves holdings lists (views) and security details to many clients from one shared cache, and
/// prefetches per client around what each one is looking at.
///
/// An actor. A client is an HTTP connection, or a name a client gives itself (`X-Relay-Client`) to
/// keep its prefetches across connections; a connection's prefetches are cancelled when it closes, a
/// named client's when it has been idle for `idleTimeout`. Views are kept (at most 256, least recently
/// used dropped) with the order the client was shown; a view id not kept is rebuilt from the id.
public actor SecurityBrowser {
    public nonisolated let cache: SecurityCache<SecurityDetail>
    public nonisolated let service: PortfolioService
    public nonisolated let loader: SecurityDetailLoader
    public nonisolated let idleTimeout: Duration
    private let metrics: SecurityCacheMetrics
    private let logger: Logger
    private var clients: [ClientKey: Client] = [:]
    /// Each view's order, kept per set of rights: a view sorted by value orders what its keys may read.
    private var views: [ViewKey: (order: [String], used: UInt64)] = [:]
    private struct ViewKey: Hashable {
        let rights: Entitlement
        let id: String
    }
    private var viewClock: UInt64 = 0
    static let maxViews = 256

    public enum ClientKey: Hashable, Sendable, CustomStringConvertible {
        case connection(ObjectIdentifier)
        case named(String)

        public var description: String {
            switch self {
            case .connection(let id): "connection \(UInt(bitPattern: id.hashValue))"
            case .named(let name): "client \(name)"
            }
        }
    }

    struct Client {
        let prefetch: PrefetchCoordinator<SecurityDetail>
        var lastSeen: ContinuousClock.Instant
    }

    public init(
        service: PortfolioService, loader: SecurityDetailLoader, capacity: Int = 10, maxLoads: Int = 16, maxWait: Duration = .seconds(30),
        idleTimeout: Duration = .seconds(120),
        metrics: SecurityCacheMetrics = .none, logger: Logger = Logger(label: "relay.securities")
    ) {
        self.service = service
        self.loader = loader
        self.idleTimeout = idleTimeout
        self.metrics = metrics
        self.logger = logger
        self.cache = SecurityCache(capacity: capacity, maxLoads: maxLoads, maxWait: maxWait, logger: logger, metrics: metrics, isComplete: \.isComplete) {
            symbol in
            await loader.load(symbol)
        }
    }

    /// A list as a client sees it.
    public struct HoldingsView: Sendable, Encodable {
        public var id: String
        public var query: HoldingsQuery
        public var holdings: [Holding]

        enum CodingKeys: String, CodingKey { case view, asOf, count, holdings }
        enum ViewKeys: String, CodingKey { case id }
        enum RowKeys: String, CodingKey { case position }

        /// `{"view":{"id":…, the query…},"asOf":…,"count":…,"holdings":[…]}`; each holding carries its
        /// `position` in the list.
        public func encode(to encoder: any Encoder) throws {
            var c = encoder.container(keyedBy: CodingKeys.self)
            let view = c.superEncoder(forKey: .view)
            try query.encode(to: view)
            var viewKeys = view.container(keyedBy: ViewKeys.self)
            try viewKeys.encode(id, forKey: .id)
            try c.encode(Date.now, forKey: .asOf)
            try c.encode(holdings.count, forKey: .count)
            var rows = c.nestedUnkeyedContainer(forKey: .holdings)
            for (position, holding) in holdings.enumerated() {
                let row = rows.superEncoder()
                try holding.encode(to: row)
                var rowKeys = row.container(keyedBy: RowKeys.self)
                try rowKeys.encode(position, forKey: .position)
            }
        }
    }

    /// Where a security sits in a view.
    public struct ViewPosition: Sendable, Equatable, Encodable {
        public var id: String
        public var index: Int
        public var count: Int
        public var previous: String?
        public var next: String?

        enum CodingKeys: String, CodingKey { case id, index = "position", count, previous, next }
    }

    public struct DetailAnswer: Sendable, Encodable {
        public var detail: SecurityDetail
        public var outcome: SecurityCache<SecurityDetail>.Outcome
        public var view: ViewPosition?

        enum CodingKeys: String, CodingKey { case cache, view }

        /// The detail with `cache` (`hit`, `miss`, `joined`: a prefetch was under way) and its place in
        /// the view.
        public func encode(to encoder: any Encoder) throws {
            try detail.encode(to: encoder)
            var c = encoder.container(keyedBy: CodingKeys.self)
            try c.encode(outcome, forKey: .cache)
            try c.encodeIfPresent(view, forKey: .view)
        }
    }

    /// The holdings `query` selects, in its order; the view is kept, and the client's first security
    /// is prefetched.
    public func holdings(_ query: HoldingsQuery, client: ClientKey, access: PriceAccess = .everything) async throws -> HoldingsView {
        let coordinator = seen(client)
        let holdings = try await list(query, access: access)
        let id = query.viewID
        let order = holdings.map(\.symbol)
        keep(ViewKey(rights: access.rights, id: id), order)
        await coordinator.listed(order: order)
        return HoldingsView(id: id, query: query, holdings: holdings)
    }

    /// The detail of `symbol`, placed in view `viewID` when given; once it is complete, its neighbours
    /// in the view are prefetched for this client. Live trade and quote replace older cached ones.
    public func detail(_ symbol: String, view viewID: String?, client: ClientKey, access: PriceAccess = .everything) async throws -> DetailAnswer {
        let coordinator = seen(client)
        var position: ViewPosition?
        var order: [String] = []
        if let viewID {
            order = try await self.order(of: viewID, access: access)
            guard let index = order.firstIndex(of: symbol) else {
                throw PortfolioStore.ValidationError(field: "symbol", message: "\(symbol) is not in this view")
            }
            position = ViewPosition(
                id: viewID, index: index, count: order.count, previous: index > 0 ? order[index - 1] : nil,
                next: index + 1 < order.count ? order[index + 1] : nil)
        }
        var move: UInt64?
        if let position { move = await coordinator.moving(order: order, index: position.index) }
        var (detail, outcome) = try await cache.detail(symbol)
        if detail.isComplete, let position {
            // Not if the client asked for another security meanwhile, or went away.
            await coordinator.viewed(order: order, index: position.index, move: move)
        }
        await overlayLive(&detail)
        return DetailAnswer(detail: detail, outcome: outcome, view: position)
    }

    /// Transactions changed: cached transactions and lots are out of date.
    public func transactionsChanged() async {
        await cache.removeAll()
    }

    /// The client went away: its prefetches are cancelled.
    public func clientGone(_ client: ClientKey) async {
        guard let gone = clients.removeValue(forKey: client) else { return }
        logger.debug("client gone: cancelling its prefetches", metadata: ["client": "\(client)"])
        await gone.prefetch.cancelAll(closing: true)
    }

    /// Whether the client is known (a connection is registered on its first request).
    public func knows(_ client: ClientKey) -> Bool { clients[client] != nil }

    /// Clients with prefetch state.
    public var clientCount: Int { clients.count }

    /// The client's prefetcher (tests look at what it does).
    public func prefetcher(of client: ClientKey) -> PrefetchCoordinator<SecurityDetail>? { clients[client]?.prefetch }

    // MARK: inside

    /// Marks `client` as active, creating its state, and lets named clients that went quiet go.
    private func seen(_ client: ClientKey) -> PrefetchCoordinator<SecurityDetail> {
        let now = ContinuousClock.now
        for (key, state) in clients where key != client && now - state.lastSeen > idleTimeout {
            if case .named = key {
                clients[key] = nil
                logger.debug("client idle: cancelling its prefetches", metadata: ["client": "\(key)"])
                Task { await state.prefetch.cancelAll(closing: true) }
            }
        }
        if var state = clients[client] {
            state.lastSeen = now
            clients[client] = state
            return state.prefetch
        }
        let coordinator = PrefetchCoordinator(cache: cache, metrics: metrics, logger: logger)
        clients[client] = Client(prefetch: coordinator, lastSeen: now)
        // A client may name itself anything: past `maxNamedClients` names of one client key (the relay
        // prefixes the name with the key's name) the least recently seen goes, so a varying
        // X-Relay-Client header cannot grow this table without bound.
        if case .named(let name) = client {
            let scope = name.split(separator: ":", maxSplits: 1).count > 1 ? name.prefix { $0 != ":" } : ""
            let named = clients.filter { entry in
                guard case .named(let other) = entry.key else { return false }
                return (other.split(separator: ":", maxSplits: 1).count > 1 ? other.prefix { $0 != ":" } : "") == scope
            }
            if named.count > Self.maxNamedClients, let oldest = named.min(by: { $0.value.lastSeen < $1.value.lastSeen }) {
                clients[oldest.key] = nil
                logger.debug("too many named clients: forgetting the least recently seen", metadata: ["client": "\(oldest.key)"])
                Task { await oldest.value.prefetch.cancelAll(closing: true) }
            }
        }
        return coordinator
    }

    /// Named clients (`X-Relay-Client`) remembered at most, per client key.
    public static let maxNamedClients = 256

    /// The holdings `query` selects, valued now, in its order.
    private func list(_ query: HoldingsQuery, access: PriceAccess = .everything) async throws -> [Holding] {
        query.apply(try await service.holdings(accounts: query.accounts, access: access))
    }

    private func keep(_ id: ViewKey, _ order: [String]) {
        viewClock += 1
        views[id] = (order, viewClock)
        if views.count > Self.maxViews, let oldest = views.min(by: { $0.value.used < $1.value.used })?.key {
            views[oldest] = nil
        }
    }

    private func order(of viewID: String, access: PriceAccess) async throws -> [String] {
        let key = ViewKey(rights: access.rights, id: viewID)
        if let kept = views[key] {
            viewClock += 1
            views[key]?.used = viewClock
            return kept.order
        }
        let order = try await list(HoldingsQuery(viewID: viewID), access: access).map(\.symbol)
        keep(key, order)
        return order
    }

    private func overlayLive(_ detail: inout SecurityDetail) async {
        guard case .loaded(var details) = detail.details else { return }
        if let trade = await loader.liveTrade(detail.symbol), trade.at >= details.lastTrade?.at ?? .distantPast {
            details.lastTrade = trade
        }
        if let quote = await loader.liveQuote(detail.symbol), quote.at >= details.lastQuote?.at ?? .distantPast {
            details.lastQuote = quote
        }
        detail.details = .loaded(details)
    }
}
