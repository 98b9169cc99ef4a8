import AsyncHTTPClient
import Crypto
import Foundation
import Logging
import MarketCore
import MarketREST
import Metrics
import NIOCore
import NIOHTTP1
import Synchronization

/// Who is asking: the client key's name and its rights, as the relay's key check found them.
public struct GatewayClient: Sendable {
    public var name: String
    /// The key's `rest` right.
    public var rest: Bool
    /// Whether the key may read a topic of a market (its markets and topic patterns).
    public var allows: @Sendable (Market, Topic) -> Bool
    /// Whether the key may read a whole market (its markets, and no topic pattern narrowing it).
    public var allowsMarket: @Sendable (Market) -> Bool
    /// The key's own budget (`nil`: only the account's).
    public var quota: RESTBudget?
    /// Whether the calls its requests start are bounded by ``RESTGateway/Settings/flightsPerKey`` (not
    /// the keyless loopback client's: it is everyone on the host).
    public var boundedFlights = true

    public init(
        name: String, rest: Bool = true, allows: @escaping @Sendable (Market, Topic) -> Bool = { _, _ in true },
        allowsMarket: @escaping @Sendable (Market) -> Bool = { _ in true }, quota: RESTBudget? = nil
    ) {
        self.name = name
        self.rest = rest
        self.allows = allows
        self.allowsMarket = allowsMarket
        self.quota = quota
    }
}

/// The team's REST gateway for one upstream account: official REST clients ask the relay with a relay
/// key, and the gateway answers
/// - from the stream, when the relay holds the values (last trade, last quote, snapshot: no upstream call);
/// - from its cache, for what cannot change (closed days) and reference data for a while;
/// - from the vendor with the upstream key (which never leaves the relay), one call for identical
///   requests in flight, each call taking a token of the account's ``RESTBudget``.
///
/// What each path is, and how long its answer holds, is the vendor's ``GatewayDialect``; the gateway
/// itself names no vendor. `Sendable`: immutable parts, the flights in flight behind a `Mutex`.
public final class RESTGateway: Sendable {
    public struct Settings: Sendable {
        /// The whole upstream exchange, body included; past it the client gets 504.
        public var timeout: Duration = .seconds(10)
        /// The largest upstream body passed on; a larger one is a 502.
        public var maxBodyBytes = 32 << 20
        /// How long reference data (tickers, exchanges, conditions, holidays) is kept.
        public var referenceTTL: Duration = .seconds(3600)
        /// The bound on vendor bodies being read at once, shared by the relay's gateways (`nil`: none).
        public var reading: ReadingBytes?
        /// Vendor calls one key's requests started that are under way (waiting for the budget or at
        /// the vendor) at most; its next request that would start one is a 429. A request joining a
        /// call under way costs nothing. One key cannot fill the account's queue for the others.
        public var flightsPerKey = 64

        public init() {}
    }

    public let dialect: any GatewayDialect
    public let budget: any AccountBudget
    public let cache: GatewayCache?
    public let settings: Settings
    private let upstreamBase: @Sendable () async throws -> String
    private let credentials: RESTCredentials
    private let client: HTTPClient
    private let values: any LiveValues
    private let logger: Logger
    /// The vendor's failures and redirects, as often as it answers so: a line per kind every ten seconds.
    private let warnings = ThrottledLog()
    private let metrics: GatewayMetrics
    private let flights = Mutex<[String: Task<Fetched, Never>]>([:])
    /// The vendor calls under way each key started (only keys with some), locked within `flights`.
    private let keyFlights = Mutex<[String: Int]>([:])

    /// An upstream answer as fetched, before it is made right for a client.
    struct Fetched: Sendable {
        var status: Int
        var body: ByteBuffer
        var contentType: String
        var retryAfter: Int?
        /// Made by the relay (budget, timeout, transport), not the vendor's.
        var fromRelay: Bool
    }

