import Logging
import MarketCore
import Synchronization
import Testing

/// What outsiders can repeat costs a log line per reason per interval, with the count held back.
@Suite("Throttled log")
struct ThrottledLogTests {
    /// Keeps every line logged to it, with its metadata.
    final class Lines: Sendable {
        let lines = Mutex<[(message: String, metadata: Logger.Metadata)]>([])
        var logger: Logger {
            Logger(label: "test") { _ in Handler(lines: self) }
        }
        struct Handler: LogHandler {
            let lines: Lines
            var metadata: Logger.Metadata = [:]
            var logLevel: Logger.Level = .trace
            subscript(metadataKey key: String) -> Logger.Metadata.Value? {
                get { metadata[key] }
                set { metadata[key] = newValue }
            }
            func log(event: LogEvent) {
                lines.lines.withLock { $0.append(("\(event.message)", event.metadata ?? [:])) }
            }
        }
    }

    @Test func aReasonLogsOncePerIntervalCountingWhatItHeldBackAndMakesNoMessageForIt() async throws {
        let lines = Lines()
        let logger = lines.logger
        let log = ThrottledLog(every: .milliseconds(200))
        let made = Atomic<Int>(0)
        func message(_ text: String) -> Logger.Message {
            made.add(1, ordering: .relaxed)
            return "\(text)"
        }
        for _ in 0..<5 { log.log(.info, "refused", message("refused"), metadata: ["address": "a"], to: logger) }
        log.log(.warning, "other", message("other"), to: logger)
        #expect(lines.lines.withLock { $0.map(\.message) } == ["refused", "other"], "one line per reason")
        #expect(made.load(ordering: .relaxed) == 2, "a line held back makes no message")
        #expect(lines.lines.withLock { $0[0].metadata["suppressed_since_last"] } == nil)

        // Once the interval has passed, the next line says how many were held back.
        let deadline = ContinuousClock.now + .seconds(10)
        while lines.lines.withLock({ $0.count }) < 3, ContinuousClock.now < deadline {
            try await Task.sleep(for: .milliseconds(50))
            log.log(.info, "refused", message("refused again"), metadata: ["address": "b"], to: logger)
        }
        let last = try #require(lines.lines.withLock { $0.last }, "the reason logged again after its interval")
        #expect(last.message == "refused again")
        #expect(last.metadata["address"] == "b")
        let held = Int(last.metadata["suppressed_since_last"].map { "\($0)" } ?? "") ?? 0
        #expect(held >= 4, "the four held back in the first interval are counted (\(held))")
    }
}
