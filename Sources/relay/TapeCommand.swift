import ArgumentParser
import Cluster
import Foundation
import Logging
import MarketCore
import RelayComposition
import RelayConfiguration
import Tape
import TapeReplay

struct TapeCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "tape",
        abstract: "Look at the tape: what the relay recorded, per market and UTC day.",
        subcommands: [List.self, Export.self, Pull.self, Import.self]
    )

    struct List: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            commandName: "ls", abstract: "List the tape's days per market: size, events, gaps, the time they span, epochs (a relay's start begins one), damage.")

        @Option(name: .customLong("tape-dir"), help: "The tape's directory.") var directory: String = "./data/tape"

        func run() async throws {
            let days = try TapeDaySummary.all(directory: directory)
            guard !days.isEmpty else {
                print("no tape in \(directory)")
                return
            }
            print("market     day          size        events  gaps (s)        from      to        epochs  damage")
            for day in days {
                let gap = day.gaps == 0 ? "0" : "\(day.gaps) (\(String(format: "%.1f", Double(day.gapNanoseconds) / 1e9)))"
                let damage = day.skippedBlocks == 0 && day.damagedBytes == 0 ? "none" : "\(day.skippedBlocks) blocks, \(day.damagedBytes) bytes"
                print(
                    [
                        day.market.padding(10), day.day.padding(12), Self.size(day.bytes).padding(11, right: true), "\(day.events)".padding(7, right: true),
                        "  " + gap.padding(14), Self.time(day.first).padding(9), Self.time(day.last).padding(9), "\(day.epochs.count)".padding(7), damage,
                    ].joined(separator: " "))
            }
        }

        static func size(_ bytes: Int64) -> String {
            bytes >= 1 << 30 ? String(format: "%.2f GB", Double(bytes) / Double(1 << 30))
                : bytes >= 1 << 20 ? String(format: "%.1f MB", Double(bytes) / Double(1 << 20)) : String(format: "%.1f KB", Double(bytes) / 1024)
        }

        /// `HH:MM:SS` UTC of a receive time.
        static func time(_ nanoseconds: Int64?) -> String {
            nanoseconds.map(TapeFile.clock(of:)) ?? "-"
        }
    }
}

