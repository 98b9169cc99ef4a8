/// What the hub does when a subscriber's buffer is full. Value type, `Sendable`.
public enum SlowConsumerPolicy: String, Sendable, CaseIterable {
    /// Drop the newest events for that subscriber, count them, and tell it how many once it has drained
    /// (a `lagging` status notice).
    case drop
    /// End the subscription: the relay tells the client why and closes with 1013 ("try again later").
    case disconnect
}
