/// Identifies one subscriber of the hub for its lifetime. Value type, `Sendable`.
public struct SubscriberID: Hashable, Sendable, CustomStringConvertible {
    public let rawValue: UInt64

    init(_ rawValue: UInt64) {
        self.rawValue = rawValue
    }

    public var description: String { "sub-\(rawValue)" }
}
