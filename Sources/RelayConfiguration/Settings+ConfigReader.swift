import Cluster
import Configuration
import MarketREST
import Foundation
import GapFill
import Logging
import MarketDataHub
import MarketCore
import RelayServer
import Tape
import TapeReplay

// Each configuration type reads its own keys from the resolved reader (flags > environment > file >
// default), the way Hummingbird's `+ConfigReader` files do; `RelaySettings.resolve` only puts them
// together. A value out of range is an ``RelaySettings/InvalidSetting`` naming its key.

extension ConfigReader {
    /// A whole number, `nil` when the setting is not given. swift-configuration's typed read answers
    /// `nil` for a value it cannot convert as well, which would quietly mean the default: the value is
    /// then read as text (a file's quoted `"5000"` is a number too), and refused, naming its key, when
    /// it is not one.
    func wholeNumber(_ key: ConfigKey) throws -> Int? {
        if let value = int(forKey: key) { return value }
        return try fromText(key, expecting: "a whole number") { text in
            if let value = Int(text) { return value }
            // Digits past what an Int holds: past any setting's bound, said so.
            let digits = text.hasPrefix("-") || text.hasPrefix("+") ? text.dropFirst() : Substring(text)
            if !digits.isEmpty, digits.allSatisfy(\.isASCII), digits.allSatisfy(\.isNumber) {
                let side = text.hasPrefix("-") ? "below" : "past"
                throw RelaySettings.InvalidSetting(description: "\(key): a whole number \(side) any bound of a setting, got \(text)")
            }
            return nil
        }
    }

    /// A finite number (`1.5`, `20`), `nil` when not given; anything else given is refused.
    func number(_ key: ConfigKey) throws -> Double? {
        let value = try double(forKey: key) ?? fromText(key, expecting: "a number") { Double($0) }
        guard let value else { return nil }
        guard value.isFinite else { throw RelaySettings.InvalidSetting(description: "\(key): a number, got \(value)") }
        return value
    }

    /// `true` or `false` (also `yes`/`no`, `1`/`0`, in any case), `nil` when not given; anything else
    /// given is refused.
    func flag(_ key: ConfigKey) throws -> Bool? {
        if let value = bool(forKey: key) { return value }
        return try fromText(key, expecting: "true or false") { text in
            switch text.lowercased() {
            case "true", "yes", "1": true
            case "false", "no", "0": false
            default: nil
            }
        }
    }

    /// The typed read found nothing: the setting's text, if it is given, converted by `convert`, or an
    /// error naming the key.
    private func fromText<Value>(_ key: ConfigKey, expecting expected: String, _ convert: (String) throws -> Value?) throws -> Value? {
        guard let raw = try text(key, expecting: expected) else { return nil }
        guard let value = try convert(raw.trimmingCharacters(in: .whitespaces)) else {
            throw RelaySettings.InvalidSetting(description: "\(key): \(expected), got \"\(raw)\"")
        }
        return value
    }

    /// A setting's text, `nil` when it is not given. An empty value, and YAML's null (`~`, `null`),
    /// count as not given, as for numbers and switches; a list where one value belongs is refused
    /// (a secret's list is not shown).
    func text(_ key: ConfigKey, expecting expected: String = "one value", isSecret: Bool = false) throws -> String? {
        guard let raw = string(forKey: key, isSecret: isSecret) else {
            // A list (or a mapping read as one) where one value belongs is not a value.
            if let list = stringArray(forKey: key, isSecret: isSecret) {
                throw RelaySettings.InvalidSetting(description: "\(key): \(expected), got a list\(isSecret ? "" : " \(list)")")
            }
            return nil
        }
        return RelaySettings.countsAsNotGiven(raw) ? nil : raw
    }

    /// A list: the file's list, or items separated by commas; `nil` when not given (empty and null
    /// items are left out).
    func list(_ key: ConfigKey, isSecret: Bool = false) throws -> [String]? {
        let items =
            try stringArray(forKey: key, isSecret: isSecret)?.flatMap(RelaySettings.splitList)
            ?? text(key, isSecret: isSecret).map(RelaySettings.splitList)
        let given = items?.filter { !RelaySettings.countsAsNotGiven($0) } ?? []
        return given.isEmpty ? nil : given
    }

