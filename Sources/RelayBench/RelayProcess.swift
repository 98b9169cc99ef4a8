import Foundation
import Synchronization

#if canImport(Glibc)
    import Glibc
#endif

/// The relay under test, in a process of its own, so its CPU time and memory are its own.
public final class RelayProcess: Sendable {
    public let process: Process
    private let stdout = ChildOutput(name: "relay")
    /// Its owner asked it to stop (``stop()``, ``kill()``, ``terminate()``): from then on its going is
    /// the owner's to wait for (a cluster test lets go of a node it sent SIGTERM, to see it fail over).
    private let stopAsked = Atomic<Bool>(false)

    public struct StartError: Error, CustomStringConvertible {
        public var description: String
    }

    /// - Parameters:
    ///   - captureLogs: keep the log (stderr) with the output, for ``output`` (instead of `showLogs`).
    ///   - environment: added to this process's environment.
    ///   - isolated: the relay reads none of this process's settings from the environment (the
    ///     variables named `RELAY_…` and the vendors' key variables): only `arguments` and
    ///     `environment` configure it. A benchmark's relay must not join an operator's cluster
    ///     (`RELAY_CLUSTER`), nor record into their tape (`RELAY_TAPE_DIR`).
    ///   - base: the environment the process starts from (this process's).
    public init(
        binary: String, arguments: [String], showLogs: Bool, captureLogs: Bool = false, environment: [String: String] = [:],
        isolated: Bool = false, inheriting base: [String: String] = ProcessInfo.processInfo.environment
    ) {
        process = Process()
        process.executableURL = URL(fileURLWithPath: binary)
        process.arguments = arguments
        process.standardOutput = stdout.handle
        process.standardError = captureLogs ? stdout.handle : showLogs ? FileHandle.standardError : FileHandle.nullDevice
        let inherited = isolated ? base.filter { !Self.isSetting($0.key) } : base
        process.environment = inherited.merging(environment) { $1 }
    }

    /// Whether the relay reads the environment variable `name` as a setting.
    public static func isSetting(_ name: String) -> Bool {
        name.hasPrefix("RELAY_") || ["POLYGON_API_KEY", "APCA_API_KEY_ID", "APCA_API_SECRET_KEY"].contains(name)
    }

    /// The port the banner names: `WebSocket  ws://127.0.0.1:PORT/stocks`.
    private var reportedPort: Int? {
        let all = stdout.text
        guard let range = all.range(of: #"WebSocket +wss?://[^ ]+:(\d+)/"#, options: .regularExpression) else { return nil }
        let match = all[range]
        guard let colon = match.dropLast().lastIndex(of: ":") else { return nil }
        return Int(match[match.index(after: colon)...].dropLast())
    }

    /// Starts the relay and waits (at most `timeout`) until it prints its port.
    public func start(timeout: Duration = .seconds(30)) async throws -> Int {
        try process.run()
        let deadline = ContinuousClock.now + timeout
        while ContinuousClock.now < deadline {
            if let port = reportedPort { return port }
            guard process.isRunning else { break }
            try await Task.sleep(for: .milliseconds(20))
        }
        throw StartError(description: "the relay did not report its port; it printed:\n\(stdout.text)")
    }

    /// CPU seconds (user + system) the relay has used.
    public func cpuSeconds() -> Double {
        guard let stat = try? String(contentsOfFile: "/proc/\(process.processIdentifier)/stat", encoding: .utf8),
            let close = stat.lastIndex(of: ")")
        else { return 0 }
        let fields = stat[stat.index(after: close)...].split(separator: " ")
        // After the command: state is field 3, utime 14, stime 15 (1-based) → offsets 11 and 12.
        guard fields.count > 12, let user = Double(fields[11]), let system = Double(fields[12]) else { return 0 }
        return (user + system) / Double(sysconf(Int32(_SC_CLK_TCK)))
    }

    /// The relay's peak resident memory, in bytes.
    public func peakResidentBytes() -> Int { statusField("VmHWM") }

    /// The relay's resident memory now, in bytes.
    public func residentBytes() -> Int { statusField("VmRSS") }

    private func statusField(_ name: String) -> Int {
        guard let status = try? String(contentsOfFile: "/proc/\(process.processIdentifier)/status", encoding: .utf8) else { return 0 }
        for line in status.split(separator: "\n") where line.hasPrefix(name + ":") {
            let digits = line.split(separator: " ").compactMap { Int($0) }.first ?? 0
            return digits * 1024
        }
        return 0
    }

    /// SIGTERM, then wait for the exit (bounded).
    public func stop() async {
        stopAsked.store(true, ordering: .relaxed)
        guard process.isRunning else { return }
        process.terminate()
        let deadline = ContinuousClock.now + .seconds(10)
        // Cancelled (a test's clean-up after its time limit), it kills at once rather than spin.
        while process.isRunning, ContinuousClock.now < deadline, (try? await Task.sleep(for: .milliseconds(20))) != nil {}
        if process.isRunning { Glibc.kill(process.processIdentifier, SIGKILL) }
    }

    /// SIGKILL: the process dies at once, as in a crash; waits (bounded) until it is gone.
    public func kill() async {
        stopAsked.store(true, ordering: .relaxed)
        guard process.isRunning else { return }
        Glibc.kill(process.processIdentifier, SIGKILL)
        let deadline = ContinuousClock.now + .seconds(10)
        while process.isRunning, ContinuousClock.now < deadline, (try? await Task.sleep(for: .milliseconds(10))) != nil {}
    }

    /// SIGTERM without waiting.
    public func terminate() {
        stopAsked.store(true, ordering: .relaxed)
        if process.isRunning { process.terminate() }
    }

    /// Never asked to stop (a test that threw before its `stop`, a failed `#require`): killed by its own
    /// process id, so no relay outlives its owner. One asked to stop is left to finish as asked.
    deinit {
        if !stopAsked.load(ordering: .relaxed), process.isRunning { Glibc.kill(process.processIdentifier, SIGKILL) }
    }

    /// What the relay printed on standard output so far (and its log, with `captureLogs`).
    public var output: String { stdout.text }

    /// The relay executable beside the running one (`relay`, or a test bundle in the same build folder),
    /// or `RELAY_BINARY`.
    public static func siblingBinary() -> String {
        if let path = ProcessInfo.processInfo.environment["RELAY_BINARY"], !path.isEmpty { return path }
        let me = (try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe")) ?? CommandLine.arguments[0]
        return URL(fileURLWithPath: me).deletingLastPathComponent().appendingPathComponent("relay").path
    }
}
