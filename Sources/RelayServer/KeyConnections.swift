import CoreMetrics
import MarketCore
import Synchronization

/// How many market WebSocket connections each client key holds, to enforce its `maxConnections`.
/// `Sendable`; the counts sit behind a `Mutex`. Recorded per key name (never the key) as
/// `relay_client_connections{key=…}`.
final class KeyConnections: Sendable {
    private let counts = Mutex<[String: Int]>([:])
    private let factory: any MetricsFactory

    init(factory: any MetricsFactory) {
        self.factory = factory
    }

    /// Counts one more connection for `grant`'s key, unless that would pass its limit.
    func admit(_ grant: ClientGrant) -> Bool {
        let count: Int? = counts.withLock { counts in
            let current = counts[grant.name, default: 0]
            if let limit = grant.maxConnections, current >= limit { return nil }
            counts[grant.name] = current + 1
            return current + 1
        }
        guard let count else { return false }
        Gauge(label: "relay_client_connections", dimensions: [("key", grant.name)], factory: factory).record(count)
        return true
    }

    /// What a client over its key's limit is told, as Polygon words it.
    static func limitMessage(_ grant: ClientGrant) -> String {
        "Maximum number of websocket connections exceeded for key \"\(grant.name)\" (\(grant.maxConnections ?? 0))."
    }

    func release(_ grant: ClientGrant) {
        let count = counts.withLock { counts in
            let next = max(counts[grant.name, default: 0] - 1, 0)
            counts[grant.name] = next == 0 ? nil : next
            return next
        }
        Gauge(label: "relay_client_connections", dimensions: [("key", grant.name)], factory: factory).record(count)
    }
}
