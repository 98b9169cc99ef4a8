import MarketCore
import NIOCore

/// The leader's folded topics (order books) as it publishes their events: each one's whole state goes
/// to the last-value store in place of its last change (a change alone means nothing to a node that
/// starts on it), written with the other last values, so a node that begins receiving a book late takes
/// it whole from there and brings it up to date by position (``MarketDataHub/seed(_:)``).
///
/// A fold that is not whole (before the vendor's whole book, after a loss, once its topic left the
/// upstream set) empties its entry in the store: no node takes a book the leader cannot vouch for.
/// Held in the leader's lock: its folds are classes confined to it.
struct FoldedLastValues {
    private var folds: [Topic: any TopicFold] = [:]
    private var changed: Set<Topic> = []

    /// The most books kept; past it they start afresh (each whole again at its vendor's next reset).
    static let limit = 10_000

    mutating func apply(_ event: MarketEvent, folding: TopicFolding) {
        let topic = event.topic
        if folds[topic] == nil {
            if folds.count >= Self.limit {
                // Emptied in the store too (each is marked changed and has no fold left).
                interruptAll()
                folds.removeAll()
            }
            guard let fold = folding.fold(for: topic) else { return }
            folds[topic] = fold
        }
        folds[topic]?.apply(event)
        changed.insert(topic)
    }

    /// Events stopped (the upstream was lost, or events were dropped): nothing is vouched for.
    mutating func interruptAll() {
        for (topic, fold) in folds {
            fold.interrupt()
            changed.insert(topic)
        }
    }

    /// Topics no longer in the upstream set stop coming: their books are no longer vouched for.
    mutating func interrupt(outside upstream: Set<Topic>) {
        for (topic, fold) in folds where !upstream.contains(topic) && !upstream.contains(.wildcard(topic.eventType)) {
            fold.interrupt()
            changed.insert(topic)
            folds[topic] = nil
        }
    }

    /// The books it cannot vouch for (after a loss, an unreadable change): what the upstream is asked
    /// for whole again.
    func notWhole() -> [Topic] { folds.compactMap { $0.value.isWhole ? nil : $0.key } }

    /// What changed since the last call: each book whole, or empty bytes for one that is not.
    mutating func takeChanged() -> [(Topic, ByteBuffer)] {
        defer { changed.removeAll(keepingCapacity: true) }
        return changed.map { topic in (topic, folds[topic]?.whole()?.bytes ?? ByteBuffer()) }
    }
}
