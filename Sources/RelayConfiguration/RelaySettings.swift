import Cluster
import Configuration
import DemoFeed
import Foundation
import GapFill
import Logging
import MarketDataHub
import MarketCore
import MarketREST
import RelayServer
import SystemPackage
import Yams
import Upstream

/// Everything `relay serve` needs, resolved from flags, environment, a YAML file and defaults, in that
/// order of precedence. Value type, `Sendable`.
public struct RelaySettings: Sendable {
    /// `HOST:PORT`, e.g. `127.0.0.1:8080` or `[::1]:8080`.
    public struct Address: Sendable, Equatable, CustomStringConvertible {
        public var host: String
        public var port: Int

        public init(host: String, port: Int) {
            self.host = host
            self.port = port
        }

        /// Parses `HOST:PORT`; IPv6 hosts in brackets.
        public init?(_ text: String) {
            let text = text.trimmingCharacters(in: .whitespaces)
            guard let colon = text.lastIndex(of: ":"), let port = Int(text[text.index(after: colon)...]),
                (0...65535).contains(port)
            else { return nil }
            var host = String(text[..<colon])
            if host.hasPrefix("[") && host.hasSuffix("]") { host = String(host.dropFirst().dropLast()) }
            guard !host.isEmpty else { return nil }
            self.init(host: host, port: port)
        }

        public var description: String { host.contains(":") ? "[\(host)]:\(port)" : "\(host):\(port)" }
    }

    public var listen: Address
    /// The upstreams, one per market (``MarketUpstream``); none runs the built-in demo feed in-process,
    /// serving every market, and connects to it.
    public var upstreams: [MarketUpstream] = []
    /// The first upstream's URL (a one-market relay); setting it configures that one upstream.
    public var upstream: UpstreamConfiguration.Endpoint? {
        get { upstreams.first?.endpoint }
        set {
            upstreams = newValue.map { endpoint in
                [MarketUpstream(market: Market(rawValue: endpoint.market.lowercased()) ?? .stocks, endpoint: endpoint)]
            } ?? []
        }
    }
    /// Polygon's options cap: `Q` and `FMV` contracts per upstream connection.
    public var optionsContracts = 1_000
    /// Each market's recent events for resumes (`nil`: no history and no positions).
    public var history: HistoryLimits? = HistoryLimits()
    /// After an upstream outage, what the market did meanwhile from the REST API (`nil`: off).
    public var gapFill: GapFillSettings? = GapFillSettings()
    /// The tape: where each market's events are recorded (`nil`: not recorded). `relay serve` records by
    /// default (its settings come from ``resolve(vendors:commandLine:environment:)``); a relay whose
    /// settings are made in code records only when given one, so that embedders and tests do not share
    /// `./data/tape` (and go on from each other's runs).
    public var tape: TapeSettings?
    /// The REST gateway (`nil`: off; on by default when read from flags, environment and file).
    public var gateway: GatewaySettings?
    /// A recorded day replayed instead of the live upstreams (`nil`: live). A replay does not record.
    public var replay: ReplaySettings?
    /// Tagged sessions: how long, how far back, how many.
    public var resume = ResumeSettings()
    /// The upstream API key (required with a real upstream).
    public var upstreamKey: String?
    /// Whose protocol the upstream speaks; `nil`: known from each URL's host or path (the first vendor's
    /// otherwise).
    public var upstreamVendor: WireVendor?
    /// The vendors the relay speaks, the composition root's list (`Relay.vendors`): the settings
    /// recognise their hosts and paths and name them.
    public var vendors: [WireVendor] = []
    /// Alpaca's secret key.
    public var upstreamSecret: String?
    /// A PEM file of extra trusted CAs for a `wss://` upstream.
    public var upstreamCAFile: String?
    /// The upstream's REST API (`https://api.polygon.io`), for the portfolio's reference prices.
    public var upstreamRESTURL: String?
    /// The REST API's own key (`nil`: the upstream key, for a Polygon upstream only).
    public var upstreamRESTKey: String?
    /// The relay's own client keys, each with every right (`--client-keys`, or a plain list in the file).
    public var clientKeys: [String]
    /// Client keys with rights, from the config file's `client.keys` entries that are mappings.
    public var clientKeyRights: [ClientKey] = []
    /// Events per second of the in-process demo feed.
    public var demoRate: Double
    /// A delay before each of the demo feed's REST answers: a slow data source, to see prefetching work.
    public var demoRESTDelayMilliseconds: Int?
    public var logLevel: Logger.Level
    /// What to do with a client whose buffer of events is full.
    public var slowConsumerPolicy: SlowConsumerPolicy
    /// The events each client's buffer holds (``MarketDataHub/bufferLimitRange``; 1,000 by default).
    public var subscriberBuffer = MarketDataHub.defaultBufferLimit
    /// Whether a new subscription to a ticker topic immediately gets that topic's last event.
    public var snapshotOnSubscribe: Bool
    /// How long a wildcard stays wanted upstream after its last subscriber left (`.zero`: let go at once).
    public var wildcardLinger: Duration = .seconds(5)
    /// Bounds of the states the hub folds from increments (order books: levels per side).
    public var foldLimits = FoldLimits()
    /// The news market (Alpaca's news stream): its largest item, and whether a subscription gets each
    /// symbol's last item at once.
    public var news = NewsSettings()

