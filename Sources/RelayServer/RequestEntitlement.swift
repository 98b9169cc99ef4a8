import Hummingbird
import MarketCore

extension ClientAuthentication {
    /// The topics the key an HTTP request presents (bearer token, else `apiKey`) may read, as
    /// `/v1/last/**` checks them: its key's entitlement, or everything when no key is configured
    /// (any key on loopback). Routes behind the client-key check use it for market data they answer.
    public func entitlement(of request: Request) -> Entitlement {
        ClientKeyMiddleware.key(in: request).flatMap(identify)?.entitlement ?? .everything
    }
}