    /// The most any whole-number setting takes unless it says otherwise: 10^9 (of events, bytes,
    /// seconds or milliseconds, more than any use), so that what is made of it (bytes from megabytes,
    /// a `Duration`, nanoseconds) stays within its type instead of wrapping or trapping later.
    static let largestWholeNumber = 1_000_000_000

    /// An integer setting that must be at least 1 and at most `limit`.
    func positive(_ key: ConfigKey, atMost limit: Int = largestWholeNumber) throws -> Int? {
        guard let value = try wholeNumber(key) else { return nil }
        guard value >= 1 else { throw RelaySettings.InvalidSetting(description: "\(key): at least 1, got \(value)") }
        return try value.checked(key, atMost: limit)
    }

    /// An integer setting that must not be negative, and at most `limit`.
    func notNegative(_ key: ConfigKey, atMost limit: Int = largestWholeNumber) throws -> Int? {
        guard let value = try wholeNumber(key) else { return nil }
        guard value >= 0 else { throw RelaySettings.InvalidSetting(description: "\(key): not negative, got \(value)") }
        return try value.checked(key, atMost: limit)
    }

    /// A size in megabytes, at least 1 and at most a tebibyte, in bytes.
    func megabytes(_ key: ConfigKey) throws -> Int? {
        try positive(key, atMost: 1 << 20).map { $0 << 20 }
    }

    /// A number that must be above 0 and at most `limit` (by default 10^9: of seconds or gigabytes more
    /// than any use, and it keeps what is made of them within their types).
    func aboveZero(_ key: ConfigKey, atMost limit: Double = 1e9) throws -> Double? {
        guard let value = try number(key) else { return nil }
        guard value > 0 else { throw RelaySettings.InvalidSetting(description: "\(key): must be above 0, got \(value)") }
        return try value.checked(key, atMost: limit)
    }
}

extension RelaySettings {
    /// Empty (or blank), `~` and `null`: YAML's ways of saying nothing, taken the same from anywhere.
    static func countsAsNotGiven(_ text: String) -> Bool {
        let trimmed = text.trimmingCharacters(in: .whitespaces)
        return trimmed.isEmpty || trimmed == "~" || trimmed.lowercased() == "null"
    }
}

extension Comparable {
    /// The value, or an error naming `key` when it is past `limit`.
    fileprivate func checked(_ key: ConfigKey, atMost limit: Self) throws -> Self {
        guard self <= limit else { throw RelaySettings.InvalidSetting(description: "\(key): at most \(limit), got \(self)") }
        return self
    }
}

extension HistoryLimits {
    /// `history.*`; `nil` with `history.enabled` false.
    init?(reading config: ConfigReader) throws {
        guard try config.flag("history.enabled") != false else { return nil }
        self.init()
        if let value = try config.positive("history.eventsPerTopic") { eventsPerTopic = value }
        if let value = try config.positive("history.maxAgeSeconds") { maxAge = .seconds(value) }
        if let bytes = try config.megabytes("history.memoryMB") { memoryBytes = bytes }
        if let value = try config.positive("history.eventsPerResume") { eventsPerResume = value }
        if let value = try config.positive("history.resumesPerKey") { resumesPerKey = value }
    }
}

extension ResumeSettings {
    /// `resume.*`.
    init(reading config: ConfigReader) throws {
        self.init()
        if let value = try config.positive("resume.windowSeconds") { window = .seconds(value) }
        if let value = try config.notNegative("resume.marginBytes") { marginBytes = value }
        if let value = try config.positive("resume.sessions") { sessions = value }
    }
}

extension GapFillSettings {
    /// `gapFill.*`; `nil` with `gapFill.enabled` false.
    init?(reading config: ConfigReader) throws {
        guard try config.flag("gapFill.enabled") != false else { return nil }
        self.init()
        if let value = try config.positive("gapFill.maxWindowSeconds") { maxWindow = .seconds(value) }
        if let value = try config.positive("gapFill.maxTopics") { maxTopics = value }
        if let value = try config.positive("gapFill.requestsPerSecond") { requestsPerSecond = Double(value) }
        if let value = try config.positive("gapFill.eventsPerTopic") { eventsPerTopic = value }
        if let value = try config.positive("gapFill.pagesPerTopic") { pagesPerTopic = value }
        if let value = try config.positive("gapFill.maxDurationSeconds") { maxDuration = .seconds(value) }
        if let value = try config.positive("gapFill.requestTimeoutSeconds") { requestTimeout = .seconds(value) }
    }
}

