import MarketCore

/// Answers of the cluster's last-value store (`/v1/last` on a node whose clients do not hold the
/// topic), kept for ``keepFor``: the leader writes the store every quarter second, so an answer that
/// young is no staler than the store itself, and clients polling the same topics cost one lookup a
/// topic a quarter second, not one each. Bounded in entries and in bytes; when full, what has aged out
/// is swept (at most once per ``keepFor``) and otherwise nothing more is kept. Value type, with the
/// clock passed in.
struct RecentLastValues {
    let keepFor: Duration
    let maxEntries: Int
    let maxBytes: Int
    private var entries: [Topic: (event: MarketEvent?, at: ContinuousClock.Instant)] = [:]
    private(set) var bytes = 0
    private var sweptAt: ContinuousClock.Instant?

    init(keepFor: Duration = .milliseconds(250), maxEntries: Int = 4_096, maxBytes: Int = 8 << 20) {
        self.keepFor = keepFor
        self.maxEntries = maxEntries
        self.maxBytes = maxBytes
    }

    var count: Int { entries.count }

    /// The answer for `topic` if one was given within ``keepFor`` (`.some(nil)`: the store had none);
    /// `nil` when there is no recent answer.
    mutating func answer(for topic: Topic, at now: ContinuousClock.Instant) -> MarketEvent?? {
        guard let entry = entries[topic] else { return nil }
        guard now - entry.at < keepFor else {
            forget(topic)
            return nil
        }
        return .some(entry.event)
    }

    /// Keeps the store's answer for `topic`, if there is room.
    mutating func remember(_ event: MarketEvent?, for topic: Topic, at now: ContinuousClock.Instant) {
        forget(topic)
        let size = event?.bytes.readableBytes ?? 0
        if entries.count >= maxEntries || bytes + size > maxBytes {
            guard sweptAt.map({ now - $0 >= keepFor }) ?? true else { return }
            sweptAt = now
            for (topic, entry) in entries where now - entry.at >= keepFor { forget(topic) }
            guard entries.count < maxEntries, bytes + size <= maxBytes else { return }
        }
        entries[topic] = (event, now)
        bytes += size
    }

    private mutating func forget(_ topic: Topic) {
        if let gone = entries.removeValue(forKey: topic) { bytes -= gone.event?.bytes.readableBytes ?? 0 }
    }
}
