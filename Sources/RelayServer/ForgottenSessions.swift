import MarketCore
import NIOCore
import Synchronization

/// Tagged sessions let go before their window ended: pushed off a full shelf (``ResumeSettings/sessions``
/// per market, a tenth of it per key), or not restored whole after a restart (past the resume's bound on
/// sessions, or topics past their key's limits). A reconnect under such a name is told `gap` for the
/// topics it had, as they are subscribed, rather than subscribed as if nothing had been missed. Each is
/// kept until its session's window would have ended; at most ``ResumeSettings/sessions`` names and
/// ``mostTopics`` topics in all, the oldest let go first. `Sendable` behind a `Mutex`.
final class ForgottenSessions: Sendable {
    struct Forgotten: Sendable, Equatable {
        var topics: Set<Topic>
        var why: String
    }

    private struct Table {
        var entries: [String: (forgotten: Forgotten, until: ContinuousClock.Instant, stamp: UInt64)] = [:]
        var order = CircularBuffer<(name: String, stamp: UInt64)>()
        var topics = 0
        var stamps: UInt64 = 0

        mutating func remove(_ name: String) -> Forgotten? {
            guard let entry = entries.removeValue(forKey: name) else { return nil }
            topics -= entry.forgotten.topics.count
            return entry.forgotten
        }

        /// Lets go of the oldest while past the bounds, and of those whose window has ended.
        mutating func trim(names: Int, topics mostTopics: Int, now: ContinuousClock.Instant) {
            while let oldest = order.first {
                guard let entry = entries[oldest.name], entry.stamp == oldest.stamp else {
                    order.removeFirst()
                    continue
                }
                guard entries.count > names || topics > mostTopics || entry.until <= now else { break }
                _ = remove(oldest.name)
                order.removeFirst()
            }
        }
    }

    /// Topics kept in all, at most (a name's own are cut to it).
    static let mostTopics = 1_000_000

    private let names: Int
    private let table = Mutex(Table())

    init(names: Int) {
        self.names = max(names, 1)
    }

    /// `name`'s session was let go with `topics`, for `why`; a reconnect until `until` is told so
    /// (with what is known of it already).
    func forget(_ name: String, topics: Set<Topic>, why: String, until: ContinuousClock.Instant, now: ContinuousClock.Instant = .now) {
        guard !topics.isEmpty, until > now else { return }
        table.withLock { table in
            // What is known of it already, unless its own window has ended.
            let known = table.entries[name].flatMap { $0.until > now ? $0.forgotten : nil }
            _ = table.remove(name)
            var forgotten = known ?? Forgotten(topics: [], why: why)
            forgotten.topics.formUnion(topics.prefix(Self.mostTopics - forgotten.topics.count))
            forgotten.why = why
            table.stamps += 1
            table.entries[name] = (forgotten, until, table.stamps)
            table.topics += forgotten.topics.count
            table.order.append((name, table.stamps))
            table.trim(names: names, topics: Self.mostTopics, now: now)
        }
    }

    /// What was let go of `name`'s session, once (nothing past its window).
    func take(_ name: String, now: ContinuousClock.Instant = .now) -> Forgotten? {
        table.withLock { table in
            table.trim(names: names, topics: Self.mostTopics, now: now)
            // Windows do not end in the order they were let go: one may be past its own here.
            let until = table.entries[name]?.until
            let forgotten = table.remove(name)
            guard let until, until > now else { return nil }
            return forgotten
        }
    }

    /// Names kept now.
    var count: Int { table.withLock { $0.entries.count } }
}
