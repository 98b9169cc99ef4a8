import Hummingbird
import MarketCore

/// What the key an HTTP request presents (``ClientKeyMiddleware/key(in:)``) may do, for the routes
/// added beside the relay's own (the portfolio's): the topics it may read, and its share of the
/// vendor's REST budget. `Sendable`, a value type.
public struct RequestKeys: Sendable {
    let authentication: ClientAuthentication
    let quotas: KeyQuotas

    /// The topics the request's key may read, as `/v1/last/**` checks them: its entitlement, or
    /// everything when no key is configured (any key on loopback).
    public func entitlement(of request: Request) -> Entitlement {
        key(of: request)?.entitlement ?? .everything
    }

    /// Takes one request of the key's REST quota (its `restRate`, as a REST gateway request does) for
    /// a call the relay makes to the vendor on its behalf: `nil` when granted, when the key has no
    /// quota or none is configured; else why not (over its quota, or the request went away while it
    /// waited) and when to ask again, or (no time: `403`) that the key may not use the vendor's REST
    /// at all (`rest: false`).
    public func spendREST(for request: Request) async -> (reason: String, retryAfter: Duration?)? {
        guard let key = key(of: request) else { return nil }
        guard key.rest else { return ("key \"\(key.name)\" may not use the vendor's REST API (rest: false): only what is held or cached is shown", nil) }
        guard let quota = quotas.budget(for: key) else { return nil }
        switch await quota.take(.foreground, bounded: true) {
        case .granted: return nil
        case .cancelled: return ("cancelled", .seconds(1))
        case .refused(let after): return ("key \"\(key.name)\" is over its REST quota (\(quota.rate))", after)
        }
    }

    private func key(of request: Request) -> ClientKey? {
        ClientKeyMiddleware.key(in: request).flatMap(authentication.identify)
    }
}
