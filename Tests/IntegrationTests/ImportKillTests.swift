import Foundation
import Portfolio
import PortfolioData
import RelayBench
import Testing

/// `relay portfolio import` is all or nothing, even when the process is killed while it writes.
@Suite("Import killed midway")
struct ImportKillTests {
    /// The import reads its file whole: a device or a pipe (read until memory runs out) is refused, named.
    @Test func anImportOfWhatIsNoRegularFileIsRefused() throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("relay-import-zero-\(UUID().uuidString)").path
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let ended = try runRelayCommand(["portfolio", "import", "/dev/zero", "--data-dir", directory])
        #expect(ended.status != 0 && ended.output.contains("/dev/zero is not a regular file"), "\(ended.output)")
        // A link to a file (a mounted configuration's) is followed.
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        try "account,date,kind,symbol,quantity,price,fees,amount\nA,2024-01-01,deposit,,,,,100\n".write(toFile: directory + "/real.csv", atomically: true, encoding: .utf8)
        try FileManager.default.createSymbolicLink(atPath: directory + "/linked.csv", withDestinationPath: directory + "/real.csv")
        let linked = try runRelayCommand(["portfolio", "import", directory + "/linked.csv", "--data-dir", directory + "/data"])
        #expect(linked.status == 0 && linked.output.contains("imported 1 transactions"), "\(linked.output)")
    }

    @Test func anImportKilledWhileWritingLeavesNothing() async throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("relay-import-kill-\(UUID().uuidString)").path
        defer { try? FileManager.default.removeItem(atPath: directory) }
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        // Large enough to report its progress a few times before it commits.
        var csv = "account,date,kind,symbol,quantity,price,fees,amount\nBig,2024-01-02,deposit,,,,,100000000\n"
        for index in 0..<40_000 { csv += "Big,2024-01-03,buy,S\(index % 50),1,10.25,0.5,\n" }
        let file = directory + "/big.csv"
        try csv.write(toFile: file, atomically: true, encoding: .utf8)
        let data = directory + "/data"

        let process = Process()
        process.executableURL = URL(fileURLWithPath: RelayProcess.siblingBinary())
        process.arguments = ["portfolio", "import", file, "--data-dir", data]
        process.standardOutput = FileHandle.nullDevice
        let errors = Pipe()
        process.standardError = errors
        try process.run()
        // The import reports its progress inside its one transaction: the first report means rows are
        // written and not committed.
        let firstReport = Task.detached { errors.fileHandleForReading.availableData }
        let report = String(decoding: try await within(.seconds(120), "the import's first progress report") { await firstReport.value }, as: UTF8.self)
        #expect(report.contains("rows written"), "\(report)")
        try #require(process.isRunning, "the import finished before it could be killed: make the file larger")
        kill(process.processIdentifier, SIGKILL)
        process.waitUntilExit()
        #expect(process.terminationReason == .uncaughtSignal)

        // Reopened (SQLite rolls the torn transaction back): nothing of it, not even its account.
        let store = try PortfolioStore(directory: data)
        #expect(try await store.accounts().isEmpty)
    }
}
