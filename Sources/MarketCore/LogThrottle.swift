/// Lets a repeating log line through once per interval per reason, counting what it held back: what
/// outsiders can make happen as often as they like (a refused connection, a junk message) is logged a
/// line per reason per interval, never a line each. Value type, `Sendable`; its reasons are the
/// caller's literals (a few), never outsiders' text.
public struct LogThrottle: Sendable {
    private var lastLogged: [String: ContinuousClock.Instant] = [:]
    private var suppressed: [String: Int] = [:]

    public init() {}

    /// Whether to log `key` now, and how many occurrences were held back since it last was.
    public mutating func admit(_ key: String, every interval: Duration, now: ContinuousClock.Instant = .now) -> (log: Bool, suppressed: Int) {
        if let last = lastLogged[key], now - last < interval {
            suppressed[key, default: 0] += 1
            return (false, 0)
        }
        lastLogged[key] = now
        let held = suppressed.removeValue(forKey: key) ?? 0
        return (true, held)
    }
}
