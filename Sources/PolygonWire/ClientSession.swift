/// The client side of the Polygon conversation for one connection, without I/O: when to authenticate,
/// what to subscribe after `auth_success`, the subscribe/unsubscribe messages that move the server
/// from what it has to what is wanted, and what `auth_failed` and `max_connections` mean.
///
/// Value type, `Sendable`; one per upstream client, owned by whoever holds its lock. The server side is
/// ``ServerSession``. The wanted set survives a lost connection; the server's subscriptions do not, so
/// after the next `auth_success` the whole wanted set is subscribed again.
public struct ClientSession: Sendable {
    /// What a status means, in the relay's words (``UpstreamSignal``); Polygon's session never says
    /// `refused` (its errors do not name the request they answer).
    public typealias Event = UpstreamSignal

    /// What to do after a status message.
    public struct Reaction: Sendable, Equatable {
        /// Client messages to send, in order.
        public var send: [String] = []
        public var event: Event
        /// Close the connection (the server refused us).
        public var close: Bool { event.closes }
    }

    /// Longest `params` of one subscribe/unsubscribe message.
    public static let maxParamsBytes = 8 * 1024

    public let apiKey: String
    public private(set) var isAuthenticated = false
    /// The login was sent on this connection: a server greeting again gets no second one.
    private var loggedIn = false
    /// What the client wants the server to send.
    public private(set) var wanted: Set<Topic> = []
    /// What the server was told to send on this connection (empty until authenticated).
    public private(set) var subscribed: Set<Topic> = []

    public init(apiKey: String) {
        self.apiKey = apiKey
    }

    /// Handles one status object from the server.
    public mutating func receive(_ status: StatusMessage) -> Reaction {
        switch status.status {
        // A server that greets or accepts the login again gets nothing: each answer would cost a login,
        // or the whole wanted set subscribed anew (up to 50,000 topics), as often as it cares to say it.
        case StatusMessage.Kind.connected where loggedIn, StatusMessage.Kind.authSuccess where isAuthenticated:
            return Reaction(event: .other(status: status.status, message: "said again on this connection: ignored"))
        case StatusMessage.Kind.connected:
            loggedIn = true
            return Reaction(send: [ClientAction(.auth, params: apiKey).json], event: .connected)
        case StatusMessage.Kind.authSuccess:
            isAuthenticated = true
            subscribed = wanted
            return Reaction(send: Self.actions(.subscribe, wanted), event: .authenticated)
        case StatusMessage.Kind.authFailed:
            isAuthenticated = false
            return Reaction(event: .authFailed(status.message))
        case StatusMessage.Kind.maxConnections:
            isAuthenticated = false
            return Reaction(event: .maxConnections(status.message))
        case StatusMessage.Kind.authTimeout:
            return Reaction(event: .authTimeout(status.message))
        case StatusMessage.Kind.success:
            return Reaction(event: .acknowledged(status.message))
        case StatusMessage.Kind.error:
            return Reaction(event: .error(status.message))
        default:
            return Reaction(event: .other(status: status.status, message: status.message))
        }
    }

    /// Replaces the wanted set. While authenticated, returns the messages that move the server there:
    /// subscribes first, then unsubscribes, so a move from tickers to their wildcard leaves no gap.
    /// Otherwise returns nothing: the set is subscribed after the next `auth_success`.
    public mutating func setWanted(_ topics: Set<Topic>) -> [String] {
        wanted = topics
        guard isAuthenticated else { return [] }
        let added = topics.subtracting(subscribed)
        let removed = subscribed.subtracting(topics)
        subscribed = topics
        return Self.actions(.subscribe, added) + Self.actions(.unsubscribe, removed)
    }

    /// The connection ended: the server's subscriptions are gone with it.
    public mutating func connectionEnded() {
        isAuthenticated = false
        loggedIn = false
        subscribed = []
    }

    /// Most topics in one subscribe/unsubscribe message: a server that takes at most 1,000 (the relay's
    /// own, and so a relay upstream of another) would refuse the whole message past it.
    public static let maxTopicsPerMessage = 1_000

    /// Topic changes as few messages as the protocol allows: one per ``maxParamsBytes`` of params or
    /// ``maxTopicsPerMessage`` topics.
    public static func actions(_ kind: ClientAction.Kind, _ topics: Set<Topic>) -> [String] {
        var messages: [String] = []
        var params = ""
        var count = 0
        for topic in topics.sorted() {
            let entry = topic.description
            if !params.isEmpty, params.utf8.count + entry.utf8.count + 1 > maxParamsBytes || count >= maxTopicsPerMessage {
                messages.append(ClientAction(kind, params: params).json)
                params = ""
                count = 0
            }
            params += params.isEmpty ? entry : "," + entry
            count += 1
        }
        if !params.isEmpty { messages.append(ClientAction(kind, params: params).json) }
        return messages
    }
}

extension ClientSession: UpstreamSession {
    /// A status from ``PolygonWireProtocol/readUpstream(_:receivedAt:market:)``.
    public mutating func react(to control: UpstreamControl) -> UpstreamReaction {
        guard let status = control.message as? StatusMessage else {
            return UpstreamReaction(signal: .other(status: "mismatch", message: "a control message of another protocol"))
        }
        let reaction = receive(status)
        return UpstreamReaction(send: reaction.send.map { Array($0.utf8) }, signal: reaction.event)
    }

    public mutating func want(_ topics: Set<Topic>) -> [[UInt8]] {
        setWanted(topics).map { Array($0.utf8) }
    }
}
