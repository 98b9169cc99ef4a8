import MarketDataHub
import NIOCore
import NIOWebSocket
import MarketCore
import Synchronization

/// Moves what the hub queued for the clients of one event loop into their connections, with a task
/// only while some client of the loop has something queued.
///
/// Each client's events arrive on its own hub subscription (an `AsyncStream`,
/// `.bufferingOldest(1000)`, filtered by symbol, at most its own `bufferLimit` of events queued),
/// and the loop's drain is the one consumer of that stream. The hub tells it when it queued
/// something for a client (``ClientFeed/kick()``, after a whole publish); the client joins the
/// ready list, and the drain's task (started by the first kick, ended when the list is empty) takes
/// each ready client in turn: reads everything queued for it (the read never waits: a client is
/// only read while ``HubSubscription/hasQueued``) and builds it as one whole WebSocket frame of the
/// upstream's own bytes, header included (``WireFrameBuilder``; several frames only past 1,000,000
/// bytes), copied straight from where the hub holds the events. The frames of a whole turn go to
/// the loop in one `execute`, which writes each below NIO's frame encoder and flushes. One publish
/// thus costs about one task and one loop wake-up per loop, not a task per client. A client whose
/// connection is not writable is not read until it is (its events wait in its own bounded hub
/// buffer), so a slow client never holds up the others; the bytes handed to its loop and not yet
/// written count too (``Writability/handedToLoop(_:)``), so a loop that falls behind cannot make
/// its queue of writes grow without bound; a client that still has events after its
/// turn goes to the back of the list, so a busy one cannot starve the rest.
///
/// A default actor, not one on the loop: the stream's `next()` runs on the global executor, and only a
/// default actor can step there and back on the same thread (from a loop's executor each read would be
/// two thread hand-offs). Its isolated state is the streams' readers. Also tried and measured: the
/// drain's task with the loop as its task executor preference (``LoopTaskExecutor``), reading and
/// writing on the loop. `fanout`'s p99 fell, but in `relay bench alpaca-json` (the machine saturated by
/// the harness) fast subscribers were told they lag (113–329 `lagging` notices against none) and the
/// delivery ratio fell to 0.91–0.999 against 1.0: the drain stays on the pool.
actor LoopDrain {
    let loop: any EventLoop
    private let metrics: DownstreamMetrics
    /// Clients with something to take, and whether the drain's task runs (it empties the list).
    private let ready = Mutex<(clients: [ClientFeed], running: Bool)>(([], false))
    /// The list being worked through, kept to reuse its storage.
    private var taking: [ClientFeed] = []
    /// Each client's stream reader, made at its first turn, dropped when its stream ends.
    private var readers: [SubscriberID: HubSubscription.Reader] = [:]
    /// What one client's turn took, kept to reuse its storage.
    private var taken: [HubDelivery] = []
    /// Per client, what it was given past one turn's bytes (the rest of a replay, and what came after
    /// it): taken before its stream is read again.
    private var carry: [SubscriberID: [HubDelivery]] = [:]
    /// The most frame bytes one turn builds for a client while a replay is being sent: a resume of
    /// 100,000 events goes out as the client reads, never built all at once and held.
    static let replayBytesPerTurn = 256 << 10
    /// A turn's live deliveries past this are left for the next turn (a market's usual turn is far
    /// smaller; a run of news items of megabytes is not built into frames all at once).
    static let liveBytesPerTurn = 4 << 20

    init(loop: any EventLoop, metrics: DownstreamMetrics) {
        self.loop = loop
        self.metrics = metrics
    }

    /// Puts a client on the ready list (it is not on it already) and starts the task if it is not
    /// running. Quick, from any thread.
    nonisolated func schedule(_ client: ClientFeed) {
        let start = ready.withLock { state -> Bool in
            state.clients.append(client)
            defer { state.running = true }
            return !state.running
        }
        if start { Task { await self.run() } }
    }

    private func run() async {
        while true {
            let more = ready.withLock { state -> Bool in
                if state.clients.isEmpty {
                    state.running = false
                    return false
                }
                swap(&taking, &state.clients)
                return true
            }
            guard more else { return }
            var writes: [Write] = []
            writes.reserveCapacity(taking.count)
            var delivered = 0
            for client in taking {
                if let write = await take(client, delivered: &delivered) { writes.append(write) }
            }
            taking.removeAll(keepingCapacity: true)
            if !writes.isEmpty {
                metrics.tally.add(delivered: delivered)
                let turn = writes
                loop.execute { Self.write(turn) }
            }
        }
    }

    /// What one client's turn hands its loop.
    private struct Write: Sendable {
        let handler: NIOLoopBound<WebSocketConnectionHandler>
        /// Whole WebSocket frames (``WireFrame``), the usual one first (no array for it); empty: none,
        /// only the position it completes.
        let frame: ByteBuffer
        var more: [ByteBuffer] = []
        /// Close with this code after the frames (a client the hub evicted).
        var close: (code: WebSocketErrorCode, reason: String)? = nil
        /// What it completes of a tagged session's position (tagged sessions only; else nothing).
        var through = WrittenThrough.nothing
        /// Its frames' bytes, counted as handed to the loop (``Writability/handedToLoop(_:)``) until written.
        var bytes = 0
    }

    /// One turn of one client: everything queued for it, as one write.
    private func take(_ client: ClientFeed, delivered: inout Int) async -> Write? {
        client.isReady.store(false, ordering: .releasing)
        guard client.canTake else { return nil }
        let id = client.subscription.id
        // The reader holds only a reference to the stream's state: a copy reads the same stream.
        var reader = readers[id] ?? client.subscription.makeReader()
        var deliveries: [HubDelivery] = []
        swap(&deliveries, &taken)
        defer {
            deliveries.removeAll(keepingCapacity: true)
            swap(&deliveries, &taken)
        }
        if let carried = carry.removeValue(forKey: id) {
            deliveries += carried
            client.subscription.carried(replayed: -carried.reduce(0) { $0 + $1.replayWeight })
        } else {
            guard await reader.nextDeliveries(into: &deliveries) else {
                readers[id] = nil
                return finished(client)
            }
            readers[id] = reader
        }
        if !client.writability.isClosed, let rest = HubDelivery.cut(&deliveries, afterBytes: Self.replayBytesPerTurn, liveBytes: Self.liveBytesPerTurn) {
            carry[id] = rest
            client.subscription.carried(replayed: rest.reduce(0) { $0 + $1.replayWeight })
        }
        client.carrying.store(carry[id] != nil, ordering: .releasing)
        defer { if client.canTake { client.kick() } }
        if client.writability.isClosed { return nil }  // read and drop: the stream ends after hub.remove
        var payload = 1
        var through = WrittenThrough.nothing
        var replayed = 0
        var events = 0
        let tracked = client.tracksPositions.load(ordering: .relaxed)
        for index in deliveries.indices {
            payload += deliveries[index].framedBytes
            events += deliveries[index].marketEventCount
            guard tracked else { continue }
            replayed += deliveries[index].replayWeight
            if let started = deliveries[index].epochStarted {
                // Positions count afresh from here: only the new epoch's note where the client stands.
                through.epoch = started
                through.sequence = 0
            } else {
                through.sequence = max(through.sequence, deliveries[index].lastSequence)
            }
        }
        // Counted as the turn takes them, in order: once the count passes what the hub had queued by the
        // end of a resume, that resume's replay is in this write or an earlier one.
        if replayed > 0 { through.replayed = client.replayedWritten.add(replayed, ordering: .relaxed).newValue }
        delivered += events
        client.metrics.delivered.increment(by: events)
        // One call through the protocol seam per client turn: its framing builds the frames.
        guard
            let framed = (client.wantsTimes.load(ordering: .relaxed) ? client.timedFraming : client.framing).frames(
                payloadBytes: payload,
                events: { body in for index in deliveries.indices { deliveries[index].forEachEventAddress(body) } },
                converted: { convert, body in for index in deliveries.indices { deliveries[index].forEachEvent(convertedBy: convert, body) } })
        else {
            // Nothing to send (each event one the client already has: a news item's second route), and
            // yet the turn took its events: a tagged session still notes how far it stands.
            guard through != .nothing else { return nil }
            var write = Write(handler: client.handler, frame: ByteBuffer())
            write.through = through
            return write
        }
        var write = Write(handler: client.handler, frame: framed.first, more: framed.more)
        write.bytes = framed.first.readableBytes + framed.more.reduce(0) { $0 + $1.readableBytes }
        client.writability.handedToLoop(write.bytes)
        let oldest = framed.oldestReceivedAt
        if oldest != 0 {
            let latency = Int64(MonotonicClock.nanoseconds() &- oldest)
            client.metrics.deliveryLatency.recordNanoseconds(latency)
            metrics.tally.record(latencyNanoseconds: latency)
        }
        client.metrics.writes.increment()
        write.through = through
        return write
    }

    /// The stream ended: an evicted client is told why and closed with 1013.
    private func finished(_ client: ClientFeed) -> Write? {
        client.finish()
        carry[client.subscription.id] = nil
        guard client.subscription.wasEvicted, !client.writability.isClosed else { return nil }
        // In its protocol's words (Polygon's `lagging` status, Alpaca's 407 slow client).
        return Write(
            handler: client.handler, frame: client.framing.evictedFrame(bufferLimit: client.subscription.bufferLimit),
            close: (MarketConnection.tooSlowCloseCode, "too slow"))
    }

    /// On the loop: each connection's frames, flushed, in the order of the turn.
    private static func write(_ writes: [Write]) {
        for write in writes {
            let handler = write.handler.value
            handler.writeWire(write.frame, completing: write.more.isEmpty ? write.through : .nothing)
            for (index, frame) in write.more.enumerated() {
                let last = index == write.more.count - 1
                handler.writeWire(frame, completing: last ? write.through : .nothing)
            }
            handler.flushWire()
            if let close = write.close { handler.close(code: close.code, reason: close.reason) }
            if write.bytes > 0 { handler.writability.written(write.bytes) }
        }
    }
}

