import Foundation
import RelayServer
import Testing
import Upstream

@testable import RelayCore

@Suite("Configuration precedence")
struct SettingsTests {
    func writeConfig(_ text: String) throws -> String {
        let path = FileManager.default.temporaryDirectory.appendingPathComponent("relay-\(UUID().uuidString).yaml").path
        try text.write(toFile: path, atomically: true, encoding: .utf8)
        return path
    }

    @Test func defaultsServeTheDemoFeedOnLoopback8080() async throws {
        let settings = try await RelaySettings.resolve(flags: .init(), environment: [:])
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
            flags: .init(listen: "127.0.0.1:9000", configFile: file),
            environment: ["RELAY_LISTEN": "127.0.0.1:8000", "RELAY_UPSTREAM": "ws://env.example:81/crypto"])
        #expect(settings.listen.port == 9000, "flag over environment")
        #expect(settings.upstream?.description == "ws://env.example:81/crypto", "environment over file")
        #expect(settings.upstreamKey == "file-key", "file over default")
        #expect(settings.clientKeys == ["file-a", "file-b"])
        #expect(settings.demoRate == 123)
        #expect(settings.upstream?.market == "crypto")
    }

    @Test func documentedEnvironmentVariablesAreRead() async throws {
        let settings = try await RelaySettings.resolve(
            flags: .init(),
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
        let defaults = try await RelaySettings.resolve(flags: .init(), environment: [:])
        #expect(defaults.slowConsumerPolicy == .drop)
        #expect(defaults.snapshotOnSubscribe)
        let fromEnvironment = try await RelaySettings.resolve(
            flags: .init(), environment: ["RELAY_SLOW_CONSUMER": "disconnect", "RELAY_SNAPSHOT_ON_SUBSCRIBE": "false"])
        #expect(fromEnvironment.slowConsumerPolicy == .disconnect)
        #expect(!fromEnvironment.snapshotOnSubscribe)
        let fromFlags = try await RelaySettings.resolve(
            flags: .init(slowConsumer: "drop", snapshotOnSubscribe: true), environment: ["RELAY_SLOW_CONSUMER": "disconnect"])
        #expect(fromFlags.slowConsumerPolicy == .drop)
        #expect(fromFlags.snapshotOnSubscribe)
    }

    @Test func clientKeysFlagIsACommaSeparatedList() async throws {
        let settings = try await RelaySettings.resolve(flags: .init(clientKeys: "k1,k2 , k3"), environment: ["RELAY_CLIENT_KEYS": "env"])
        #expect(settings.clientKeys == ["k1", "k2", "k3"])
    }

    @Test(arguments: [
        (RelaySettings.Flags(listen: "nonsense"), "listen"),
        (RelaySettings.Flags(upstream: "http://x/stocks", upstreamKey: "k"), "upstream"),
        (RelaySettings.Flags(upstream: "wss://x/stocks"), "API key"),
        (RelaySettings.Flags(logLevel: "loud"), "log level"),
        (RelaySettings.Flags(configFile: "/nonexistent/relay.yaml"), "config file"),
        (RelaySettings.Flags(slowConsumer: "sometimes"), "slow consumer"),
    ])
    func badSettingsNameTheirProblem(flags: RelaySettings.Flags, mentions: String) async throws {
        do {
            _ = try await RelaySettings.resolve(flags: flags, environment: [:])
            Issue.record("expected an error mentioning \(mentions)")
        } catch {
            #expect("\(error)".contains(mentions))
        }
    }

    @Test func theSampleConfigFileLoads() async throws {
        let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
        let settings = try await RelaySettings.resolve(
            flags: .init(configFile: root.appendingPathComponent("config/relay.yaml").path), environment: [:])
        #expect(settings.listen.port == 8080)
        #expect(settings.upstream == nil, "the sample keeps the demo feed as default")
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
            flags: .init(configFile: file, cluster: "nats://a:4222,nats://b:4223", nodeID: "flag-node"),
            environment: ["RELAY_CLUSTER_NAME": "envcluster", "RELAY_NODE_ID": "env-node"])
        let cluster = try #require(settings.cluster)
        #expect(cluster.servers == ["nats://a:4222", "nats://b:4223"], "flag over file")
        #expect(cluster.nodeID == "flag-node", "flag over environment")
        #expect(cluster.name == "envcluster", "environment over file")
        #expect(cluster.leaseDuration == .seconds(8), "file over default")
        #expect(cluster.renewInterval < cluster.dropUpstreamAfter && cluster.dropUpstreamAfter < cluster.leaseDuration)

        let single = try await RelaySettings.resolve(flags: .init(), environment: [:])
        #expect(single.cluster == nil, "without --cluster nothing changes")
        let defaulted = try await RelaySettings.resolve(flags: .init(listen: "127.0.0.1:8181", cluster: "nats://x:1"), environment: [:])
        #expect(defaulted.cluster?.name == "relay")
        #expect(defaulted.cluster?.nodeID.hasSuffix("-8181") == true, "default node id: hostname and port")
        #expect(defaulted.cluster?.leaseDuration == .seconds(5))
    }

    @Test func badClusterSettingsNameTheSetting() async throws {
        await #expect(throws: RelaySettings.InvalidSetting.self) {
            try await RelaySettings.resolve(flags: .init(cluster: "http://x:4222"), environment: [:])
        }
        await #expect(throws: RelaySettings.InvalidSetting.self) {
            try await RelaySettings.resolve(flags: .init(cluster: "nats://x:4222", clusterName: "a.b"), environment: [:])
        }
        await #expect(throws: RelaySettings.InvalidSetting.self) {
            try await RelaySettings.resolve(flags: .init(cluster: "nats://x:4222"), environment: ["RELAY_CLUSTER_LEASE_SECONDS": "0.5"])
        }
    }

    @Test func aPlainHTTPRESTURLIsRefusedUnlessItIsLoopback() async throws {
        await #expect(throws: RelaySettings.InvalidSetting.self) {
            try await RelaySettings.resolve(flags: .init(restURL: "http://api.polygon.io"), environment: [:])
        }
        await #expect(throws: RelaySettings.InvalidSetting.self) {
            try await RelaySettings.resolve(flags: .init(restURL: "http://127.evil.example:80"), environment: [:])
        }
        let loopback = try await RelaySettings.resolve(flags: .init(restURL: "http://127.0.0.1:9009"), environment: [:])
        #expect(loopback.upstreamRESTURL == "http://127.0.0.1:9009")
        let secure = try await RelaySettings.resolve(flags: .init(restURL: "https://api.polygon.io"), environment: [:])
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
}
