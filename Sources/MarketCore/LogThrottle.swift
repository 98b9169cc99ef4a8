import Logging
import Synchronization

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

/// A log whose lines of one reason go out at most once per interval, each with how many of them were held
/// back (`suppressed_since_last`): for what outsiders (a client, a REST host, a NATS publisher, the
/// upstream) can make happen as often as they like. `Sendable`: the throttle sits behind a `Mutex`.
public final class ThrottledLog: Sendable {
    private let throttle = Mutex(LogThrottle())
    private let interval: Duration

    public init(every interval: Duration = .seconds(10)) {
        self.interval = interval
    }

    /// Logs `message` to `logger` at `level` unless a line of `reason` (a literal, or one naming a
    /// configured key: a bounded set) went out in the last interval. The message and its metadata are made
    /// only for a line that goes out.
    public func log(
        _ level: Logger.Level, _ reason: String, _ message: @autoclosure () -> Logger.Message,
        metadata: @autoclosure () -> Logger.Metadata = [:], to logger: Logger
    ) {
        let (log, held) = throttle.withLock { $0.admit(reason, every: interval) }
        guard log else { return }
        var fields = metadata()
        if held > 0 { fields["suppressed_since_last"] = "\(held)" }
        logger.log(level: level, message(), metadata: fields)
    }
}
