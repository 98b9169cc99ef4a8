import Foundation
import RelayComposition
import Testing

@testable import RelayConfiguration

/// Each setting is declared once; the command line, the environment and `relay serve --help` all come
/// from that declaration, and these tests keep the code that reads settings from drifting away from it.
@Suite("Settings declared once")
struct SettingDeclarationTests {
    @Test func theCommandLineIsReadThroughTheDeclarations() throws {
        let values = try RelaySettings.parse(commandLine: [
            "--listen", "127.0.0.1:9000", "--upstream", "wss://a/stocks", "--upstream=wss://a/crypto", "--no-snapshot", "--public-metrics",
        ])
        #expect(values["listen"] == "127.0.0.1:9000")
        #expect(values["upstream.url"] == "wss://a/stocks,wss://a/crypto", "repeatable")
        #expect(values["subscribers.snapshotOnSubscribe"] == "false")
        #expect(values["metrics.public"] == "true")
        #expect(throws: RelaySettings.CommandLineError.self) { try RelaySettings.parse(commandLine: ["--bogus", "1"]) }
        #expect(throws: RelaySettings.CommandLineError.self) { try RelaySettings.parse(commandLine: ["--listen"]) }
        #expect(throws: RelaySettings.CommandLineError.self) { try RelaySettings.parse(commandLine: ["--no-portfolio=yes"]) }
        #expect(throws: RelaySettings.CommandLineError.self) { try RelaySettings.parse(commandLine: ["stray"]) }
    }

    @Test func flagsBeatTheEnvironmentThroughTheSamePath() async throws {
        let settings = try await RelaySettings.resolve(
            vendors: Relay.vendors,
            commandLine: ["--listen", "127.0.0.1:9001", "--options-contracts", "300", "--no-portfolio", "--demo-rate", "42.5"],
            environment: [
                "RELAY_LISTEN": "127.0.0.1:8000", "RELAY_LIMIT_OPTIONS_CONTRACTS": "7", "RELAY_LIMIT_TOPICS": "99",
                "RELAY_LIMIT_AUTH_TIMEOUT_SECONDS": "45",
            ])
        #expect(settings.listen.port == 9001)
        #expect(settings.optionsContracts == 300)
        #expect(settings.connectionLimits.topics == 99, "the environment where no flag was given")
        #expect(settings.connectionLimits.authTimeout == .seconds(45))
        #expect(settings.portfolio == nil)
        #expect(settings.demoRate == 42.5)
    }

