import NIOCore

/// Where a resuming subscribe starts. Value type, `Sendable`.
public enum ResumeRequest: Sendable, Equatable {
    /// Per topic, the last position the client has (a ticker topic's topic sequence, a wildcard's
    /// market sequence) in `epoch`; topics not named subscribe plainly.
    case positions(epoch: String?, [Topic: UInt64])
    /// Every event the relay received from this Unix ms on.
    case time(milliseconds: Int64)
}

/// What one client message did, in any protocol. Value type, `Sendable`.
public struct DownstreamReaction: Sendable {
    /// Frames to send, in order (payloads; ``DownstreamFraming/isBinary`` says their opcode).
    public var frames: [ByteBuffer]
    public var added: [Topic]
    public var removed: [Topic]
    public var close: Bool
    /// A topic of another market was asked for (counted).
    public var marketRefused: Bool
    public var resume: ResumeRequest?
    public var conflate: Duration?
    /// The client asked for its events' receive and send times (``EventTimes``).
    public var timestamps: Bool

    public init(
        frames: [ByteBuffer] = [], added: [Topic] = [], removed: [Topic] = [], close: Bool = false, marketRefused: Bool = false,
        resume: ResumeRequest? = nil, conflate: Duration? = nil, timestamps: Bool = false
    ) {
        self.timestamps = timestamps
        self.frames = frames
        self.added = added
        self.removed = removed
        self.close = close
        self.marketRefused = marketRefused
        self.resume = resume
        self.conflate = conflate
    }
}

/// What a protocol needs to make a downstream connection's session (``WireProtocol/downstreamSession(_:)``).
public struct DownstreamContext: Sendable {
    public var market: Market
    /// The market's topic rules (its ticker forms, limits).
    public var limits: SessionLimits
    /// Where a session reserves and releases its topics (the relay's topic limits).
    public var budget: TopicBudget?
    /// The upgrade request's `Content-Type` (a codec a protocol lets its clients choose), if any.
    public var contentType: String?
    /// The rights of a client key, `nil` for a key the relay does not know.
    public var grants: @Sendable (String) -> ClientGrant?

    public init(
        market: Market, limits: SessionLimits, budget: TopicBudget?, contentType: String?, grants: @escaping @Sendable (String) -> ClientGrant?
    ) {
        self.market = market
        self.limits = limits
        self.budget = budget
        self.contentType = contentType
        self.grants = grants
    }
}

/// A protocol's server side of one downstream connection, as the server drives it: the client's
/// messages in, the reactions out, and the protocol's wording of what the connection itself says
/// (connected, auth timeout, refusals). `Sendable` value types.
public protocol DownstreamSession: Sendable {
    var isAuthenticated: Bool { get }
    var grant: ClientGrant? { get }
    /// A session the relay keeps after a break (Polygon's `KEY#tag`); `nil` for none.
    var sessionTag: String? { get }
    var topics: Set<Topic> { get }
    /// The epoch of the market's positions, told where the protocol tells it.
    var epoch: String? { get set }
    /// How this connection's events become frames.
    var framing: any DownstreamFraming { get }
    mutating func respond(to message: ByteBuffer) -> DownstreamReaction
    /// Releases every topic from the budget (the connection closed).
    mutating func releaseAll()
    /// The first frame, on connect.
    var connectedFrame: ByteBuffer { get }
    /// The frame before a close for a missing auth.
    var authTimeoutFrame: ByteBuffer { get }
    /// A connection limit reached (a key's, an address's, the relay's), saying which.
    func connectionLimitFrame(_ message: String) -> ByteBuffer
    /// A refusal that is not about the key (an address with too many failures).
    func refusalFrame(_ message: String) -> ByteBuffer
    /// What of the protocol's own state outlives a broken connection of a tagged session (kept on the
    /// shelf with it, handed to the connection that takes it back); `nil`: nothing (the default).
    var carriedOver: (any Sendable)? { get }
    /// Takes what a broken connection of the same tagged session carried over (its ``carriedOver``),
    /// before anything is sent to the client.
    func adopt(carriedOver: any Sendable)
}

/// What a downstream client did that closes its connection, told in its protocol's words first.
public enum DownstreamError: Sendable, Equatable {
    /// A message past the size limit (then close 1009).
    case messageTooLarge(String)
    /// More written to it than it read (then close 1008).
    case tooMuchUnread(String)

    /// What it says.
    public var message: String {
        switch self {
        case .messageTooLarge(let message), .tooMuchUnread(let message): message
        }
    }
}

/// Lends a client turn's events, in order, to `body`: each by its address where the hub holds it, valid
/// during the call. An address and not a `borrowing` value because a value lent through a closure
/// from a buffer is copied at the call (a retain and release of its bytes per event per client: ~5% of
/// a fan-out's CPU in a profile); read through the address, its fields are loaded in place.
public typealias TurnEvents = (_ body: (UnsafePointer<MarketEvent>) -> Void) -> Void

/// Lends a client turn's events, in order, each with its form made by `convert`: an event of a publish
/// is converted once and the form shared by every client of the hub that asks (so every caller of one
/// hub must pass the same conversion).
public typealias ConvertedTurnEvents = (
    _ convert: (borrowing MarketEvent) -> ByteBuffer?, _ body: (borrowing MarketEvent, ByteBuffer?) -> Void
) -> Void

/// One client turn's events as whole WebSocket frames (header included), the usual single one first.
public struct FramedTurn: Sendable {
    public var first: ByteBuffer
    public var more: [ByteBuffer]
    /// The oldest receive time among the events (``MonotonicClock``; 0: none known).
    public var oldestReceivedAt: UInt64

    public init(first: ByteBuffer, more: [ByteBuffer] = [], oldestReceivedAt: UInt64) {
        self.first = first
        self.more = more
        self.oldestReceivedAt = oldestReceivedAt
    }
}

/// How a downstream connection's events become frames, in its protocol and codec: asked once per
/// client turn (never per event). `Sendable` value types.
public protocol DownstreamFraming: Sendable {
    /// Whether its frames are binary (MessagePack) rather than text.
    var isBinary: Bool { get }
    /// The turn's events as whole frames; `payloadBytes` is what their bytes and one separator each come
    /// to (a frame's size before framing). A framing reads them through one of the two views, once.
    /// `nil`: nothing to send.
    func frames(payloadBytes: Int, events: TurnEvents, converted: ConvertedTurnEvents) -> FramedTurn?
    /// The same framing with each event's receive and send times written in (``EventTimes``), for a
    /// client that asked for them.
    func withTimes() -> any DownstreamFraming
    /// The whole frame telling a client it was dropped for not keeping up (its buffer of `bufferLimit`
    /// events was full), before the close.
    func evictedFrame(bufferLimit: Int) -> ByteBuffer
    /// An error about what the client did, before the connection closes (a payload in ``isBinary``'s
    /// opcode).
    func errorFrame(_ error: DownstreamError) -> ByteBuffer
}

extension DownstreamSession {
    /// Whether this connection's frames are binary (MessagePack) rather than text.
    public var isBinary: Bool { framing.isBinary }

    public var carriedOver: (any Sendable)? { nil }

    public func adopt(carriedOver: any Sendable) {}
}
