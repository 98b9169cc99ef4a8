import CoreMetrics
import Synchronization

/// The bytes of vendor answers being read, across the relay's gateways, bounded. A page of history may
/// be tens of megabytes (a body is refused past ``RESTGateway/Settings/maxBodyBytes``), and each call
/// the account's budget allows reads its page into memory before anything is sent: many clients asking
/// for large pages at once (or a vendor that sends them slowly, for up to the request timeout each)
/// held their sum. Counted as the body's parts arrive, until the read ends; a part that would pass the
/// bound while other bytes are counted ends the read (the client gets `503` with `Retry-After`). One
/// read alone always goes on, whatever its size. The answers being sent are counted apart, against a
/// bound of their own.
///
/// `Sendable`: a `Mutex`.
public final class ReadingBytes: Sendable {
    public let limit: Int
    private let held = Mutex(0)
    private let gauge: Gauge?
    private let refusals: Counter?

    public init(limit: Int, factory: (any MetricsFactory)? = nil) {
        self.limit = max(limit, 1)
        gauge = factory.map { Gauge(label: "relay_rest_answer_bytes_reading", factory: $0) }
        refusals = factory.map { Counter(label: "relay_rest_reads_refused_total", factory: $0) }
    }

    /// The bytes counted now.
    public var bytes: Int { held.withLock { $0 } }

    /// Counts `count` bytes more (a read holding `own` already), unless other reads hold bytes and these
    /// would pass the bound.
    func take(_ count: Int, holding own: Int) -> Bool {
        let taken = held.withLock { held in
            guard held == own || held + count <= limit else { return false }
            held += count
            gauge?.record(held)
            return true
        }
        if !taken { refusals?.increment() }
        return taken
    }

    /// A read's bytes go back (it ended, whole or not).
    func give(_ count: Int) {
        guard count > 0 else { return }
        held.withLock { held in
            held -= count
            gauge?.record(held)
        }
    }
}

/// A read refused by the bound on answers being read.
public struct ReadingRefused: Error, CustomStringConvertible {
    let bytes: Int
    let limit: Int
    /// The vendor's status for the answer being read.
    let status: Int

    public var description: String {
        "the relay is reading \(bytes >> 20) MB of REST answers from the vendor already (at most \(limit >> 20) MB at once, rest.answersInFlightMB)"
    }
}
