import Foundation
import Hummingbird
import NIOCore

/// The one key check for every HTTP route (and the WebSocket routes other than the market feed, which
/// authenticates with Polygon's `auth` message): a request carries a client key as
/// `Authorization: Bearer KEY` or, as Polygon's own REST API takes it, the `apiKey` query parameter.
/// Without an accepted key it is answered `401` with a JSON error and goes no further.
///
/// With no keys configured the relay only listens on loopback (``ClientAuthentication``), and every
/// request passes. `Sendable`, a value type; one per router group.
public struct ClientKeyMiddleware<Context: RequestContext>: RouterMiddleware {
    let authentication: ClientAuthentication

    public init(authentication: ClientAuthentication) {
        self.authentication = authentication
    }

    public func handle(_ request: Request, context: Context, next: (Request, Context) async throws -> Response) async throws -> Response {
        guard case .keys = authentication else { return try await next(request, context) }
        guard let key = Self.key(in: request), authentication.accepts(key) else {
            var headers = HTTPFields()
            headers[.contentType] = "application/json"
            headers[.wwwAuthenticate] = #"Bearer realm="relay""#
            let body = #"{"error":"a client key is required: send Authorization: Bearer KEY or ?apiKey=KEY","status":401}"#
            return Response(status: .unauthorized, headers: headers, body: .init(byteBuffer: ByteBuffer(string: body)))
        }
        return try await next(request, context)
    }

    /// The key a request presents: the bearer token, else `apiKey` from the query.
    static func key(in request: Request) -> String? {
        if let header = request.headers[.authorization], header.lowercased().hasPrefix("bearer ") {
            return String(header.dropFirst("bearer ".count)).trimmingCharacters(in: .whitespaces)
        }
        return request.uri.queryParameters.get("apiKey").map { String($0) }
    }
}