/// One market client as its loop's ``LoopDrain`` sees it: its hub subscription and its connection.
/// `Sendable`: the handler is bound to its loop (`NIOLoopBound`), the flags are atomics.
final class ClientFeed: Sendable {
    let subscription: HubSubscription
    let handler: NIOLoopBound<WebSocketConnectionHandler>
    let writability: Writability
    private let drain: LoopDrain
    /// On the drain's ready list (cleared as its turn starts, so a kick during the turn puts it back).
    let isReady = Atomic<Bool>(false)
    /// The stream has ended; nothing more will come.
    private let isFinished = Atomic<Bool>(false)
    /// A tagged session: each write notes the newest market sequence it carried.
    let tracksPositions = Atomic<Bool>(false)
    /// The replayed events (``HubDelivery/replayWeight``) written to a tagged session in all: compared
    /// with ``HubSubscription/replayedQueued``.
    let replayedWritten = Atomic<Int>(0)
    /// The drain keeps part of what it took for the next turn (a replay past one turn's bytes).
    let carrying = Atomic<Bool>(false)
    /// How its events become frames, in its protocol and codec.
    let framing: any DownstreamFraming
    /// The same with each event's receive and send times, once the client asks for them (``wantsTimes``).
    let timedFraming: any DownstreamFraming
    /// The client asked for its events' times (its key's `timestamps`, or a subscribe option).
    let wantsTimes = Atomic<Bool>(false)
    /// Its market's delivery metrics.
    let metrics: DeliveryMetrics

