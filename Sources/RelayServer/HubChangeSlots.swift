import NIOCore

/// How many connections of one event loop may have hub changes under way at once (``MarketConnection``:
/// joining, subscribing, leaving). Each under way holds a task (some 1.7 KB while it waits for the hub);
/// a burst of 10,000 clients subscribing at once held 10,000 of them, 12 MB for a moment. Past the
/// limit a connection waits in line, without a task, and is started when one under way finishes.
///
/// A tagged session's shelve does not wait: it is started at once, over the limit, since a new
/// connection taking over the session waits for it (holding its own slot meanwhile). Nothing else
/// waits for another connection's changes, so the line always moves.
///
/// Event-loop confined (not `Sendable`): reached through ``PerLoop``, on its loop.
final class HubChangeSlots<Connection: AnyObject> {
    /// Connections with changes under way at most (shelving ones aside).
    let limit: Int
    private(set) var running = 0
    private var waiting = CircularBuffer<Connection>()

    init(limit: Int) {
        self.limit = max(limit, 1)
    }

    /// How many wait for a slot.
    var waitingCount: Int { waiting.count }

    /// Whether `connection` may start now (`urgent`: whatever the limit); if not, it waits in line and
    /// ``finished()`` hands it back when a slot is free.
    func start(_ connection: Connection, urgent: Bool) -> Bool {
        guard urgent || running < limit else {
            waiting.append(connection)
            return false
        }
        running += 1
        return true
    }

    /// `connection`, waiting in line, must start now (its session is shelved): it leaves the line, over the limit.
    func startNow(_ connection: Connection) {
        if let index = waiting.firstIndex(where: { $0 === connection }) { waiting.remove(at: index) }
        running += 1
    }

    /// A connection's changes are done: the next one in line, if a slot is free, to start now (its slot taken).
    func finished() -> Connection? {
        running -= 1
        guard running < limit, let next = waiting.popFirst() else { return nil }
        running += 1
        return next
    }
}