    public init(
        dialect: any GatewayDialect, upstreamBase: @escaping @Sendable () async throws -> String, credentials: RESTCredentials,
        budget: any AccountBudget, cache: GatewayCache?, values: any LiveValues, settings: Settings = .init(), client: HTTPClient,
        metricsFactory: (any MetricsFactory)? = nil, logger: Logger = Logger(label: "relay.rest-gateway")
    ) {
        self.dialect = dialect
        self.upstreamBase = {
            let url = try await upstreamBase()
            return url.hasSuffix("/") ? String(url.dropLast()) : url
        }
        self.credentials = credentials
        self.budget = budget
        self.cache = cache
        self.values = values
        self.settings = settings
        self.client = client
        self.logger = logger
        metrics = GatewayMetrics(factory: metricsFactory ?? MetricsSystem.factory)
    }

    /// What the gateway counted: answers by source, upstream calls, calls saved.
    public var tally: GatewayTally { metrics.tally.withLock { $0 } }

    /// What `/v1/status` and the dashboard show: the counts, the hit rate, the account's budget, the cache.
    public func report() async -> GatewayReport {
        let budget = await budget.snapshot()
        let tally = self.tally
        return GatewayReport(
            vendor: dialect.name, answers: tally, hitRate: tally.hitRate, budget: budget.rate.description, tokens: budget.tokens,
            burst: budget.burst, waiting: budget.waiting, pausedUntil: budget.pausedUntil, refusedByBudget: budget.refused,
            cacheBytes: cache?.bytes, cacheLimitBytes: cache?.maxBytes)
    }

    /// Answers one client request.
    public func answer(_ request: GatewayRequest, client: GatewayClient) async -> GatewayAnswer {
        let now = WallClock.nowMilliseconds()
        guard client.rest else {
            return refusal(403, "key \"\(client.name)\" has no rest right", route: "refused")
        }
        if let repeated = request.repeatedParameter {
            return refusal(400, "the query gives \(repeated.prefix(60)) more than once: give a list once, comma-separated", route: "invalid")
        }
        let route: GatewayRoute
        switch dialect.route(request, now: now) {
        case .success(let found): route = found
        case .failure(.badRequest(let message)): return refusal(400, message, route: "invalid")
        case .failure(.notFound(let message)):
            return refusal(404, "\(message); the gateway serves \(dialect.routeList.joined(separator: ", "))", route: "unknown")
        }
        switch route.scope {
        case .reference: break
        case .topics(let market, let topics):
            // A list naming nothing asks for what the vendor gives then (often the whole market).
            if topics.isEmpty, !client.allowsMarket(market) {
                return refusal(403, "key \"\(client.name)\" may not read the whole \(market) market (the request names no symbol)", route: route.name)
            }
            for topic in topics where !client.allows(market, topic) {
                return refusal(403, "key \"\(client.name)\" may not read \(topic.ticker) in \(market) (\(topic))", route: route.name)
            }
        case .markets(let markets):
            for market in markets where !client.allowsMarket(market) {
                return refusal(403, "key \"\(client.name)\" may not read the whole \(market) market", route: route.name)
            }
        }
        if let quota = client.quota {
            switch await quota.take(route.priority, bounded: true) {
            case .granted: break
            case .cancelled: return refusal(499, "cancelled", route: route.name)
            case .refused(let after):
                metrics.count(route: route.name, outcome: "quota")
                var answer = relayAnswer(429, "key \"\(client.name)\" is over its REST quota (\(quota.rate))")
                answer.retryAfter = Self.seconds(after)
                return answer
            }
        }
        return await serve(route, request: request, now: now, starter: client.boundedFlights ? client.name : nil)
    }

    /// A route's answer: live, cached, coalesced or fetched.
    /// - Parameter starter: the key a vendor call this starts is counted for (`nil`: none).
    private func serve(_ route: GatewayRoute, request: GatewayRequest, now: Int64, starter: String?) async -> GatewayAnswer {
        // A live answer's own call the relay refused (the key's flights, the account's budget): the
        // request is answered that refusal, not a live answer short of what the call would have added.
        let refused = Mutex<GatewayAnswer?>(nil)
        if route.live,
            let body = await dialect.live(
                route, values: values,
                fetch: { [self] path in
                    let answer = await self.internalAnswer(path, base: request.base, starter: starter)
                    if answer.status == 429, answer.source == .relay { refused.withLock { $0 = answer } }
                    return answer
                })
        {
            if let refusal = refused.withLock({ $0 }) { return refusal }
            metrics.count(route: route.name, outcome: "live")
            metrics.saved()
            return GatewayAnswer(status: 200, body: body, source: .live)
        }
        // What is not live may read a page of megabytes (from the cache or the vendor): on the global
        // executor, not on the caller's (the relay answers requests on their connection's event loop).
        return await withTaskExecutorPreference(globalConcurrentExecutor) {
            await self.fetched(route, request: request, now: now, starter: starter)
        }
    }

