import Portfolio
import PortfolioDomain
import PortfolioData
import Foundation
import HTTPTypes
import Hummingbird
import NIOCore
import MarketCore

/// The portfolio's HTTP and WebSocket endpoints, mounted on the relay's own server:
///
/// - `POST /v1/accounts`, `GET /v1/accounts`, `GET /v1/accounts/{id}`, `POST /v1/accounts/{id}/close`,
///   `DELETE /v1/accounts/{id}`
/// - `POST|GET /v1/accounts/{id}/transactions`, `POST|GET /v1/accounts/{id}/updates`
/// - `GET /v1/portfolio`, `GET /v1/accounts/{id}/valuation`
/// - `GET /v1/portfolio/history?from=&to=`, `GET /v1/accounts/{id}/history?from=&to=`
/// - WebSocket `/v1/portfolio/stream`: the valuation each time it changes
/// - `GET /v1/holdings?sort=&order=&filter=&assetType=&account=`: a view of the holdings
/// - `GET /v1/securities/{symbol}?view=`: a security's detail, its neighbours in the view prefetched
///
/// Validation errors answer 422 with `{"error":…, "field":…}` naming the field.
public struct PortfolioRoutes: Sendable {
    public let service: PortfolioService
    public let browser: SecurityBrowser?
    private let broadcast: ValuationBroadcast

    public init(service: PortfolioService, browser: SecurityBrowser? = nil) {
        self.service = service
        self.browser = browser
        self.broadcast = ValuationBroadcast(service: service)
    }

    /// The header a client names itself with to keep its prefetches across connections.
    public static let clientHeader = "X-Relay-Client"

    struct Problem: Encodable {
        var error: String
        var field: String?
        var status: Int?
    }

    /// Seconds a client is told to wait (`Retry-After`) when the database is busy.
    static let busyRetryAfter = 2