extension TapeCommand {
    struct Export: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            commandName: "export",
            abstract: "Write a recorded day's events as JSON lines or CSV, in arrival order, each with the time the relay received it.",
            discussion: """
                jsonl: the vendor's own event object (Alpaca's MessagePack as its JSON) with "_r" (receive time, UTC ns), "_s" and "_m" \
                (topic and market sequences) added at its end. csv: received_ns, received_utc, topic_sequence, market_sequence, \
                event_type, symbol, then a column per field of the events exported.
                """)

        @Option(name: .customLong("tape-dir"), help: "The tape's directory.") var directory: String = "./data/tape"
        @Option(help: "The market.") var market: String
        @Option(help: "The UTC day, yyyy-mm-dd (default: the market's newest).") var date: String?
        @Option(help: "Topics to write, comma-separated (T.AAPL,Q.*; Alpaca's t.AAPL); default: every event.") var topics: String?
        @Option(help: "The window's start, HH:MM[:SS] UTC.") var from: String?
        @Option(help: "The window's end, HH:MM[:SS] UTC.") var to: String?
        @Option(help: "jsonl or csv.") var format: String = "jsonl"
        @Option(name: .shortAndLong, help: "The file written (default: standard output).") var output: String?

        func run() async throws {
            guard let format = TapeExport.Format(rawValue: format) else { throw ValidationError("--format: jsonl or csv, not \"\(format)\"") }
            let days = TapeFile.days(directory: directory, market: market)
            guard let day = date ?? days.last?.day else { throw ValidationError("no tape of \(market) in \(directory)") }
            guard let file = days.first(where: { $0.day == day }) else {
                throw ValidationError("no tape of \(market) for \(day) in \(directory) (days: \(days.map(\.day).joined(separator: ", ")))")
            }
            var export = TapeExport(
                path: file.path, format: format, wire: try Relay.recordedProtocol(of: file.path, market: Market(rawValue: market) ?? .stocks).wire)
            if let topics {
                let parsed = Topic.parseList(topics)
                guard parsed.invalid.isEmpty else { throw ValidationError("--topics: not topics: \(parsed.invalid.joined(separator: ", "))") }
                export.topics = parsed.topics
            }
            for (name, value) in [("--from", from), ("--to", to)] {
                guard let value else { continue }
                guard let time = ReplayPlan.time(value, on: day) else { throw ValidationError("\(name): HH:MM or HH:MM:SS (UTC), not \"\(value)\"") }
                if name == "--from" { export.from = time } else { export.to = time }
            }
            if let from = export.from, let to = export.to, from > to { throw ValidationError("--from: after --to") }
            let handle: FileHandle
            if let output {
                guard FileManager.default.createFile(atPath: output, contents: nil) , let opened = FileHandle(forWritingAtPath: output) else {
                    throw ValidationError("--output: cannot write \(output)")
                }
                handle = opened
            } else {
                handle = FileHandle.standardOutput
            }
            let outcome = try export.run { text in try handle.write(contentsOf: Data(text.utf8)) }
            if output != nil { try handle.close() }
            var summary = "\(outcome.events) events of \(market) \(day) written"
            if outcome.unreadable > 0 { summary += "; \(outcome.unreadable) could not be written as JSON and were left out" }
            if outcome.skippedBlocks > 0 { summary += "; \(outcome.skippedBlocks) damaged blocks skipped" }
            FileHandle.standardError.write(Data((summary + "\n").utf8))
        }
    }
}

extension TapeCommand {
    struct Pull: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            commandName: "pull",
            abstract: "Copy a cluster's tape (its JetStream streams) into day files here, for replay, export and ls.",
            discussion: """
                Each UTC day the stream holds is written whole and renamed over that day's file in --tape-dir, so pulling again replaces it; a day here that begins earlier than the stream keeps its file, and a pull cut short replaces nothing. Each event is checked as a node checks one from NATS (news items within --news-max-bytes: give the nodes' news.maxBytes if they raised it); a block holding one that does not check is left out. The user, password or token may be in the URL; RELAY_CLUSTER_TOKEN is read too.
                """)

        @Option(name: .customLong("cluster"), help: "NATS: nats://HOST:PORT[,…] or tls://…") var cluster: String
        @Option(name: .customLong("cluster-name"), help: "The cluster's name (what its nodes run with).") var name: String = "relay"
        @Option(help: "Markets, comma-separated (stocks,crypto,…).") var markets: String
        @Option(name: .customLong("tape-dir"), help: "Where the day files go.") var directory: String = "./data/tape"
        @Option(name: .customLong("cluster-credentials"), help: "A NATS .creds file.") var credentials: String?
        @Option(name: .customLong("cluster-tls-ca"), help: "CA certificates (PEM) for TLS.") var caFile: String?
        @Option(name: .customLong("news-max-bytes"), help: "The largest news item taken (the nodes' news.maxBytes; default 4 MiB).") var newsMaxBytes: Int?

        func run() async throws {
            let servers: [String]
            do { servers = try ClusterConfiguration.servers(from: cluster) } catch { throw ValidationError("--cluster: \(error)") }
            var security = ClusterConfiguration.Security()
            security.credentialsFile = credentials
            security.caFile = caFile
            security.token = ProcessInfo.processInfo.environment["RELAY_CLUSTER_TOKEN"]
            let bounds = try TapeCommand.eventBounds(newsMaxBytes: newsMaxBytes)
            var named: [String] = []
            for market in markets.split(separator: ",").map(String.init) where !named.contains(market) { named.append(market) }
            let unknown = named.filter { Market(rawValue: $0) == nil }
            guard !named.isEmpty, unknown.isEmpty else { throw ValidationError("--markets: markets, comma-separated; not markets: \(unknown.joined(separator: ", "))") }
            var logger = Logger(label: "relay.tape.pull")
            logger.logLevel = .warning
            for case let market? in named.map(Market.init(rawValue:)) {
                let outcome = try await ClusterTapePull.pull(
                    servers: servers, security: security, cluster: name, market: market.rawValue, directory: directory,
                    check: { Relay.tapeCheck(market, source: $0, settings: bounds) }, logger: logger)
                var line = "\(market): \(outcome.blocks) blocks into \(outcome.days.count) days (\(outcome.days.joined(separator: ", ")))"
                if outcome.missing > 0 { line += "; \(outcome.missing) blocks NATS no longer had or sent damaged" }
                if let why = outcome.firstRefusal { line += "; \(outcome.refused) blocks left out for an event that did not check (the first: \(why))" }
                if !outcome.kept.isEmpty { line += "; kept here as they were (they begin earlier than the stream): \(outcome.kept.joined(separator: ", "))" }
                print(line)
            }
        }
    }
}

