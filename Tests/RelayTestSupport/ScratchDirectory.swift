import Foundation

/// A path for a test's own directory under the system's temporary one, `relay-<name>-<uuid>` (not made:
/// the code under test makes it; the test removes it).
public func scratchDirectory(_ name: String) -> String {
    FileManager.default.temporaryDirectory.appendingPathComponent("relay-\(name)-\(UUID().uuidString)").path
}
