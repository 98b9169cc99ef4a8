import CoreMetrics
import Logging
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

    /// Counts one more connection for `grant`'s key; past its limit, why not (as Polygon words it).
    func admit(_ grant: ClientGrant) -> ConnectionRefusal? {
        let count: Int? = counts.withLock { counts in
            let current = counts[grant.name, default: 0]
            if let limit = grant.maxConnections, current >= limit { return nil }
            counts[grant.name] = current + 1
            return current + 1
        }
        guard let count else {
            return ConnectionRefusal(
                message: "Maximum number of websocket connections exceeded for key \"\(grant.name)\" (\(grant.maxConnections ?? 0)).",
                reason: "key-limit " + grant.name)
        }
        Gauge(label: "relay_client_connections", dimensions: [("key", grant.name)], factory: factory).record(count)
        return nil
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

/// How many push streams are open, in all and per client key, within their limits
/// (``RelayServerConfiguration/ConnectionLimits/pushStreams`` and `pushStreamsPerKey`). `Sendable`; the
/// counts sit behind a `Mutex`.
final class PushStreamCount: Sendable {
    private let counts = Mutex<(all: Int, perKey: [String: Int])>((0, [:]))
    private let total: Int
    private let perKey: Int

    init(limits: RelayServerConfiguration.ConnectionLimits) {
        total = limits.pushStreams
        perKey = limits.pushStreamsPerKey
    }

    /// Counts one more stream of `key` (`nil`: without keys, only the total holds); past a limit, why not.
    func admit(key: String?) -> ConnectionRefusal? {
        counts.withLock { counts in
            if counts.all >= total { return ConnectionRefusal(message: "Maximum number of push streams exceeded (\(total), limits.pushStreams).", reason: "push-streams") }
            if let key {
                let held = counts.perKey[key, default: 0]
                if held >= perKey {
                    return ConnectionRefusal(
                        message: "Maximum number of push streams exceeded for key \"\(key)\" (\(perKey), limits.pushStreamsPerKey).", reason: "push-streams " + key)
                }
                counts.perKey[key] = held + 1
            }
            counts.all += 1
            return nil
        }
    }

    func release(key: String?) {
        counts.withLock { counts in
            counts.all = max(counts.all - 1, 0)
            if let key {
                let next = counts.perKey[key, default: 0] - 1
                counts.perKey[key] = next > 0 ? next : nil
            }
        }
    }
}

/// Why a connection is refused at a limit: what its client is told, and the reason its log line is
/// throttled under (the server's ``ThrottledLog``): a literal, or one naming a configured key, so one client at its
/// limit hides no other key's refusals. Value type, `Sendable`.
struct ConnectionRefusal: Sendable {
    let message: String
    let reason: String
}

/// The places a connection took in the bounds it is admitted under, one after the other: the places taken
/// are given back together when it goes, or at once when a later bound refuses it. A value; `Sendable`.
struct Admission: Sendable {
    private var releases: [@Sendable () -> Void] = []

    /// One more bound: nil when `refusal` is (the place is then held, `release` gives it back with the
    /// others); else every place taken so far is given back and `refusal` returned.
    mutating func take(_ refusal: ConnectionRefusal?, release: @escaping @Sendable () -> Void) -> ConnectionRefusal? {
        guard let refusal else {
            releases.append(release)
            return nil
        }
        self.release()
        releases = []
        return refusal
    }

    /// Gives every place taken back, the last taken first.
    func release() {
        for release in releases.reversed() { release() }
    }
}