    public struct NewsSettings: Sendable, Equatable {
        /// The largest news message the relay takes from the upstream (a larger one is dropped, counted,
        /// and told to the news clients) and the room each news client's unread bytes get on top of
        /// ``RelayServerConfiguration/ConnectionLimits/outboundBytes``. Other markets keep their limits.
        public var maxBytes = 4 << 20
        /// A news subscription gets each symbol's last item at once (off: Alpaca sends none).
        public var snapshot = false

        public init() {}

        /// The bounds of ``maxBytes``: at most 16 MiB, well inside what one tape block may hold (64 MiB,
        /// with what was pending beside it).
        public static let maxBytesRange = (64 << 10)...(16 << 20)
    }
    /// The portfolio sidecar: where its SQLite file lives and the zone its days are in; `nil` turns it off.
    public var portfolio: PortfolioSettings?
    /// Run as one node of a cluster on NATS; `nil` runs a single relay.
    public var cluster: ClusterConfiguration?
    /// Serve `/metrics` without a client key.
    public var metricsPublic = false
    /// Per-connection limits (the market's event types are added when the relay starts).
    public var limits = SessionLimits()
    /// Market WebSocket connections in all and per address, failed authentications per address.
    public var connectionLimits = RelayServerConfiguration.ConnectionLimits()
    /// Serve `wss://` and `https://` with this certificate and key.
    public var tls: RelayServerConfiguration.TLSFiles?

    public struct PortfolioSettings: Sendable, Equatable {
        public var dataDirectory: String
        /// An IANA zone, e.g. `America/New_York`.
        public var timeZone: String
        /// Prices older than this are `stale`.
        public var staleAfterSeconds: Double
        /// `/v1/portfolio/stream` sends at most one valuation this often.
        public var pushIntervalMilliseconds: Int
        /// Security details kept in the cache (prefetched ones included).
        public var securityCacheSize: Int
        /// A named client (`X-Relay-Client`) idle this long has its prefetches cancelled.
        public var clientIdleSeconds: Double
        /// Security details loading at once, at most (prefetches take at most half).
        public var securityLoads: Int
        /// How long a request for a security's detail waits for its load.
        public var securityWaitSeconds: Double
        /// Value past days from the upstream's daily closes (fetched over REST once per symbol and range).
        public var closeHistory: Bool
        /// What the store holds at most: accounts, transactions and value updates of one account, distinct symbols.
        public var maxAccounts = 100
        public var maxTransactionsPerAccount = 100_000
        public var maxUpdatesPerAccount = 100_000
        public var maxSymbols = 2_000

