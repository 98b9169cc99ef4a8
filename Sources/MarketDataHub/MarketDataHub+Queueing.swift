import Logging
import MarketCore

/// Queueing for one subscriber: within its bound, the drops and the `lagging` notice, the evictions of
/// the `disconnect` policy, and telling its reader.
extension MarketDataHub {
    /// The events a subscriber's buffer holds from now on (its key's `buffer`), kept within
    /// ``bufferLimitRange``; `nil`: the hub's ``bufferLimit``. What it has queued stays queued.
    public func setBufferLimit(_ limit: Int?, for id: SubscriberID) {
        subscribers[id]?.bufferLimit = limit.map(Self.bounded) ?? bufferLimit
    }

    /// A buffer limit within ``bufferLimitRange``.
    static func bounded(_ limit: Int) -> Int { min(max(limit, bufferLimitRange.lowerBound), bufferLimitRange.upperBound) }

    /// Calls `whenQueued` of those of `candidates` that had something queued since they were last told
    /// (`enqueue` only marks them, so a hub call tells everyone at its end, together). A flag on the
    /// subscriber rather than a list of them: a publish allocates nothing for it.
    func tell(_ candidates: some Sequence<Subscriber>) {
        for subscriber in candidates where subscriber.untold {
            subscriber.untold = false
            subscriber.whenQueued?()
        }
    }

    /// Queues events for one subscriber within its own bound of events (``Subscriber/bufferLimit``); what
    /// does not fit is dropped (and counted) or, with the `disconnect` policy, ends the subscriber.
    func enqueue(_ delivery: HubDelivery, to subscriber: Subscriber) {
        guard !subscriber.parked else { return }
        var delivery = delivery
        var count = delivery.count
        var pending = subscriber.queue.pending.load(ordering: .acquiring)
        // A subscriber that lost events and has since drained to half its buffer is told first, so the
        // notice sits exactly where its gap is.
        if subscriber.lostSinceNotice > 0, pending <= subscriber.bufferLimit / 2 {
            let notice = lossNotice(for: subscriber)
            subscriber.lostSinceNotice = 0
            setLagging(false)
            if yield(HubDelivery([notice]), count: 1, to: subscriber) { pending += 1 }
            // Its books missed changes: each comes whole again right after the notice (a change queued
            // after it only sets again what the whole book already holds).
            let wholes = folding == nil ? [] : wholeStates(held: subscriber.topics)
            if !wholes.isEmpty, yield(HubDelivery(wholes), count: wholes.count, to: subscriber) { pending += wholes.count }
        }
        let room = max(subscriber.bufferLimit - pending, 0)
        if count > room {
            let lost = count - room
            delivery = delivery.prefix(room)
            count = room
            subscriber.dropped += lost
            droppedTotal += lost
            switch policy {
            case .drop:
                droppedFull.increment(by: lost)
                if subscriber.lostSinceNotice == 0 { setLagging(true) }
                subscriber.lostSinceNotice += lost
            case .disconnect:
                // What fits is still queued, so the client reads up to the point it fell behind.
                droppedEvicted.increment(by: lost)
                if count > 0 { _ = yield(delivery, count: count, to: subscriber) }
                evict(subscriber)
                return
            }
        }
        guard count > 0 else { return }
        if yield(delivery, count: count, to: subscriber) {
            pending += count
            if pending >= subscriber.warningFill { warnFalling(behind: subscriber, fill: pending) }
        }
    }

    /// Queues a delivery on a subscriber's stream and counts it; whether it was queued. It joins the
    /// stream's newest element while the reader has not taken that yet (``DeliveryBatch``), else the
    /// batch is yielded again with it.
    func yield(_ delivery: HubDelivery, count: Int, to subscriber: Subscriber) -> Bool {
        let batch = subscriber.batch
        if batch.add(delivery, count: count, queue: subscriber.queue) {
            subscriber.untold = true
            return true
        }
        batch.reopen(with: delivery, count: count, queue: subscriber.queue)
        let result = subscriber.continuation.yield(batch)
        if case .enqueued = result {
            subscriber.queue.batches.add(1, ordering: .releasing)
            subscriber.untold = true
            return true
        }
        // Not in the stream (ended, or past its own bound): closed again, its count taken back.
        batch.withdraw(queue: subscriber.queue)
        if case .dropped = result {
            // The stream's own bound (1,000 elements) is a backstop: it holds one batch at a time.
            subscriber.dropped += count
            droppedTotal += count
            droppedFull.increment(by: count)
        }
        return false
    }

    /// The notice telling a subscriber how many events it lost since the last one.
    func lossNotice(for subscriber: Subscriber) -> MarketEvent {
        let lost = subscriber.lostSinceNotice
        return wire.render(
            Notice(
                .lagging, message: "\(lost) events were dropped because this connection did not keep up",
                details: ["dropped": .number(Int64(lost)), "dropped_total": .number(Int64(subscriber.dropped))]))
    }

    func evict(_ subscriber: Subscriber) {
        // A line per 10 s however many (a client may connect, not read and be evicted again and again).
        warnings.log(
            .warning, "evicted", "subscriber disconnected: its buffer of \(subscriber.bufferLimit) events was full",
            metadata: ["subscriber": "\(subscriber.id)"], to: logger)
        subscriber.queue.evicted.store(true, ordering: .releasing)
        remove(subscriber.id)
    }

    func warnFalling(behind subscriber: Subscriber, fill: Int) {
        let now = ContinuousClock.now
        if let last = subscriber.lastWarning, now - last < .seconds(10) { return }
        subscriber.lastWarning = now
        warnings.log(
            .warning, "falling-behind", "subscriber falling behind: buffer \(fill * 100 / subscriber.bufferLimit)% full",
            metadata: ["subscriber": "\(subscriber.id)", "dropped_total": "\(subscriber.dropped)"], to: logger)
    }

    func setLagging(_ lagging: Bool) {
        laggingCount += lagging ? 1 : -1
        laggingGauge.record(laggingCount)
    }
}
