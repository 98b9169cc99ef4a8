import MarketCore

/// The server side of Alpaca's conversation for one connection, without I/O: it reads client messages
/// (in the connection's codec) and says what to answer and which topics to add or drop.
///
/// As Alpaca does: `auth` with `key` and `secret` (the key is the relay's client key; the secret is
/// not checked, relay keys have none), then `subscribe`/`unsubscribe` with a list of symbols per channel.
/// Every change is answered with the connection's whole subscription, each control message alone in a
/// one-element array (Go's SDK reads exactly one element). A trades subscription brings its symbols'
/// corrections and cancel errors, as Alpaca's does. Errors go in Alpaca's codes; the connection lives
/// except after a failed auth, which closes it.
///
/// Value type, `Sendable`; one per connection, owned by the task that reads it.
public struct AlpacaServerSession: Sendable {
    public struct Reaction: Sendable {
        /// Frames to send, in order, in the connection's codec.
        public var frames: [[UInt8]] = []
        public var added: [Topic] = []
        public var removed: [Topic] = []
        /// Close after sending `frames` (a failed auth).
        public var close = false
        /// The key was right but may not use this connection's market (answered at once: no guess).
        public var marketRefused = false
    }

    public let codec: AlpacaCodec
    public let feed: AlpacaFeed
    /// The relay's market this feed is served as (a key's markets and per-market patterns apply).
    public let market: Market?
    public let limits: SessionLimits
    public private(set) var grant: ClientGrant?
    /// The session tag the client gave with its key id (`KEY#tag`): the relay keeps the session for a
    /// while after the connection breaks, and a reconnect with the same tag resumes it.
    public private(set) var sessionTag: String?
    public private(set) var topics: Set<Topic> = [] {
        didSet { subscriptionFrame = nil }
    }
    /// The topics' tickers by event type, each list kept sorted as topics come and go (a binary search
    /// and a move each): a change is answered by encoding the whole subscription, as Alpaca's protocol
    /// wants, without sorting up to ``SessionLimits/topicsPerConnection`` tickers again.
    private var listed: [String: [String]] = [:]
    /// The whole subscription as last encoded, until the topics change: a change that changes nothing
    /// (or any number of them in a row) is answered without listing every topic again.
    private var subscriptionFrame: [UInt8]?
    public var isAuthenticated: Bool { grant != nil }
    private let authenticate: @Sendable (String) -> ClientGrant?
    private let budget: TopicBudget?
    private var rate: MessageRate
    /// On the news feed: the items this connection was sent lately, so an item goes once however many
    /// of its symbols the connection holds (``AlpacaFraming``).
    let newsSent: NewsSent?

    public init(
        codec: AlpacaCodec, feed: AlpacaFeed, market: Market? = nil, limits: SessionLimits = SessionLimits(), budget: TopicBudget? = nil,
        grants authenticate: @escaping @Sendable (String) -> ClientGrant?
    ) {
        self.codec = codec
        self.feed = feed
        self.market = market
        var limits = limits
        limits.eventTypes = feed.eventTypes
        self.limits = limits
        self.budget = budget
        self.authenticate = authenticate
        rate = MessageRate(limits)
        newsSent = feed == .news ? NewsSent() : nil
    }

    /// Handles one client message (arriving at `now`).
    public mutating func receive(_ message: [UInt8], at now: ContinuousClock.Instant = .now) -> Reaction {
        refusal(ofBytes: message.count, at: now) ?? handle(message)
    }

    /// The answer to a message of `count` bytes arriving at `now` that is not read: past the message
    /// rate, or too large (told before its bytes are copied); `nil`: it is read.
    mutating func refusal(ofBytes count: Int, at now: ContinuousClock.Instant) -> Reaction? {
        guard rate.admit(at: now) else {
            guard rate.tellsRefusal(at: now) else { return Reaction() }
            return error(.invalidSyntax, "at most \(limits.messagesPerSecond) messages per second; messages past it are dropped")
        }
        guard count <= limits.messageBytes else { return error(.invalidSyntax, limits.tooLarge(count)) }
        return nil
    }

