import NIOCore

/// What a control message of the upstream server means to the connection, in no vendor's words.
public enum UpstreamSignal: Sendable, Equatable {
    /// The server greeted us: the login is in ``UpstreamReaction/send``.
    case connected
    /// The login was accepted: events for the wanted topics follow.
    case authenticated
    /// The key was refused; close, and retry only slowly.
    case authFailed(String)
    /// Another connection holds the account's slot; close and back off.
    case maxConnections(String)
    /// The server gave up waiting for our login.
    case authTimeout(String)
    /// A subscription was acknowledged.
    case acknowledged(String)
    /// An error the server sent (e.g. a topic outside the plan).
    case error(String)
    /// A subscription the server refused, naming its topics (when its protocol lets the session tell
    /// which request an error answers).
    case refused(code: Int, message: String, topics: Set<Topic>)
    /// A message the session does not know; logged, otherwise ignored.
    case other(status: String, message: String)

    /// Whether the connection must close: the server refused us.
    public var closes: Bool {
        switch self {
        case .authFailed, .maxConnections: true
        default: false
        }
    }
}

/// What to do after a control message: client messages to send, in order, and what it meant.
public struct UpstreamReaction: Sendable, Equatable {
    public var send: [[UInt8]]
    public var signal: UpstreamSignal

    public init(send: [[UInt8]] = [], signal: UpstreamSignal) {
        self.send = send
        self.signal = signal
    }
}

/// A control message as its protocol's reader found it, for that protocol's session alone (the
/// connection carries it from the reader, off the lock, to the session, under it).
public struct UpstreamControl: Sendable {
    public let message: any Sendable

    public init(_ message: any Sendable) {
        self.message = message
    }
}

/// One whole server message read: its events, and its control messages in order.
public struct UpstreamReading: Sendable {
    public var events: [MarketEvent]
    public var controls: [UpstreamControl]

    public init(events: [MarketEvent] = [], controls: [UpstreamControl] = []) {
        self.events = events
        self.controls = controls
    }
}

/// A protocol's client side of one upstream connection, without I/O: the login, the wanted and the
/// subscribed topics. Made by ``WireProtocol/upstreamSession(key:secret:)``; driven by the upstream
/// client's connection machine, under its lock.
public protocol UpstreamSession: Sendable {
    /// The topics the server was asked for on this connection.
    var subscribed: Set<Topic> { get }
    /// What a control message means, and what to send.
    mutating func react(to control: UpstreamControl) -> UpstreamReaction
    /// The messages that make the server's subscriptions `topics` (none before the login is accepted).
    mutating func want(_ topics: Set<Topic>) -> [[UInt8]]
    /// The connection ended: nothing is subscribed on the next one until it is asked again.
    mutating func connectionEnded()
}
