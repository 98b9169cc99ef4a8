#if canImport(Glibc)
    import Glibc
#endif

extension Duration {
    /// Whole milliseconds (truncated).
    public var milliseconds: Int64 {
        let (seconds, attoseconds) = components
        return seconds * 1000 + attoseconds / 1_000_000_000_000_000
    }

    /// Seconds as a floating-point number (metrics, rates).
    public var seconds: Double {
        Double(components.seconds) + Double(components.attoseconds) / 1e18
    }
}

/// A monotonic clock in nanoseconds, cheap enough to read per message.
public enum MonotonicClock {
    public static func nanoseconds() -> UInt64 {
        var spec = timespec()
        clock_gettime(CLOCK_MONOTONIC, &spec)
        return UInt64(spec.tv_sec) * 1_000_000_000 + UInt64(spec.tv_nsec)
    }
}

/// Unix time in milliseconds, the unit Polygon timestamps and relay notices use.
public enum WallClock {
    /// Unix time in nanoseconds.
    public static func nowNanoseconds() -> Int64 {
        var spec = timespec()
        clock_gettime(CLOCK_REALTIME, &spec)
        return Int64(spec.tv_sec) * 1_000_000_000 + Int64(spec.tv_nsec)
    }

    public static func nowMilliseconds() -> Int64 {
        var spec = timespec()
        clock_gettime(CLOCK_REALTIME, &spec)
        return Int64(spec.tv_sec) * 1000 + Int64(spec.tv_nsec) / 1_000_000
    }
}

/// Calendar days as the REST APIs write them.
public enum CivilDay {
    /// `YYYY-MM-DD` as days since 1970-01-01 (Howard Hinnant's `days_from_civil`), `nil` if it is not one.
    public static func days(_ text: some StringProtocol) -> Int64? {
        let parts = text.split(separator: "-", omittingEmptySubsequences: false)
        guard parts.count == 3, parts[0].count == 4, parts[1].count == 2, parts[2].count == 2, let y = Int64(parts[0]), let m = Int64(parts[1]),
            let d = Int64(parts[2]), (1...12).contains(m), (1...31).contains(d)
        else { return nil }
        let year = m <= 2 ? y - 1 : y
        let era = (year >= 0 ? year : year - 399) / 400
        let yoe = year - era * 400
        let doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1
        let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy
        return era * 146_097 + doe - 719_468
    }
}
