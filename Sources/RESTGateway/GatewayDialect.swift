#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif
import MarketCore
import MarketREST
import NIOCore

/// One request to the gateway, as the client sent it: its path (percent-encoded, as on the wire), its
/// query (decoded) and the address the client reached the relay at (`http://relay:8080`), which the
/// `next_url` of a page points back to. Value type, `Sendable`.
public struct GatewayRequest: Sendable {
    public var path: String
    public var query: [(name: String, value: String)]
    /// Scheme, host and port the client used, no trailing slash.
    public var base: String

    public init(path: String, query: [(name: String, value: String)], base: String) {
        self.path = path
        self.query = query
        self.base = base
    }

    /// The first value of a query parameter.
    public func parameter(_ name: String) -> String? { query.first { $0.name == name }?.value }

    /// A parameter the query gives more than once (the gateway refuses such a query: the vendor might
    /// read another of its values than the one checked).
    public var repeatedParameter: String? {
        var seen = Set<String>()
        return query.first { !seen.insert($0.name).inserted }?.name
    }
}

/// Where an answer came from: the `X-Relay-Source` header and the metrics' `outcome`.
public enum AnswerSource: String, Sendable {
    /// From the values the relay holds on its stream: no upstream call.
    case live
    /// From the gateway's cache.
    case cache
    /// The answer of an identical request already on its way upstream.
    case coalesced
    /// From the vendor's API.
    case upstream
    /// Made by the relay: a refusal, an error, the budget's 429.
    case relay
}

/// An answer for the client: status, body, and for a 429 the seconds after which to try again.
public struct GatewayAnswer: Sendable {
    public var status: Int
    public var body: ByteBuffer
    public var contentType: String
    public var retryAfter: Int?
    public var source: AnswerSource

    public init(status: Int, body: ByteBuffer, contentType: String = "application/json", retryAfter: Int? = nil, source: AnswerSource) {
        self.status = status
        self.body = body
        self.contentType = contentType
        self.retryAfter = retryAfter
        self.source = source
    }
}

/// What data a route reads, for the key's rights.
public enum RouteScope: Sendable, Equatable {
    /// Reference data (tickers, exchanges, conditions, market status, news): the `rest` right only.
    case reference
    /// One market's data about these tickers, each read as these topics (the key must be allowed one).
    case topics(Market, [Topic])
    /// Whole markets' data (a full snapshot, grouped bars): the key must hold each market's every ticker.
    case markets([Market])
}

/// How long an answer may be served from the cache.
public enum CachePolicy: Sendable, Equatable {
    /// Never cached (today's data, anything live): each request goes upstream, identical ones coalesced.
    case pass
    /// Cannot change: kept until evicted.
    case forever
    /// Kept until this time, Unix ms.
    case until(Int64)
    /// A page named by a `cursor` a cached answer gave (as the dialect names it in ``GatewayDialect/forClient(_:request:)``'s
    /// cursors, e.g. with its path): cached as that answer was, else passed.
    case cursor(String)
}

/// A request the dialect recognised: its route's name (the metrics' label), what it reads, how it may
/// be cached, its place in the budget's queue, and the request to send upstream (path and query, the
/// client's key taken out, parameters in a fixed order so identical requests share one cache entry).
public struct GatewayRoute: Sendable {
    public var name: String
    public var scope: RouteScope
    public var policy: CachePolicy
    public var priority: RequestGate.Priority
    public var upstream: String
    /// Answered from the stream when the relay holds the values (``GatewayDialect/live(_:values:fetch:)``).
    public var live: Bool

    public init(name: String, scope: RouteScope, policy: CachePolicy, priority: RequestGate.Priority, upstream: String, live: Bool = false) {
        self.name = name
        self.scope = scope
        self.policy = policy
        self.priority = priority
        self.upstream = upstream
        self.live = live
    }
}

/// Why a request is not served: the client's fault (400) or a path the gateway does not have (404).
public enum GatewayProblem: Error, Sendable, Equatable {
    case badRequest(String)
    case notFound(String)
}

/// The values a relay holds on its stream, for live answers: a topic's last event, `nil` unless the
/// relay is subscribed to it upstream now (a value from before an unsubscribe or an outage is stale).
public protocol LiveValues: Sendable {
    func held(_ topic: Topic, in market: Market) async -> MarketEvent?
}

