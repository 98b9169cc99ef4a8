import MarketDataHub
import NIOCore
import NIOWebSocket
import PolygonWire
import Synchronization

/// Moves what the hub queued for one client into its connection, with a task only while there is
/// something to move.
///
/// The client's events arrive on its own hub subscription (an `AsyncStream`, `.bufferingOldest(1000)`,
/// filtered by symbol). Instead of a task waiting in that stream for the connection's whole life (a
/// task and its frames are about 2.7 KB, most of an idle client's cost), the hub tells the drain when
/// it queued something (``kick()``), and a short task reads everything queued (the read never waits:
/// it only runs while ``HubSubscription/hasQueued``), encodes it as one frame of the upstream's own
/// bytes (several only past 1,000,000 bytes), hands it to the loop's ``LoopWriteQueue``, and ends. A
/// busy client keeps its task for as long as events keep coming. A connection that is not writable is
/// left alone until it is (its events wait in its own bounded hub buffer), so a slow client never
/// holds up the others.
///
/// An actor, so the stream's reader is its state between tasks; `running` (an atomic, so the hub's
/// kick stays synchronous) keeps it to one task at a time. A default actor: the stream's read can run
/// inline on the same thread, with no hop to another executor.
actor ClientDrain {
    nonisolated let subscription: HubSubscription
    private let handler: NIOLoopBound<WebSocketConnectionHandler>
    private let writability: Writability
    private let writes: LoopWriteQueue
    private let metrics: DownstreamMetrics
    private var reader: HubSubscription.Reader
    private nonisolated let running = Atomic<Bool>(false)
    private var finished = false

    init(
        subscription: HubSubscription, handler: NIOLoopBound<WebSocketConnectionHandler>, writability: Writability,
        writes: LoopWriteQueue, metrics: DownstreamMetrics
    ) {
        self.subscription = subscription
        self.handler = handler
        self.writability = writability
        self.writes = writes
        self.metrics = metrics
        self.reader = subscription.makeReader()
    }

    /// Something was queued for the client, its connection can take more again, or it closed. Quick,
    /// from any thread (the hub calls it).
    nonisolated func kick() {
        guard running.compareExchange(expected: false, desired: true, ordering: .acquiringAndReleasing).exchanged else { return }
        Task.detached { await self.drain() }
    }

    private nonisolated var canTake: Bool { subscription.hasQueued && (writability.isWritable || writability.isClosed) }

    private func drain() async {
        while !finished {
            // The reader holds only a reference to the stream's state: a copy reads the same stream.
            var reader = self.reader
            while canTake {
                guard let batch = await reader.nextBatch() else {
                    finished = true
                    break
                }
                if writability.isClosed { continue }  // read and drop: the stream ends after hub.remove
                writes.submit(.init(handler: handler, frames: frames(for: batch), close: nil))
            }
            if finished {
                if subscription.wasEvicted, !writability.isClosed {
                    let notice = StatusMessage(
                        status: StatusMessage.Kind.lagging,
                        message: "disconnected: this connection did not keep up and its buffer of \(MarketDataHub.bufferLimit) events was full")
                    writes.submit(.init(handler: handler, frames: [notice.frame], close: (MarketConnection.tooSlowCloseCode, "too slow")))
                }
                return  // `running` stays set: nothing more will come
            }
            running.store(false, ordering: .releasing)
            // Queued after the last look but before `running` was cleared: that kick found us running.
            guard canTake, running.compareExchange(expected: false, desired: true, ordering: .acquiringAndReleasing).exchanged else {
                return
            }
        }
    }

    private func frames(for batch: [MarketEvent]) -> [ByteBuffer] {
        var delivered = 0
        var oldest = UInt64.max
        for index in batch.indices where !batch[index].isNotice {
            delivered += 1
            let receivedAt = batch[index].receivedAt
            if receivedAt > 0, receivedAt < oldest { oldest = receivedAt }
        }
        metrics.delivered.increment(by: delivered)
        metrics.writes.increment()
        if oldest != .max {
            metrics.deliveryLatency.recordNanoseconds(Int64(MonotonicClock.nanoseconds() &- oldest))
        }
        return FrameEncoder.frames(for: batch)
    }
}

/// Where the hub's `whenQueued` for a subscription points: the subscription's ``ClientDrain``, which
/// only exists once `subscribe` has returned. `Sendable` behind a `Mutex`.
final class DrainTarget: Sendable {
    private let drain = Mutex<ClientDrain?>(nil)

    func set(_ target: ClientDrain) { drain.withLock { $0 = target } }

    nonisolated func kick() { drain.withLock { $0 }?.kick() }
}
