import MarketCore

/// The client side of Alpaca's conversation for one upstream connection, without I/O: `auth` with the
/// account's key and secret after `connected`, the whole wanted set subscribed after `authenticated`,
/// and per change the subscribe and unsubscribe messages that move the server there, in MessagePack.
/// Alpaca's errors are read as the relay's upstream client knows them (402 auth failed, 406 connection
/// limit, and 409 insufficient subscription before auth: close and back off; 404 auth timeout). Alpaca
/// answers each subscribe and unsubscribe with one message, the `subscription` or an error, in order, so
/// an error after auth (405 symbol limit, 409 insufficient subscription, 410 …) names the message it
/// refused: its topics are ``Event/refused(code:message:topics:)``, not asked for again while wanted on
/// this connection (so an account at its limit is not asked once per change of interest).
///
/// Value type, `Sendable`; one per upstream client, owned by whoever holds its lock. The wanted set
/// survives a lost connection; the server's subscriptions do not.
public struct AlpacaClientSession: Sendable {
    /// What one server control message means, in the relay's words (``UpstreamSignal``): Alpaca's 406 is
    /// `maxConnections`, its `subscription` reply `acknowledged`, an error `"<code> <msg>"`.
    public typealias Event = UpstreamSignal

    public struct Reaction: Sendable, Equatable {
        /// Client messages (MessagePack), in order.
        public var send: [[UInt8]] = []
        public var event: Event
    }

    /// Symbols per subscribe message (Alpaca's frames stay far under a megabyte).
    public static let symbolsPerMessage = 4_000

    public let key: String
    public let secret: String
    public private(set) var isAuthenticated = false
    public private(set) var wanted: Set<Topic> = []
    public private(set) var subscribed: Set<Topic> = []
    /// Topics the server refused on this connection and that are still wanted.
    public private(set) var refused: Set<Topic> = []
    /// The subscribe and unsubscribe messages sent and not answered yet, oldest first: whether each
    /// subscribed, and its topics.
    private var awaiting: [(subscribes: Bool, topics: Set<Topic>)] = []
    /// More messages went unanswered than ``awaitingLimit``: answers can no longer be matched to
    /// their messages, so until the connection ends errors are only logged.
    public private(set) var lostTrack = false
    /// The login was sent on this connection: a server greeting again gets no second one.
    private var loggedIn = false

    public init(key: String, secret: String) {
        self.key = key
        self.secret = secret
    }

    /// Handles one control message (a map with `T`).
    public mutating func receive(_ control: MessagePack.Value) -> Reaction {
        // The vendor's words, bounded and printable: they reach logs, `/healthz` and clients' notices.
        let message = VisibleText.visible(control["msg"]?.string ?? "", limit: VisibleText.vendorBytes)
        switch control["T"]?.string {
        // A server that greets or accepts the login again gets nothing: each answer would cost a login,
        // or the whole wanted set subscribed anew, as often as it cares to say it.
        case "success" where message == "connected" && loggedIn, "success" where message == "authenticated" && isAuthenticated:
            return Reaction(event: .other(status: "success", message: "\(message) said again on this connection: ignored"))
        case "success" where message == "connected":
            loggedIn = true
            let auth = MessagePack.Value.map([
                .init(.string("action"), .string("auth")), .init(.string("key"), .string(key)), .init(.string("secret"), .string(secret)),
            ])
            return Reaction(send: [MessagePack.encode(auth)], event: .connected)
        case "success" where message == "authenticated":
            isAuthenticated = true
            subscribed = wanted
            return Reaction(send: send("subscribe", subscribed), event: .authenticated)
        case "subscription":
            if !lostTrack, !awaiting.isEmpty { awaiting.removeFirst() }
            return Reaction(event: .acknowledged(Self.describe(control)))
        case "error":
            let code = Int(control["code"]?.integer ?? 0)
            switch code {
            case AlpacaError.insufficientSubscription.rawValue where !isAuthenticated:
                // The feed is outside the account's plan: as a refused key, retried only slowly.
                return Reaction(event: .authFailed("\(code) \(message)"))
            case AlpacaError.authFailed.rawValue, AlpacaError.notAuthenticated.rawValue:
                isAuthenticated = false
                return Reaction(event: .authFailed("\(code) \(message)"))
            case AlpacaError.connectionLimitExceeded.rawValue:
                isAuthenticated = false
                return Reaction(event: .maxConnections("\(code) \(message)"))
            case AlpacaError.authTimeout.rawValue:
                return Reaction(event: .authTimeout("\(code) \(message)"))
            case AlpacaError.invalidSyntax.rawValue, AlpacaError.symbolLimitExceeded.rawValue, AlpacaError.insufficientSubscription.rawValue,
                AlpacaError.invalidSubscribeAction.rawValue:
                // The answer to the oldest message not answered yet. Other errors (407 slow client, 500
                // internal error) come unasked and answer nothing.
                guard isAuthenticated, !lostTrack, !awaiting.isEmpty else { return Reaction(event: .error("\(code) \(message)")) }
                let answered = awaiting.removeFirst()
                guard answered.subscribes else { return Reaction(event: .error("\(code) \(message)")) }
                // Nothing of the message was done: the server does not send these topics.
                let topics = answered.topics.intersection(wanted)
                subscribed.subtract(answered.topics)
                refused.formUnion(topics)
                return Reaction(event: .refused(code: code, message: message, topics: topics))
            default:
                return Reaction(event: .error("\(code) \(message)"))
            }
        default:
            return Reaction(event: .other(status: "alpaca", message: Self.describe(control)))
        }
    }

