import Foundation
import RelayServer
import MarketCore
import RelayComposition
import Testing
import Upstream

@testable import RelayConfiguration

/// A configuration file in the temporary directory, for one test.
func writeTemporaryConfig(_ text: String) throws -> String {
    let path = FileManager.default.temporaryDirectory.appendingPathComponent("relay-\(UUID().uuidString).yaml").path
    try text.write(toFile: path, atomically: true, encoding: .utf8)
    return path
}

@Suite("Configuration precedence")
struct SettingsTests {
    func writeConfig(_ text: String) throws -> String { try writeTemporaryConfig(text) }

    @Test func defaultsServeTheDemoFeedOnLoopback8080() async throws {
        let settings = try await RelaySettings.resolve(vendors: Relay.vendors, commandLine: [], environment: [:])
        #expect(settings.listen == .init(host: "127.0.0.1", port: 8080))
        #expect(settings.upstream == nil)
        #expect(settings.clientKeys.isEmpty)
    }

    @Test func flagBeatsEnvironmentBeatsFileBeatsDefault() async throws {
        let file = try writeConfig(
            """
            listen: 127.0.0.1:7000
            upstream:
              url: wss://file.example/stocks
              key: file-key
            client:
              keys: [file-a, file-b]
            demo:
              rate: 123
            """)
        defer { try? FileManager.default.removeItem(atPath: file) }
        let settings = try await RelaySettings.resolve(
            vendors: Relay.vendors,
            commandLine: ["--listen", "127.0.0.1:9000", "--config", file],
            environment: ["RELAY_LISTEN": "127.0.0.1:8000", "RELAY_UPSTREAM": "wss://env.example:81/crypto"])
        #expect(settings.listen.port == 9000, "flag over environment")
        #expect(settings.upstream?.description == "wss://env.example:81/crypto", "environment over file")
        #expect(settings.upstreamKey == "file-key", "file over default")
        #expect(settings.clientKeys == ["file-a", "file-b"])
        #expect(settings.demoRate == 123)
        #expect(settings.upstream?.market == "crypto")
    }

    @Test func documentedEnvironmentVariablesAreRead() async throws {
        let settings = try await RelaySettings.resolve(
            vendors: Relay.vendors,
            commandLine: [],
            environment: [
                "RELAY_UPSTREAM": "wss://socket.polygon.io/stocks", "POLYGON_API_KEY": "pk",
                "RELAY_CLIENT_KEYS": "a, b", "RELAY_LISTEN": "[::1]:8181",
            ])
        #expect(settings.upstream?.secure == true)
        #expect(settings.upstream?.port == 443)
        #expect(settings.upstreamKey == "pk")
        #expect(settings.clientKeys == ["a", "b"])
        #expect(settings.listen == .init(host: "::1", port: 8181))
    }

    @Test func slowConsumerPolicyAndSnapshotsAreConfigurable() async throws {
        let defaults = try await RelaySettings.resolve(vendors: Relay.vendors, commandLine: [], environment: [:])
        #expect(defaults.slowConsumerPolicy == .drop)
        #expect(defaults.snapshotOnSubscribe)
        let fromEnvironment = try await RelaySettings.resolve(
            vendors: Relay.vendors,
            commandLine: [], environment: ["RELAY_SLOW_CONSUMER": "disconnect", "RELAY_SNAPSHOT_ON_SUBSCRIBE": "false"])
        #expect(fromEnvironment.slowConsumerPolicy == .disconnect)
        #expect(!fromEnvironment.snapshotOnSubscribe)
        let fromFlags = try await RelaySettings.resolve(
            vendors: Relay.vendors,
            commandLine: ["--slow-consumer", "drop"], environment: ["RELAY_SLOW_CONSUMER": "disconnect"])
        #expect(fromFlags.slowConsumerPolicy == .drop)
        #expect(fromFlags.snapshotOnSubscribe)
    }

    @Test func theSubscribersBufferIsConfigurableWithinItsRange() async throws {
        #expect(try await RelaySettings.resolve(vendors: Relay.vendors, commandLine: [], environment: [:]).subscriberBuffer == 1000)
        let fromEnvironment = try await RelaySettings.resolve(
            vendors: Relay.vendors, commandLine: [], environment: ["RELAY_SUBSCRIBER_BUFFER": "20000"])
        #expect(fromEnvironment.subscriberBuffer == 20000)
        let fromFlag = try await RelaySettings.resolve(
            vendors: Relay.vendors, commandLine: ["--subscriber-buffer", "5000"], environment: ["RELAY_SUBSCRIBER_BUFFER": "20000"])
        #expect(fromFlag.subscriberBuffer == 5000)
        let file = try writeConfig("subscribers:\n  buffer: 7000\n")
        defer { try? FileManager.default.removeItem(atPath: file) }
        #expect(try await RelaySettings.resolve(vendors: Relay.vendors, commandLine: ["--config", file], environment: [:]).subscriberBuffer == 7000)
    }

