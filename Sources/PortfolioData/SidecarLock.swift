import PortfolioDomain
import Foundation

#if canImport(Glibc)
    import Glibc
#endif

/// Makes sure one portfolio data directory has one valuation sidecar: an exclusive `flock` on
/// `sidecar.lock` beside the database, held while the sidecar runs and released by the kernel when the
/// process ends, however it ends. Two relays valuing the same book would write every daily snapshot
/// twice; in a cluster the sidecar runs on one node (see the README), and this refuses a second.
///
/// `Sendable`: the descriptor is immutable and closed once, when the lock is released (deinit).
public final class SidecarLock: Sendable {
    private let descriptor: Int32

    public struct Held: Error, Sendable, CustomStringConvertible {
        public var directory: String
        public var description: String {
            "the portfolio in \(directory) is already valued by another running relay (its sidecar holds \(directory)/sidecar.lock); "
                + "run the sidecar on one node only (--no-portfolio on the others) or give this one its own --data-dir"
        }
    }

    public init(directory: String) throws {
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        let path = (directory as NSString).appendingPathComponent("sidecar.lock")
        let descriptor = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0o644)
        guard descriptor >= 0 else { throw Held(directory: directory) }
        guard flock(descriptor, LOCK_EX | LOCK_NB) == 0 else {
            close(descriptor)
            throw Held(directory: directory)
        }
        self.descriptor = descriptor
    }

    deinit {
        close(descriptor)
    }
}
