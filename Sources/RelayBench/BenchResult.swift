import Foundation

/// What one benchmark run measured. Value type, `Sendable`, `Codable` (for `--json`).
public struct BenchResult: Sendable, Codable {
    public struct Latency: Sendable, Codable {
        public var p50: Double
        public var p99: Double
        public var p999: Double
        public var max: Double
        public var samples: UInt64
    }

    public var scenario: BenchScenario
    /// Upstream quotes and trades sent during the measured window.
    public var upstreamEvents: Int
    public var upstreamEventsPerSecond: Double
    /// Events the fast subscribers should have received in the window, and what they did receive.
    public var expected: Int
    public var delivered: Int
    public var deliveredPerSecond: Double
    public var deliveryRatio: Double
    /// From the upstream feed sending an event to a subscriber parsing it, in milliseconds.
    public var latencyMs: Latency
    /// Events the relay dropped for full buffers during the window (all subscribers), from its `/metrics`.
    public var relayDropped: Int
    /// `lagging` notices the fast subscribers received during the window (they should get none).
    public var laggingNoticesFast: Int
    /// What stalled subscribers received and were told, if any.
    public var stalledDelivered: Int
    public var laggingNoticesStalled: Int
    /// Downstream frames the relay wrote in the window, and events per frame.
    public var relayWrites: Int
    public var eventsPerWrite: Double
    public var relayCPUSeconds: Double
    /// Relay CPU time over wall time (100 = one core busy).
    public var relayCPUPercent: Double
    public var relayPeakRSSMB: Double
    public var relayRSSMB: Double
    /// The harness's own CPU (feed and clients run in it, on the same two cores).
    public var benchCPUPercent: Double

    /// A table for people.
    public var table: String {
        func n(_ value: Double, _ digits: Int = 0) -> String { BenchResult.format(value, digits: digits) }
        let s = scenario
        let shape =
            s.wildcard
            ? "\(s.subscribers) subscribers on Q.* and T.* over \(s.universe) symbols"
            : "\(s.subscribers) subscribers × \(s.symbolsPerSubscriber) of \(s.universe) symbols"
        var lines = [
            "relay bench — \(s.name): \(shape), \(n(s.rate)) events/s upstream in frames of \(s.frameEvents)"
                + (s.stalledSubscribers > 0 ? ", \(s.stalledSubscribers) stalled" : "") + ", \(n(s.durationSeconds)) s",
            "  upstream     \(n(upstreamEventsPerSecond)) events/s sent",
            "  delivered    \(n(deliveredPerSecond)) events/s   ratio \(n(deliveryRatio, 4))   (\(n(Double(delivered))) of \(n(Double(expected))))",
            "  latency      p50 \(n(latencyMs.p50, 3)) ms   p99 \(n(latencyMs.p99, 3)) ms   p99.9 \(n(latencyMs.p999, 3)) ms   max \(n(latencyMs.max, 3)) ms",
            "  drops        \(n(Double(relayDropped))) dropped by the relay   \(laggingNoticesFast) lagging notices to fast subscribers",
            "  writes       \(n(Double(relayWrites))) frames, \(n(eventsPerWrite, 1)) events per frame",
            "  relay        CPU \(n(relayCPUPercent))% of one core (\(n(relayCPUSeconds, 2)) s)   peak RSS \(n(relayPeakRSSMB, 1)) MB   RSS now \(n(relayRSSMB, 1)) MB",
            "  harness      CPU \(n(benchCPUPercent))% (feed and clients share the machine)",
        ]
        if s.stalledSubscribers > 0 {
            lines.append(
                "  stalled      \(n(Double(stalledDelivered))) events read before stalling, \(laggingNoticesStalled) lagging notices")
        }
        return lines.joined(separator: "\n")
    }

    /// `1234567.891` → `1,234,567.9` (one digit): grouping by hand, as Foundation's formatter on Linux
    /// does not honour fraction digits.
    static func format(_ value: Double, digits: Int) -> String {
        guard value.isFinite else { return "\(value)" }
        let text = String(format: "%.\(digits)f", abs(value))
        let parts = text.split(separator: ".", omittingEmptySubsequences: false)
        var whole = String(parts[0])
        var grouped = ""
        while whole.count > 3 {
            grouped = "," + whole.suffix(3) + grouped
            whole = String(whole.dropLast(3))
        }
        grouped = whole + grouped
        return (value < 0 ? "-" : "") + grouped + (parts.count > 1 ? "." + parts[1] : "")
    }
}
