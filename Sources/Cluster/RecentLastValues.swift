import MarketCore

/// Answers of the cluster's last-value store (`/v1/last` on a node whose clients do not hold the
/// topic), kept for ``keepFor`` from when the store was asked: the leader writes the store every
/// quarter second, so an answer that young is no staler than the store itself, and clients polling the
/// same topics cost one lookup a topic a quarter second, not one each. Bounded in entries and in bytes;
/// what has aged out is swept at most once per ``keepFor``, on any use, and when full nothing more is
/// kept. Value type, with the clock passed in.
struct RecentLastValues {
    let keepFor: Duration
    let maxEntries: Int
    let maxBytes: Int
    private var entries: [Topic: (event: MarketEvent?, at: ContinuousClock.Instant)] = [:]
    private(set) var bytes = 0
    private var sweptAt: ContinuousClock.Instant?

    init(keepFor: Duration = .milliseconds(250), maxEntries: Int = 4_096, maxBytes: Int = 4 << 20) {
        self.keepFor = keepFor
        self.maxEntries = maxEntries
        self.maxBytes = maxBytes
    }

    var count: Int { entries.count }

    /// The answer for `topic` if the store was asked within ``keepFor`` (`.some(nil)`: it had none);
    /// `nil` when there is no recent answer.
    mutating func answer(for topic: Topic, at now: ContinuousClock.Instant) -> MarketEvent?? {
        sweepIfDue(at: now)
        guard let entry = entries[topic] else { return nil }
        guard now - entry.at < keepFor else {
            forget(topic)
            return nil
        }
        return .some(entry.event)
    }

    /// Keeps the store's answer for `topic`, asked at `asked`, if there is room.
    mutating func remember(_ event: MarketEvent?, for topic: Topic, at asked: ContinuousClock.Instant, now: ContinuousClock.Instant) {
        forget(topic)
        sweepIfDue(at: now)
        let size = event?.bytes.readableBytes ?? 0
        guard now - asked < keepFor, entries.count < maxEntries, bytes + size <= maxBytes else { return }
        entries[topic] = (event, asked)
        bytes += size
    }

    private mutating func sweepIfDue(at now: ContinuousClock.Instant) {
        guard !entries.isEmpty, sweptAt.map({ now - $0 >= keepFor }) ?? true else { return }
        sweptAt = now
        for (topic, entry) in entries where now - entry.at >= keepFor { forget(topic) }
    }

    private mutating func forget(_ topic: Topic) {
        if let gone = entries.removeValue(forKey: topic) { bytes -= gone.event?.bytes.readableBytes ?? 0 }
    }
}