    /// Replaces the wanted set; while authenticated, the messages that move the server there
    /// (subscribes first, then unsubscribes).
    public mutating func setWanted(_ topics: Set<Topic>) -> [[UInt8]] {
        wanted = topics
        // A refused topic no longer wanted is forgotten: wanted again, it is asked for again.
        refused.formIntersection(topics)
        guard isAuthenticated else { return [] }
        let asked = topics.subtracting(refused)
        let added = asked.subtracting(subscribed)
        let removed = subscribed.subtracting(asked)
        subscribed = asked
        return send("subscribe", added) + send("unsubscribe", removed)
    }

    public mutating func connectionEnded() {
        isAuthenticated = false
        loggedIn = false
        subscribed = []
        refused = []
        awaiting = []
        lostTrack = false
    }

    /// Messages awaiting their answer at most: a server that stops answering (Alpaca answers each)
    /// must not make the list grow with every change of interest. Past it the list is dropped and
    /// answers are no longer matched (``lostTrack``) until the connection ends.
    public static let awaitingLimit = 1_000

    /// The messages of ``actions(_:_:)``, each noted as awaiting its answer.
    private mutating func send(_ action: String, _ topics: Set<Topic>) -> [[UInt8]] {
        let batches = Self.batches(topics)
        if !lostTrack {
            for batch in batches { awaiting.append((action == "subscribe", batch)) }
            if awaiting.count > Self.awaitingLimit {
                awaiting = []
                lostTrack = true
            }
        }
        return batches.map { Self.message(action, $0) }
    }

    /// Topic changes as `{"action":…,"trades":[…],…}` maps, at most ``symbolsPerMessage`` symbols each.
    /// A trade's corrections and cancel errors come with its trades: they are never asked for.
    public static func actions(_ action: String, _ topics: Set<Topic>) -> [[UInt8]] {
        batches(topics).map { message(action, $0) }
    }

    /// The topics of each message, at most ``symbolsPerMessage`` each, in order.
    static func batches(_ topics: Set<Topic>) -> [Set<Topic>] {
        var batches: [Set<Topic>] = []
        var batch: Set<Topic> = []
        for topic in topics.sorted() {
            guard let channel = AlpacaChannel(eventType: topic.eventType), channel != .corrections, channel != .cancelErrors else { continue }
            batch.insert(topic)
            if batch.count >= symbolsPerMessage {
                batches.append(batch)
                batch = []
            }
        }
        if !batch.isEmpty { batches.append(batch) }
        return batches
    }

    /// One subscribe or unsubscribe message: the topics' symbols per channel.
    static func message(_ action: String, _ topics: Set<Topic>) -> [UInt8] {
        var channels: [AlpacaChannel: [String]] = [:]
        for topic in topics.sorted() {
            guard let channel = AlpacaChannel(eventType: topic.eventType) else { continue }
            channels[channel, default: []].append(topic.ticker)
        }
        var entries: [MessagePack.Value.Entry] = [.init(.string("action"), .string(action))]
        for channel in channels.keys.sorted() {
            entries.append(.init(.string(channel.rawValue), .array((channels[channel] ?? []).map { .string($0) })))
        }
        return MessagePack.encode(.map(entries))
    }

    private static func describe(_ value: MessagePack.Value) -> String {
        AlpacaJSON.excerpt(value, bytes: 300)
    }
}

extension AlpacaClientSession: UpstreamSession {
    /// A control map from ``AlpacaWireProtocol/readUpstream(_:receivedAt:market:)``, in the relay's words.
    public mutating func react(to control: UpstreamControl) -> UpstreamReaction {
        guard let value = control.message as? MessagePack.Value else {
            return UpstreamReaction(signal: .other(status: "mismatch", message: "a control message of another protocol"))
        }
        let reaction = receive(value)
        return UpstreamReaction(send: reaction.send, signal: reaction.event)
    }

    public mutating func want(_ topics: Set<Topic>) -> [[UInt8]] {
        setWanted(topics)
    }
}