    init(
        subscription: HubSubscription, handler: NIOLoopBound<WebSocketConnectionHandler>, writability: Writability, drain: LoopDrain,
        metrics: DeliveryMetrics, framing: any DownstreamFraming
    ) {
        self.subscription = subscription
        self.metrics = metrics
        self.handler = handler
        self.writability = writability
        self.drain = drain
        self.framing = framing
        timedFraming = framing.withTimes()
    }

    /// Something was queued for the client, its connection can take more again, or it closed. Quick,
    /// from any thread (the hub calls it).
    func kick() {
        guard !isFinished.load(ordering: .acquiring), canTake,
            isReady.compareExchange(expected: false, desired: true, ordering: .acquiringAndReleasing).exchanged
        else { return }
        drain.schedule(self)
    }

    var canTake: Bool {
        (subscription.hasQueued || carrying.load(ordering: .acquiring)) && (writability.isWritable || writability.isClosed)
    }

    fileprivate func finish() { isFinished.store(true, ordering: .releasing) }
}

/// Where the hub's `whenQueued` for a subscription points: the subscription's ``ClientFeed``, which
/// only exists once `subscribe` has returned. `Sendable` behind a `Mutex`.
final class FeedTarget: Sendable {
    private let feed = Mutex<ClientFeed?>(nil)

    func set(_ target: ClientFeed) { feed.withLock { $0 = target } }

    func kick() { feed.withLock { $0 }?.kick() }
}

/// One drain per event loop of a group, found by the loop.
final class LoopDrains: Sendable {
    private let drains = Mutex<[ObjectIdentifier: LoopDrain]>([:])
    private let metrics: DownstreamMetrics

    init(metrics: DownstreamMetrics) {
        self.metrics = metrics
    }

    func drain(for loop: any EventLoop) -> LoopDrain {
        drains.withLock { drains in
            if let drain = drains[ObjectIdentifier(loop)] { return drain }
            let drain = LoopDrain(loop: loop, metrics: metrics)
            drains[ObjectIdentifier(loop)] = drain
            return drain
        }
    }
}