/// A vendor's REST API as the gateway serves it: the one conformance each vendor writes (Polygon's is
/// `PolygonGatewayDialect`). It names the routes, says what each reads and how long its answer holds,
/// renders live answers in the vendor's shapes, and rewrites what points back at the vendor (a page's
/// `next_url`) to point at the relay.
public protocol GatewayDialect: Sendable {
    /// The vendor's name (`polygon`): logs and the cache's keys.
    var name: String { get }
    /// The path prefixes this vendor's API answers under (`/v2`): the relay routes a request to the
    /// dialect with the longest prefix of its path.
    var pathPrefixes: [String] { get }
    /// The route families served, for the 404 that names them.
    var routeList: [String] { get }
    /// The request's route, or why it has none. `now`: Unix ms (whether a day is closed).
    func route(_ request: GatewayRequest, now: Int64) -> Result<GatewayRoute, GatewayProblem>
    /// A live answer's body from the held values, `nil` when the relay does not hold them (the request
    /// then goes upstream). `fetch` answers another path through the gateway (cache, budget and all).
    func live(_ route: GatewayRoute, values: any LiveValues, fetch: @Sendable (String) async -> GatewayAnswer) async -> ByteBuffer?
    /// The upstream body made right for this client: each link back to the vendor rewritten to the
    /// relay's address (`request.base`), and the pages those links name, as a ``CachePolicy/cursor(_:)``
    /// of the page's own request names them. `nil`: a body that names a next page but cannot be read,
    /// or names it twice (not passed on: its link could point anywhere).
    func forClient(_ body: ByteBuffer, request: GatewayRequest) -> (body: ByteBuffer, cursors: [String])?
    /// The headers that carry the upstream credentials.
    func credentialHeaders(_ credentials: RESTCredentials) -> [(String, String)]
    /// An error body in the vendor's own shape.
    func errorBody(status: Int, message: String) -> ByteBuffer
}

/// The upstream account's credentials: Polygon's key, or Alpaca's key id and secret. Never sent to a
/// client, never logged (its description hides it).
public struct RESTCredentials: Sendable, CustomStringConvertible {
    public var key: String
    public var secret: String?
    /// What a vendor's echo of the credentials becomes before anything of it leaves the relay.
    public static let hidden = "<relay-upstream-key>"

    public init(key: String, secret: String? = nil) {
        self.key = key
        self.secret = secret
    }

    public var description: String { "RESTCredentials(hidden)" }
}

extension ByteBuffer {
    /// Whether the readable bytes hold `text` anywhere: a look before a body of megabytes is read as
    /// text (copied and checked as UTF-8) for a member it may not have.
    ///
    /// `memchr` finds each place the needle's first byte other than a quote occurs (JSON is full of
    /// quotes), `memcmp` checks the needle there: a page of megabytes is looked through at memory speed,
    /// where the generic collection search took seconds in a debug build and held up its answer.
    public func mentions(_ text: String) -> Bool {
        firstOffset(of: Array(text.utf8)) != nil
    }

    /// Where `needle` first occurs in the readable bytes at or after `from` (an offset from the reader
    /// index), by `memchr` and `memcmp`; `nil`: nowhere.
    package func firstOffset(of needle: [UInt8], from: Int = 0) -> Int? {
        guard let anchor = needle.firstIndex(where: { $0 != UInt8(ascii: "\"") }) ?? needle.indices.first else { return from }
        return withUnsafeReadableBytes { haystack in needle.withUnsafeBytes { name in
            guard haystack.count >= name.count, let base = haystack.baseAddress, let wanted = name.baseAddress else { return nil }
            // A match starting at `start` has its anchor at `start + anchor`; the last start is `count - needle.count`.
            var start = max(from, 0)
            let lastStart = haystack.count - name.count
            while start <= lastStart {
                guard let found = memchr(base + start + anchor, Int32(needle[anchor]), lastStart - start + 1) else { return nil }
                let candidate = base.distance(to: UnsafeRawPointer(found)) - anchor
                if memcmp(base + candidate, wanted, name.count) == 0 { return candidate }
                start = candidate + 1
            }
            return nil
        } }
    }

    /// The readable bytes with every occurrence of each of `needles` replaced by `replacement`, in one
    /// new buffer; `self` when none occurs (nothing copied).
    public func replacing(_ needles: [String], with replacement: String) -> ByteBuffer {
        var result = self
        for needle in needles.map({ Array($0.utf8) }) where !needle.isEmpty {
            guard var found = result.firstOffset(of: needle) else { continue }
            var out = ByteBufferAllocator().buffer(capacity: result.readableBytes)
            var copied = 0
            let view = result.readableBytesView
            while true {
                out.writeBytes(view[(view.startIndex + copied)..<(view.startIndex + found)])
                out.writeString(replacement)
                copied = found + needle.count
                guard let next = result.firstOffset(of: needle, from: copied) else { break }
                found = next
            }
            out.writeBytes(view[(view.startIndex + copied)...])
            result = out
        }
        return result
    }
}