    /// swift-configuration's typed reads answer `nil` for text they cannot convert, which would quietly
    /// mean the default: every number and every switch refuses such text instead, naming its key,
    /// whether it comes from the environment or the file.
    /// What makes a group's keys read at all: a cluster, a replay.
    static let needs = ["cluster.": ["RELAY_CLUSTER": "nats://127.0.0.1:4222"], "replay.": ["RELAY_REPLAY_DATE": "last"]]

    /// The settings resolved with `declaration` given `value` from its environment variable, or from
    /// the file when it has none (`a.b: value` as `a:\n  b: value`), beside what its group needs.
    static func resolve(_ declaration: SettingDeclaration, given value: String) async throws -> RelaySettings {
        var environment = needs.first { declaration.key.hasPrefix($0.key) }?.value ?? [:]
        var arguments: [String] = []
        var file: String?
        if let variable = declaration.environment {
            environment[variable] = value
        } else {
            let parts = declaration.key.split(separator: ".")
            let yaml = parts.enumerated().map { String(repeating: "  ", count: $0.offset) + $0.element + ":" }.joined(separator: "\n") + " \(value)\n"
            file = try writeTemporaryConfig(yaml)
            arguments = ["--config", file ?? ""]
        }
        defer { if let file { try? FileManager.default.removeItem(atPath: file) } }
        return try await RelaySettings.resolve(vendors: Relay.vendors, commandLine: arguments, environment: environment)
    }

    /// Each of `declarations` given `value` is refused, naming its key and showing `shown`.
    static func expectEachRefuses(_ declarations: [SettingDeclaration], _ value: String, showing shown: String) async throws {
        for declaration in declarations {
            do {
                _ = try await resolve(declaration, given: value)
                Issue.record("\(declaration.key) = \(value) was taken")
            } catch let error as RelaySettings.InvalidSetting {
                #expect(error.description.contains(declaration.key), "\(error.description)")
                #expect(error.description.contains(shown), "the refusal shows what was given: \(error.description)")
            }
        }
    }

    /// The settings whose default is a number.
    static var numbers: [SettingDeclaration] { RelaySettings.declarations.filter { Double($0.defaultValue) != nil } }