/// The REST gateway (``RelaySettings/gateway``): the account's budget, the waits it allows, the cache.
public struct GatewaySettings: Sendable, Equatable {
    /// The account's plan: requests per second or minute, shared by every client, gap fill and the portfolio.
    public var budget = RESTRate(requests: 100, per: .seconds(1))
    /// Alpaca's account (200/min on its basic plan), when an Alpaca market is served.
    public var alpacaBudget = RESTRate(requests: 200, per: .seconds(60))
    /// Alpaca's data REST API (`nil`: `https://data.alpaca.markets`, or the demo feed's).
    public var alpacaURL: String?
    /// Requests waiting for the budget at most; past it a client gets 429.
    public var queue = 256
    /// Vendor calls one key's requests started that are under way at most (waiting for the budget or
    /// at the vendor); past it that key gets 429.
    public var flightsPerKey = 64
    /// The longest a client's request waits for the budget; longer is a 429 with `Retry-After`.
    public var maxWait: Duration = .seconds(10)
    /// The whole upstream answer; past it the client gets 504.
    public var timeout: Duration = .seconds(10)
    /// The cache's file (`nil`: no cache), and its bound in bytes.
    public var cachePath: String?
    public var cacheBytes = 256 << 20
    /// The bytes of answers being sent at once, at most, and apart of vendor bodies being read
    /// (`rest.answersInFlightMB`).
    public var answersInFlightBytes = 256 << 20
    /// A client that takes longer than this to read 64 KiB of an answer is disconnected (`rest.sendTimeoutSeconds`).
    public var sendTimeout: Duration = .seconds(30)
    /// How long reference data is kept.
    public var referenceTTL: Duration = .seconds(3600)
    /// The address clients reach the relay at, for a page's `next_url` (`nil`: the `Host` they send).
    public var publicURL: String?

    public init() {}
}

extension GatewaySettings {
    /// `rest.*`; `nil` with `rest.gateway` false.
    init?(reading config: ConfigReader) throws {
        guard try config.flag("rest.gateway") != false else { return nil }
        self.init()
        if let text = try config.text("rest.budget") {
            guard let rate = RESTRate(parsing: text) else {
                throw RelaySettings.InvalidSetting(description: "rest.budget: a rate such as 5/min or 100/s, got \(text)")
            }
            budget = rate
        }
        if let text = try config.text("rest.alpacaBudget") {
            guard let rate = RESTRate(parsing: text) else {
                throw RelaySettings.InvalidSetting(description: "rest.alpacaBudget: a rate such as 200/min, got \(text)")
            }
            alpacaBudget = rate
        }
        if let url = try config.text("rest.alpacaURL") {
            guard let parsed = URL(string: url), parsed.scheme == "https" || (parsed.scheme == "http" && ["127.0.0.1", "localhost", "::1"].contains(parsed.host ?? "")) else {
                throw RelaySettings.InvalidSetting(description: "rest.alpacaURL: https://host (plain http only to loopback: the key travels with every request), got \(url)")
            }
            alpacaURL = url
        }
        if let value = try config.positive("rest.queue") { queue = value }
        if let value = try config.positive("rest.flightsPerKey") { flightsPerKey = value }
        if let value = try config.positive("rest.maxWaitSeconds") { maxWait = .seconds(value) }
        if let value = try config.positive("rest.timeoutSeconds") { timeout = .seconds(value) }
        if let bytes = try config.megabytes("rest.cacheMB") { cacheBytes = bytes }
        if let bytes = try config.megabytes("rest.answersInFlightMB") { answersInFlightBytes = bytes }
        if let value = try config.positive("rest.sendTimeoutSeconds", atMost: 86_400) { sendTimeout = .seconds(value) }
        if let value = try config.positive("rest.referenceTTLSeconds") { referenceTTL = .seconds(value) }
        if let path = try config.text("rest.cachePath") {
            cachePath = path
        } else {
            let data = try config.text("portfolio.dataDir") ?? "./data"
            cachePath = data.hasSuffix("/") ? "\(data)rest-cache.sqlite" : "\(data)/rest-cache.sqlite"
        }
        if let url = try config.text("rest.publicURL") {
            guard let parsed = URL(string: url), parsed.scheme == "http" || parsed.scheme == "https", parsed.host != nil, parsed.path.isEmpty || parsed.path == "/" else {
                throw RelaySettings.InvalidSetting(description: "rest.publicURL: http(s)://host[:port], got \(url)")
            }
            publicURL = url.hasSuffix("/") ? String(url.dropLast()) : url
        }
    }
}

