import Dispatch
import NIOPosix

/// Work that blocks its thread (the disk, a C library waiting for a server) runs on threads made for
/// it, never on Swift's cooperative pool: that pool has one thread per core (two on a small machine),
/// and a task that blocks one of them stops every other task queued behind it, timers' wake-ups
/// included.
///
/// Not on `DispatchQueue.global()` either: on Linux its threads also fire every `Task.sleep` of the
/// process, and sixteen calls held there for a second delayed a 100 ms sleep by 14 s.
///
/// The work always runs, once, even when the caller is cancelled meanwhile (a save at shutdown must
/// not be skipped), and its caller is always answered.
public enum BlockingWork {
    /// Runs `work` in `pool` (NIO's shared blocking pool unless told) and returns what it returned or
    /// threw. Work past the pool's threads waits its turn in the pool's queue. The pool must have been
    /// started and not shut down: NIO runs work given to any other pool on the caller's own thread.
    public static func run<T: Sendable, Failure: Error>(
        in pool: NIOThreadPool = .singleton, _ work: @escaping @Sendable () throws(Failure) -> T
    ) async throws(Failure) -> T {
        let result = await withCheckedContinuation { (continuation: CheckedContinuation<Result<T, Failure>, Never>) in
            // NIO runs each item once; `.cancelled` only before the pool started or after it shut down
            // (the relay's pools start when made and are never shut down): the work runs either way.
            pool.submit { _ in continuation.resume(returning: Result { () throws(Failure) -> T in try work() }) }
        }
        return try result.get()
    }

    /// Runs `work` on `queue` (a serial queue: a thread of its own for work that must never wait behind
    /// others) and returns what it returned or threw.
    public static func run<T: Sendable, Failure: Error>(
        on queue: DispatchQueue, _ work: @escaping @Sendable () throws(Failure) -> T
    ) async throws(Failure) -> T {
        let result = await withCheckedContinuation { (continuation: CheckedContinuation<Result<T, Failure>, Never>) in
            queue.async { continuation.resume(returning: Result { () throws(Failure) -> T in try work() }) }
        }
        return try result.get()
    }
}
