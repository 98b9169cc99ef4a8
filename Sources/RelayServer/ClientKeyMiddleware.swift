import Foundation
import HTTPTypes
import Hummingbird
import HummingbirdCore
import NIOCore
import MarketCore

/// The one key check for every HTTP route (and the WebSocket routes other than the market feed, which
/// authenticates with Polygon's `auth` message): a request carries a client key as
/// `Authorization: Bearer KEY` or, as Polygon's own REST API takes it, the `apiKey` query parameter.
/// Without an accepted key it is answered `401` with a JSON error and goes no further.
///
/// On the portfolio's routes the key also needs its portfolio right: `read` to read (GET), `write` to
/// change anything; short of it the answer is `403` naming the key and its right.
///
/// A `401` ends its connection (requests sent behind it on the connection are not handled), so each
/// guess costs a connection; a wrong key is treated as on the market feed: its `401` comes after the
/// delay its address's recent failures call for (``AddressGuard``), and an address with as many delayed
/// answers waiting as it may is answered `429` unchecked.
///
/// With no keys configured the relay only listens on loopback (``ClientAuthentication``), and every
/// request passes. `Sendable`, a value type; one per router group.
public struct ClientKeyMiddleware: RouterMiddleware {
    public typealias Context = RelayRequestContext
    let authentication: ClientAuthentication
    let portfolio: Bool
    /// Where failed authentications are counted and delayed.
    let failures: AddressGuard

    /// The header a browser tells whose page made a request with.
    static let fetchSite = HTTPField.Name("Sec-Fetch-Site")

    init(authentication: ClientAuthentication, portfolio: Bool = false, failures: AddressGuard) {
        self.authentication = authentication
        self.portfolio = portfolio
        self.failures = failures
    }

    public func handle(_ request: Request, context: Context, next: (Request, Context) async throws -> Response) async throws -> Response {
        guard authentication.requiresKeys else {
            // Loopback without keys: not for pages of other sites (``LoopbackOrigin``).
            if let problem = LoopbackOrigin.problem(
                host: request.head.authority, origin: request.headers[.origin], fetchSite: Self.fetchSite.flatMap { request.headers[$0] }) {
                return Self.lastAnswer(.forbidden, problem, headers: [:], on: context.channel)
            }
            // Without keys every name shares one scope (so the bound on names holds whatever they are).
            return try await next(portfolio ? Self.scopingClientName(request, by: "loopback") : request, context)
        }
        let channel = context.channel
        let address = channel.remoteAddress?.ipAddress ?? "unknown"
        // Built only when it is the answer (most requests are not refused).
        let guessing = {
            let refused = RelayChildChannel.Refused.guessing
            return Self.lastAnswer(refused.status, refused.message, headers: refused.retryAfter.map { [.retryAfter: $0] } ?? [:], on: channel)
        }
        if failures.isGuessing(address) { return guessing() }
        let presented = Self.key(in: request)
        guard let presented, let key = authentication.identify(presented) else {
            let refusal = Self.lastAnswer(
                .unauthorized, "a client key is required: send Authorization: Bearer KEY, APCA-API-KEY-ID: KEY or ?apiKey=KEY",
                headers: [.wwwAuthenticate: #"Bearer realm="relay""#], on: channel)
            // No key at all is no guess: answered at once.
            guard presented != nil else { return refusal }
            guard let delay = failures.failedUnlessGuessing(from: address) else { return guessing() }
            return await failures.answer(after: delay, failureOf: address) { refusal }
        }
        if portfolio {
            let reading = request.method == .get || request.method == .head
            let needed: ClientKey.PortfolioRight = reading ? .read : .write
            guard key.portfolio >= needed else {
                return Self.error(
                    .forbidden, "key \"\(key.name)\" may not \(reading ? "read" : "change") the portfolio (its right: \(key.portfolio.rawValue))")
            }
            return try await next(Self.scopingClientName(request, by: key.name), context)
        }
        return try await next(request, context)
    }

    /// A client's self-chosen name (X-Relay-Client) scoped by its key, `KEY:NAME`, so each key's names
    /// are bounded on their own and one key cannot push out another's clients. Key names have no `:`
    /// of their own here: the scope is what precedes the first one.
    static func scopingClientName(_ request: Request, by scope: String) -> Request {
        guard let header = HTTPField.Name("X-Relay-Client"), let name = request.headers[header], !name.isEmpty else { return request }
        var head = request.head
        head.headerFields[header] = "\(scope.replacingOccurrences(of: ":", with: "_")):\(name)"
        return Request(head: head, body: request.body)
    }

    static let guessing = "too many failed authentications from this address are being answered; try again in a few seconds"

    static func error(_ status: HTTPResponse.Status, _ message: String, headers: HTTPFields = [:]) -> Response {
        var headers = headers
        headers[.contentType] = "application/json"
        return Response(status: status, headers: headers, body: .init(byteBuffer: errorBody(status, message)))
    }

    static func errorBody(_ status: HTTPResponse.Status, _ message: String) -> ByteBuffer {
        ByteBuffer(string: #"{"error":"\#(JSONText.escape(message))","status":\#(status.code)}"#)
    }

    /// An error that ends its connection: it says `Connection: close` (the relay's side is closed once
    /// it is written, ``RequestHeadDeadline``), and its writing returns only when the connection has
    /// closed, so no request read ahead behind it is handled.
    static func lastAnswer(_ status: HTTPResponse.Status, _ message: String, headers: HTTPFields, on channel: any Channel) -> Response {
        var headers = headers
        headers[.contentType] = "application/json"
        headers[.connection] = "close"
        let body = errorBody(status, message)
        return Response(
            status: status, headers: headers,
            body: ResponseBody(contentLength: body.readableBytes) { writer in
                try await writer.write(body)
                try await writer.finish(nil)
                try? await channel.closeFuture.get()
            })
    }

    /// The key a request presents: the bearer token, else Alpaca's `APCA-API-KEY-ID` header (its SDKs'
    /// REST clients send the key there; the secret beside it is not checked: relay keys have none), else
    /// `apiKey` from the query.
    static func key(in request: Request) -> String? {
        if request.headers[.authorization] == nil, let name = HTTPField.Name("APCA-API-KEY-ID"), let alpaca = request.headers[name], !alpaca.isEmpty {
            return alpaca
        }
        return key(authorization: request.headers[.authorization], uri: request.uri)
    }

    /// The key in an `Authorization` header's bearer token, else in the URI's `apiKey` parameter.
    static func key(authorization: String?, uri: URI) -> String? {
        if let authorization {
            // Read as bytes: every request passes here (Foundation's trimming was a few percent of a
            // live REST answer).
            let bytes = authorization.utf8
            let scheme = "bearer ".utf8
            if bytes.count >= scheme.count, zip(bytes, scheme).allSatisfy({ $1 == UInt8(ascii: " ") ? $0 == $1 : $0 | 0x20 == $1 }) {
                let isSpace: (UInt8) -> Bool = { $0 == UInt8(ascii: " ") || $0 == UInt8(ascii: "\t") }
                let token = bytes.dropFirst(scheme.count).drop(while: isSpace)
                let end = token.lastIndex(where: { !isSpace($0) }).map { token.index(after: $0) } ?? token.startIndex
                return String(Substring(token[token.startIndex..<end]))
            }
        }
        return uri.queryParameters.get("apiKey").map { String($0) }
    }
}
