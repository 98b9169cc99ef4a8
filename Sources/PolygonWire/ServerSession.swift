import NIOCore

/// The server side of the Polygon conversation for one connection, without I/O: it reads client
/// messages and says what to answer and which topics to add or drop.
///
/// Value type, `Sendable`; one per connection, owned by the task that reads that connection. Used by
/// the relay's downstream endpoint and by the demo feed, so both speak the protocol identically:
/// the auth reply is a frame of its own; subscribes that arrive right behind `auth` (before its reply
/// was read) are handled in order; `params` entries are trimmed; unsubscribing what was never
/// subscribed is acknowledged; a malformed message is answered with an `error` status and the
/// connection goes on.
public struct ServerSession: Sendable {
    /// What to do after one client message.
    public struct Reaction: Sendable {
        /// Frames to send, in order (each under ``FrameEncoder/maxFrameBytes``).
        public var frames: [ByteBuffer] = []
        /// Topics this message added to the connection.
        public var added: [Topic] = []
        /// Topics this message removed from the connection.
        public var removed: [Topic] = []
        /// Close the connection after sending `frames` (authentication failed).
        public var close = false
    }

    public var isAuthenticated: Bool { grant != nil }
    /// Who the client authenticated as, once it has.
    public private(set) var grant: ClientGrant?
    public private(set) var topics: Set<Topic> = []
    private let authenticate: @Sendable (String) -> ClientGrant?

    /// - Parameter authenticate: what a client key may do, or `nil` when it is not accepted.
    public init(grants authenticate: @escaping @Sendable (String) -> ClientGrant?) {
        self.authenticate = authenticate
    }

    /// - Parameter authenticate: whether a client key is accepted (for everything).
    public init(authenticate: @escaping @Sendable (String) -> Bool) {
        self.init(grants: { authenticate($0) ? ClientGrant(name: "client") : nil })
    }

    /// Handles one client message.
    public mutating func receive(_ message: ByteBuffer) -> Reaction {
        let action: ClientAction
        do {
            action = try ClientAction.decode(message)
        } catch {
            return Reaction(frames: [StatusMessage.error(error.message).frame])
        }
        switch action.kind {
        case .auth:
            let key = String(action.params.trimmingWhitespace())
            guard let granted = authenticate(key) else {
                grant = nil
                return Reaction(frames: [StatusMessage.authFailed.frame], close: true)
            }
            grant = granted
            return Reaction(frames: [StatusMessage.authSuccess.frame])
        case .subscribe, .unsubscribe:
            guard isAuthenticated else {
                return Reaction(frames: [StatusMessage.error("not authorized: send auth first").frame])
            }
            return changeTopics(action)
        }
    }

    private mutating func changeTopics(_ action: ClientAction) -> Reaction {
        let (parsed, invalid) = Topic.parseList(action.params)
        var reaction = Reaction()
        var acks: [StatusMessage] = []
        var refused: [Topic] = []
        for topic in parsed {
            if action.kind == .subscribe, let grant, !grant.entitlement.allows(topic) {
                refused.append(topic)
                continue
            }
            if action.kind == .subscribe {
                if topics.insert(topic).inserted { reaction.added.append(topic) }
                acks.append(StatusMessage(status: StatusMessage.Kind.success, message: "subscribed to: \(topic)"))
            } else {
                if topics.remove(topic) != nil { reaction.removed.append(topic) }
                acks.append(StatusMessage(status: StatusMessage.Kind.success, message: "unsubscribed to: \(topic)"))
            }
        }
        if !refused.isEmpty {
            acks.append(.error("not authorized: key \"\(grant?.name ?? "")\" may not subscribe to \(Topic.joinList(refused))"))
        }
        for entry in invalid {
            acks.append(.error("invalid topic \"\(entry)\": expected EVENT.TICKER, e.g. Q.AAPL or T.*"))
        }
        if parsed.isEmpty && invalid.isEmpty {
            acks.append(.error("\(action.kind.rawValue): no topics in params"))
        }
        reaction.frames = Self.frames(acks)
        return reaction
    }

    /// Status objects packed into frames under the frame limit.
    static func frames(_ statuses: [StatusMessage]) -> [ByteBuffer] {
        var frames: [ByteBuffer] = []
        var batch: [StatusMessage] = []
        var size = 2
        for status in statuses {
            let length = status.json.utf8.count + 1
            if !batch.isEmpty, size + length > FrameEncoder.maxFrameBytes {
                frames.append(StatusMessage.frame(batch))
                batch = []
                size = 2
            }
            batch.append(status)
            size += length
        }
        if !batch.isEmpty { frames.append(StatusMessage.frame(batch)) }
        return frames
    }
}
