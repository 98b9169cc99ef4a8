import Foundation

#if canImport(Glibc)
    import Glibc
#endif

/// A `nats-server` with JetStream, in a process of its own on a loopback port it picks itself, for
/// `relay bench cluster` and the cluster tests. Stopped by its own process id.
public final class NATSServerProcess: Sendable {
    public let process: Process
    public let storeDirectory: String
    private let log = ChildOutput(name: "nats")

    public struct StartError: Error, CustomStringConvertible {
        public var description: String
    }

    /// Where Debian's `nats-server` lives, if installed.
    public static var binary: String? {
        let candidates =
            (ProcessInfo.processInfo.environment["PATH"] ?? "").split(separator: ":").map { "\($0)/nats-server" }
            + ["/usr/sbin/nats-server", "/usr/bin/nats-server"]
        return candidates.first { FileManager.default.isExecutableFile(atPath: $0) }
    }

    /// - Parameters:
    ///   - port: the port to listen on; `nil` lets the server pick a free one.
    ///   - configFile: a nats-server configuration file (TLS, accounts, permissions); the flags above
    ///     still set the address, port and store.
    public init(port: Int? = nil, configFile: String? = nil) throws {
        guard let binary = Self.binary else {
            throw StartError(description: "nats-server is not installed (Debian: apt-get install nats-server; scripts/test does)")
        }
        storeDirectory = FileManager.default.temporaryDirectory.appendingPathComponent("relay-nats-\(UUID().uuidString)").path
        process = Process()
        process.executableURL = URL(fileURLWithPath: binary)
        // -p -1: a random free port, which the server logs.
        process.arguments =
            (configFile.map { ["-c", $0] } ?? []) + ["-js", "-a", "127.0.0.1", "-p", port.map(String.init) ?? "-1", "-sd", storeDirectory]
        process.standardError = log.handle
        process.standardOutput = log.handle
    }

    /// Starts the server and waits until it listens; returns its `nats://` URL.
    public func start(timeout: Duration = .seconds(15)) async throws -> String {
        try process.run()
        let deadline = ContinuousClock.now + timeout
        while ContinuousClock.now < deadline {
            let text = log.text
            if let range = text.range(of: #"Listening for client connections on 127\.0\.0\.1:(\d+)"#, options: .regularExpression),
                let port = text[range].split(separator: ":").last.flatMap({ Int($0) }),
                text.contains("Server is ready")
            {
                return "nats://127.0.0.1:\(port)"
            }
            guard process.isRunning else { break }
            try await Task.sleep(for: .milliseconds(20))
        }
        throw StartError(description: "nats-server did not start; it logged:\n\(log.text)")
    }

    /// Stops the server (SIGTERM, then SIGKILL) and removes its store.
    public func stop() async {
        if process.isRunning {
            process.terminate()
            let deadline = ContinuousClock.now + .seconds(5)
            // Cancelled, it kills at once rather than spin.
            while process.isRunning, ContinuousClock.now < deadline, (try? await Task.sleep(for: .milliseconds(20))) != nil {}
            if process.isRunning { kill(process.processIdentifier, SIGKILL) }
        }
        try? FileManager.default.removeItem(atPath: storeDirectory)
    }

    /// The server's log so far.
    public var output: String { log.text }

    /// Not stopped (a test that threw before its `stop`, a failed `#require`): killed by its own process
    /// id, its store removed, so no server outlives its owner.
    deinit {
        if process.isRunning { kill(process.processIdentifier, SIGKILL) }
        try? FileManager.default.removeItem(atPath: storeDirectory)
    }
}