    /// A route's answer from the cache, another client's call in flight or the vendor.
    private func fetched(_ route: GatewayRoute, request: GatewayRequest, now: Int64, starter: String?) async -> GatewayAnswer {
        // The account's: another host or key (the demo's, another plan's) has answers of its own.
        let key = "\(dialect.name) \(await accountTag()) \(route.upstream)"
        let expires: Int64?? = await expiry(of: route.policy, now: now)
        // An entry kept before the rules for what is kept (a page of HTML, JSON cut short) is asked
        // for again rather than served.
        if let expires, let cache, let hit = await cache.answer(key, now: now), Self.looksWhole(hit.body, as: Self.passedOn(hit.contentType)) {
            metrics.count(route: route.name, outcome: "cache")
            metrics.saved()
            metrics.cacheBytes(cache.bytes)
            guard let (body, cursors) = dialect.forClient(hit.body, request: request) else { return unreadable(route) }
            await cache.remember(cursors: cursors, expires: expires)
            return GatewayAnswer(status: 200, body: scrubbed(body), contentType: Self.passedOn(hit.contentType), source: .cache)
        }
        guard let (fetched, joined) = flight(key, route: route, expires: expires, now: now, starter: starter) else {
            metrics.count(route: route.name, outcome: "flights")
            var answer = relayAnswer(
                429, "key \"\(starter ?? "")\" has \(settings.flightsPerKey) requests waiting for the vendor or at it already (rest.flightsPerKey)")
            answer.retryAfter = 1
            return answer
        }
        let result = await fetched.value
        if joined && !result.fromRelay {
            metrics.count(route: route.name, outcome: "coalesced")
            metrics.saved()
        } else {
            metrics.count(route: route.name, outcome: result.fromRelay ? Self.outcome(ofRelayStatus: result.status) : "upstream")
        }
        var answer = GatewayAnswer(
            status: result.status, body: result.body, contentType: result.contentType, retryAfter: result.retryAfter,
            source: result.fromRelay ? .relay : joined ? .coalesced : .upstream)
        if (200..<300).contains(result.status) {
            guard let (body, cursors) = dialect.forClient(result.body, request: request) else { return unreadable(route) }
            // Scrubbed again once rewritten: a key the vendor echoed encoded is plain text now.
            answer.body = scrubbed(body)
            if let expires, let cache, !joined { await cache.remember(cursors: cursors, expires: expires) }
        }
        return answer
    }

    /// An upstream answer that names a next page but could not be read: not passed on.
    private func unreadable(_ route: GatewayRoute) -> GatewayAnswer {
        metrics.count(route: route.name, outcome: "failed")
        let message = "the upstream's answer names a next page but is not one readable JSON object; not passed on"
        return GatewayAnswer(status: 502, body: dialect.errorBody(status: 502, message: message), contentType: "application/json", source: .relay)
    }

    /// The upstream's host and a digest of its key: what a cached answer belongs to.
    private func accountTag() async -> String {
        let host = (try? await upstreamBase()).flatMap { URLComponents(string: $0)?.host } ?? "unknown"
        let digest = SHA256.hash(data: Array((credentials.key + "\u{0}" + (credentials.secret ?? "")).utf8))
        return "\(host) \(digest.prefix(8).map { String(format: "%02x", $0) }.joined())"
    }