extension TapeCommand {
    struct Import: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            commandName: "import",
            abstract: "Copy day files from elsewhere into the tape's directory, checking every event on its way in.",
            discussion: """
                A replay serves a day's events as they were recorded, so what enters the tape's directory is checked: each event as the \
                relay checks one from its upstream, in the protocol of the vendor the file's first source record names (news items \
                within --news-max-bytes). A block that does not read, holds an event that does not check or names another source is \
                left out and told. A day the directory has already is kept unless --replace; each day is renamed into place only when \
                whole. Not while a relay records the market into the same directory.
                """)

        @Argument(help: "Day files (yyyy-mm-dd.tape) to import.") var files: [String]
        @Option(help: "The market the files are of (stocks, crypto, …).") var market: String
        @Option(name: .customLong("tape-dir"), help: "The tape's directory.") var directory: String = "./data/tape"
        @Flag(help: "Replace a day the directory has already.") var replace = false
        @Option(name: .customLong("news-max-bytes"), help: "The largest news item taken (default 4 MiB).") var newsMaxBytes: Int?

        func run() async throws {
            guard let market = Market(rawValue: market) else { throw ValidationError("--market: a market (stocks, crypto, …), not \"\(self.market)\"") }
            let bounds = try TapeCommand.eventBounds(newsMaxBytes: newsMaxBytes)
            for file in files {
                let outcome = try TapeImport.copy(from: file, market: market.rawValue, into: directory, replace: replace) {
                    Relay.tapeCheck(market, source: $0, settings: bounds)
                }
                var line = "\(file): \(outcome.blocks) blocks into \(outcome.days.count) days (\(outcome.days.joined(separator: ", ")))"
                if let why = outcome.firstRefusal { line += "; \(outcome.refused) blocks left out (the first: \(why))" }
                if !outcome.kept.isEmpty { line += "; already here, kept as they were (--replace replaces): \(outcome.kept.joined(separator: ", "))" }
                print(line)
            }
        }
    }
}

extension TapeCommand {
    /// The bounds an event entering a tape's folder is checked against, as a node checks one from NATS
    /// (only news.maxBytes is a setting: `--news-max-bytes`).
    static func eventBounds(newsMaxBytes: Int?) throws -> RelaySettings {
        var settings = RelaySettings()
        if let newsMaxBytes {
            let range = RelaySettings.NewsSettings.maxBytesRange
            guard range.contains(newsMaxBytes) else { throw ValidationError("--news-max-bytes: \(range.lowerBound) to \(range.upperBound)") }
            settings.news.maxBytes = newsMaxBytes
        }
        return settings
    }
}

extension String {
    fileprivate func padding(_ width: Int, right: Bool = false) -> String {
        count >= width ? self : right ? String(repeating: " ", count: width - count) + self : self + String(repeating: " ", count: width - count)
    }
}
