import ArgumentParser
import Foundation
import MarketCore
import RelayComposition
import Tape
import TapeReplay

struct TapeCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "tape",
        abstract: "Look at the tape: what the relay recorded, per market and UTC day.",
        subcommands: [List.self, Export.self]
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

extension String {
    fileprivate func padding(_ width: Int, right: Bool = false) -> String {
        count >= width ? self : right ? String(repeating: " ", count: width - count) + self : self + String(repeating: " ", count: width - count)
    }
}