        public init(
            dataDirectory: String = "./data", timeZone: String = "UTC", staleAfterSeconds: Double = 900,
            pushIntervalMilliseconds: Int = 500,
            securityCacheSize: Int = 10, clientIdleSeconds: Double = 120, securityLoads: Int = 16, securityWaitSeconds: Double = 30,
            closeHistory: Bool = true
        ) {
            self.securityLoads = securityLoads
            self.securityWaitSeconds = securityWaitSeconds
            self.closeHistory = closeHistory
            self.securityCacheSize = securityCacheSize
            self.clientIdleSeconds = clientIdleSeconds
            self.dataDirectory = dataDirectory
            self.timeZone = timeZone
            self.staleAfterSeconds = staleAfterSeconds
            self.pushIntervalMilliseconds = pushIntervalMilliseconds
        }
    }

    /// The upstream client's timing: reconnect policy, pings, dead and handshake timeouts, size cap.
    /// Its endpoint, key and CA file are replaced by the settings above when the relay starts.
    public var upstreamTuning: UpstreamConfiguration

    public init(
        listen: Address = Address(host: "127.0.0.1", port: 8080),
        upstream: UpstreamConfiguration.Endpoint? = nil,
        upstreamKey: String? = nil,
        upstreamCAFile: String? = nil,
        clientKeys: [String] = [],
        demoRate: Double = 500,
        logLevel: Logger.Level = .info,
        slowConsumerPolicy: SlowConsumerPolicy = .drop,
        snapshotOnSubscribe: Bool = true,
        portfolio: PortfolioSettings? = nil,
        upstreamTuning: UpstreamConfiguration = RelaySettings.defaultUpstreamTuning
    ) {
        self.portfolio = portfolio
        self.listen = listen
        self.upstreamKey = upstreamKey
        self.upstreamCAFile = upstreamCAFile
        self.clientKeys = clientKeys
        self.demoRate = demoRate
        self.logLevel = logLevel
        self.slowConsumerPolicy = slowConsumerPolicy
        self.snapshotOnSubscribe = snapshotOnSubscribe
        self.upstreamTuning = upstreamTuning
        self.upstream = upstream
    }

    /// The upstream defaults (see ``ReconnectPolicy`` and ``UpstreamConfiguration``).
    public static let defaultUpstreamTuning = UpstreamConfiguration(
        endpoint: .init(secure: false, host: "127.0.0.1", port: 80, path: "/stocks"), apiKey: "", wire: .polygon)

    /// The documented environment variables and the configuration key each one sets (from
    /// ``declarations``).
    public static var environmentNames: [(variable: String, key: String)] {
        declarations.compactMap { declaration in declaration.environment.map { ($0, declaration.key) } }
    }

    /// A setting that could not be used, named so the user can fix it.
    public struct InvalidSetting: Error, Sendable, CustomStringConvertible {
        public var description: String

        /// Our modules name their own refusals this way (the composition root's start-up checks).
        package init(description: String) {
            self.description = description
        }
    }

    /// Resolves settings from `relay serve`'s arguments (read through ``declarations``):
    /// flag > environment > file (`--config` or `RELAY_CONFIG`) > default.
    public static func resolve(
        vendors: [WireVendor], commandLine arguments: [String], environment: [String: String]
    ) async throws -> RelaySettings {
        // A flag given empty, `~` or `null` is not given: the environment's or the file's value stands.
        let given = try parse(commandLine: arguments).filter { !countsAsNotGiven($0.value) }
        try namesAKey(given["client.keys"], "--client-keys")
        // Read like the environment (text, typed by the reader) under the keys' conventional names.
        var renamed: [String: String] = [:]
        for (key, value) in given { renamed[environmentStyle(key)] = value }
        let provider = EnvironmentVariablesProvider(environmentVariables: renamed, secretsSpecifier: .specific(secretNames))
        return try await resolve(
            vendors: vendors, first: provider, configFile: given["config"], clientKeysGiven: given["client.keys"] != nil,
            environment: environment)
    }

    /// A file key in the form swift-configuration's environment provider reads (`upstream.url` →
    /// `UPSTREAM_URL`).
    static func environmentStyle(_ key: String) -> String {
        key.replacingOccurrences(of: ".", with: "_").camelToSnake().uppercased()
    }

    /// The secret settings' names in that form.
    static var secretNames: Set<String> { Set(declarations.filter(\.secret).map { environmentStyle($0.key) }) }

