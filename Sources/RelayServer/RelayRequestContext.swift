import Hummingbird
import NIOCore

/// The relay's HTTP request context: Hummingbird's basics plus the connection the request came on,
/// so a route can tell one client connection from another and act when it closes.
public struct RelayRequestContext: RequestContext {
    public var coreContext: CoreRequestContextStorage
    /// The request's HTTP connection.
    public let channel: any Channel

    public init(source: ApplicationRequestContextSource) {
        coreContext = .init(source: source)
        channel = source.channel
    }
}