    @Test func everyNumberAndSwitchRefusesTextThatIsNeither() async throws {
        let typed = RelaySettings.declarations.filter { Double($0.defaultValue) != nil || ["true", "false"].contains($0.defaultValue) }
        #expect(typed.count >= 50, "the numbers and switches found by their defaults: \(typed.map(\.key))")
        try await Self.expectEachRefuses(typed, "lots", showing: "lots")
        // The environment's other spellings of a switch, and a number with a fraction where one is allowed.
        let spelled = try await RelaySettings.resolve(
            vendors: Relay.vendors, commandLine: [], environment: ["RELAY_HISTORY": "no", "RELAY_METRICS_PUBLIC": "1", "RELAY_DEMO_RATE": "2.5"])
        #expect(spelled.history == nil && spelled.metricsPublic && spelled.demoRate == 2.5)
        await #expect(throws: RelaySettings.InvalidSetting.self, "a whole number has no fraction") {
            try await RelaySettings.resolve(vendors: Relay.vendors, commandLine: [], environment: ["RELAY_LIMIT_TOPICS": "2.5"])
        }
        let file = try writeConfig("history:\n  eventsPerTopic: many\n")
        defer { try? FileManager.default.removeItem(atPath: file) }
        await #expect(throws: RelaySettings.InvalidSetting.self, "from the file as from the environment") {
            try await RelaySettings.resolve(vendors: Relay.vendors, commandLine: ["--config", file], environment: ["RELAY_LIMIT_TOPICS": "7"])
        }
        // A file's quoted values are read as what they say; its null is not given.
        let quoted = try writeConfig("subscribers:\n  buffer: \"5000\"\nhistory:\n  enabled: \"false\"\ntape:\n  maxGB: ~\ndemo:\n  rate: \"12.5\"\n")
        defer { try? FileManager.default.removeItem(atPath: quoted) }
        let fromQuotes = try await RelaySettings.resolve(vendors: Relay.vendors, commandLine: ["--config", quoted], environment: [:])
        #expect(fromQuotes.subscriberBuffer == 5000 && fromQuotes.history == nil && fromQuotes.demoRate == 12.5)
        #expect(fromQuotes.tape?.retentionBytes == TapeSettings().retentionBytes)
        let listed = try writeConfig("subscribers:\n  buffer: [5000]\n")
        defer { try? FileManager.default.removeItem(atPath: listed) }
        await #expect(throws: RelaySettings.InvalidSetting.self, "a list where a number belongs") {
            try await RelaySettings.resolve(vendors: Relay.vendors, commandLine: ["--config", listed], environment: [:])
        }
        // Numbers that are not finite, or too large to be made into what they configure, are refused too.
        for (variable, value) in [
            ("RELAY_TAPE_MAX_GB", "inf"), ("RELAY_TAPE_MAX_GB", "1e12"), ("RELAY_DEMO_RATE", "1e400"), ("RELAY_DEMO_RATE", "nan"),
            ("RELAY_LIMIT_TOPICS", "99999999999999999999"), ("RELAY_TAPE_RETENTION_DAYS", "1000000"), ("RELAY_TAPE_MAX_GB", "1e-10"),
            ("RELAY_DEMO_RATE", "0"), ("RELAY_DEMO_RATE", "20000000"), ("RELAY_DEMO_REST_DELAY_MS", "-1"),
        ] {
            await #expect(throws: RelaySettings.InvalidSetting.self, "\(variable)=\(value)") {
                try await RelaySettings.resolve(vendors: Relay.vendors, commandLine: [], environment: [variable: value])
            }
        }
    }

    /// Every number has an upper bound: 10^12 (a thousand times the most any of them takes) is refused
    /// for each, so nothing made of one (bytes from megabytes, nanoseconds from seconds) can wrap or trap.
    @Test func everyNumberHasAnUpperBound() async throws {
        #expect(Self.numbers.count >= 45, "the numbers found by their defaults: \(Self.numbers.map(\.key))")
        try await Self.expectEachRefuses(Self.numbers, "1000000000000", showing: "1000000000000")
        // The largest whole number each group's own bound allows is taken, and made into what it configures.
        let largest = try await RelaySettings.resolve(
            vendors: Relay.vendors, commandLine: [],
            environment: ["RELAY_HISTORY_MEMORY_MB": "1048576", "RELAY_REST_CACHE_MB": "1048576", "RELAY_TAPE_REPLICAS": "5", "RELAY_LIMIT_TOPICS": "1000000000"])
        #expect(largest.history?.memoryBytes == 1 << 40 && largest.gateway?.cacheBytes == 1 << 40)
        #expect(largest.tape?.replicas == 5 && largest.connectionLimits.topics == 1_000_000_000)
        for (variable, value) in [("RELAY_HISTORY_MEMORY_MB", "1048577"), ("RELAY_TAPE_REPLICAS", "6"), ("RELAY_LIMIT_TOPICS", "1000000001")] {
            await #expect(throws: RelaySettings.InvalidSetting.self, "\(variable)=\(value)") {
                try await RelaySettings.resolve(vendors: Relay.vendors, commandLine: [], environment: [variable: value])
            }
        }
        // Digits past what a whole number holds are said to be too large, not "not a whole number".
        for value in ["99999999999999999999", "-99999999999999999999"] {
            let error = await #expect(throws: RelaySettings.InvalidSetting.self) {
                try await RelaySettings.resolve(vendors: Relay.vendors, commandLine: [], environment: ["RELAY_LIMIT_TOPICS": value])
            }
            let side = value.hasPrefix("-") ? "below" : "past"
            #expect(error?.description == "limits.topics: a whole number \(side) any bound of a setting, got \(value)")
        }
    }

    /// A text setting given as `~`, `null` or blanks counts as not given, as numbers and switches do:
    /// every declared setting given so resolves as if it were left out (`tape.dir: ~` is not a folder
    /// named `~`), and a list where one text belongs is refused.
    @Test func everySettingGivenAsNullIsNotGiven() async throws {
        for declaration in RelaySettings.declarations {
            var environment = Self.needs.first { declaration.key.hasPrefix($0.key) }?.value ?? [:]
            if let variable = declaration.environment { environment[variable] = nil }
            let left = try await RelaySettings.resolve(vendors: Relay.vendors, commandLine: [], environment: environment)
            for value in ["~", "null", "' '"] where declaration.environment != nil || value != "' '" {
                do {
                    let given = try await Self.resolve(declaration, given: value == "' '" ? " " : value)
                    #expect(String(reflecting: given) == String(reflecting: left), "\(declaration.key) = \(value) was taken as a value")
                } catch {
                    Issue.record("\(declaration.key) = \(value) was refused, not left out: \(error)")
                }
            }
        }
        let file = try writeConfig("tape:\n  dir: [a, b]\n")
        defer { try? FileManager.default.removeItem(atPath: file) }
        await #expect(throws: RelaySettings.InvalidSetting.self, "a list where a folder belongs") {
            try await RelaySettings.resolve(vendors: Relay.vendors, commandLine: ["--config", file], environment: [:])
        }
        // Null from a flag or the environment leaves the file's value standing, as an absent one does:
        // the file's folder, and the file's keys with their rights (not no keys at all).
        let withKeys = try writeConfig("tape:\n  dir: /tmp/relay-file-tape\nclient:\n  keys:\n    - {name: robot, key: robot-secret}\n    - plain-key\n")
        defer { try? FileManager.default.removeItem(atPath: withKeys) }
        for (arguments, environment) in [
            (["--config", withKeys], ["RELAY_TAPE_DIR": "~", "RELAY_CLIENT_KEYS": "null"]),
            (["--config", withKeys, "--tape-dir", "~", "--client-keys", " "], [:]),
        ] {
            let standing = try await RelaySettings.resolve(vendors: Relay.vendors, commandLine: arguments, environment: environment)
            #expect(standing.tape?.directory == "/tmp/relay-file-tape", "\(arguments) \(environment)")
            #expect(standing.clientKeys == ["plain-key"] && standing.clientKeyRights.map(\.name) == ["robot"], "\(arguments) \(environment)")
        }
        // A file YAML cannot read is told by line and problem, not with its text (a key may be in it).
        let unreadable = try writeConfig("upstream:\n  key: @s3cret-upstream-key\n")
        defer { try? FileManager.default.removeItem(atPath: unreadable) }
        do {
            _ = try await RelaySettings.resolve(vendors: Relay.vendors, commandLine: ["--config", unreadable], environment: [:])
            Issue.record("a file YAML cannot read is refused")
        } catch {
            #expect(!"\(error)".contains("s3cret") && "\(error)".contains("line 2"), "\(error)")
        }
        // Given, yet naming no key (a template's unset variables): refused, not taken as no keys.
        for (arguments, environment) in [(["--config", withKeys], ["RELAY_CLIENT_KEYS": ","]), (["--config", withKeys, "--client-keys", " , null"], [:])] {
            await #expect(throws: RelaySettings.InvalidSetting.self, "\(arguments) \(environment)") {
                try await RelaySettings.resolve(vendors: Relay.vendors, commandLine: arguments, environment: environment)
            }
        }
        let markets = try writeConfig("replay:\n  date: last\n  markets: [stocks, crypto]\n")
        defer { try? FileManager.default.removeItem(atPath: markets) }
        let replay = try await RelaySettings.resolve(vendors: Relay.vendors, commandLine: ["--config", markets], environment: [:])
        #expect(replay.replay?.markets == [.stocks, .crypto], "replay.markets takes a list in the file")
    }

    @Test func closeHistoryIsOnByDefaultAndCanBeTurnedOff() async throws {
        #expect(try await RelaySettings.resolve(vendors: Relay.vendors, commandLine: [], environment: [:]).portfolio?.closeHistory == true)
        let fromEnvironment = try await RelaySettings.resolve(vendors: Relay.vendors, commandLine: [], environment: ["RELAY_CLOSE_HISTORY": "false"])
        #expect(fromEnvironment.portfolio?.closeHistory == false)
        let fromFlag = try await RelaySettings.resolve(vendors: Relay.vendors, commandLine: ["--no-close-history"], environment: ["RELAY_CLOSE_HISTORY": "true"])
        #expect(fromFlag.portfolio?.closeHistory == false)
    }

    @Test func clientKeysFlagIsACommaSeparatedList() async throws {
        let settings = try await RelaySettings.resolve(vendors: Relay.vendors, commandLine: ["--client-keys", "k1,k2 , k3"], environment: ["RELAY_CLIENT_KEYS": "env"])
        #expect(settings.clientKeys == ["k1", "k2", "k3"])
    }

    @Test(arguments: [
        (["--listen", "nonsense"], "listen"),
        (["--upstream", "http://x/stocks", "--upstream-key", "k"], "upstream"),
        (["--upstream", "wss://x/stocks"], "API key"),
        (["--log-level", "loud"], "log level"),
        (["--config", "/nonexistent/relay.yaml"], "config file"),
        (["--slow-consumer", "sometimes"], "slow consumer"),
        (["--subscriber-buffer", "999"], "subscribers.buffer: 1000 to 1000000 events"),
        (["--subscriber-buffer", "2000000"], "subscribers.buffer"),
        (["--subscriber-buffer", "20k"], "subscribers.buffer: a whole number, got \"20k\""),
    ])
    func badSettingsNameTheirProblem(arguments: [String], mentions: String) async throws {
        do {
            _ = try await RelaySettings.resolve(vendors: Relay.vendors, commandLine: arguments, environment: [:])
            Issue.record("expected an error mentioning \(mentions)")
        } catch {
            #expect("\(error)".contains(mentions))
        }
    }

    @Test func theSampleConfigFileLoads() async throws {
        let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
        let settings = try await RelaySettings.resolve(
            vendors: Relay.vendors,
            commandLine: ["--config", root.appendingPathComponent("config/relay.yaml").path], environment: [:])
        #expect(settings.listen.port == 8080)
        #expect(settings.upstream == nil, "the sample keeps the demo feed as default")
    }

    @Test func gapFillSettingsFollowTheSamePrecedence() async throws {
        let file = try writeConfig(
            """
            gapFill:
              maxTopics: 7
              requestsPerSecond: 50
            """)
        let fromFile = try await RelaySettings.resolve(
            vendors: Relay.vendors,
            commandLine: ["--config", file], environment: ["RELAY_GAP_FILL_MAX_TOPICS": "9"])
        #expect(fromFile.gapFill?.maxTopics == 9, "the environment over the file")
        #expect(fromFile.gapFill?.requestsPerSecond == 50)
        #expect(fromFile.gapFill?.maxWindow == .seconds(900))
        let off = try await RelaySettings.resolve(vendors: Relay.vendors, commandLine: ["--config", file, "--no-gap-fill"], environment: [:])
        #expect(off.gapFill == nil)
        await #expect(throws: (any Error).self) {
            _ = try await RelaySettings.resolve(vendors: Relay.vendors, commandLine: [], environment: ["RELAY_GAP_FILL_MAX_TOPICS": "0"])
        }
    }

    @Test func clusterSettingsFollowTheSamePrecedence() async throws {
        let file = try writeConfig(
            """
            cluster:
              url: nats://file:4222
              name: filecluster
              nodeId: file-node
              leaseSeconds: 8
            """)
        defer { try? FileManager.default.removeItem(atPath: file) }
        let settings = try await RelaySettings.resolve(
            vendors: Relay.vendors,
            commandLine: ["--config", file, "--cluster", "nats://a:4222,nats://b:4223", "--node-id", "flag-node"],
            environment: ["RELAY_CLUSTER_NAME": "envcluster", "RELAY_NODE_ID": "env-node"])
        let cluster = try #require(settings.cluster)
        #expect(cluster.servers == ["nats://a:4222", "nats://b:4223"], "flag over file")
        #expect(cluster.nodeID == "flag-node", "flag over environment")
        #expect(cluster.name == "envcluster", "environment over file")
        #expect(cluster.leaseDuration == .seconds(8), "file over default")
        #expect(cluster.renewInterval < cluster.dropUpstreamAfter && cluster.dropUpstreamAfter < cluster.leaseDuration)

        let single = try await RelaySettings.resolve(vendors: Relay.vendors, commandLine: [], environment: [:])
        #expect(single.cluster == nil, "without --cluster nothing changes")
        let defaulted = try await RelaySettings.resolve(vendors: Relay.vendors, commandLine: ["--listen", "127.0.0.1:8181", "--cluster", "nats://x:1"], environment: [:])
        #expect(defaulted.cluster?.name == "relay")
        #expect(defaulted.cluster?.nodeID.hasSuffix("-8181") == true, "default node id: hostname and port")
        #expect(defaulted.cluster?.leaseDuration == .seconds(5))
    }

    @Test func badClusterSettingsNameTheSetting() async throws {
        await #expect(throws: RelaySettings.InvalidSetting.self) {
            try await RelaySettings.resolve(vendors: Relay.vendors, commandLine: ["--cluster", "http://x:4222"], environment: [:])
        }
        await #expect(throws: RelaySettings.InvalidSetting.self) {
            try await RelaySettings.resolve(vendors: Relay.vendors, commandLine: ["--cluster", "nats://x:4222", "--cluster-name", "a.b"], environment: [:])
        }
        await #expect(throws: RelaySettings.InvalidSetting.self) {
            try await RelaySettings.resolve(vendors: Relay.vendors, commandLine: ["--cluster", "nats://x:4222"], environment: ["RELAY_CLUSTER_LEASE_SECONDS": "0.5"])
        }
    }

    @Test func aPlainHTTPRESTURLIsRefusedUnlessItIsLoopback() async throws {
        await #expect(throws: RelaySettings.InvalidSetting.self) {
            try await RelaySettings.resolve(vendors: Relay.vendors, commandLine: ["--rest-url", "http://api.polygon.io"], environment: [:])
        }
        await #expect(throws: RelaySettings.InvalidSetting.self) {
            try await RelaySettings.resolve(vendors: Relay.vendors, commandLine: ["--rest-url", "http://127.evil.example:80"], environment: [:])
        }
        let loopback = try await RelaySettings.resolve(vendors: Relay.vendors, commandLine: ["--rest-url", "http://127.0.0.1:9009"], environment: [:])
        #expect(loopback.upstreamRESTURL == "http://127.0.0.1:9009")
        let secure = try await RelaySettings.resolve(vendors: Relay.vendors, commandLine: ["--rest-url", "https://api.polygon.io"], environment: [:])
        #expect(secure.upstreamRESTURL == "https://api.polygon.io")
    }

    @Test(arguments: [
        ("127.0.0.1", true), ("127.1.2.3", true), ("localhost", true), ("::1", true), ("[::1]", true), ("::ffff:127.0.0.1", true),
        ("127.example.com", false), ("0.0.0.0", false), ("10.0.0.1", false), ("::", false), ("example.com", false), ("1270.0.0.1", false),
    ])
    func loopbackIsDecidedByParsingTheAddress(host: String, loopback: Bool) {
        #expect(ClientAuthentication.isLoopback(host) == loopback, "\(host)")
    }

    @Test func maxConnectionsBacksOffExponentiallyWithJitterInTheUpperHalf() {
        let policy = ReconnectPolicy(maxConnectionsDelay: .seconds(15), maxConnectionsMaxDelay: .seconds(300))
        var generator = SystemRandomNumberGenerator()
        for _ in 0..<200 {
            let first = policy.maxConnectionsDelay(attempt: 0, using: &generator)
            #expect(first >= .milliseconds(7500) && first <= .seconds(15))
            let third = policy.maxConnectionsDelay(attempt: 2, using: &generator)
            #expect(third >= .seconds(30) && third <= .seconds(60))
            let late = policy.maxConnectionsDelay(attempt: 12, using: &generator)
            #expect(late >= .seconds(150) && late <= .seconds(300))
        }
    }

    @Test func aRefusedLoginBacksOffWithJitterToFiveTimesItsFirstWait() {
        let policy = ReconnectPolicy(authFailedDelay: .seconds(120))
        var generator = SystemRandomNumberGenerator()
        var firsts = Set<Duration>()
        for _ in 0..<200 {
            let first = policy.authFailedDelay(attempt: 0, using: &generator)
            #expect(first >= .seconds(60) && first <= .seconds(120))
            firsts.insert(first)
            let late = policy.authFailedDelay(attempt: 12, using: &generator)
            #expect(late >= .seconds(300) && late <= .seconds(600))
        }
        #expect(firsts.count > 100, "spread out, not in lockstep")
    }

    @Test func aConfigFileWithTheUpstreamKeyIsReadWithoutACopyAnywhere() async throws {
        // Keys with rights made the relay write the file, less those keys but with upstream.key, to a
        // world-readable temporary file while it read it. With no usable temporary directory, that
        // copy failed; the file is now read from memory.
        let file = try writeConfig(
            """
            upstream:
              url: wss://socket.polygon.io/stocks
              key: upstream-secret
            client:
              keys:
                - {name: robot, key: robot-secret, topics: ["Q.*"]}
            """)
        defer { try? FileManager.default.removeItem(atPath: file) }
        let saved = ProcessInfo.processInfo.environment["TMPDIR"]
        setenv("TMPDIR", "/nonexistent-relay-tmp-\(UUID().uuidString)", 1)
        defer { if let saved { setenv("TMPDIR", saved, 1) } else { unsetenv("TMPDIR") } }
        let settings = try await RelaySettings.resolve(vendors: Relay.vendors, commandLine: ["--config", file], environment: [:])
        #expect(settings.upstreamKey == "upstream-secret")
        #expect(settings.clientKeyRights.map(\.name) == ["robot"])
    }

    @Test func keysWithRightsComeFromTheConfigFile() async throws {
        let file = try writeConfig(
            """
            client:
              keys:
                - {name: dashboard, key: "sha256:2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824", topics: ["Q.*", "T.AAPL"], maxConnections: 5, portfolio: read}
                - {name: robot, key: robot-secret, timestamps: true, buffer: 50000}
                - plain-key
            """)
        defer { try? FileManager.default.removeItem(atPath: file) }
        let settings = try await RelaySettings.resolve(vendors: Relay.vendors, commandLine: ["--config", file], environment: [:])
        #expect(settings.clientKeys == ["plain-key"])
        #expect(settings.clientKeyRights.map(\.name) == ["dashboard", "robot"])
        let authentication = try ClientAuthentication.resolve(
            keys: settings.clientKeys, withRights: settings.clientKeyRights, listenHost: "0.0.0.0")
        // sha256("hello") is the digest above: the file holds no secret.
        let dashboard = try #require(authentication.identify("hello"))
        #expect(dashboard.name == "dashboard")
        #expect(dashboard.portfolio == .read)
        #expect(dashboard.maxConnections == 5)
        #expect(dashboard.entitlement.allows(Topic(eventType: "Q", ticker: "MSFT")!))
        #expect(!dashboard.entitlement.allows(Topic(eventType: "T", ticker: "MSFT")!))
        #expect(authentication.identify("robot-secret")?.portfolio == .write, "unrestricted unless said")
        #expect(authentication.identify("robot-secret")?.grant.timestamps == true && !dashboard.grant.timestamps, "timestamps only when asked")
        #expect(authentication.identify("robot-secret")?.grant.buffer == 50000 && dashboard.grant.buffer == nil, "a buffer of its own only when given")
        #expect(authentication.identify("plain-key")?.name == "key-1", "a plain key is named, never shown")
        #expect(authentication.identify("nope") == nil)

        // A flag replaces the file's keys.
        let flagged = try await RelaySettings.resolve(vendors: Relay.vendors, commandLine: ["--client-keys", "flag-key", "--config", file], environment: [:])
        #expect(flagged.clientKeys == ["flag-key"] && flagged.clientKeyRights.isEmpty)
    }

    @Test func badKeyDefinitionsNameTheProblem() async throws {
        for entry in [
            "{name: a, key: k, portfolio: admin}", "{name: a, key: k, colour: red}", "{name: a}", "{name: a, key: k, maxConnections: 0}",
            "{name: a, key: k, topics: [nodot]}", "{name: a, key: \"sha256:abc\"}", "{name: a, key: k, timestamps: sometimes}",
            "{name: a, key: k, buffer: 999}", "{name: a, key: k, buffer: 1000001}", "{name: a, key: k, buffer: lots}",
            // YAML's null and numbers are no key (their text would be "<null>", "83").
            "{name: a, key: }", "{name: a, key: ~}", "{name: a, key: null}", "{name: a, key: 0123}", "{name: a, key: yes}",
        ] {
            let file = try writeConfig("client:\n  keys:\n    - \(entry)\n")
            defer { try? FileManager.default.removeItem(atPath: file) }
            await #expect(throws: RelaySettings.InvalidSetting.self, "\(entry)") {
                try await RelaySettings.resolve(vendors: Relay.vendors, commandLine: ["--config", file], environment: [:])
            }
        }
    }
}