    /// An answer the relay needs for a live one (a snapshot's previous day), through the gateway as a
    /// client's would be, with every right; a vendor call it starts counts for the key whose request
    /// needed it (`starter`), as the request's own would.
    private func internalAnswer(_ pathAndQuery: String, base: String, starter: String?) async -> GatewayAnswer {
        let components = URLComponents(string: pathAndQuery)
        let request = GatewayRequest(
            path: components?.percentEncodedPath ?? pathAndQuery,
            query: (components?.queryItems ?? []).map { ($0.name, $0.value ?? "") }, base: base)
        let now = WallClock.nowMilliseconds()
        guard case .success(let route) = dialect.route(request, now: now) else {
            return relayAnswer(404, "no route \(pathAndQuery)")
        }
        return await serve(
            GatewayRoute(name: route.name, scope: route.scope, policy: route.policy, priority: route.priority, upstream: route.upstream), request: request,
            now: now, starter: starter)
    }

    /// How long an answer that cannot change any more is kept at most: a week. What the vendor says of a
    /// closed day does not change, but what a broken host answered with a 200 (an empty page, an error in
    /// JSON) would else be served to every client until evicted.
    static let keptAtMostMilliseconds: Int64 = 7 * 86_400_000

    /// How long an answer under this policy may be kept: `nil` not at all, `.some(t)` until `t` (a
    /// cursor's page remembered without an end: `.some(nil)`, until evicted).
    private func expiry(of policy: CachePolicy, now: Int64) async -> Int64?? {
        switch policy {
        case .pass: nil
        case .forever: .some(now + Self.keptAtMostMilliseconds)
        case .until(let time): time > now ? .some(time) : nil
        case .cursor(let cursor): await cache?.cursorPolicy(cursor, now: now) ?? nil
        }
    }

    /// The request's flight upstream: a new one, or the one an identical request started (`joined`);
    /// `nil` when a new one is needed and `starter` has as many under way as it may.
    private func flight(
        _ key: String, route: GatewayRoute, expires: Int64??, now: Int64, starter: String?
    ) -> (Task<Fetched, Never>, joined: Bool)? {
        let limit = settings.flightsPerKey
        return flights.withLock { flights in
            if let running = flights[key] { return (running, true) }
            if let starter {
                let started = keyFlights.withLock { counts in
                    guard counts[starter, default: 0] < limit else { return false }
                    counts[starter, default: 0] += 1
                    return true
                }
                guard started else { return nil }
            }
            let task = Task<Fetched, Never> {
                let fetched = await self.fetch(route)
                if let expires, let cache = self.cache, fetched.status == 200, !fetched.fromRelay,
                    Self.looksWhole(fetched.body, as: fetched.contentType)
                {
                    await cache.store(key, body: fetched.body, contentType: fetched.contentType, expires: expires, now: now)
                    self.metrics.cacheBytes(cache.bytes)
                }
                self.flights.withLock { flights in
                    flights.removeValue(forKey: key)
                    // Under the same lock: a request seeing the flight gone sees the key's count down too.
                    guard let starter else { return }
                    self.keyFlights.withLock { counts in
                        let left = (counts[starter] ?? 1) - 1
                        counts[starter] = left > 0 ? left : nil
                    }
                }
                return fetched
            }
            flights[key] = task
            return (task, false)
        }
    }

    /// A content type's essence (`application/json` of `application/json; charset=utf-8`), lowercased.
    static func essence(_ contentType: String) -> String {
        (contentType.split(separator: ";").first.map(String.init) ?? "").trimmingCharacters(in: .whitespaces).lowercased()
    }

    /// The content type a vendor's answer is passed on with, written by the relay: JSON as
    /// `application/json`, a listed raster image (a logo) by its type alone, anything else as plain
    /// text, so nothing a vendor sends runs as a page or script on the relay's origin.
    static func passedOn(_ contentType: String) -> String {
        // One type, not a list (a browser takes a list's last).
        guard !contentType.contains(",") else { return "text/plain; charset=utf-8" }
        let essence = essence(contentType)
        if essence == "application/json" || (essence.hasSuffix("+json") && essence.hasPrefix("application/")) { return "application/json; charset=utf-8" }
        if rasterImages.contains(essence) { return essence }
        return "text/plain; charset=utf-8"
    }

    /// The image types passed on as themselves (a vendor's logos).
    static let rasterImages: Set<String> = ["image/png", "image/jpeg", "image/gif", "image/webp", "image/avif", "image/x-icon", "image/vnd.microsoft.icon"]

