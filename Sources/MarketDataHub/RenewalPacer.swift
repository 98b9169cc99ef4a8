import MarketCore

/// When a source asks its upstream for folded topics whole again (Alpaca sends a book whole after a
/// subscribe, so the topic is unsubscribed and subscribed again): a topic not whole for ``grace`` (its
/// vendor's whole state may be on its way) is due, then again every ``interval`` while it stays so, at
/// most ``batch`` a round. Value type; its owner's loop keeps it.
public struct RenewalPacer: Sendable {
    public var grace: Duration = .seconds(2)
    public var interval: Duration = .seconds(10)
    public var batch = 100
    private var since: [Topic: ContinuousClock.Instant] = [:]
    private var renewed: [Topic: ContinuousClock.Instant] = [:]

    public init() {}

    /// The topics of `notWhole` to renew now.
    public mutating func due(_ notWhole: [Topic], now: ContinuousClock.Instant = .now) -> Set<Topic> {
        let current = Set(notWhole)
        since = since.filter { current.contains($0.key) }
        renewed = renewed.filter { current.contains($0.key) }
        var due: Set<Topic> = []
        for topic in notWhole {
            let first = since[topic] ?? now
            since[topic] = first
            guard now - first >= grace else { continue }
            if let last = renewed[topic], now - last < interval { continue }
            renewed[topic] = now
            due.insert(topic)
            if due.count >= batch { break }
        }
        return due
    }
}
