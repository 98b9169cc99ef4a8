/// Why a frame could not be read. Carries the byte offset so a logged error points at the fault.
public struct WireError: Error, Sendable, Equatable, CustomStringConvertible {
    public var offset: Int
    public var reason: String

    public init(offset: Int, reason: String) {
        self.offset = offset
        self.reason = reason
    }

    public var description: String { "malformed frame at byte \(offset): \(reason)" }
}