    /// Whether an answer may be kept: JSON that is one whole object or array from its first byte to its
    /// last, or an image (a maintenance page, or a body cut short, sent with a 200 is passed on once,
    /// never kept for every later client).
    static func looksWhole(_ body: ByteBuffer, as contentType: String) -> Bool {
        let essence = essence(contentType)
        if rasterImages.contains(essence) { return true }
        guard essence == "application/json" else { return false }
        let view = body.readableBytesView
        switch (view.first(where: { !JSONText.isSpace($0) }), view.last(where: { !JSONText.isSpace($0) })) {
        case (UInt8(ascii: "{")?, UInt8(ascii: "}")?), (UInt8(ascii: "[")?, UInt8(ascii: "]")?): return true
        default: return false
        }
    }

    /// One upstream call: a token of the budget, the request with the account's credentials, the whole
    /// answer within the timeout. The vendor's errors pass through with their status and body (the key
    /// scrubbed from it); its 429 pauses the budget for its `Retry-After`.
    private func fetch(_ route: GatewayRoute) async -> Fetched {
        switch await budget.take(route.priority, bounded: true) {
        case .granted: break
        case .cancelled: return Self.made(499, dialect.errorBody(status: 499, message: "cancelled"))
        case .refused(let after):
            var refused = Self.made(
                429, dialect.errorBody(status: 429, message: "the account's REST budget (\(budget.rate)) is spent; retry after \(Self.seconds(after)) s"))
            refused.retryAfter = Self.seconds(after)
            return refused
        }
        let base: String
        do { base = try await upstreamBase() } catch {
            return Self.made(502, dialect.errorBody(status: 502, message: "the vendor's REST API has no address yet"))
        }
        let url = base + route.upstream
        let started = ContinuousClock.now
        do {
            let (client, headers, timeout, maxBody) = (self.client, dialect.credentialHeaders(credentials), settings.timeout, settings.maxBodyBytes)
            let reading = settings.reading
            let result = try await RESTDeadline.within(timeout) { () -> Fetched in
                var request = HTTPClientRequest(url: url)
                request.headers.add(name: "Accept", value: "application/json")
                for (name, value) in headers { request.headers.add(name: name, value: value) }
                let response = try await client.execute(request, timeout: .milliseconds(timeout.milliseconds))
                let body = try await Self.read(response.body, upTo: maxBody, counting: reading, status: Int(response.status.code))
                // Passed on as JSON, an image or plain text (never HTML or script on the relay's origin),
                // and a `Retry-After` of 1 s to an hour.
                let contentType = response.headers.first(name: "Content-Type") ?? "application/json"
                return Fetched(
                    status: Int(response.status.code), body: body, contentType: Self.passedOn(contentType),
                    retryAfter: response.headers.first(name: "Retry-After").flatMap { Int($0.trimmingCharacters(in: .whitespaces)) }
                        .map { min(max($0, 1), 3600) },
                    fromRelay: false)
            }
            metrics.upstream(status: result.status, took: ContinuousClock.now - started)
            // A final answer's status is 200 to 599: anything else (past 599, a `1xx` given as final) is
            // not the vendor's answer to pass on.
            guard (200..<600).contains(result.status) else {
                warnings.log(.warning, "status", "REST gateway: \(route.name): the vendor answered status \(result.status), which is no final answer", to: logger)
                return Self.made(502, dialect.errorBody(status: 502, message: "the vendor's REST API answered with status \(result.status), which is no final HTTP answer"))
            }
            if (300..<400).contains(result.status) {
                // Never followed (the credentials would go along): the vendor's API does not redirect.
                warnings.log(.warning, "redirect", "REST gateway: \(route.name): the vendor answered \(result.status) (a redirect, not followed)", to: logger)
                return Self.made(502, dialect.errorBody(status: 502, message: "the vendor's REST API answered with a redirect, which the relay does not follow"))
            }
            if result.status == 429 {
                await budget.pause(for: .seconds(result.retryAfter ?? 1))
            }
            return Fetched(
                status: result.status, body: scrubbed(result.body), contentType: result.contentType,
                retryAfter: result.status == 429 ? result.retryAfter ?? 1 : nil, fromRelay: false)
        } catch let refused as ReadingRefused {
            // The vendor answered (its call counted with its status); the relay would not hold more of it.
            metrics.upstream(status: refused.status, took: ContinuousClock.now - started)
            // Its body unread, a vendor's 429 still pauses the budget (for the least it could ask).
            if refused.status == 429 { await budget.pause(for: .seconds(1)) }
            var busy = Self.made(
                503, dialect.errorBody(
                    status: 503,
                    message: "the relay is reading \(refused.bytes >> 20) MB of REST answers from the vendor already (at most \(refused.limit >> 20) MB at once); retry shortly"))
            busy.retryAfter = 1
            return busy
        } catch is RESTDeadline.TimedOut {
            metrics.upstream(status: 504, took: ContinuousClock.now - started)
            return Self.made(504, dialect.errorBody(status: 504, message: "the vendor's REST API did not answer within \(settings.timeout.components.seconds) s"))
        } catch {
            metrics.upstream(status: 502, took: ContinuousClock.now - started)
            warnings.log(.warning, "failed", "REST gateway: \(route.name) failed: \(error)", to: logger)
            return Self.made(502, dialect.errorBody(status: 502, message: "the vendor's REST API could not be reached"))
        }
    }

