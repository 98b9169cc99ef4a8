import ArgumentParser
import Foundation
import Tape

struct TapeCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "tape",
        abstract: "Look at the tape: what the relay recorded, per market and UTC day.",
        subcommands: [List.self]
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

extension String {
    fileprivate func padding(_ width: Int, right: Bool = false) -> String {
        count >= width ? self : right ? String(repeating: " ", count: width - count) + self : self + String(repeating: " ", count: width - count)
    }
}
