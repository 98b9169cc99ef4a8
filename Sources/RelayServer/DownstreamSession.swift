import AlpacaWire
import NIOCore
import MarketCore
import PolygonWire

/// What one client message did, in any vendor's protocol. Value type, `Sendable`.
struct DownstreamReaction: Sendable {
    /// Frames to send, in order (payloads; ``DownstreamSession/isBinary`` says their opcode).
    var frames: [ByteBuffer] = []
    var added: [Topic] = []
    var removed: [Topic] = []
    var close = false
    var marketRefused = false
    var resume: ClientAction.Resume?
    var conflate: Duration?
}

/// One vendor's conversation on a downstream connection, as ``MarketConnection`` drives it: the pure
/// session type of the vendor's wire module, and the vendor's wording of what the connection itself
/// says (connected, auth timeout, refusals). `Sendable` value types.
protocol DownstreamSession: Sendable {
    var isAuthenticated: Bool { get }
    var grant: ClientGrant? { get }
    /// A session the relay keeps after a break (Polygon's `KEY#tag`); `nil` for none.
    var sessionTag: String? { get }
    var topics: Set<Topic> { get }
    /// The epoch of the market's positions, told where the protocol tells it.
    var epoch: String? { get set }
    /// Whether this connection's frames are binary (MessagePack) rather than text.
    var isBinary: Bool { get }
    /// Alpaca's protocol in this codec (its events are framed by ``AlpacaDelivery``); `nil`: Polygon's.
    var alpacaCodec: AlpacaCodec? { get }
    mutating func receive(_ message: ByteBuffer) -> DownstreamReaction
    mutating func releaseAll()
    /// The first frame, on connect.
    var connectedFrame: ByteBuffer { get }
    /// The frame before a close for a missing auth.
    var authTimeoutFrame: ByteBuffer { get }
    /// A connection limit reached (a key's, an address's, the relay's), saying which.
    func connectionLimitFrame(_ message: String) -> ByteBuffer
    /// A refusal that is not about the key (an address with too many failures, a connection limit).
    func refusalFrame(_ message: String) -> ByteBuffer
}

extension ServerSession: DownstreamSession {
    var isBinary: Bool { false }
    var alpacaCodec: AlpacaCodec? { nil }

    mutating func receive(_ message: ByteBuffer) -> DownstreamReaction {
        let reaction: Reaction = receive(message, at: .now)
        return DownstreamReaction(
            frames: reaction.frames, added: reaction.added, removed: reaction.removed, close: reaction.close,
            marketRefused: reaction.marketRefused, resume: reaction.resume, conflate: reaction.conflate)
    }

    var connectedFrame: ByteBuffer { StatusMessage.connected.frame }
    var authTimeoutFrame: ByteBuffer { StatusMessage.authTimeout.frame }

    func connectionLimitFrame(_ message: String) -> ByteBuffer {
        StatusMessage(status: StatusMessage.Kind.maxConnections, message: message).frame
    }

    func refusalFrame(_ message: String) -> ByteBuffer { StatusMessage.error(message).frame }
}

extension AlpacaServerSession: DownstreamSession {
    /// Alpaca's protocol names no epoch: a tagged session resumes within the relay's current one.
    var epoch: String? {
        get { nil }
        set {}
    }
    var isBinary: Bool { codec == .messagePack }
    var alpacaCodec: AlpacaCodec? { codec }

    mutating func receive(_ message: ByteBuffer) -> DownstreamReaction {
        let reaction: Reaction = receive(Array(message.readableBytesView), at: .now)
        return DownstreamReaction(
            frames: reaction.frames.map { ByteBuffer(bytes: $0) }, added: reaction.added, removed: reaction.removed, close: reaction.close,
            marketRefused: reaction.marketRefused)
    }

    var connectedFrame: ByteBuffer { ByteBuffer(bytes: codec.frame([AlpacaControl.connected])) }
    var authTimeoutFrame: ByteBuffer { ByteBuffer(bytes: codec.frame([AlpacaError.authTimeout.message])) }

    func connectionLimitFrame(_ message: String) -> ByteBuffer {
        ByteBuffer(bytes: codec.frame([AlpacaError.connectionLimitExceeded.message(detail: message)]))
    }

    func refusalFrame(_ message: String) -> ByteBuffer {
        ByteBuffer(bytes: codec.frame([AlpacaError.connectionLimitExceeded.message(detail: message)]))
    }
}