/// Where and how each market's events are recorded (``RelaySettings/tape``).
public struct TapeSettings: Sendable, Equatable {
    /// The tape's directory (a folder per market).
    public var directory = "./data/tape"
    /// The longest a received event waits in memory before its block is written.
    public var flushInterval: Duration = .milliseconds(500)
    /// Days kept per market (today's included), and bytes per market.
    public var retentionDays = 7
    public var retentionBytes: Int64 = 20 << 30
    /// On a cluster: copies of each block on the NATS servers (the tape stream's replicas).
    public var replicas = 1

    public init() {}

    /// The defaults, recording under `directory`.
    public init(directory: String) {
        self.directory = directory
    }
}

extension TapeSettings {
    /// `tape.*`; `nil` with `tape.enabled` false. Without `tape.dir`, `tape/` in `portfolio.dataDir`.
    init?(reading config: ConfigReader) throws {
        guard try config.flag("tape.enabled") != false else { return nil }
        self.init()
        directory = try Self.directory(config)
        if let milliseconds = try config.positive("tape.flushMs") { flushInterval = .milliseconds(milliseconds) }
        // A century: what a stream's age limit in nanoseconds (a cluster's tape) can hold, and more than enough.
        if let days = try config.positive("tape.retentionDays", atMost: 36_500) { retentionDays = days }
        if let gigabytes = try config.aboveZero("tape.maxGB") {
            guard gigabytes >= 0.001 else { throw RelaySettings.InvalidSetting(description: "tape.maxGB: at least 0.001 (1 MB), got \(gigabytes)") }
            retentionBytes = Int64(gigabytes * Double(1 << 30))
        }
        // A JetStream stream has at most 5 replicas.
        if let replicas = try config.positive("tape.replicas", atMost: 5) { self.replicas = replicas }
    }

    /// `tape.dir`, or `tape/` in `portfolio.dataDir`, or `./data/tape` (recorded or not: a replay reads it).
    static func directory(_ config: ConfigReader) throws -> String {
        if let directory = try config.text("tape.dir") { return directory }
        if let data = try config.text("portfolio.dataDir") { return data.hasSuffix("/") ? "\(data)tape" : "\(data)/tape" }
        return TapeSettings().directory
    }
}

/// A recorded day replayed instead of the live upstreams (``RelaySettings/replay``): which day, which
/// markets, what window, how fast, and whether on a loop. Value type, `Sendable`.
public struct ReplaySettings: Sendable, Equatable {
    /// The tape's directory.
    public var directory: String
    /// `yyyy-mm-dd` (UTC), or `nil`: the newest day recorded.
    public var day: String?
    /// The markets replayed (`nil`: every market recorded that day).
    public var markets: [Market]?
    /// `1`, `10` … (the recorded spacing divided by it) or `max`.
    public var speed: String = "1"
    /// The window of the day, `HH:MM[:SS]` UTC (`nil`: its start, its end).
    public var from: String?
    public var to: String?
    /// Start again at the end.
    public var loop = false

    public init(directory: String) { self.directory = directory }
}