    private static func resolve(
        vendors: [WireVendor], first: any ConfigProvider, configFile: String?, clientKeysGiven: Bool, environment: [String: String]
    ) async throws -> RelaySettings {
        // A variable set empty, `~` or `null` is not given either (`RELAY_TAPE_DIR=~` leaves the file's).
        let environment = environment.filter { !countsAsNotGiven($0.value) }
        try namesAKey(environment["RELAY_CLIENT_KEYS"], "RELAY_CLIENT_KEYS")
        let file = configFile ?? environment["RELAY_CONFIG"]
        let config = try reader(first: first, file: file, environment: environment)
        var settings = RelaySettings()
        settings.vendors = vendors
        try settings.readServing(config)
        try settings.readUpstreams(config, file: file, environment: environment)
        settings.history = try HistoryLimits(reading: config)
        if settings.history != nil { settings.resume = try ResumeSettings(reading: config) }
        settings.gapFill = try GapFillSettings(reading: config)
        settings.tape = try TapeSettings(reading: config)
        settings.gateway = try GatewaySettings(reading: config)
        settings.replay = try ReplaySettings(reading: config)
        if settings.replay != nil { settings.tape = nil }
        try settings.limits.read(config)
        try settings.connectionLimits.read(config)
        settings.portfolio = try PortfolioSettings(reading: config)
        settings.cluster = try ClusterConfiguration(reading: config, listenPort: settings.listen.port)
        if settings.replay != nil, settings.cluster != nil {
            throw InvalidSetting(description: "replay.date: a replay runs on one relay, not on a cluster node (leave out cluster.*)")
        }
        // A flag or the environment replace the file's keys; the file may also give keys with rights.
        if !clientKeysGiven, environment["RELAY_CLIENT_KEYS"] == nil, let file, let rights = try keysWithRights(inFile: file) {
            settings.clientKeys = rights.plain
            settings.clientKeyRights = rights.keyed
        } else {
            settings.clientKeys = try config.list("client.keys", isSecret: true) ?? []
        }
        try settings.checkUpstreamKeys()
        return settings
    }

    /// The settings' reader: `first` (the flags), the documented environment variables, then the file.
    private static func reader(first: any ConfigProvider, file: String?, environment: [String: String]) throws -> ConfigReader {
        var providers: [any ConfigProvider] = [first]
        // The documented variable names are renamed to the keys' conventional form (`upstream.url` is
        // read as `UPSTREAM_URL`), so only the documented names take effect.
        var renamed: [String: String] = [:]
        for (variable, key) in environmentNames {
            if let value = environment[variable] { renamed[environmentStyle(key)] = value }
        }
        providers.append(EnvironmentVariablesProvider(environmentVariables: renamed, secretsSpecifier: .specific(secretNames)))
        if let file, !file.isEmpty {
            guard FileManager.default.fileExists(atPath: file) else {
                throw InvalidSetting(description: "config file not found: \(file)")
            }
            // swift-configuration reads lists of scalars only: keys with rights (mappings under
            // client.keys) are read with Yams below, and the provider gets the file without them.
            // Read from memory: the file (with the upstream key in it) is never copied anywhere.
            let readable = try withoutKeysWithRights(file)
            do {
                let snapshot = try readable.withUnsafeBytes { bytes in
                    try YAMLSnapshot(data: RawSpan(_unsafeBytes: bytes), providerName: "file \(file)", parsingOptions: .default)
                }
                providers.append(SnapshotProvider(fixed: snapshot))
            } catch {
                throw InvalidSetting(description: "config file \(file) could not be read: \(withoutItsText(error))")
            }
        }
        return ConfigReader(providers: providers)
    }

    /// A YAML error's place and problem without the file's line it quotes: that line may hold a key.
    static func withoutItsText(_ error: any Error) -> String {
        guard let error = error as? YamlError else { return "\(error)" }
        switch error {
        case .scanner(let context, let problem, let mark, _), .parser(let context, let problem, let mark, _),
            .composer(let context, let problem, let mark, _):
            return "line \(mark.line), column \(mark.column): \(context.map { "\($0.text): " } ?? "")\(problem)"
        case .reader(let problem, let offset, _, _):
            return "\(problem) at byte \(offset.map(String.init) ?? "?")"
        default:
            return "\(error)"
        }
    }

