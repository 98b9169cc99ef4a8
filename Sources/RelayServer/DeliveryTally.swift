import Foundation
import Synchronization

/// Deliveries and their latency as the relay can read them back (swift-metrics' counters and timers
/// are write-only): the events written to clients and a histogram of delivery latency, for
/// `/v1/status`. One lock per write and one per drain turn, never an allocation. `Sendable` through
/// its `Mutex`.
final class DeliveryTally: Sendable {
    struct Counts: Sendable, Equatable {
        var delivered = 0
        /// Writes per latency bucket (``DeliveryTally/upperBound(ofBucket:)``).
        var buckets = [Int](repeating: 0, count: DeliveryTally.bucketCount)
    }

    /// Bucket `i` holds latencies up to 10 µs × 2^(i/4): four buckets per doubling (each bound 19%
    /// above the last), from 10 µs to about 10 s.
    static let bucketCount = 81
    private let counts = Mutex(Counts())

    static func bucket(ofNanoseconds nanoseconds: Int64) -> Int {
        guard nanoseconds > 10_000 else { return 0 }
        let index = (log2(Double(nanoseconds) / 10_000) * 4).rounded(.up)
        return min(Int(index), bucketCount - 1)
    }

    static func upperBound(ofBucket index: Int) -> Double { 10e-6 * pow(2, Double(index) / 4) }

    /// Events written to clients in one drain turn.
    func add(delivered: Int) {
        counts.withLock { $0.delivered += delivered }
    }

    /// One write's delivery latency (its oldest event's).
    func record(latencyNanoseconds: Int64) {
        let bucket = Self.bucket(ofNanoseconds: latencyNanoseconds)
        counts.withLock { $0.buckets[bucket] += 1 }
    }

    func read() -> Counts { counts.withLock { $0 } }

    /// The latency (seconds, a bucket's upper bound) below which `fraction` of the writes between two
    /// readings fell; `nil` without writes.
    static func quantile(_ fraction: Double, from earlier: Counts, to later: Counts) -> Double? {
        let deltas = zip(later.buckets, earlier.buckets).map { $0 - $1 }
        let total = deltas.reduce(0, +)
        guard total > 0 else { return nil }
        let wanted = Double(total) * fraction
        var seen = 0
        for (index, count) in deltas.enumerated() {
            seen += count
            if Double(seen) >= wanted { return upperBound(ofBucket: index) }
        }
        return upperBound(ofBucket: bucketCount - 1)
    }
}