extension ReplaySettings {
    /// `replay.*`; `nil` without `replay.date`.
    init?(reading config: ConfigReader) throws {
        guard let date = try config.text("replay.date") else { return nil }
        self.init(directory: try TapeSettings.directory(config))
        if date.lowercased() != "last" {
            guard TapeFile.midnight(of: date) != nil else { throw RelaySettings.InvalidSetting(description: "replay.date: expected yyyy-mm-dd or last, got \"\(date)\"") }
            day = date
        }
        if let list = try config.list("replay.markets") {
            markets = try list.map { name in
                guard let market = Market(rawValue: name.lowercased()) else {
                    throw RelaySettings.InvalidSetting(description: "replay.markets: \"\(name)\" is not a market (one of \(Market.allCases.map(\.rawValue).joined(separator: ", ")))")
                }
                return market
            }
        }
        if let speed = try config.text("replay.speed") {
            guard ReplayPlan.Speed(speed) != nil else {
                throw RelaySettings.InvalidSetting(description: "replay.speed: expected a number above 0 (1 is as recorded, 10 ten times faster) or max, got \"\(speed)\"")
            }
            self.speed = speed.lowercased()
        }
        for (key, value) in [("replay.from", try config.text("replay.from")), ("replay.to", try config.text("replay.to"))] {
            guard let value else { continue }
            guard TapeFile.seconds(ofClock: value) != nil else {
                throw RelaySettings.InvalidSetting(description: "\(key): expected HH:MM or HH:MM:SS (UTC, up to 24:00), got \"\(value)\"")
            }
            if key == "replay.from" { from = value } else { to = value }
        }
        if let from, let to, let start = TapeFile.seconds(ofClock: from), let end = TapeFile.seconds(ofClock: to), start >= end {
            throw RelaySettings.InvalidSetting(description: "replay.from (\(from)) must come before replay.to (\(to))")
        }
        loop = try config.flag("replay.loop") ?? false
    }
}

extension SessionLimits {
    /// `limits.topicsPerMessage`, `limits.topicsPerConnection`, `limits.messagesPerSecond` over the defaults.
    mutating func read(_ config: ConfigReader) throws {
        if let value = try config.positive("limits.topicsPerMessage") { topicsPerMessage = value }
        if let value = try config.positive("limits.topicsPerConnection") { topicsPerConnection = value }
        if let value = try config.positive("limits.messagesPerSecond") { messagesPerSecond = value }
    }
}

extension RelayServerConfiguration.ConnectionLimits {
    /// `limits.connections`, `…PerAddress`, `httpConnections`, `…PerAddress`, `pushStreams`, `…PerKey`, `pending`, `…PerAddress`,
    /// `outboundBytes`, `topicsPerKey`, `topics`, `subscriptionsPerKey`, `subscriptions`,
    /// `authTimeoutSeconds` over the defaults.
    mutating func read(_ config: ConfigReader) throws {
        if let value = try config.positive("limits.connections") { total = value }
        if let value = try config.positive("limits.connectionsPerAddress") { perAddress = value }
        if let value = try config.positive("limits.httpConnections") { httpConnections = value }
        if let value = try config.positive("limits.httpConnectionsPerAddress") { httpConnectionsPerAddress = value }
        if let value = try config.positive("limits.pushStreams") { pushStreams = value }
        if let value = try config.positive("limits.pushStreamsPerKey") { pushStreamsPerKey = value }
        if let value = try config.positive("limits.pendingPerAddress") { pendingPerAddress = value }
        if let value = try config.positive("limits.pending") { pending = value }
        if let value = try config.positive("limits.outboundBytes") { outboundBytes = value }
        if let value = try config.positive("limits.topicsPerKey") { topicsPerKey = value }
        if let value = try config.positive("limits.topics") { topics = value }
        if let value = try config.positive("limits.subscriptionsPerKey") { subscriptionsPerKey = value }
        if let value = try config.positive("limits.subscriptions") { subscriptions = value }
        if let value = try config.positive("limits.authTimeoutSeconds") { authTimeout = .seconds(value) }
    }
}

