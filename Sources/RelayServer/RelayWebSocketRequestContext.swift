import Hummingbird
import HummingbirdWebSocket
import NIOCore

/// The request context of the relay's WebSocket routes: Hummingbird's WebSocket context plus the
/// connection's channel, whose remote address the per-address limits count.
public struct RelayWebSocketRequestContext: RequestContext, WebSocketRequestContext {
    public var coreContext: CoreRequestContextStorage
    public let webSocket: WebSocketHandlerReference<Self>
    /// The request's connection.
    public let channel: any Channel

    public init(source: ApplicationRequestContextSource) {
        coreContext = .init(source: source)
        webSocket = .init()
        channel = source.channel
    }
}
