import Foundation
import HTTPTypes
import Hummingbird
import MarketCore
import MarketREST
import NIOCore
import RESTGateway
import Synchronization

/// The values the served markets hold, for the REST gateway's live answers: a topic's last event while
/// its market is subscribed to it upstream now, in the market protocol's form of the topic.
package struct ServedLiveValues: LiveValues {
    let markets: [ServedMarket]

    package init(markets: [ServedMarket]) {
        self.markets = markets
    }

    package func held(_ topic: Topic, in market: Market) async -> MarketEvent? {
        guard let served = markets.first(where: { $0.market == market }),
            case .success(let normalized) = served.wire.lastValueTopic(topic, market: market)
        else { return nil }
        return await served.hub.currentEvent(for: normalized)
    }
}

/// Each key's own REST budget (its `restRate`), made when the key first asks. `Sendable`: a `Mutex`.
final class KeyQuotas: Sendable {
    private let budgets = Mutex<[String: RESTBudget]>([:])

    func budget(for key: ClientKey) -> RESTBudget? {
        guard let rate = key.restRate else { return nil }
        // By name and rate: a key file changed to another rate gets a budget of that rate.
        let name = "\(key.name) \(rate)"
        return budgets.withLock { budgets in
            if let budget = budgets[name] { return budget }
            let budget = RESTBudget(rate: rate, maxWaiting: 64, maxWait: .seconds(5))
            budgets[name] = budget
            return budget
        }
    }
}

extension RelayServer {
    /// The gateways' routes (`/v2/**` for Polygon's), behind the key check: each request goes to the
    /// gateway whose path prefix is its path's longest.
    func addGateways(to keyed: RouterGroup<RelayRequestContext>) {
        let gateways = configuration.gateways
        guard !gateways.isEmpty else { return }
        let prefixes = Set(gateways.flatMap(\.dialect.pathPrefixes))
        for prefix in prefixes.sorted() {
            // The prefix itself is a route too (Alpaca's `/v1beta1/news`).
            keyed.get(RouterPath(prefix)) { request, context in await self.gatewayAnswer(request, context: context) }
            keyed.get("\(prefix)/**") { request, context in await self.gatewayAnswer(request, context: context) }
        }
    }

    /// The gateway that serves `path`, if any.
    func gateway(for path: String) -> RESTGateway? {
        var best: (RESTGateway, Int)?
        for gateway in configuration.gateways {
            for prefix in gateway.dialect.pathPrefixes where (path == prefix || path.hasPrefix(prefix + "/")) && prefix.count > (best?.1 ?? -1) {
                best = (gateway, prefix.count)
            }
        }
        return best?.0
    }

    func gatewayAnswer(_ request: Request, context: RelayRequestContext) async -> Response {
        let uri = request.uri
        guard let gateway = gateway(for: uri.path) else {
            return ClientKeyMiddleware.error(.notFound, "no REST gateway serves \(uri.path.prefix(200))")
        }
        let authentication = configuration.authentication
        let key = ClientKeyMiddleware.key(in: request).flatMap(authentication.identify)
        var client: GatewayClient
        if let key {
            let entitlement = key.entitlement
            let markets = self.markets
            client = GatewayClient(
                name: key.name, rest: key.rest,
                allows: { market, topic in
                    guard let wire = markets.first(where: { $0.market == market })?.served.wire else { return entitlement.allows(topic, in: market) }
                    return wire.allows(topic, on: market, by: wire.entitlement(entitlement, inFormOf: market))
                },
                allowsMarket: { entitlement.allowsWhole(market: $0) }, quota: keyQuotas.budget(for: key))
        } else {
            // Without keys (loopback only) every request has every right.
            client = GatewayClient(name: "loopback")
            client.boundedFlights = false
        }
        let query = Self.formQuery(uri.query ?? "")
        let gatewayRequest = GatewayRequest(path: uri.path, query: query, base: clientBase(request))
        let answer = await gateway.answer(gatewayRequest, client: client)
        var headers: HTTPFields = [.contentType: answer.contentType]
        // The vendor's text on the relay's own origin (the dashboard's) is never read as another type.
        if let noSniff = HTTPField.Name("X-Content-Type-Options") { headers[noSniff] = "nosniff" }
        if let source = HTTPField.Name("X-Relay-Source") { headers[source] = answer.source.rawValue }
        if let retryAfter = answer.retryAfter { headers[.retryAfter] = String(retryAfter) }
        guard let body = answersInFlight.responseBody(answer.body, on: context.channel, stallTimeout: configuration.gatewayPieceTimeout) else {
            headers = [.contentType: "application/json", .retryAfter: "1"]
            if let source = HTTPField.Name("X-Relay-Source") { headers[source] = "relay" }
            let message = "the relay is sending \(answersInFlight.bytes >> 20) MB of REST answers already (at most \(answersInFlight.limit >> 20) MB at once); retry shortly"
            return Response(status: .serviceUnavailable, headers: headers, body: .init(byteBuffer: gateway.dialect.errorBody(status: 503, message: message)))
        }
        return Response(status: .init(code: answer.status), headers: headers, body: body)
    }

    /// A query as HTML forms and the vendors' clients write it: `+` is a space, then percent-decoding.
    static func formQuery(_ query: String) -> [(name: String, value: String)] {
        query.split(separator: "&", omittingEmptySubsequences: true).map { pair in
            let parts = pair.split(separator: "=", maxSplits: 1, omittingEmptySubsequences: false)
            func decoded(_ text: Substring) -> String {
                let spaced = text.replacingOccurrences(of: "+", with: " ")
                return spaced.removingPercentEncoding ?? spaced
            }
            return (decoded(parts[0]), parts.count > 1 ? decoded(parts[1]) : "")
        }
    }

    /// How the client reached the relay (`http://host:port`), for the links a page carries back: the
    /// `Host` it sent when that is a plain host and port, else the relay's own address.
    func clientBase(_ request: Request) -> String {
        let scheme = configuration.tls == nil ? "http" : "https"
        if let publicURL = configuration.restPublicURL { return publicURL }
        if let authority = request.head.authority, !authority.isEmpty, authority.utf8.count <= 255,
            authority.utf8.allSatisfy({ byte in
                (UInt8(ascii: "a")...UInt8(ascii: "z")).contains(byte | 0x20) || (UInt8(ascii: "0")...UInt8(ascii: "9")).contains(byte)
                    || Array(".-:[]".utf8).contains(byte)
            })
        {
            return "\(scheme)://\(authority)"
        }
        return "\(scheme)://\(configuration.host):\(configuration.port)"
    }
}
