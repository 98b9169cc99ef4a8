import PolygonWire
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
    /// Derived bars the subscribers received whose window ended in the measured window, and per second.
    public var barsBuilt: Int = 0
    public var barsPerSecond: Double = 0
    /// Per node, in a cluster run.
    public var nodes: [Node]?
    /// Failover times, in a cluster run.
    public var failover: Failover?

    /// One cluster node's share of the run.
    public struct Node: Sendable, Codable {
        public var name: String
        public var deliveryRatio: Double
        public var p50Ms: Double
        public var p99Ms: Double
        public var peakRSSMB: Double
    }

    /// From stopping the leader to every subscriber on the surviving nodes receiving an event sent
    /// after the stop.
    public struct Failover: Sendable, Codable {
        public var killSeconds: Double
        public var terminateSeconds: Double
    }

    /// A table for people.
    public var table: String {
        func n(_ value: Double, _ digits: Int = 0) -> String { BenchResult.format(value, digits: digits) }
        let s = scenario
        var shape =
            s.wildcard
            ? "\(s.subscribers) subscribers on Q.* and T.* over \(s.universe) symbols"
            : "\(s.subscribers) subscribers × \(s.symbolsPerSubscriber) of \(s.universe) symbols"
        if s.nodes > 1 { shape += " spread over \(s.nodes) cluster nodes" }
        var lines = [
            "relay bench — \(s.name): \(shape), \(n(s.rate)) events/s upstream in frames of \(s.frameEvents)"
                + (s.markets == [.stocks] ? "" : ", on \(s.markets.map { "/\($0)" }.joined(separator: " ")) (an upstream connection each)")
                + (s.stalledSubscribers > 0 ? ", \(s.stalledSubscribers) stalled" : "") + ", \(n(s.durationSeconds)) s",
            "  upstream     \(n(upstreamEventsPerSecond)) events/s sent",
            "  delivered    \(n(deliveredPerSecond)) events/s   ratio \(n(deliveryRatio, 4))   (\(n(Double(delivered))) of \(n(Double(expected))))",
            "  latency      p50 \(n(latencyMs.p50, 3)) ms   p99 \(n(latencyMs.p99, 3)) ms   p99.9 \(n(latencyMs.p999, 3)) ms   max \(n(latencyMs.max, 3)) ms",
            "  drops        \(n(Double(relayDropped))) dropped by the relay   \(laggingNoticesFast) lagging notices to fast subscribers",
            "  writes       \(n(Double(relayWrites))) frames, \(n(eventsPerWrite, 1)) events per frame",
            "  relay        CPU \(n(relayCPUPercent))% of one core (\(n(relayCPUSeconds, 2)) s)   peak RSS \(n(relayPeakRSSMB, 1)) MB   RSS now \(n(relayRSSMB, 1)) MB",
            "  harness      CPU \(n(benchCPUPercent))% (feed and clients share the machine)",
        ]
        if s.barShare > 0 {
            lines.append(
                "  bars         \(n(s.barShare * 100))% of subscribers hold 5-second bars\(s.barsOnly ? " (and nothing else)" : ""): \(n(Double(barsBuilt))) bars out, \(n(barsPerSecond, 1)) per second")
        }
        for node in nodes ?? [] {
            lines.append(
                "  \(node.name)        ratio \(n(node.deliveryRatio, 4))   p50 \(n(node.p50Ms, 3)) ms   p99 \(n(node.p99Ms, 3)) ms   peak RSS \(n(node.peakRSSMB, 1)) MB"
            )
        }
        if let failover {
            lines.append(
                "  failover     kill -9 of the leader: events on every other node after \(n(failover.killSeconds, 2)) s;"
                    + " SIGTERM: after \(n(failover.terminateSeconds, 2)) s")
        }
        if s.stalledSubscribers > 0 {
            lines.append(
                "  stalled      \(n(Double(stalledDelivered))) events read before stalling, \(laggingNoticesStalled) lagging notices")
        }
        return lines.joined(separator: "\n")
    }

    /// `1234567.891` → `1,234,567.9` (one digit): grouping by hand, as Foundation's formatter on Linux
    /// does not honour fraction digits.
    public static func format(_ value: Double, digits: Int) -> String {
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