    /// Reads a message the rate and the size let through.
    mutating func handle(_ message: [UInt8]) -> Reaction {
        guard let value = codec.decode(message, maxContainers: AlpacaCodec.maxClientContainers), case .map = value, let action = value["action"]?.string else {
            return error(.invalidSyntax)
        }
        switch action {
        case "auth":
            guard grant == nil else { return error(.alreadyAuthenticated) }
            guard var key = value["key"]?.string, !key.isEmpty else {
                var reaction = error(.authFailed)
                reaction.close = true
                return reaction
            }
            if let hash = key.lastIndex(of: "#") {
                let tag = String(key[key.index(after: hash)...])
                key = String(key[..<hash])
                guard SessionTag.isValid(tag) else {
                    var reaction = error(.authFailed, "a session tag after # has 1 to 64 letters, digits, '.', '_' or '-'")
                    reaction.close = true
                    return reaction
                }
                sessionTag = tag
            }
            guard let granted = authenticate(key) else {
                var reaction = error(.authFailed)
                reaction.close = true
                return reaction
            }
            if let market, !granted.entitlement.allows(market: market) {
                // As Alpaca answers a feed outside the plan: 409, then closed.
                var reaction = error(.insufficientSubscription, "key \"\(granted.name)\" may not use the \(market) market")
                reaction.close = true
                reaction.marketRefused = true
                return reaction
            }
            grant = granted
            return Reaction(frames: [codec.frame([AlpacaControl.authenticated])])
        case "subscribe", "unsubscribe":
            guard isAuthenticated else { return error(.notAuthenticated) }
            return change(value, subscribe: action == "subscribe")
        default:
            return error(.invalidSyntax)
        }
    }

    private func error(_ code: AlpacaError, _ detail: String? = nil) -> Reaction {
        Reaction(frames: [codec.frame([code.message(detail: detail)])])
    }

    private mutating func change(_ message: MessagePack.Value, subscribe: Bool) -> Reaction {
        guard case .map(let entries) = message else { return error(.invalidSyntax) }
        var asked: [Topic] = []
        // A trade's corrections and cancel errors come with it where the key allows them, never refusing it.
        var implied: [Topic] = []
        for entry in entries {
            guard let name = entry.key.string, name != "action" else { continue }
            guard let channel = AlpacaChannel(rawValue: name) else { return error(.invalidSyntax, "unknown channel \(VisibleText.visible(name, limit: 32))") }
            guard feed.channels.contains(channel) else { return error(.invalidSubscribeAction) }
            guard let symbols = entry.value.array else { return error(.invalidSyntax, "\(name) takes a list of symbols") }
            guard asked.count + symbols.count <= limits.topicsPerMessage else {
                return error(.symbolLimitExceeded, "at most \(limits.topicsPerMessage) symbols in one message; nothing was changed")
            }
            for symbol in symbols {
                guard let text = symbol.string, let topic = Topic(eventType: channel.eventType, ticker: text), limits.problem(with: topic) == nil
                else { return error(.invalidSyntax, "not a symbol: \(symbol.string.map { VisibleText.visible($0, limit: 40) } ?? "a value that is no text")") }
                if topic.isDerived {
                    // `AAPL@5m` on `bars`: a bar the relay builds from the symbol's trades.
                    guard let rules = AlpacaBarRules(feed: feed) else { return error(.invalidSyntax, "no derived bars on this feed") }
                    if let problem = rules.problem(with: topic) { return error(.invalidSyntax, String(problem.prefix(200))) }
                }
                asked.append(topic)
                // Alpaca sends a trade's corrections and cancel errors to whoever takes its trades.
                if channel == .trades, feed.market == .stocks {
                    for channel in [AlpacaChannel.corrections, .cancelErrors] {
                        if let topic = Topic(eventType: channel.eventType, ticker: text) { implied.append(topic) }
                    }
                }
            }
        }
        var reaction = Reaction()
        if subscribe {
            var wanted: [Topic] = []
            var seen = Set<Topic>()
            // Counted at the message's first derived topic, then kept up to date.
            var derived: DerivedLimits.Tally?
            for topic in asked where !topics.contains(topic) && seen.insert(topic).inserted {
                if let grant, !grant.entitlement.allows(topic, in: market) { return error(.insufficientSubscription) }
                if topic.isDerived {
                    // A bar of one trade is the trade: a derived topic needs the right to its trades too.
                    if let grant, !grant.entitlement.allowsTrades(behind: topic, rules: AlpacaBarRules(feed: feed), in: market) {
                        return error(.insufficientSubscription)
                    }
                    if let problem = DerivedLimits.Tally.problem(adding: topic, &derived, held: topics) {
                        return error(.symbolLimitExceeded, problem)
                    }
                    derived?.add(topic)
                }
                wanted.append(topic)
            }
            for topic in implied where !topics.contains(topic) && seen.insert(topic).inserted {
                if let grant, !grant.entitlement.allows(topic, in: market) { continue }
                wanted.append(topic)
            }
            guard topics.count + wanted.count <= limits.topicsPerConnection else {
                return error(.symbolLimitExceeded, "a connection holds at most \(limits.topicsPerConnection) topics")
            }
            if !wanted.isEmpty, let budget, let grant {
                let verdict = budget.reserve(wanted, grant)
                guard verdict.refused.isEmpty else {
                    let refused = Set(verdict.refused)
                    budget.release(wanted.filter { !refused.contains($0) }, grant)
                    return error(.symbolLimitExceeded, verdict.reason ?? "topic limit reached")
                }
            }
            if !wanted.isEmpty { hold(wanted) }
            reaction.added = wanted
        } else {
            var seen = Set<Topic>()
            reaction.removed = (asked + implied).filter { topics.contains($0) && seen.insert($0).inserted }
            if !reaction.removed.isEmpty { letGo(reaction.removed) }
            if !reaction.removed.isEmpty, let budget, let grant { budget.release(reaction.removed, grant) }
        }
        let frame = subscriptionFrame ?? codec.frame([subscription])
        subscriptionFrame = frame
        reaction.frames = [frame]
        // The reply lists the whole subscription: past 64 KB, each 16 KB more costs a message more, so
        // a client holding many topics and changing one again and again is not sent megabytes a second.
        rate.charge(Double(max(frame.count - Self.freeReplyBytes, 0) / 16_384))
        return reaction
    }