    static func json(_ value: some Encodable, status: HTTPResponse.Status = .ok) -> Response {
        let data = (try? PortfolioJSON.encoder.encode(value)) ?? Data(#"{"error":"encoding failed"}"#.utf8)
        return Response(status: status, headers: [.contentType: "application/json"], body: .init(byteBuffer: ByteBuffer(bytes: data)))
    }

    static func problem(_ status: HTTPResponse.Status, _ message: String, field: String? = nil) -> Response {
        json(Problem(error: message, field: field), status: status)
    }

    /// Runs a handler, turning the store's errors into answers a client can act on.
    static func answer(_ body: () async throws -> Response) async -> Response {
        do {
            return try await body()
        } catch let error as PortfolioStore.ValidationError {
            return problem(.unprocessableContent, error.message, field: error.field)
        } catch let error as PortfolioStore.ConflictError {
            return problem(.conflict, error.message, field: error.field)
        } catch let error as PortfolioStore.StoreError {
            switch error {
            case .notFound: return problem(.notFound, error.description)
            case .busy:
                var response = json(Problem(error: error.description, status: 503), status: .serviceUnavailable)
                response.headers[.retryAfter] = "\(busyRetryAfter)"
                return response
            case .corrupt: return problem(.internalServerError, error.description)
            }
        } catch let error as DetailUnavailable {
            var response = json(Problem(error: error.reason, status: 503), status: .serviceUnavailable)
            response.headers[.retryAfter] = "\(max(1, error.retryAfter.components.seconds))"
            return response
        } catch let error as DecodingError {
            return problem(.badRequest, "malformed body: \(Self.describe(error))", field: Self.field(of: error))
        } catch is NIOTooManyBytesError {
            return problem(.contentTooLarge, "the body is larger than \(maxBodyBytes >> 20) MB")
        } catch {
            return problem(.internalServerError, "\(error)")
        }
    }

    static func field(of error: DecodingError) -> String? {
        switch error {
        case .keyNotFound(let key, _): key.stringValue
        case .typeMismatch(_, let context), .valueNotFound(_, let context), .dataCorrupted(let context):
            context.codingPath.last?.stringValue
        @unknown default: nil
        }
    }

    static func describe(_ error: DecodingError) -> String {
        switch error {
        case .keyNotFound(let key, _): "missing \(key.stringValue)"
        case .typeMismatch(_, let context), .valueNotFound(_, let context), .dataCorrupted(let context): context.debugDescription
        @unknown default: "\(error)"
        }
    }

    /// The largest body a portfolio route reads (past it: 413).
    static let maxBodyBytes = 1 << 20

    static func body<T: Decodable>(_ type: T.Type, _ request: Request) async throws -> T {
        try decode(T.self, try await request.body.collect(upTo: maxBodyBytes))
    }

    /// A body that may be left out (empty, or only white space): `empty` then; else read as ``body(_:_:)``
    /// reads one (a malformed one is refused, not taken for none).
    static func body<T: Decodable>(_ type: T.Type, _ request: Request, orIfNone empty: T) async throws -> T {
        let buffer = try await request.body.collect(upTo: maxBodyBytes)
        return buffer.readableBytesView.allSatisfy(JSONText.isSpace) ? empty : try decode(T.self, buffer)
    }

    private static func decode<T: Decodable>(_ type: T.Type, _ buffer: ByteBuffer) throws -> T {
        // Money is exact: a number written with an exponent (1e3) is refused like such a string would be.
        if let field = JSONNumbers.fieldWithExponent(in: buffer.readableBytesView) {
            throw PortfolioStore.ValidationError(
                field: field, message: "write the number without an exponent, preferably as a string such as \"1000\"")
        }
        return try PortfolioJSON.decoder.decode(T.self, from: Data(buffer.readableBytesView))
    }

    static func id(_ context: some RequestContext) throws -> Int64 {
        guard let text = context.parameters.get("id"), let id = Int64(text) else {
            throw PortfolioStore.ValidationError(field: "id", message: "must be an account number")
        }
        return id
    }

    static func range(_ request: Request, default start: Day, _ end: Day) throws -> (Day, Day) {
        let from = try request.uri.queryParameters.get("from").map { text in
            guard let day = Day(String(text)) else { throw PortfolioStore.ValidationError(field: "from", message: "expected YYYY-MM-DD") }
            return day
        }
        let to = try request.uri.queryParameters.get("to").map { text in
            guard let day = Day(String(text)) else { throw PortfolioStore.ValidationError(field: "to", message: "expected YYYY-MM-DD") }
            return day
        }
        let range = (from ?? start, to ?? end)
        guard range.0 <= range.1 else { throw PortfolioStore.ValidationError(field: "from", message: "must not be after to") }
        return range
    }

    /// The rows a list answers when its request names no `limit`.
    static let defaultPageRows = 1_000

    /// The page a list request asks for: `limit` rows (1 through ``PortfolioStore/maxPageRows``, default
    /// ``defaultPageRows``) after the row numbered `after` (from the first when left out).
    static func pageAsked(_ request: Request) throws -> (after: Int64?, limit: Int) {
        let limit = try request.uri.queryParameters.get("limit").map { text in
            guard let limit = Int(String(text)), (1...PortfolioStore.maxPageRows).contains(limit) else {
                throw PortfolioStore.ValidationError(field: "limit", message: "must be a number from 1 through \(PortfolioStore.maxPageRows)")
            }
            return limit
        }
        let after = try request.uri.queryParameters.get("after").map { text in
            guard let id = Int64(String(text)) else { throw PortfolioStore.ValidationError(field: "after", message: "must be a row's id") }
            return id
        }
        return (after, limit ?? defaultPageRows)
    }

    /// A page of a list as a JSON array; when more rows follow, a `Link` header (RFC 8288) names the next
    /// page: the same path and limit, after the last row's id.
    static func json<Element: Encodable>(_ page: PortfolioStore.Page<Element>, limit: Int, request: Request, id: (Element) -> Int64)
        -> Response
    {
        var response = json(page.rows)
        if page.more, let last = page.rows.last, let link = HTTPField.Name("Link") {
            response.headers[link] = "<\(request.uri.path)?limit=\(limit)&after=\(id(last))>; rel=\"next\""
        }
        return response
    }

    /// - Parameters:
    ///   - connection: the HTTP connection a request came on, when the context knows it: a client
    ///     without a name is its connection, and its prefetches stop when it closes.
    ///   - entitlement: the topics the key a request presents may read (as on the WebSocket and
    ///     `/v1/last/**`): the prices it sees (``PriceAccess``), the symbols it may write, the histories
    ///     it may read.
    ///   - spendREST: takes what a request's key may spend of the vendor's REST (a security not cached
    ///     is loaded from it): `nil` when granted, else why not and when to ask again (`429`), or with
    ///     no time, that it may not (`403`).
    public func add<Context: RequestContext>(
        to router: some RouterMethods<Context>, connection: @escaping @Sendable (Context) -> (any Channel)? = { _ in nil },
        entitlement: @escaping @Sendable (Request) -> Entitlement = { _ in .everything },
        spendREST: @escaping @Sendable (Request) async -> (reason: String, retryAfter: Duration?)? = { _ in nil }
    ) {
        let service = self.service
        let store = service.store
        let browser = self.browser
        if let browser {
            Self.addSecurities(to: router, browser: browser, connection: connection, entitlement: entitlement, spendREST: spendREST)
        }
        router.post("/v1/accounts") { request, _ in
            await Self.answer {
                let new = try await Self.body(PortfolioJSON.NewAccount.self, request)
                let account = try await store.createAccount(
                    name: new.name, kind: new.kind, currency: new.currency ?? "USD", createdAt: new.createdAt ?? .now,
                    allowNegativeCash: new.allowNegativeCash ?? false, calendar: service.calendar)
                await service.historyChanged(from: service.calendar.day(of: account.createdAt))
                return Self.json(account, status: .created)
            }
        }
        router.get("/v1/accounts") { _, _ in
            await Self.answer { Self.json(try await store.accounts()) }
        }
        router.get("/v1/accounts/:id") { _, context in
            await Self.answer { Self.json(try await store.account(try Self.id(context))) }
        }
        router.post("/v1/accounts/:id/close") { request, context in
            await Self.answer {
                let close = try await Self.body(PortfolioJSON.Close.self, request, orIfNone: PortfolioJSON.Close())
                let account = try await store.closeAccount(try Self.id(context), at: close.closedAt ?? .now, calendar: service.calendar)
                try await service.holdingsChanged()
                await browser?.transactionsChanged()
                await service.historyChanged(from: service.calendar.day(of: account.closedAt ?? .now))
                return Self.json(account)
            }
        }
        router.delete("/v1/accounts/:id") { _, context in
            await Self.answer {
                let account = try await store.deleteAccount(try Self.id(context))
                try await service.holdingsChanged()
                await browser?.transactionsChanged()
                // Every day it counted on loses it from the portfolio's total.
                await service.historyChanged(from: service.calendar.day(of: account.createdAt))
                return Response(status: .noContent)
            }
        }
        router.post("/v1/accounts/:id/transactions") { request, context in
            await Self.answer {
                let new = try await Self.body(PortfolioJSON.NewTransaction.self, request)
                if let refusal = try await Self.writeRefusal(new, account: try Self.id(context), store, service.priceAccess(for: entitlement(request))) {
                    return refusal
                }
                let transaction = try await store.addTransaction(
                    accountID: try Self.id(context),
                    .init(
                        date: new.date, kind: new.kind, symbol: new.symbol ?? "", quantity: new.quantity?.value ?? 0,
                        price: new.price?.value ?? 0, fees: new.fees?.value ?? 0, amount: new.amount?.value ?? 0),
                    calendar: service.calendar)
                try await service.holdingsChanged()
                await browser?.transactionsChanged()
                // Read your writes: the history from its day on is right when this answers.
                await service.historyChanged(from: transaction.date)
                return Self.json(transaction, status: .created)
            }
        }
        router.get("/v1/accounts/:id/transactions") { request, context in
            await Self.answer {
                let (after, limit) = try Self.pageAsked(request)
                let page = try await store.transactions(accountID: try Self.id(context), after: after, limit: limit)
                return Self.json(page, limit: limit, request: request, id: \.id)
            }
        }
        router.post("/v1/accounts/:id/updates") { request, context in
            await Self.answer {
                let new = try await Self.body(PortfolioJSON.NewUpdate.self, request)
                let update = try await store.addUpdate(
                    accountID: try Self.id(context), at: new.at ?? .now, value: new.value.value, calendar: service.calendar)
                await service.historyChanged(from: service.calendar.day(of: update.at))
                return Self.json(update, status: .created)
            }
        }
        router.get("/v1/accounts/:id/updates") { request, context in
            await Self.answer {
                let (after, limit) = try Self.pageAsked(request)
                let page = try await store.updates(accountID: try Self.id(context), after: after, limit: limit)
                return Self.json(page, limit: limit, request: request, id: \.id)
            }
        }
        router.get("/v1/portfolio") { request, _ in
            await Self.answer { Self.json(try await service.valuation(access: service.priceAccess(for: entitlement(request)))) }
        }
        router.get("/v1/accounts/:id/valuation") { request, context in
            await Self.answer {
                let id = try Self.id(context)
                _ = try await store.account(id)
                return Self.json(try await service.valuation(accountID: id, access: service.priceAccess(for: entitlement(request))))
            }
        }
        router.get("/v1/accounts/:id/history") { request, context in
            await Self.answer {
                let account = try await store.account(try Self.id(context))
                if let refusal = try await Self.historyWithheld(of: account.id, service, entitlement(request)) { return refusal }
                let today = service.calendar.day(of: .now)
                let (from, to) = try Self.range(request, default: service.calendar.day(of: account.createdAt), today)
                return Self.json(
                    try await store.accountSnapshots(accountID: account.id, from: from, through: to))
            }
        }
        router.get("/v1/portfolio/history") { request, _ in
            await Self.answer {
                if let refusal = try await Self.historyWithheld(of: nil, service, entitlement(request)) { return refusal }
                let today = service.calendar.day(of: .now)
                let start = try await store.accounts().map { service.calendar.day(of: $0.createdAt) }.min() ?? today
                let (from, to) = try Self.range(request, default: start, today)
                return Self.json(try await store.portfolioSnapshots(from: from, through: to))
            }
        }
    }

    static func addSecurities<Context: RequestContext>(
        to router: some RouterMethods<Context>, browser: SecurityBrowser, connection: @escaping @Sendable (Context) -> (any Channel)?,
        entitlement: @escaping @Sendable (Request) -> Entitlement,
        spendREST: @escaping @Sendable (Request) async -> (reason: String, retryAfter: Duration?)?
    ) {
        let store = browser.service.store
        router.get("/v1/holdings") { request, context in
            await Self.answer {
                var parameters: [String: String] = [:]
                for (name, value) in request.uri.queryParameters {
                    parameters[String(name)] = String(value).removingPercentEncoding ?? String(value)
                }
                let query = try HoldingsQuery(parameters: parameters)
                for id in query.accounts { _ = try await store.account(id) }
                let access = browser.service.priceAccess(for: entitlement(request))
                let view = try await Self.asClient(request, context, browser, connection) { client in
                    try await browser.holdings(query, client: client, access: access)
                }
                return Self.json(view)
            }
        }
        router.get("/v1/securities/:symbol") { request, context in
            await Self.answer {
                let raw = context.parameters.get("symbol") ?? ""
                let symbol = (raw.removingPercentEncoding ?? raw).uppercased()
                if let problem = HeldSymbol.problem(with: symbol) {
                    throw PortfolioStore.ValidationError(field: "symbol", message: "\(problem): expected a ticker such as AAPL or X:BTCUSD")
                }
                // The key's topics hold here as on the WebSocket: the last trade is the symbol's trades
                // topic on its market (T.<symbol> on Polygon's stocks), the last quote its quotes topic. A
                // key that may read neither is refused before anything is loaded; one that may read one of
                // them gets the detail without the other (named in `withheld`).
                let access = browser.service.priceAccess(for: entitlement(request))
                let readable = access.readability(of: symbol)
                guard readable != .none else { return Self.notReadable(symbol, access) }
                // A security neither cached nor loading is loaded from the vendor's REST (when there is
                // one): on the key's quota. Joining a load under way costs nothing.
                if browser.loader.rest != nil, await browser.cache.wouldLoad(symbol), let refused = await spendREST(request) {
                    if let after = refused.retryAfter {
                        var response = Self.problem(.tooManyRequests, refused.reason)
                        let (seconds, attoseconds) = after.components
                        response.headers[.retryAfter] = "\(max(1, seconds + (attoseconds > 0 ? 1 : 0)))"
                        return response
                    }
                    // A key that may not use the vendor's REST sees what the book holds (a dashboard's
                    // detail pages), never a security loaded for it alone.
                    guard await browser.service.holds(symbol) else { return Self.problem(.forbidden, refused.reason, field: "symbol") }
                }
                let view = request.uri.queryParameters.get("view").map { String($0) }.flatMap { $0.isEmpty ? nil : $0 }
                var answer = try await Self.asClient(request, context, browser, connection) { client in
                    try await browser.detail(symbol, view: view, client: client, access: access)
                }
                answer.detail = answer.detail.withholding(readable, topics: access.topics(of: symbol))
                return Self.json(answer)
            }
        }
    }

    /// `403` for a key that may not read the prices of a symbol the history of an account (`nil`: the
    /// portfolio) is valued from: its daily values, today's at most a minute old, would give them away.
    static func historyWithheld(of account: Int64?, _ service: PortfolioService, _ entitlement: Entitlement) async throws -> Response? {
        let access = service.priceAccess(for: entitlement)
        let withheld = try await service.withheldFromHistory(of: account, access: access)
        guard let first = withheld.first else { return nil }
        let named = withheld.prefix(10).joined(separator: ", ") + (withheld.count > 10 ? " and \(withheld.count - 10) more" : "")
        return problem(
            .forbidden,
            "not authorized: this history is valued from the prices of \(named), which this key may not read in full (e.g. \(topicsText(first, access, "and")))")
    }

    /// `403` for a transaction of a symbol whose prices the key may read none of: holding it would show
    /// them. Only the kinds that keep a symbol; one the ticker rules refuse is left to the store's `422`,
    /// an account that does not exist to its `404`.
    static func writeRefusal(_ new: PortfolioJSON.NewTransaction, account: Int64, _ store: PortfolioStore, _ access: PriceAccess) async throws -> Response? {
        guard !access.isWhole, [.buy, .sell, .dividend].contains(new.kind), let symbol = new.symbol.map(HeldSymbol.normalized),
            HeldSymbol.problem(with: symbol) == nil
        else { return nil }
        _ = try await store.account(account)
        return access.readability(of: symbol) == .none ? notReadable(symbol, access) : nil
    }

    /// The answer to a key that may read none of `symbol`'s prices (`403`, naming its topics).
    static func notReadable(_ symbol: String, _ access: PriceAccess) -> Response {
        problem(.forbidden, "not authorized: this key may read neither \(topicsText(symbol, access, "nor")) (the prices of \(symbol))", field: "symbol")
    }

    /// The topics that price `symbol`, as a refusal names them (`T.MSFT nor Q.MSFT`).
    private static func topicsText(_ symbol: String, _ access: PriceAccess, _ joiner: String) -> String {
        let topics = access.topics(of: symbol).all.map(\.description)
        return topics.isEmpty ? "its market" : topics.joined(separator: " \(joiner) ")
    }

    /// Runs `body` for the request's client: the `X-Relay-Client` name, else the connection, whose
    /// prefetches are cancelled when it closes.
    static func asClient<Context: RequestContext, T: Sendable>(
        _ request: Request, _ context: Context, _ browser: SecurityBrowser, _ connection: (Context) -> (any Channel)?,
        _ body: (SecurityBrowser.ClientKey) async throws -> T
    ) async throws -> T {
        if let name = request.headers.first(where: { $0.name.canonicalName == clientHeader.lowercased() })?.value, !name.isEmpty {
            return try await body(.named(String(name.prefix(128))))
        }
        guard let channel = connection(context) else { return try await body(.named("anonymous")) }
        let key = SecurityBrowser.ClientKey.connection(ObjectIdentifier(channel))
        let isNew = await !browser.knows(key)
        let result = try await body(key)
        if isNew {
            // Registered after the client's state exists: a connection already closed fires at once.
            channel.closeFuture.whenComplete { _ in Task { await browser.clientGone(key) } }
        }
        return result
    }

    /// The live valuation as WebSocket text frames, one per change (at most one per push interval): the
    /// stream behind `/v1/portfolio/stream`, one per connection, with the prices a key with
    /// `entitlement` may read; all fed from one subscription, each valuation encoded once for every
    /// connection of the same rights.
    public func valuationFrames(for entitlement: Entitlement = .everything) async -> AsyncStream<ByteBuffer> {
        await broadcast.frames(for: entitlement)
    }
}