    /// The whole body, at most `maxBytes` (past it `NIOTooManyBytesError`, as `collect(upTo:)`), its
    /// parts counted in `reading` as they arrive and given back when the read ends.
    public static func read(_ body: HTTPClientResponse.Body, upTo maxBytes: Int, counting reading: ReadingBytes?, status: Int) async throws -> ByteBuffer {
        guard let reading else { return try await body.collect(upTo: maxBytes) }
        var whole = ByteBuffer()
        var counted = 0
        defer { reading.give(counted) }
        for try await part in body {
            guard whole.readableBytes + part.readableBytes <= maxBytes else { throw NIOTooManyBytesError(maxBytes: maxBytes) }
            guard reading.take(part.readableBytes, holding: counted) else {
                throw ReadingRefused(bytes: reading.bytes, limit: reading.limit, status: status)
            }
            counted += part.readableBytes
            whole.writeImmutableBuffer(part)
        }
        return whole
    }

    /// The body with every occurrence of the upstream credentials replaced.
    private func scrubbed(_ body: ByteBuffer) -> ByteBuffer {
        // In the bytes: a body without the key (nearly all) is not copied, one with it is copied once.
        body.replacing([credentials.key, credentials.secret].compactMap { $0 }.filter { $0.utf8.count >= 4 }, with: RESTCredentials.hidden)
    }

    /// A request's outcome when the relay made its answer: `budget` (429), `reading` (503: the bound on
    /// bodies being read), else `failed`.
    static func outcome(ofRelayStatus status: Int) -> String {
        switch status {
        case 429: "budget"
        case 503: "reading"
        default: "failed"
        }
    }

    private static func made(_ status: Int, _ body: ByteBuffer) -> Fetched {
        Fetched(status: status, body: body, contentType: "application/json", retryAfter: nil, fromRelay: true)
    }

    private func refusal(_ status: Int, _ message: String, route: String) -> GatewayAnswer {
        metrics.count(route: route, outcome: "refused")
        return relayAnswer(status, message)
    }

    private func relayAnswer(_ status: Int, _ message: String) -> GatewayAnswer {
        GatewayAnswer(status: status, body: dialect.errorBody(status: status, message: message), source: .relay)
    }

    /// Whole seconds, rounded up, at least 1: `Retry-After`.
    static func seconds(_ duration: Duration) -> Int {
        let (seconds, attoseconds) = duration.components
        return max(1, Int(seconds) + (attoseconds > 0 ? 1 : 0))
    }
}

/// A gateway's state for `/v1/status`. Value type, `Sendable`, `Encodable`.
public struct GatewayReport: Sendable, Encodable {
    public var vendor: String
    public var answers: GatewayTally
    /// Answers that needed no upstream call, of those answered with data (`nil`: none yet).
    public var hitRate: Double?
    /// The account's plan (`100/s`), tokens in hand now, the bucket's size, requests waiting.
    public var budget: String
    public var tokens: Double
    public var burst: Int
    public var waiting: Int
    /// Until when a vendor's 429 pauses the account, Unix ms.
    public var pausedUntil: Int64?
    public var refusedByBudget: Int
    public var cacheBytes: Int?
    public var cacheLimitBytes: Int?
}

