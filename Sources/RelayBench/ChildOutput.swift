import Foundation

/// Where a child process's output goes: a temporary file, read back on demand.
///
/// A file rather than a pipe with a `readabilityHandler`: that handler is a dispatch source on the
/// pipe's descriptor, and freeing the pipe while the source is live crashed libdispatch when tests
/// started and dropped many child processes. `Sendable`: only immutable paths and handles.
final class ChildOutput: Sendable {
    let path: String
    let handle: FileHandle

    init(name: String) {
        path = FileManager.default.temporaryDirectory.appendingPathComponent("relay-\(name)-\(UUID().uuidString).log").path
        _ = FileManager.default.createFile(atPath: path, contents: nil)
        handle = FileHandle(forWritingAtPath: path) ?? FileHandle.nullDevice
    }

    /// Everything written so far.
    var text: String {
        (try? String(contentsOfFile: path, encoding: .utf8)) ?? ""
    }

    deinit {
        try? handle.close()
        try? FileManager.default.removeItem(atPath: path)
    }
}