    /// What the server itself is told: where it listens, how it logs, treats subscribers and serves
    /// TLS, and the demo feed's pace.
    private mutating func readServing(_ config: ConfigReader) throws {
        if let listen = try config.text("listen") {
            guard let address = Address(listen) else {
                throw InvalidSetting(description: "listen: expected HOST:PORT, got \"\(listen)\"")
            }
            self.listen = address
        }
        if let rate = try config.aboveZero("demo.rate", atMost: 10_000_000) { demoRate = rate }
        if let milliseconds = try config.notNegative("demo.restDelayMs") { demoRESTDelayMilliseconds = milliseconds }
        if let level = try config.text("log.level") {
            guard let parsed = Logger.Level(rawValue: level.lowercased()) else {
                throw InvalidSetting(
                    description: "log level: one of trace, debug, info, notice, warning, error, critical; got \"\(level)\"")
            }
            logLevel = parsed
        }
        if let policy = try config.text("subscribers.slowConsumer") {
            guard let parsed = SlowConsumerPolicy(rawValue: policy.lowercased()) else {
                throw InvalidSetting(description: "slow consumer policy: drop or disconnect, got \"\(policy)\"")
            }
            slowConsumerPolicy = parsed
        }
        if let events = try config.wholeNumber("subscribers.buffer") {
            subscriberBuffer = try Self.bufferLimit(events, of: "subscribers.buffer")
        }
        snapshotOnSubscribe = try config.flag("subscribers.snapshotOnSubscribe") ?? true
        if let milliseconds = try config.notNegative("subscribers.wildcardLingerMs", atMost: 600_000) { wildcardLinger = .milliseconds(milliseconds) }
        if let bytes = try config.positive("news.maxBytes") {
            guard NewsSettings.maxBytesRange.contains(bytes) else {
                throw InvalidSetting(
                    description: "news.maxBytes: \(NewsSettings.maxBytesRange.lowerBound) to \(NewsSettings.maxBytesRange.upperBound) bytes, got \(bytes)")
            }
            news.maxBytes = bytes
        }
        news.snapshot = try config.flag("news.snapshot") ?? false
        // A whole book must fit one cluster message (64 KiB: about 1,400 levels a side).
        if let levels = try config.positive("books.levels", atMost: 1000) { foldLimits = FoldLimits(bookLevels: levels) }
        metricsPublic = try config.flag("metrics.public") ?? false
        switch (try config.text("tls.cert"), try config.text("tls.key")) {
        case (nil, nil):
            break
        case (let certificate?, let key?):
            for (what, path) in [("certificate", certificate), ("key", key)] where !FileManager.default.isReadableFile(atPath: path) {
                throw InvalidSetting(description: "TLS \(what) file not readable: \(path)")
            }
            tls = .init(certificatePath: certificate, privateKeyPath: key)
        default:
            throw InvalidSetting(description: "TLS needs both a certificate and its key: --tls-cert PEM --tls-key PEM")
        }
    }

