import PolygonWire

/// The client side of Alpaca's conversation for one upstream connection, without I/O: `auth` with the
/// account's key and secret after `connected`, the whole wanted set subscribed after `authenticated`,
/// and per change the subscribe and unsubscribe messages that move the server there, in MessagePack.
/// Alpaca's errors are read as the relay's upstream client knows them (402 auth failed, 406 connection
/// limit: close and back off; 404 auth timeout; the rest logged).
///
/// Value type, `Sendable`; one per upstream client, owned by whoever holds its lock. The wanted set
/// survives a lost connection; the server's subscriptions do not.
public struct AlpacaClientSession: Sendable {
    /// What one server control message means.
    public enum Event: Sendable, Equatable {
        case connected
        case authenticated
        case authFailed(String)
        case connectionLimit(String)
        case authTimeout(String)
        /// The `subscription` reply (what the server now sends).
        case subscribed(String)
        /// Another error (405 symbol limit, 409 insufficient subscription, 410 …): logged.
        case error(code: Int, message: String)
        case other(String)
    }

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

    public init(key: String, secret: String) {
        self.key = key
        self.secret = secret
    }

    /// Handles one control message (a map with `T`).
    public mutating func receive(_ control: MessagePack.Value) -> Reaction {
        let message = control["msg"]?.string ?? ""
        switch control["T"]?.string {
        case "success" where message == "connected":
            let auth = MessagePack.Value.map([
                .init(.string("action"), .string("auth")), .init(.string("key"), .string(key)), .init(.string("secret"), .string(secret)),
            ])
            return Reaction(send: [MessagePack.encode(auth)], event: .connected)
        case "success" where message == "authenticated":
            isAuthenticated = true
            subscribed = wanted
            return Reaction(send: Self.actions("subscribe", wanted), event: .authenticated)
        case "subscription":
            return Reaction(event: .subscribed(Self.describe(control)))
        case "error":
            let code = Int(control["code"]?.integer ?? 0)
            switch code {
            case AlpacaError.authFailed.rawValue, AlpacaError.notAuthenticated.rawValue:
                isAuthenticated = false
                return Reaction(event: .authFailed("\(code) \(message)"))
            case AlpacaError.connectionLimitExceeded.rawValue:
                isAuthenticated = false
                return Reaction(event: .connectionLimit("\(code) \(message)"))
            case AlpacaError.authTimeout.rawValue:
                return Reaction(event: .authTimeout("\(code) \(message)"))
            default:
                return Reaction(event: .error(code: code, message: message))
            }
        default:
            return Reaction(event: .other(Self.describe(control)))
        }
    }

    /// Replaces the wanted set; while authenticated, the messages that move the server there
    /// (subscribes first, then unsubscribes).
    public mutating func setWanted(_ topics: Set<Topic>) -> [[UInt8]] {
        wanted = topics
        guard isAuthenticated else { return [] }
        let added = topics.subtracting(subscribed)
        let removed = subscribed.subtracting(topics)
        subscribed = topics
        return Self.actions("subscribe", added) + Self.actions("unsubscribe", removed)
    }

    public mutating func connectionEnded() {
        isAuthenticated = false
        subscribed = []
    }

    /// Topic changes as `{"action":…,"trades":[…],…}` maps, at most ``symbolsPerMessage`` symbols each.
    /// A trade's corrections and cancel errors come with its trades: they are never asked for.
    public static func actions(_ action: String, _ topics: Set<Topic>) -> [[UInt8]] {
        var messages: [[UInt8]] = []
        var channels: [AlpacaChannel: [String]] = [:]
        var count = 0
        func flush() {
            guard count > 0 else { return }
            var entries: [MessagePack.Value.Entry] = [.init(.string("action"), .string(action))]
            for channel in channels.keys.sorted() {
                entries.append(.init(.string(channel.rawValue), .array((channels[channel] ?? []).map { .string($0) })))
            }
            messages.append(MessagePack.encode(.map(entries)))
            channels = [:]
            count = 0
        }
        for topic in topics.sorted() {
            guard let channel = AlpacaChannel(eventType: topic.eventType), channel != .corrections, channel != .cancelErrors else { continue }
            channels[channel, default: []].append(topic.ticker)
            count += 1
            if count >= symbolsPerMessage { flush() }
        }
        flush()
        return messages
    }

    private static func describe(_ value: MessagePack.Value) -> String {
        String(decoding: AlpacaJSON.text(value).prefix(300), as: UTF8.self)
    }
}
