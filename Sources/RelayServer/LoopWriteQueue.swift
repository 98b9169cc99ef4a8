import NIOCore
import NIOWebSocket
import Synchronization

/// Frames waiting to be written by one event loop, handed over by the tasks that drain subscribers'
/// hub streams (``ClientDrain``, on the cooperative pool).
///
/// One per event loop. A publish wakes the drains of many subscribers at once; each hands its frames
/// here, and the loop is woken once to write them all, instead of once per subscriber (each wake-up is
/// a system call and a thread switch, more than the write itself costs). `Sendable`: the queue is
/// behind a `Mutex`; the handlers it holds are only touched on their loop (`NIOLoopBound`).
final class LoopWriteQueue: Sendable {
    struct Item {
        let handler: NIOLoopBound<WebSocketConnectionHandler>
        let frames: [ByteBuffer]
        /// Close with this code after the frames (a client the hub evicted).
        let close: (code: WebSocketErrorCode, reason: String)?
    }

    let loop: any EventLoop
    private let pending = Mutex<(items: [Item], scheduled: Bool)>(([], false))

    init(loop: any EventLoop) {
        self.loop = loop
    }

    /// Queues frames for a connection of this loop; they are written, in order per connection, on the
    /// loop's next pass.
    func submit(_ item: Item) {
        let schedule = pending.withLock { state -> Bool in
            state.items.append(item)
            defer { state.scheduled = true }
            return !state.scheduled
        }
        if schedule { loop.execute { self.writeAll() } }
    }

    private func writeAll() {
        let items = pending.withLock { state -> [Item] in
            state.scheduled = false
            defer { state.items = [] }
            return state.items
        }
        for item in items {
            let handler = item.handler.value
            for frame in item.frames { handler.write(frame, flush: false) }
            handler.flush()
            if let close = item.close { handler.close(code: close.code, reason: close.reason) }
        }
    }

    /// One queue per event loop of a group, found by the loop.
    final class PerLoop: Sendable {
        private let queues = Mutex<[ObjectIdentifier: LoopWriteQueue]>([:])

        func queue(for loop: any EventLoop) -> LoopWriteQueue {
            queues.withLock { queues in
                if let queue = queues[ObjectIdentifier(loop)] { return queue }
                let queue = LoopWriteQueue(loop: loop)
                queues[ObjectIdentifier(loop)] = queue
                return queue
            }
        }
    }
}

/// Whether a connection can take more bytes now, readable from any thread: the handler sets it on its
/// loop, the client's drain checks it before taking events, and is told when it turns writable again. `Sendable` behind a `Mutex`.
final class Writability: Sendable {
    private let writable = Atomic<Bool>(true)
    private let closed = Atomic<Bool>(false)
    private let whenWritable = Mutex<(@Sendable () -> Void)?>(nil)

    var isWritable: Bool { writable.load(ordering: .acquiring) && !closed.load(ordering: .acquiring) }
    var isClosed: Bool { closed.load(ordering: .acquiring) }

    /// Called each time the connection turns writable again, and when it closes.
    func onWritable(_ action: @escaping @Sendable () -> Void) {
        whenWritable.withLock { $0 = action }
    }

    func set(writable isWritable: Bool) {
        let was = writable.exchange(isWritable, ordering: .acquiringAndReleasing)
        if isWritable, !was { whenWritable.withLock { $0 }?() }
    }

    func close() {
        closed.store(true, ordering: .releasing)
        whenWritable.withLock { action in
            defer { action = nil }
            return action
        }?()
    }
}