    /// Every market's upstream (URLs, then markets on a host, then the file's list: ``MarketUpstream``),
    /// whose protocol it speaks, its keys, its REST API and the client's tuning.
    private mutating func readUpstreams(_ config: ConfigReader, file: String?, environment: [String: String]) throws {
        var places: [[MarketUpstream]] = []
        if let urls = try config.list("upstream.url") {
            var listed: [MarketUpstream] = []
            for url in urls { try listed.append(MarketUpstream(url: url, vendors: vendors)) }
            places.append(listed)
        }
        if let markets = try config.list("upstream.markets")?.joined(separator: ",") {
            let host = try config.text("upstream.host") ?? MarketUpstream.defaultHost
            guard !host.contains("/") else {
                throw InvalidSetting(description: "upstream host: a host name such as socket.massive.com, got \"\(host)\"")
            }
            places.append(try MarketUpstream.markets(markets, host: host, vendors: vendors))
        }
        if let file, let listed = try MarketUpstream.list(inFile: file, environment: environment, vendors: vendors) {
            places.append(listed)
        }
        upstreams = try MarketUpstream.merge(places)
        if let contracts = try config.positive("limits.optionsContracts") { optionsContracts = contracts }
        if let vendor = try config.text("upstream.vendor") {
            guard let known = vendors.named(vendor) else {
                throw InvalidSetting(
                    description: "upstream.vendor: \"\(vendor)\" is not a vendor (one of \(vendors.map(\.name).joined(separator: ", ")))")
            }
            upstreamVendor = known
        }
        upstreamKey = try config.text("upstream.key", isSecret: true)
        upstreamSecret = try config.text("upstream.secret", isSecret: true)
        // An upstream signing in with a key id and a secret (Alpaca's) takes Alpaca's own variable when
        // no key was given otherwise.
        let withSecret = upstreamVendor?.signsInWithSecret == true || upstreams.contains { vendor(of: $0)?.signsInWithSecret == true }
        if withSecret, upstreamKey == nil { upstreamKey = try config.text("upstream.keyId", isSecret: true) }
        upstreamCAFile = try config.text("upstream.caFile")
        if let milliseconds = try config.notNegative("bars.graceMs", atMost: 60_000) { upstreamTuning.barGrace = .milliseconds(milliseconds) }
        if let seconds = try config.notNegative("upstream.silentAfterSeconds") {
            upstreamTuning.silentAfter = seconds == 0 ? nil : .seconds(seconds)
        }
        upstreamRESTKey = try config.text("upstream.restKey", isSecret: true)
        if let rest = try config.text("upstream.restURL") {
            guard let url = URL(string: rest), url.scheme == "http" || url.scheme == "https", let host = url.host, !host.isEmpty else {
                throw InvalidSetting(description: "rest URL: expected http(s)://host, got \"\(rest)\"")
            }
            // The upstream key travels with every REST request: in the clear only to this machine.
            guard url.scheme == "https" || ClientAuthentication.isLoopback(host) else {
                throw InvalidSetting(
                    description: "rest URL: http:// would send the upstream key in the clear to \(host); use https:// (plain http only to loopback)")
            }
            upstreamRESTURL = rest
        }
    }

    /// Every upstream has its key (and an Alpaca one its secret), from wherever it may come.
    private func checkUpstreamKeys() throws {
        if (upstreamKey ?? "").isEmpty, let keyless = upstreams.first(where: { ($0.apiKey ?? "").isEmpty }) {
            throw InvalidSetting(
                description: vendor(of: keyless)?.signsInWithSecret == true
                    ? "the \(keyless.market) upstream (Alpaca) needs its key id: APCA_API_KEY_ID, --upstream-key or upstream.key in the config file"
                    : "the \(keyless.market) upstream needs its API key: --upstream-key, POLYGON_API_KEY or upstream.key in the config file "
                        + "(every market's default), or key/keyEnv in its upstreams entry")
        }
        if (upstreamSecret ?? "").isEmpty, let alpaca = upstreams.first(where: { vendor(of: $0)?.signsInWithSecret == true }) {
            throw InvalidSetting(
                description: "the \(alpaca.market) upstream (Alpaca) needs its secret key: APCA_API_SECRET_KEY, --upstream-secret or upstream.secret in the config file")
        }
    }

    /// Whose protocol an upstream speaks: the setting, else the vendor owning its host, else the one
    /// whose paths name a market (Alpaca's feed paths), else the first of ``vendors`` (Polygon's); `nil`
    /// only when no vendors are listed.
    public func vendor(of upstream: MarketUpstream) -> WireVendor? {
        upstreamVendor ?? vendors.speaking(host: upstream.endpoint.host, path: upstream.endpoint.path)
    }

    /// A client buffer's size in events, within ``MarketDataHub/bufferLimitRange`` (`setting` names it in the error).
    static func bufferLimit(_ events: Int, of setting: String) throws(InvalidSetting) -> Int {
        let range = MarketDataHub.bufferLimitRange
        guard range.contains(events) else {
            throw InvalidSetting(description: "\(setting): \(range.lowerBound) to \(range.upperBound) events, got \(events)")
        }
        return events
    }

