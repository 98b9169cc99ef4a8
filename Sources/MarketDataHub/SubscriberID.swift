import Synchronization

/// Identifies one subscriber for its lifetime, unique across every hub of the process (a relay runs a
/// hub per market, and a consumer that reads several hubs' subscriptions, such as a loop's drain, keys
/// them by this). Value type, `Sendable`.
public struct SubscriberID: Hashable, Sendable, CustomStringConvertible {
    public let rawValue: UInt64

    private static let next = Atomic<UInt64>(1)

    init(_ rawValue: UInt64) {
        self.rawValue = rawValue
    }

    /// A new identifier, never handed out before in this process.
    package static func make() -> SubscriberID {
        SubscriberID(next.wrappingAdd(1, ordering: .relaxed).oldValue)
    }

    public var description: String { "sub-\(rawValue)" }
}
