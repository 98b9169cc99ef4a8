import Dashboard
import HTTPTypes
import Hummingbird
import NIOCore

extension RelayServer {
    /// The dashboard's page at `/` and its files under `/ui/<version>/`, without a key: the page asks
    /// for one and sends it with every call of the API, which checks it.
    func addDashboard(to router: Router<RelayRequestContext>) {
        let dashboard = self.dashboard
        let keysRequired = configuration.authentication.requiresKeys
        router.get("/") { _, _ in
            guard let page = dashboard.page(keysRequired: keysRequired) else { return Response(status: .notFound) }
            return Self.asset(page, cache: "no-cache")
        }
        router.get("/ui/:version/:file") { _, context in
            guard let name = context.parameters.get("file"), let asset = dashboard.asset(name) else {
                return Response(status: .notFound)
            }
            // This build's files never change: cached for good. A page of an older build gets today's
            // file, uncached.
            let current = context.parameters.get("version") == dashboard.version
            return Self.asset(asset, cache: current ? "public, max-age=31536000, immutable" : "no-cache")
        }
    }

    /// The page's own files and the API only: no inline script, no other origin.
    static let contentSecurityPolicy =
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self' ws: wss:; "
        + "base-uri 'none'; form-action 'self'; frame-ancestors 'none'"

    static func asset(_ asset: Dashboard.Asset, cache: String) -> Response {
        var headers: HTTPFields = [.contentType: asset.contentType, .cacheControl: cache]
        headers[.contentSecurityPolicy] = contentSecurityPolicy
        headers[.xContentTypeOptions] = "nosniff"
        return Response(status: .ok, headers: headers, body: .init(byteBuffer: ByteBuffer(bytes: asset.bytes)))
    }
}