    /// `client.keys` of a YAML file when it holds mappings (keys with rights), and the plain strings
    /// beside them; `nil` when it holds none (then swift-configuration reads the plain list).
    ///
    /// ```yaml
    /// client:
    ///   keys:
    ///     - {name: dashboard, key: "sha256:9f86d0…", topics: ["Q.*", "T.AAPL"], maxConnections: 5, portfolio: read}
    ///     - plain-full-rights-key
    /// ```
    static func keysWithRights(inFile path: String) throws(InvalidSetting) -> (plain: [String], keyed: [ClientKey])? {
        guard let text = try? String(contentsOfFile: path, encoding: .utf8),
            let document = try? Yams.load(yaml: text) as? [String: Any],
            let client = document["client"] as? [String: Any], let entries = client["keys"] as? [Any],
            entries.contains(where: { $0 is [String: Any] })
        else { return nil }
        var plain: [String] = []
        var keyed: [ClientKey] = []
        for (index, entry) in entries.enumerated() {
            if let key = entry as? String {
                plain.append(key)
                continue
            }
            guard let fields = entry as? [String: Any] else {
                throw InvalidSetting(description: "client.keys[\(index)]: a key string or a mapping with name and key")
            }
            let known: Set<String> = ["name", "key", "topics", "markets", "maxConnections", "portfolio", "conflate", "rest", "restRate", "timestamps", "buffer"]
            if let unknown = fields.keys.first(where: { !known.contains($0) }) {
                throw InvalidSetting(description: "client.keys[\(index)]: unknown field \(unknown) (one of \(known.sorted().joined(separator: ", ")))")
            }
            // The key as written, a string only: YAML reads `key:` or `key: ~` as null and `key: 0123` as a
            // number, whose text ("<null>", "83") would be a key nobody meant.
            guard let name = fields["name"] as? String, let secret = fields["key"] as? String else {
                throw InvalidSetting(description: "client.keys[\(index)]: needs name and key, the key a string (quote one of digits only)")
            }
            var topics: [String]?
            if let raw = fields["topics"] {
                guard let list = raw as? [Any] else { throw InvalidSetting(description: "client key \(name): topics is a list") }
                topics = list.map { "\($0)" }
            }
            var markets: [String]?
            if let raw = fields["markets"] {
                guard let list = raw as? [Any] else { throw InvalidSetting(description: "client key \(name): markets is a list") }
                markets = list.map { "\($0)" }
            }
            var maxConnections: Int?
            if let raw = fields["maxConnections"] {
                guard let value = raw as? Int else { throw InvalidSetting(description: "client key \(name): maxConnections is a number") }
                maxConnections = value
            }
            var portfolio = ClientKey.PortfolioRight.write
            if let raw = fields["portfolio"] {
                guard let value = (raw as? String).flatMap(ClientKey.PortfolioRight.init(rawValue:)) else {
                    throw InvalidSetting(description: "client key \(name): portfolio is one of none, read, write")
                }
                portfolio = value
            }
            var conflation = KeyConflation.off
            if let raw = fields["conflate"] {
                guard let value = KeyConflation(parsing: "\(raw)") else {
                    throw InvalidSetting(description: "client key \(name): conflate is off, lagging, or an interval such as 250ms")
                }
                conflation = value
            }
            do {
                var key = try ClientKey(
                    name: name, secret: secret, topics: topics, markets: markets, maxConnections: maxConnections, portfolio: portfolio,
                    conflation: conflation)
                if let raw = fields["rest"] {
                    guard let value = raw as? Bool else { throw InvalidSetting(description: "client key \(name): rest is true or false") }
                    key.rest = value
                }
                if let raw = fields["timestamps"] {
                    guard let value = raw as? Bool else { throw InvalidSetting(description: "client key \(name): timestamps is true or false") }
                    key.timestamps = value
                }
                if let raw = fields["buffer"] {
                    guard let events = raw as? Int else { throw InvalidSetting(description: "client key \(name): buffer is a number of events, got \(raw)") }
                    key.buffer = try Self.bufferLimit(events, of: "client key \(name): buffer")
                }
                if let raw = fields["restRate"] {
                    guard let rate = RESTRate(parsing: "\(raw)") else {
                        throw InvalidSetting(description: "client key \(name): restRate is a rate such as 60/min or 5/s, got \(raw)")
                    }
                    key.restRate = rate
                }
                keyed.append(key)
            } catch let error as InvalidSetting {
                throw error
            } catch {
                throw InvalidSetting(description: "\(error)")
            }
        }
        let names = keyed.map(\.name)
        if Set(names).count != names.count { throw InvalidSetting(description: "client.keys: every name must be different") }
        return (plain, keyed)
    }

