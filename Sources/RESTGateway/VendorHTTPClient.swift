import AsyncHTTPClient
import NIOPosix

/// The HTTP client the relay asks a vendor's REST API with (the gateway, gap fills, the portfolio's
/// prices), made by the relay and shut down with it.
public enum VendorHTTPClient {
    /// A new client: no redirect is followed (a redirect would carry the vendor's credentials, which
    /// AsyncHTTPClient keeps on the same origin, to wherever it points, and its body would be read as
    /// the vendor's answer), and a connection that stalls dies on its own after 60 s without a byte (a
    /// call's deadline frees its caller without waiting for the request, and this ends a request that
    /// missed its cancellation, so no pooled connection is held for ever). HTTP/1.1 only: the vendors'
    /// APIs speak it, and its status line has three digits, where an HTTP/2 `:status` of any integer (a
    /// negative one traps in NIO's status type) would reach the relay from a host it does not control.
    public static func make() -> HTTPClient {
        var configuration = HTTPClient.Configuration()
        configuration.redirectConfiguration = .disallow
        configuration.httpVersion = .http1Only
        configuration.timeout.read = .seconds(60)
        return HTTPClient(eventLoopGroup: MultiThreadedEventLoopGroup.singleton, configuration: configuration)
    }
}