@Suite("Configuration: every market's upstream")
struct MarketSettingsTests {
    func writeConfig(_ text: String) throws -> String { try writeTemporaryConfig(text) }

    @Test func repeatedUpstreamsNameTheirMarketsByTheirPath() async throws {
        let settings = try await RelaySettings.resolve(
            vendors: Relay.vendors,
            commandLine: ["--upstream", "wss://socket.massive.com/stocks,ws://127.0.0.1:9/crypto", "--upstream-key", "default-key"], environment: [:])
        #expect(settings.upstreams.map(\.market) == [.stocks, .crypto])
        #expect(settings.upstreams[1].endpoint.description == "ws://127.0.0.1:9/crypto")
        #expect(settings.upstreams.allSatisfy { $0.apiKey == nil }, "each uses the default key")
        #expect(settings.upstream?.market == "stocks", "the first one is the upstream of a one-market view")
    }

    @Test func marketsOnAHostAndTheDelayedFeed() async throws {
        let live = try await RelaySettings.resolve(vendors: Relay.vendors, commandLine: ["--markets", "stocks, options,crypto"], environment: ["POLYGON_API_KEY": "k"])
        #expect(live.upstreams.map(\.endpoint.description) == [
            "wss://socket.massive.com:443/stocks", "wss://socket.massive.com:443/options", "wss://socket.massive.com:443/crypto",
        ])
        let delayed = try await RelaySettings.resolve(
            vendors: Relay.vendors,
            commandLine: [], environment: ["RELAY_MARKETS": "forex", "RELAY_UPSTREAM_HOST": "delayed.massive.com", "POLYGON_API_KEY": "k"])
        #expect(delayed.upstreams.map(\.endpoint.description) == ["wss://delayed.massive.com:443/forex"])
    }

    @Test func theFileListGivesKeysAndCAsPerMarketAndFlagsWinPerMarket() async throws {
        let file = try writeConfig(
            """
            upstream:
              key: file-default
            upstreams:
              - {market: crypto, keyEnv: CRYPTO_KEY}
              - {url: "wss://delayed.massive.com/options", key: options-key, caFile: /tmp/ca.pem}
              - {market: stocks, url: "wss://file.example/stocks"}
            """)
        defer { try? FileManager.default.removeItem(atPath: file) }
        let settings = try await RelaySettings.resolve(
            vendors: Relay.vendors,
            commandLine: ["--upstream", "ws://127.0.0.1:9/stocks", "--config", file], environment: ["CRYPTO_KEY": "crypto-secret"])
        #expect(settings.upstreams.map(\.market) == [.stocks, .crypto, .options])
        #expect(settings.upstreams[0].endpoint.host == "127.0.0.1", "the flag's stocks over the file's")
        #expect(settings.upstreams[1].apiKey == "crypto-secret")
        #expect(settings.upstreams[1].endpoint.description == "wss://socket.massive.com:443/crypto")
        #expect(settings.upstreams[2].apiKey == "options-key" && settings.upstreams[2].caFile == "/tmp/ca.pem")
        #expect(settings.upstreamKey == "file-default", "the default key of the others")
    }

    @Test func badUpstreamsAreRefusedNamingTheProblem() async throws {
        await #expect(throws: RelaySettings.InvalidSetting.self) {
            _ = try await RelaySettings.resolve(vendors: Relay.vendors, commandLine: ["--upstream", "wss://socket.massive.com/bonds"], environment: [:])
        }
        do {
            _ = try await RelaySettings.resolve(
                vendors: Relay.vendors, commandLine: ["--upstream", "wss://a/stocks,wss://b/stocks", "--upstream-key", "k"], environment: [:])
            Issue.record("the stocks market twice was taken")
        } catch let error as RelaySettings.InvalidSetting {
            #expect(error.description.contains("configured twice"), "\(error.description)")
        }
        // The key in the clear to another host: refused, naming the host; to loopback, taken.
        for (url, host) in [("ws://feed.example/stocks", "feed.example"), ("ws://10.0.0.5:9009/stocks", "10.0.0.5")] {
            do {
                _ = try await RelaySettings.resolve(vendors: Relay.vendors, commandLine: ["--upstream", url, "--upstream-key", "k"], environment: [:])
                Issue.record("\(url) was taken")
            } catch let error as RelaySettings.InvalidSetting {
                #expect(error.description.contains("in the clear to \(host)") && error.description.contains("wss://"), "\(error.description)")
            }
        }
        for loopback in ["ws://127.0.0.1:9009/stocks", "ws://localhost:9009/stocks", "ws://[::1]:9009/stocks"] {
            let settings = try await RelaySettings.resolve(
                vendors: Relay.vendors, commandLine: ["--upstream", loopback, "--upstream-key", "k"], environment: [:])
            #expect(settings.upstream?.secure == false, "\(loopback)")
        }
        await #expect(throws: RelaySettings.InvalidSetting.self) {
            _ = try await RelaySettings.resolve(vendors: Relay.vendors, commandLine: ["--markets", "stocks,bonds"], environment: [:])
        }
        let file = try writeConfig("upstreams:\n  - {market: crypto, keyEnv: NOT_SET_ANYWHERE}\n")
        await #expect(throws: RelaySettings.InvalidSetting.self, "a market without any key") {
            _ = try await RelaySettings.resolve(vendors: Relay.vendors, commandLine: ["--markets", "crypto"], environment: [:])
        }
        defer { try? FileManager.default.removeItem(atPath: file) }
        do {
            _ = try await RelaySettings.resolve(vendors: Relay.vendors, commandLine: ["--config", file], environment: [:])
            Issue.record("a keyEnv naming an unset variable was accepted")
        } catch let error as RelaySettings.InvalidSetting {
            #expect(error.description.contains("NOT_SET_ANYWHERE"))
        }
    }

    @Test func theOptionsCapAndKeysPerMarketAreSettings() async throws {
        let file = try writeConfig(
            """
            limits:
              optionsContracts: 250
            client:
              keys:
                - {name: equities, key: e-secret, markets: [stocks, options]}
            """)
        defer { try? FileManager.default.removeItem(atPath: file) }
        let settings = try await RelaySettings.resolve(vendors: Relay.vendors, commandLine: ["--config", file], environment: [:])
        #expect(settings.optionsContracts == 250)
        #expect(settings.clientKeyRights.first?.entitlement.markets == [.stocks, .options])
        let flagged = try await RelaySettings.resolve(vendors: Relay.vendors, commandLine: ["--config", file, "--options-contracts", "10"], environment: [:])
        #expect(flagged.optionsContracts == 10)
        await #expect(throws: RelaySettings.InvalidSetting.self) {
            _ = try await RelaySettings.resolve(vendors: Relay.vendors, commandLine: ["--options-contracts", "0"], environment: [:])
        }
    }
}
