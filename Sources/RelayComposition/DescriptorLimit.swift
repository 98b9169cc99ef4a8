#if canImport(Glibc)
import Glibc
#endif

/// The process's open-file limit. Each downstream client is a descriptor, and distributions start
/// processes with a soft limit (often 1,024) far below the hard one, so `relay serve` raises its soft
/// limit to the hard limit at start, as servers do.
public enum DescriptorLimit {
    /// Raises the soft limit to the hard one; returns the limit now in force.
    @discardableResult
    public static func raiseToHardLimit() -> Int {
        #if canImport(Glibc)
        var limit = rlimit()
        guard getrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit) == 0 else { return -1 }
        if limit.rlim_cur < limit.rlim_max {
            limit.rlim_cur = limit.rlim_max
            _ = setrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit)
            _ = getrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit)
        }
        return Int(clamping: limit.rlim_cur)
        #else
        return -1
        #endif
    }
}
