#if canImport(Glibc)
import Glibc
#endif
import ServiceLifecycle

/// Gives the pages malloc holds free back to the system every minute (glibc's `malloc_trim`).
///
/// The history frees its oldest buffers as new ones come, all day; freed memory between live
/// allocations stays resident unless malloc is asked to release it, so without this the process's
/// RSS creeps above what the history counts (about 25 MB an hour at 5,000 events/s, measured with
/// `scripts/soak`). A trim walks malloc's free lists once: milliseconds a minute.
struct MemoryTrim: Service {
    var interval: Duration = .seconds(60)

    func run() async {
        #if canImport(Glibc)
        // `malloc.h` is not in Swift's Glibc module: looked up by name (absent on another libc).
        guard let symbol = dlsym(UnsafeMutableRawPointer(bitPattern: 0), "malloc_trim") else { return }
        let trim = unsafeBitCast(symbol, to: (@convention(c) (Int) -> Int32).self)
        await cancelWhenGracefulShutdown {
            while !Task.isCancelled {
                try? await Task.sleep(for: interval)
                if Task.isCancelled { break }
                _ = trim(0)
            }
        }
        #endif
    }
}