    /// The file's bytes, without `client.keys` when that list holds mappings (in memory; nothing is written).
    static func withoutKeysWithRights(_ file: String) throws(InvalidSetting) -> [UInt8] {
        guard let text = try? String(contentsOfFile: file, encoding: .utf8) else {
            throw InvalidSetting(description: "config file \(file) could not be read")
        }
        // The `upstreams:` list of mappings is read by MarketUpstream; keys with rights by keysWithRights.
        guard var document = (try? Yams.load(yaml: text)) as? [String: Any] else { return Array(text.utf8) }
        let upstreams = document.removeValue(forKey: "upstreams") != nil
        var keysRemoved = false
        if var client = document["client"] as? [String: Any], let entries = client["keys"] as? [Any],
            entries.contains(where: { $0 is [String: Any] })
        {
            client["keys"] = nil
            document["client"] = client
            keysRemoved = true
        }
        guard upstreams || keysRemoved else { return Array(text.utf8) }
        do {
            return Array(try Yams.dump(object: document).utf8)
        } catch {
            throw InvalidSetting(description: "config file \(file) could not be read: \(error)")
        }
    }

    /// Client keys given (not empty, `~` or `null`) that name none (`,`: a template's unset variables)
    /// are refused: they would stand for the file's keys, and without them a loopback relay takes any.
    private static func namesAKey(_ keys: String?, _ source: String) throws(InvalidSetting) {
        guard let keys, splitList(keys).allSatisfy(countsAsNotGiven) else { return }
        throw InvalidSetting(description: "\(source): names no key (keys separated by commas); leave it out to use the file's keys")
    }

    static func splitList(_ text: String) -> [String] {
        text.split(separator: ",").map { $0.trimmingCharacters(in: .whitespaces) }.filter { !$0.isEmpty }
    }
}

extension String {
    /// `caFile` → `ca_file`, the way swift-configuration names environment variables.
    func camelToSnake() -> String {
        var out = ""
        for character in self {
            if character.isUppercase, let last = out.last, last.isLowercase { out.append("_") }
            out.append(character)
        }
        return out
    }
}

/// A configuration provider over one snapshot that never changes (the config file, read once from
/// memory). `Sendable`: the snapshot is.
struct SnapshotProvider<Snapshot: ConfigSnapshot>: ConfigProvider {
    let fixed: Snapshot

    var providerName: String { fixed.providerName }

    func value(forKey key: AbsoluteConfigKey, type: ConfigType) throws -> LookupResult {
        try fixed.value(forKey: key, type: type)
    }

    nonisolated(nonsending) func fetchValue(forKey key: AbsoluteConfigKey, type: ConfigType) async throws -> LookupResult {
        try value(forKey: key, type: type)
    }

    nonisolated(nonsending) func watchValue<Return: ~Copyable>(
        forKey key: AbsoluteConfigKey, type: ConfigType,
        updatesHandler: nonisolated(nonsending) (_ updates: ConfigUpdatesAsyncSequence<Result<LookupResult, any Error>, Never>) async throws -> Return
    ) async throws -> Return {
        try await watchValueFromValue(forKey: key, type: type, updatesHandler: updatesHandler)
    }

    func snapshot() -> any ConfigSnapshot { fixed }

    nonisolated(nonsending) func watchSnapshot<Return: ~Copyable>(
        updatesHandler: nonisolated(nonsending) (_ updates: ConfigUpdatesAsyncSequence<any ConfigSnapshot, Never>) async throws -> Return
    ) async throws -> Return {
        try await watchSnapshotFromSnapshot(updatesHandler: updatesHandler)
    }
}
