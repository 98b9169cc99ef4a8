import NIOCore
import Synchronization

/// Deadlines of one fixed delay for every connection of one event loop: the ping of a quiet client
/// (``WebSocketConnectionHandler``), the sign-in timeout (``MarketConnection``).
///
/// Every entry waits the same delay, so entries come due in the order they were added: a queue in
/// arrival order and one NIO task armed for its head do what a scheduled task per connection did (a
/// task with its promise, closure and place in the loop's task heap, some 600 bytes a connection;
/// an entry here is 24). A target is held weakly: a connection that closes is not kept alive until
/// its entry comes due; the entry just drops off then. A target that wants another deadline (the next
/// ping) adds itself again when told.
///
/// Event-loop confined (not `Sendable`): reached through ``PerLoop``, on its loop.
final class LoopDeadlineQueue<Target: AnyObject> {
    private struct Entry {
        let due: NIODeadline
        weak var target: Target?
    }

    private let loop: any EventLoop
    private let delay: TimeAmount
    /// What a target is told when its deadline passes (on the loop).
    private let due: (Target) -> Void
    private var entries = CircularBuffer<Entry>()
    /// The task armed for the head's deadline (one at a time, `nil` while the queue is empty).
    private var armed: Scheduled<Void>?

    init(loop: any EventLoop, delay: TimeAmount, due: @escaping (Target) -> Void) {
        self.loop = loop
        self.delay = delay
        self.due = due
    }

    /// How many entries wait (those of closed targets too, until they come due).
    var count: Int { entries.count }

    /// `target` is told `delay` from now (once).
    func add(_ target: Target) {
        entries.append(Entry(due: loop.now + delay, target: target))
        if armed == nil { arm() }
    }

    private func arm() {
        guard let head = entries.first else {
            armed = nil
            return
        }
        armed = loop.assumeIsolated().scheduleTask(deadline: head.due) { [self] in self.fire() }
    }

    private func fire() {
        let now = loop.now
        while let head = entries.first, head.due <= now {
            entries.removeFirst()
            if let target = head.target { due(target) }
        }
        arm()
    }
}

/// One loop-confined `Value` per event loop of a group (a ``LoopDeadlineQueue``, the ``HubChangeSlots``),
/// made on first use, found by the loop.
final class PerLoop<Value>: Sendable {
    private let values = Mutex<[ObjectIdentifier: NIOLoopBound<Value>]>([:])
    private let make: @Sendable (any EventLoop) -> Value

    init(_ make: @escaping @Sendable (any EventLoop) -> Value) {
        self.make = make
    }

    /// The value of `loop`; called on that loop.
    func on(_ loop: any EventLoop) -> NIOLoopBound<Value> {
        values.withLock { values in
            if let value = values[ObjectIdentifier(loop)] { return value }
            let value = NIOLoopBound(make(loop), eventLoop: loop)
            values[ObjectIdentifier(loop)] = value
            return value
        }
    }
}
