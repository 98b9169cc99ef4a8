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
    public let limits: SessionLimits
    private let authenticate: @Sendable (String) -> ClientGrant?
    /// The message-rate token bucket: tokens left, and when it was last filled.
    private var tokens: Double
    private var filledAt: ContinuousClock.Instant?

    /// - Parameter authenticate: what a client key may do, or `nil` when it is not accepted.
    public init(limits: SessionLimits = SessionLimits(), grants authenticate: @escaping @Sendable (String) -> ClientGrant?) {
        self.limits = limits
        self.authenticate = authenticate
        tokens = Double(max(limits.messageBurst, 1))
    }

    /// - Parameter authenticate: whether a client key is accepted (for everything).
    public init(authenticate: @escaping @Sendable (String) -> Bool) {
        self.init(grants: { authenticate($0) ? ClientGrant(name: "client") : nil })
    }

    /// Handles one client message (arriving at `now`).
    public mutating func receive(_ message: ByteBuffer, at now: ContinuousClock.Instant = .now) -> Reaction {
        guard admit(at: now) else {
            return Reaction(frames: [
                StatusMessage.error("rate limit: at most \(limits.messagesPerSecond) messages per second; this one was dropped").frame
            ])
        }
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

    /// Takes one token from the bucket of `messageBurst` tokens, refilled at `messagesPerSecond`.
    private mutating func admit(at now: ContinuousClock.Instant) -> Bool {
        let rate = Double(limits.messagesPerSecond)
        if let filledAt {
            let elapsed = now - filledAt
            tokens = min(
                Double(max(limits.messageBurst, 1)),
                tokens + rate * (Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) / 1e18))
        }
        filledAt = now
        guard tokens >= 1 else { return false }
        tokens -= 1
        return true
    }

    private mutating func changeTopics(_ action: ClientAction) -> Reaction {
        let (parsed, invalid) = Topic.parseList(action.params)
        guard parsed.count + invalid.count <= limits.topicsPerMessage else {
            return Reaction(frames: [
                StatusMessage.error(
                    "too many topics in one message: \(parsed.count + invalid.count) (at most \(limits.topicsPerMessage)); nothing was changed"
                ).frame
            ])
        }
        var reaction = Reaction()
        var acks: [StatusMessage] = []
        var refused: [Topic] = []
        var overLimit: [Topic] = []
        for topic in parsed {
            if action.kind == .subscribe, let problem = limits.problem(with: topic) {
                acks.append(.error("invalid topic \"\(topic)\": \(problem)"))
                continue
            }
            if action.kind == .subscribe, let grant, !grant.entitlement.allows(topic) {
                refused.append(topic)
                continue
            }
            if action.kind == .subscribe, !topics.contains(topic), topics.count >= limits.topicsPerConnection {
                overLimit.append(topic)
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
        if !overLimit.isEmpty {
            acks.append(
                .error("topic limit reached: a connection holds at most \(limits.topicsPerConnection); not subscribed: \(overLimit.count) topics"))
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