    /// The size of a subscription reply that costs no more than its message.
    static let freeReplyBytes = 64 << 10

    /// `{"T":"subscription","trades":[…],…}`: the connection's whole subscription, every channel of the
    /// feed listed, symbols sorted.
    public var subscription: MessagePack.Value {
        var entries: [MessagePack.Value.Entry] = [.init(.string("T"), .string("subscription"))]
        for channel in feed.channels {
            let symbols = (listed[channel.eventType] ?? []).map { MessagePack.Value.string($0) }
            entries.append(.init(.string(channel.rawValue), .array(symbols)))
        }
        return .map(entries)
    }

    /// Holds topics not held yet. A few go each into its place; many are appended and the list
    /// sorted again (the standard library's sort takes the sorted part as one run: about linear).
    private mutating func hold(_ added: [Topic]) {
        topics.formUnion(added)
        if added.count <= Self.placedOneByOne {
            for topic in added { listed[topic.eventType, default: []].insertSorted(topic.ticker) }
            return
        }
        var types = Set<String>()
        for topic in added {
            listed[topic.eventType, default: []].append(topic.ticker)
            types.insert(topic.eventType)
        }
        for type in types { listed[type]?.sort() }
    }

    /// Lets go of topics held: a few found each by a binary search, many in one pass.
    private mutating func letGo(_ removed: [Topic]) {
        topics.subtract(removed)
        if removed.count <= Self.placedOneByOne {
            for topic in removed { listed[topic.eventType]?.removeSorted(topic.ticker) }
            return
        }
        for (type, gone) in Dictionary(grouping: removed, by: \.eventType) {
            let tickers = Set(gone.map(\.ticker))
            listed[type]?.removeAll { tickers.contains($0) }
        }
    }

    /// Up to this many topics of a change are placed one by one.
    private static let placedOneByOne = 16

    /// The topics held are given up (the connection closed): their share of the budget is released.
    public mutating func releaseAll() {
        if !topics.isEmpty, let budget, let grant { budget.release(Array(topics), grant) }
        topics = []
        listed = [:]
    }
}

extension Array where Element == String {
    /// Puts `value` in its place in this sorted array.
    fileprivate mutating func insertSorted(_ value: String) {
        insert(value, at: sortedIndex(of: value))
    }

    /// Takes `value` out of this sorted array, if it is there.
    fileprivate mutating func removeSorted(_ value: String) {
        let index = sortedIndex(of: value)
        if index < count, self[index] == value { remove(at: index) }
    }

    /// Where `value` is, or goes, in this sorted array: the first index whose element is not below it.
    private func sortedIndex(of value: String) -> Int {
        var low = 0
        var high = count
        while low < high {
            let middle = (low + high) / 2
            if self[middle] < value { low = middle + 1 } else { high = middle }
        }
        return low
    }
}
