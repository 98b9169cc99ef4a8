import Foundation
import RelayComposition
import RelayConfiguration
import Testing

/// Whether Polygon's official Python client can be imported here. `scripts/test` installs it and sets
/// RELAY_REQUIRE_INTEROP=1, which turns a missing client into a failure instead of a skip.
let pythonClientAvailable: Bool = {
    if ProcessInfo.processInfo.environment["RELAY_REQUIRE_INTEROP"] == "1" { return true }
    let process = Process()
    process.executableURL = URL(fileURLWithPath: "/usr/bin/env")
    process.arguments = ["python3", "-c", "import polygon"]
    process.standardOutput = FileHandle.nullDevice
    process.standardError = FileHandle.nullDevice
    do {
        try process.run()
        process.waitUntilExit()
        return process.terminationStatus == 0
    } catch {
        return false
    }
}()

let interopScript = URL(fileURLWithPath: #filePath)
    .deletingLastPathComponent().deletingLastPathComponent()
    .appendingPathComponent("Interop/official_python_client.py").path

/// Runs the interop script; returns its exit status and output. Bounded by `timeout`.
func runPythonClient(_ arguments: [String], timeout: Duration = .seconds(40)) async throws -> (status: Int32, output: String) {
    try await runPython(interopScript, arguments, timeout: timeout)
}

/// Runs a Python script; returns its exit status and output. Bounded by `timeout`.
func runPython(_ script: String, _ arguments: [String], timeout: Duration, python: String = "python3") async throws -> (status: Int32, output: String) {
    try await runProcess("/usr/bin/env", [python, script] + arguments, timeout: timeout, what: "the Python client to finish")
}

/// Runs a program (in `directory`, if given); returns its exit status and output (stdout and stderr),
/// read while it runs so a long report cannot block it on a full pipe. Bounded by `timeout`.
func runProcess(
    _ executable: String, _ arguments: [String], in directory: URL? = nil, timeout: Duration, what: String
) async throws -> (status: Int32, output: String) {
    let process = Process()
    process.executableURL = URL(fileURLWithPath: executable)
    process.arguments = arguments
    if let directory { process.currentDirectoryURL = directory }
    let pipe = Pipe()
    process.standardOutput = pipe
    process.standardError = pipe
    let (exited, exit) = AsyncStream.makeStream(of: Int32.self)
    process.terminationHandler = { exit.yield($0.terminationStatus) }
    try process.run()
    // On a thread of its own: a blocking read on a task would hold one of the cooperative pool's few
    // threads (two on a 2-core machine), and two programs read at once starved the relay under test.
    let reader = pipe.fileHandleForReading
    let (output, written) = AsyncStream.makeStream(of: String.self)
    Thread.detachNewThread {
        written.yield(String(decoding: reader.readDataToEndOfFile(), as: UTF8.self))
        written.finish()
    }
    do {
        let status = try await within(timeout, what) {
            for await status in exited { return status }
            return -1
        }
        var text = ""
        for await part in output { text += part }
        return (status, text)
    } catch {
        // What it printed says why it did not finish: read until its pipe closes after the stop (at
        // most 5 s: a child of its own may hold the pipe).
        process.terminate()
        let printed = try? await within(.seconds(5), "the output of a stopped program") {
            var text = ""
            for await part in output { text += part }
            return text
        }
        throw TimeoutError(description: "\(error); what it printed: \(printed.map { String($0.suffix(3000)) } ?? "(not read)")")
    }
}

@Suite(
    "Interop with Polygon's official clients",
    .enabled(if: pythonClientAvailable, "python3 -m pip install -r Tests/Interop/requirements.txt"))
struct InteropTests {
    @Test func theOfficialPythonClientReceivesWhatItSubscribedTo() async throws {
        let relay = Relay(settings: RelaySettings(listen: .init(host: "127.0.0.1", port: 0), clientKeys: ["py-key"]), logger: testLogger)
        try await withServices([relay]) {
            let parts = try await within(.seconds(10), "the relay to start") { try await relay.ready() }
            let result = try await runPythonClient([
                "--port", "\(parts.port)", "--key", "py-key", "--subscribe", "Q.AAPL,T.MSFT", "--count", "20",
            ])
            #expect(result.status == 0, "\(result.output)")
            // The client may hand over one more frame after it asked to close: at least 20.
            let summary = try #require(result.output.split(separator: "\n").last { $0.hasPrefix("{") })
            let object = try JSONSerialization.jsonObject(with: Data(summary.utf8)) as? [String: Any]
            let messages = object?["messages"] as? Int ?? 0
            let topics = Set(object?["topics"] as? [String] ?? [])
            #expect(messages >= 20)
            #expect(topics.isSubset(of: ["Q.AAPL", "T.MSFT"]))
        }
    }

    @Test func theOfficialPythonClientSeesAWrongKeyAsAnAuthError() async throws {
        let relay = Relay(settings: RelaySettings(listen: .init(host: "127.0.0.1", port: 0), clientKeys: ["py-key"]), logger: testLogger)
        try await withServices([relay]) {
            let parts = try await within(.seconds(10), "the relay to start") { try await relay.ready() }
            let result = try await runPythonClient(["--port", "\(parts.port)", "--key", "wrong", "--expect-auth-failure"])
            #expect(result.status == 0, "\(result.output)")
        }
    }

    @Test func theOfficialPythonClientConnectsOverTLSGivenTheCA() async throws {
        var settings = RelaySettings(listen: .init(host: "127.0.0.1", port: 0), clientKeys: ["py-key"])
        let certificate = try fixture("test-server.pem")
        settings.tls = .init(certificatePath: certificate, privateKeyPath: try fixture("test-server.key"))
        let relay = Relay(settings: settings, logger: testLogger)
        try await withServices([relay]) {
            let parts = try await within(.seconds(10), "the relay to start") { try await relay.ready() }
            let result = try await runPythonClient([
                "--port", "\(parts.port)", "--key", "py-key", "--subscribe", "Q.AAPL", "--count", "5", "--secure", "--ca", certificate,
            ])
            #expect(result.status == 0, "\(result.output)")
            // Without the CA the certificate is not trusted: the client fails instead of connecting.
            let untrusted = try await runPythonClient(["--port", "\(parts.port)", "--key", "py-key", "--count", "1", "--secure", "--timeout", "8"])
            #expect(untrusted.status != 0)
        }
    }
}