/// The gateway's counts since start: answers by source, upstream calls, calls saved (live, cache and
/// coalesced answers).
public struct GatewayTally: Sendable, Equatable, Codable {
    public var live = 0
    public var cache = 0
    public var coalesced = 0
    public var upstream = 0
    public var refused = 0
    public var upstreamCalls = 0

    /// Answers that needed no upstream call, of all answered with data.
    public var hitRate: Double? {
        let served = live + cache + coalesced + upstream
        return served == 0 ? nil : Double(live + cache + coalesced) / Double(served)
    }
}

/// The gateway's metrics: `relay_rest_requests_total{route,outcome}`, `relay_rest_upstream_calls_total{status}`,
/// `relay_rest_upstream_seconds`, `relay_rest_upstream_saved_total`, `relay_rest_cache_bytes`.
final class GatewayMetrics: Sendable {
    private let factory: any MetricsFactory
    private let savedCounter: Counter
    private let cacheGauge: Gauge
    private let upstreamTimer: Timer
    let tally = Mutex(GatewayTally())
    /// `relay_rest_requests_total` by route and outcome, each made once (making one asks the factory
    /// under its lock, per request).
    private let requestCounters = Mutex<[RouteOutcome: Counter]>([:])
    /// `relay_rest_upstream_calls_total` by the vendor's status as labelled (``statusLabel(_:)``), each made once.
    private let upstreamCounters = Mutex<[String: Counter]>([:])

    /// The statuses a vendor's REST API answers with meaning (Polygon's and Alpaca's documented ones), each
    /// its own series; any other is its class (`2xx` … `5xx`, else `other`): what a REST host sends cannot
    /// make a series of its own.
    static let namedStatuses: Set<Int> = [200, 204, 301, 302, 304, 400, 401, 403, 404, 408, 409, 413, 422, 429, 500, 502, 503, 504]

    static func statusLabel(_ status: Int) -> String {
        if namedStatuses.contains(status) { String(status) } else if (100...599).contains(status) { "\(status / 100)xx" } else { "other" }
    }

    private struct RouteOutcome: Hashable {
        let route: String
        let outcome: String
    }

    init(factory: any MetricsFactory) {
        self.factory = factory
        savedCounter = Counter(label: "relay_rest_upstream_saved_total", factory: factory)
        cacheGauge = Gauge(label: "relay_rest_cache_bytes", factory: factory)
        upstreamTimer = Timer(label: "relay_rest_upstream_seconds", factory: factory)
    }

    func count(route: String, outcome: String) {
        let key = RouteOutcome(route: route, outcome: outcome)
        let counter = requestCounters.withLock { counters in
            if let counter = counters[key] { return counter }
            let counter = Counter(label: "relay_rest_requests_total", dimensions: [("route", route), ("outcome", outcome)], factory: factory)
            counters[key] = counter
            return counter
        }
        counter.increment()
        tally.withLock { tally in
            switch outcome {
            case "live": tally.live += 1
            case "cache": tally.cache += 1
            case "coalesced": tally.coalesced += 1
            case "upstream": tally.upstream += 1
            default: tally.refused += 1
            }
        }
    }

    func saved() { savedCounter.increment() }

    func cacheBytes(_ bytes: Int) { cacheGauge.record(bytes) }

    func upstream(status: Int, took: Duration) {
        let label = Self.statusLabel(status)
        let counter = upstreamCounters.withLock { counters in
            if let counter = counters[label] { return counter }
            let counter = Counter(label: "relay_rest_upstream_calls_total", dimensions: [("status", label)], factory: factory)
            counters[label] = counter
            return counter
        }
        counter.increment()
        upstreamTimer.recordNanoseconds(took.components.seconds * 1_000_000_000 + took.components.attoseconds / 1_000_000_000)
        tally.withLock { $0.upstreamCalls += 1 }
    }
}