extension RelaySettings.PortfolioSettings {
    /// `portfolio.*`; `nil` with `portfolio.enabled` false.
    init?(reading config: ConfigReader) throws {
        guard try config.flag("portfolio.enabled") ?? true else { return nil }
        self.init()
        if let directory = try config.text("portfolio.dataDir") { dataDirectory = directory }
        if let zone = try config.text("portfolio.timeZone") {
            guard TimeZone(identifier: zone) != nil else {
                throw RelaySettings.InvalidSetting(description: "time zone: not an IANA zone such as UTC or America/New_York: \"\(zone)\"")
            }
            timeZone = zone
        }
        if let milliseconds = try config.notNegative("portfolio.pushIntervalMs") { pushIntervalMilliseconds = milliseconds }
        if let seconds = try config.aboveZero("portfolio.staleAfterSeconds") { staleAfterSeconds = seconds }
        if let size = try config.positive("portfolio.securityCacheSize") { securityCacheSize = size }
        if let seconds = try config.aboveZero("portfolio.clientIdleSeconds") { clientIdleSeconds = seconds }
        if let loads = try config.positive("portfolio.securityLoads", atMost: 10_000) { securityLoads = loads }
        if let seconds = try config.aboveZero("portfolio.securityWaitSeconds") { securityWaitSeconds = seconds }
        if let closeHistory = try config.flag("portfolio.closeHistory") { self.closeHistory = closeHistory }
        if let accounts = try config.positive("portfolio.maxAccounts") { maxAccounts = accounts }
        if let transactions = try config.positive("portfolio.maxTransactionsPerAccount") { maxTransactionsPerAccount = transactions }
        if let updates = try config.positive("portfolio.maxUpdatesPerAccount") { maxUpdatesPerAccount = updates }
        if let symbols = try config.positive("portfolio.maxSymbols", atMost: 10_000) { maxSymbols = symbols }
    }
}

extension ClusterConfiguration {
    /// `cluster.*`; `nil` without `cluster.url`. A node without `cluster.nodeId` is named after the
    /// host and `listenPort` (or the process when the port is chosen by the system).
    init?(reading config: ConfigReader, listenPort: Int) throws {
        guard let url = try config.text("cluster.url", isSecret: true) else { return nil }
        let servers: [String]
        do { servers = try ClusterConfiguration.servers(from: url) } catch { throw RelaySettings.InvalidSetting(description: error.description) }
        let name = try config.text("cluster.name") ?? "relay"
        let node =
            try config.text("cluster.nodeId") ?? "\(ProcessInfo.processInfo.hostName)-\(listenPort == 0 ? "pid\(getpid())" : "\(listenPort)")"
        guard node.count <= 128 else { throw RelaySettings.InvalidSetting(description: "cluster node id: 1 to 128 characters") }
        self.init(servers: servers, name: name, nodeID: node)
        if let seconds = try config.number("cluster.leaseSeconds") {
            guard seconds >= 1, seconds <= 600 else {
                throw RelaySettings.InvalidSetting(description: "cluster.leaseSeconds: between 1 and 600, got \(seconds)")
            }
            leaseDuration = .milliseconds(Int64(seconds * 1000))
        }
        if let count = try config.positive("cluster.maxTopicsPerNode") { maxTopicsPerNode = count }
        if let count = try config.positive("cluster.maxTopics") { maxTopics = count }
        if let bytes = try config.megabytes("cluster.lastValueMB") { lastValueBytes = Int64(bytes) }
        let files: [(key: ConfigKey, path: WritableKeyPath<ClusterConfiguration.Security, String?>)] = [
            ("cluster.tlsCA", \.caFile), ("cluster.tlsCert", \.certificateFile), ("cluster.tlsKey", \.keyFile),
            ("cluster.credentials", \.credentialsFile), ("cluster.nkeySeed", \.nkeySeedFile),
        ]
        for (key, path) in files {
            guard let file = try config.text(key) else { continue }
            guard FileManager.default.isReadableFile(atPath: file) else { throw RelaySettings.InvalidSetting(description: "\(key): cannot read \(file)") }
            security[keyPath: path] = file
        }
        if (security.certificateFile == nil) != (security.keyFile == nil) {
            throw RelaySettings.InvalidSetting(description: "cluster.tlsCert and cluster.tlsKey go together")
        }
        if let token = try config.text("cluster.token", isSecret: true) { security.token = token }
        do { _ = try ClusterSubjects(cluster: name, market: "stocks") } catch { throw RelaySettings.InvalidSetting(description: error.description) }
    }
}