    @Test func theTapeIsOnUnderTheDataDirectoryUnlessTurnedOff() async throws {
        let byDefault = try await RelaySettings.resolve(vendors: Relay.vendors, commandLine: ["--data-dir", "/srv/relay/"], environment: [:])
        #expect(byDefault.tape?.directory == "/srv/relay/tape")
        #expect(byDefault.tape?.retentionDays == 7)
        let tuned = try await RelaySettings.resolve(
            vendors: Relay.vendors, commandLine: ["--tape-dir", "/tape"],
            environment: ["RELAY_TAPE_FLUSH_MS": "200", "RELAY_TAPE_RETENTION_DAYS": "30", "RELAY_TAPE_MAX_GB": "1.5"])
        #expect(tuned.tape?.directory == "/tape")
        #expect(tuned.tape?.flushInterval == .milliseconds(200))
        #expect(tuned.tape?.retentionDays == 30)
        #expect(tuned.tape?.retentionBytes == 1_610_612_736)
        #expect(try await RelaySettings.resolve(vendors: Relay.vendors, commandLine: ["--no-tape"], environment: [:]).tape == nil)
        await #expect(throws: RelaySettings.InvalidSetting.self) {
            try await RelaySettings.resolve(vendors: Relay.vendors, commandLine: [], environment: ["RELAY_TAPE_MAX_GB": "0"])
        }
    }

    @Test func aReplayReadsTheTapeAndRecordsNothing() async throws {
        #expect(try await RelaySettings.resolve(vendors: Relay.vendors, commandLine: [], environment: [:]).replay == nil, "live by default")
        let replay = try await RelaySettings.resolve(
            vendors: Relay.vendors,
            commandLine: ["--data-dir", "/srv/relay", "--replay-date", "2026-11-20", "--replay-speed", "10", "--replay-from", "09:30", "--replay-loop"],
            environment: ["RELAY_REPLAY_MARKETS": "stocks,crypto", "RELAY_REPLAY_TO": "10:00:30"])
        #expect(replay.replay?.directory == "/srv/relay/tape", "the tape's directory, recorded or not")
        #expect(replay.replay?.day == "2026-11-20")
        #expect(replay.replay?.markets == [.stocks, .crypto])
        #expect(replay.replay?.speed == "10")
        #expect(replay.replay?.from == "09:30" && replay.replay?.to == "10:00:30")
        #expect(replay.replay?.loop == true)
        #expect(replay.tape == nil, "a replay does not record")
        let newest = try await RelaySettings.resolve(vendors: Relay.vendors, commandLine: ["--replay-date", "last", "--replay-speed", "MAX"], environment: [:])
        #expect(newest.replay?.day == nil && newest.replay?.speed == "max")
        for bad in [
            ["--replay-date", "20-11-2026"], ["--replay-date", "last", "--replay-speed", "0"], ["--replay-date", "last", "--replay-speed", "fast"],
            ["--replay-date", "last", "--replay-from", "9.30"], ["--replay-date", "last", "--replay-to", "25:00"],
            ["--replay-date", "last", "--replay-markets", "stocks,bonds"], ["--replay-date", "last", "--replay-from", "24:30"],
            ["--replay-date", "last", "--replay-from", "½:½"], ["--replay-date", "last", "--replay-from", "10:00", "--replay-to", "09:30"],
        ] {
            await #expect(throws: RelaySettings.InvalidSetting.self, "\(bad)") {
                try await RelaySettings.resolve(vendors: Relay.vendors, commandLine: bad, environment: [:])
            }
        }
    }

    @Test func theHelpListsEverySetting() {
        let help = RelaySettings.settingsHelp
        for declaration in RelaySettings.declarations {
            #expect(help.contains("file: \(declaration.key)"), "\(declaration.key)")
            if let flag = declaration.flag { #expect(help.contains("--\(flag)"), "\(flag)") }
            if let variable = declaration.environment { #expect(help.contains(variable), "\(variable)") }
        }
        let keys = RelaySettings.declarations.map(\.key)
        #expect(Set(keys).count == keys.count, "a key declared twice")
        let flags = RelaySettings.declarations.compactMap(\.flag)
        #expect(Set(flags).count == flags.count, "a flag declared twice")
    }

    /// Every key and environment variable the resolver reads is declared (so it is in the help).
    @Test func everySettingTheCodeReadsIsDeclared() throws {
        let directory = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
            .appendingPathComponent("Sources/RelayConfiguration")
        var source = ""
        for file in ["RelaySettings.swift", "MarketUpstream.swift", "Settings+ConfigReader.swift"] {
            source += try String(contentsOf: directory.appendingPathComponent(file), encoding: .utf8)
        }
        let keys = Set(RelaySettings.declarations.map(\.key))
        let variables = Set(RelaySettings.declarations.compactMap(\.environment))
        var read: Set<String> = []
        for pattern in [#"forKey: "([a-zA-Z.]+)""#, #"\("((?:limits|cluster)\.[a-zA-Z]+)""#, #"(?:positive|notNegative|aboveZero)\("([a-zA-Z.]+)"\)"#] {
            let regex = try NSRegularExpression(pattern: pattern)
            for match in regex.matches(in: source, range: NSRange(source.startIndex..., in: source)) {
                if let range = Range(match.range(at: 1), in: source) { read.insert(String(source[range])) }
            }
        }
        #expect(read.count > 30, "the scan found what the resolver reads (\(read.count))")
        #expect(read.subtracting(keys).isEmpty, "read but not declared: \(read.subtracting(keys).sorted())")
        let variableRegex = try NSRegularExpression(pattern: #"environment\["([A-Z_]+)"\]"#)
        var readVariables: Set<String> = []
        for match in variableRegex.matches(in: source, range: NSRange(source.startIndex..., in: source)) {
            if let range = Range(match.range(at: 1), in: source) { readVariables.insert(String(source[range])) }
        }
        #expect(readVariables.subtracting(variables).isEmpty, "read but not declared: \(readVariables.subtracting(variables).sorted())")
    }
}
