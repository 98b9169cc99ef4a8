import NIOCore
import NIOWebSocket
import Synchronization

/// Frames waiting to be written by one event loop, handed over by the tasks that drain subscribers'
/// hub streams (on the cooperative pool).
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

/// Whether a connection can take more bytes now, readable from any thread, and a wait for when it can
/// again: how a drain on the cooperative pool backs off a slow client, so the client's events pile up in
/// its own hub buffer and nowhere else. `Sendable` behind a `Mutex`; the handler sets it on its loop.
final class Writability: Sendable {
    private let state = Mutex<(writable: Bool, closed: Bool, waiter: CheckedContinuation<Void, Never>?)>((true, false, nil))

    var isClosed: Bool { state.withLock { $0.closed } }

    /// Returns at once while writable (or closed), else when that changes.
    func waitUntilWritable() async {
        // The usual case costs a lock, not a suspension (a continuation resumed at once still goes
        // through the executor's queue).
        guard !state.withLock({ $0.writable || $0.closed }) else { return }
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let ready = state.withLock { state -> Bool in
                if state.writable || state.closed { return true }
                state.waiter = continuation
                return false
            }
            if ready { continuation.resume() }
        }
    }

    func set(writable: Bool) {
        let waiter = state.withLock { state -> CheckedContinuation<Void, Never>? in
            state.writable = writable
            guard writable else { return nil }
            defer { state.waiter = nil }
            return state.waiter
        }
        waiter?.resume()
    }

    func close() {
        let waiter = state.withLock { state -> CheckedContinuation<Void, Never>? in
            state.closed = true
            defer { state.waiter = nil }
            return state.waiter
        }
        waiter?.resume()
    }
}
