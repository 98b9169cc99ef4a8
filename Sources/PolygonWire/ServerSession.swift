import NIOCore

/// The server side of the Polygon conversation for one connection, without I/O: it reads client
/// messages and says what to answer and which topics to add or drop.
///
/// Value type, `Sendable`; one per connection, owned by the task that reads that connection. Used by
/// the relay's downstream endpoint and by the demo feed, so both speak the protocol identically:
/// the auth reply is a frame of its own; subscribes that arrive right behind `auth` (before its reply
/// was read) are handled in order; `params` entries are trimmed; a malformed message is answered with an
/// `error` status and the connection goes on. A client message gets at most one frame back, whatever
/// its length (what changed, with counts and the first few topics, and what was refused), and a message
/// that changes nothing and asks nothing wrong gets none: what a client can make the relay write is
/// bounded by what it sends. A second `auth` is refused (a connection keeps the key it was admitted with).
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
        /// The key was right but may not use this connection's market (answered at once: no guess).
        public var marketRefused = false
        /// A subscribe that resumes: where `added` start from (keys in the market's ticker form).
        public var resume: ClientAction.Resume?
        /// A subscribe that asked for conflation (`.zero`: the key's default interval).
        public var conflate: Duration?
        /// A subscribe that asked for receive and send times.
        public var timestamps = false
    }

    /// The session tag the client gave with its key (`KEY#tag`), naming a session the relay keeps for a
    /// while after the connection breaks so a reconnect resumes it.
    public private(set) var sessionTag: String?
    /// The epoch of the market's positions, told in each subscribe's `success` (`nil`: no history), so a
    /// client that resumes later knows which epoch its positions are of. Set by the connection.
    public var epoch: String?

    public var isAuthenticated: Bool { grant != nil }
    /// Who the client authenticated as, once it has.
    public private(set) var grant: ClientGrant?
    public private(set) var topics: Set<Topic> = []
    public let limits: SessionLimits
    /// The market the connection is on: its topics are written in its form (``Market/normalized(_:)``),
    /// a topic of another market is refused naming that market, and only its event types are taken.
    /// `nil`: no market check.
    public let market: Market?
    private let authenticate: @Sendable (String) -> ClientGrant?
    /// Distinct topics shared by every connection (per key and in all); `nil`: no such bound.
    private let budget: TopicBudget?
    private var rate: MessageRate

    /// - Parameter authenticate: what a client key may do, or `nil` when it is not accepted.
    public init(
        limits: SessionLimits = SessionLimits(), market: Market? = nil, budget: TopicBudget? = nil,
        grants authenticate: @escaping @Sendable (String) -> ClientGrant?
    ) {
        var limits = limits
        if let market { limits.eventTypes = market.eventTypes }
        self.limits = limits
        self.market = market
        self.budget = budget
        self.authenticate = authenticate
        rate = MessageRate(limits)
    }

    /// - Parameter authenticate: whether a client key is accepted (for everything).
    public init(authenticate: @escaping @Sendable (String) -> Bool) {
        self.init(grants: { authenticate($0) ? ClientGrant(name: "client") : nil })
    }

    /// Handles one client message (arriving at `now`).
    public mutating func receive(_ message: ByteBuffer, at now: ContinuousClock.Instant = .now) -> Reaction {
        guard rate.admit(at: now) else {
            // Told at most once a second: a flood past the rate is not answered message by message.
            guard rate.tellsRefusal(at: now) else { return Reaction() }
            return Reaction(frames: [
                StatusMessage.error(
                    "rate limit: at most \(limits.messagesPerSecond) messages per second; messages past it are dropped (told once a second)"
                ).frame
            ])
        }
        guard message.readableBytes <= limits.messageBytes else { return Reaction(frames: [StatusMessage.error(limits.tooLarge(message.readableBytes)).frame]) }
        let action: ClientAction
        do {
            action = try ClientAction.decode(message)
        } catch {
            return Reaction(frames: [StatusMessage.error(error.message).frame])
        }
        switch action.kind {
        case .auth:
            if let grant {
                // A grant is admitted once (its key's connection limit, its topics): no swapping keys.
                return Reaction(frames: [
                    StatusMessage.error("already authenticated as \"\(grant.name)\"; open a new connection to use another key").frame
                ])
            }
            var key = String(action.params.trimmingWhitespace())
            if let hash = key.lastIndex(of: "#") {
                let tag = String(key[key.index(after: hash)...])
                key = String(key[..<hash])
                guard Self.isSessionTag(tag) else {
                    return Reaction(
                        frames: [
                            StatusMessage(
                                status: StatusMessage.Kind.authFailed,
                                message: "session tag after # must be 1 to 64 letters, digits, '.', '_' or '-'"
                            ).frame
                        ], close: true)
                }
                sessionTag = tag
            }
            guard let granted = authenticate(key) else {
                return Reaction(frames: [StatusMessage.authFailed.frame], close: true)
            }
            if let market, !granted.entitlement.allows(market: market) {
                // Polygon answers a plan without a market the same way: auth_failed, then it closes.
                let markets = granted.entitlement.markets.map { $0.sorted().map(\.rawValue).joined(separator: ", ") } ?? ""
                var reaction = Reaction(
                    frames: [
                        StatusMessage(
                            status: StatusMessage.Kind.authFailed,
                            message: "key \"\(granted.name)\" may not use the \(market) market (its markets: \(markets))"
                        ).frame
                    ], close: true)
                reaction.marketRefused = true
                return reaction
            }
            var inForm = granted
            // The key's patterns for this market in its topics' form (`crypto:XQ.BTC-USD` is `XQ.X:BTC-USD`).
            if let market {
                inForm.entitlement = granted.entitlement.inForm(of: market) { market.problem(with: $0) == nil ? market.normalized($0) : $0 }
            }
            grant = inForm
            return Reaction(frames: [StatusMessage.authSuccess.frame])
        case .subscribe, .unsubscribe:
            guard isAuthenticated else {
                return Reaction(frames: [StatusMessage.error("not authorized: send auth first").frame])
            }
            return changeTopics(action)
        }
    }

    /// Whether `tag` may name a session: 1 to 64 ASCII letters, digits, `.`, `_`, `-`.
    public static func isSessionTag(_ tag: String) -> Bool { SessionTag.isValid(tag) }

    private mutating func changeTopics(_ action: ClientAction) -> Reaction {
        // Entries (empty ones too, which parsing drops) are counted first: a message far past the limit
        // costs a byte scan, no more.
        let entries = Topic.entryCount(action.params)
        var (parsed, invalid) = entries <= limits.topicsPerMessage * 2 ? Topic.parseList(action.params) : ([], [])
        // In the market's own form (`XT.BTC-USD` is `XT.X:BTC-USD`): what the upstream and the hub use.
        if let market, market.tickerPrefix != nil {
            parsed = parsed.map { market.problem(with: $0) == nil ? market.normalized($0) : $0 }
        }
        let count = entries <= limits.topicsPerMessage * 2 ? parsed.count + invalid.count : entries
        guard count <= limits.topicsPerMessage else {
            return Reaction(frames: [
                StatusMessage.error("too many topics in one message: \(count) (at most \(limits.topicsPerMessage)); nothing was changed").frame
            ])
        }
        var reaction = Reaction()
        var problems: [String] = []
        if action.kind == .subscribe {
            var malformed = invalid
            var refused: [Topic] = []
            var overLimit = 0
            var wanted: [Topic] = []
            var seen = Set<Topic>()
            // Counted at the message's first derived topic, then kept up to date.
            var derived: DerivedLimits.Tally?
            for topic in parsed where !topics.contains(topic) && seen.insert(topic).inserted {
                if let problem = market?.problem(with: topic) ?? limits.problem(with: topic) {
                    malformed.append("\(topic) (\(problem))")
                } else if let grant, !grant.entitlement.allows(topic, in: market) {
                    refused.append(topic)
                } else if let grant, let market, !grant.entitlement.allowsTrades(behind: topic, rules: PolygonBarRules(market: market), in: market) {
                    // A bar of one trade is the trade: a derived topic needs the right to its trades too.
                    refused.append(topic)
                } else if topic.isDerived, let problem = DerivedLimits.Tally.problem(adding: topic, &derived, held: topics) {
                    malformed.append("\(topic) (\(problem))")
                } else if topics.count + wanted.count >= limits.topicsPerConnection {
                    overLimit += 1
                } else {
                    wanted.append(topic)
                    derived?.add(topic)
                }
            }
            if !wanted.isEmpty, let budget, let grant {
                let verdict = budget.reserve(wanted, grant)
                if !verdict.refused.isEmpty {
                    let refusedSet = Set(verdict.refused)
                    wanted.removeAll { refusedSet.contains($0) }
                    problems.append("\(verdict.reason ?? "topic limit reached"); not subscribed: \(Self.summary(verdict.refused))")
                }
            }
            topics.formUnion(wanted)
            reaction.added = wanted
            reaction.conflate = action.conflate
            reaction.timestamps = action.timestamps
            switch action.resume {
            case .positions(let epoch, let positions)?:
                var normalized: [Topic: UInt64] = [:]
                for (topic, position) in positions {
                    let inForm = self.market.map { market in market.problem(with: topic) == nil ? market.normalized(topic) : topic } ?? topic
                    normalized[inForm] = position
                }
                reaction.resume = .positions(epoch: epoch, normalized)
            case let other:
                reaction.resume = other
            }
            if !malformed.isEmpty { problems.append(Self.invalidTopics(malformed)) }
            if !refused.isEmpty {
                problems.append("not authorized: key \"\(grant?.name ?? "")\" may not subscribe to \(Self.summary(refused))")
            }
            if overLimit > 0 {
                problems.append("topic limit reached: a connection holds at most \(limits.topicsPerConnection); not subscribed: \(overLimit) topics")
            }
        } else {
            for topic in parsed where topics.remove(topic) != nil { reaction.removed.append(topic) }
            if !reaction.removed.isEmpty, let budget, let grant { budget.release(reaction.removed, grant) }
            if !invalid.isEmpty { problems.append(Self.invalidTopics(invalid)) }
        }
        if parsed.isEmpty && invalid.isEmpty {
            problems.append("\(action.kind.rawValue): no topics in params")
        }
        // One frame per message whatever its length: what changed (nothing for a no-op) and what did not.
        var statuses: [StatusMessage] = []
        let changed = action.kind == .subscribe ? reaction.added : reaction.removed
        if !changed.isEmpty {
            let verb = action.kind == .subscribe ? "subscribed to" : "unsubscribed to"
            let message = changed.count == 1 ? "\(verb): \(changed[0])" : "\(verb) \(changed.count) topics: \(Self.summary(changed))"
            var success = StatusMessage(status: StatusMessage.Kind.success, message: message)
            if action.kind == .subscribe, let epoch { success.fields["epoch"] = StatusMessage.quoted(epoch) }
            statuses.append(success)
        }
        if !problems.isEmpty { statuses.append(.error(problems.joined(separator: "; "))) }
        if !statuses.isEmpty { reaction.frames = [StatusMessage.frame(statuses)] }
        return reaction
    }

    /// The topics held are given up (the connection closed): their share of the budget is released.
    public mutating func releaseAll() {
        if !topics.isEmpty, let budget, let grant { budget.release(Array(topics), grant) }
        topics = []
    }

    /// The problem of entries that are no topics (one wording for both actions).
    static func invalidTopics(_ entries: [String]) -> String {
        "invalid topics (expected EVENT.TICKER, e.g. Q.AAPL or T.*): \(summary(entries))"
    }

    /// How many entries a status names before it says how many more there are.
    static let namedInSummary = 10

    /// `A,B,C` for a few entries, `A,…,J and 990 more` for many: a status stays small whatever the message.
    static func summary(_ entries: [some CustomStringConvertible]) -> String {
        let named = entries.prefix(namedInSummary).map { String(decoding: $0.description.utf8.prefix(64), as: UTF8.self) }.joined(separator: ",")
        return entries.count > namedInSummary ? "\(named) and \(entries.count - namedInSummary) more" : named
    }
}
