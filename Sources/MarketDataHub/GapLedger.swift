import MarketCore

/// One outage of one topic waiting for its fill: the window, the last event the relay had before it
/// (`after`) and the first live one after it (`before`, once it came), what was delivered into it.
struct PendingGap {
    var generation: Int
    var from: Int64
    var through: Int64
    var after: MarketEvent?
    var before: MarketEvent?
    /// Recovered events delivered into this gap.
    var delivered = 0
    /// Recovered events that fall after `after` while `before` is not known yet: held until the topic's
    /// first live event bounds them (a trade stamped before the fill's window ends can still be on its
    /// way live) or the fill ends, so that none arrives both recovered and live.
    var held: [MarketEvent] = []
}

/// The gap fill's bookkeeping, a value the hub holds: each topic's outages waiting for a fill, the
/// recovered events held until the topic's first live event bounds them, how far recovered events
/// reached per topic, the request generation and the fills' counts. Pure: every change says which
/// recovered events go to the topic's holders now (``Released``, in order); the hub delivers them.
/// What orders a type's events is the market's protocol's (`wire`).
struct GapLedger {
    /// Recovered events to deliver now, per topic, in the order released (each list oldest first).
    typealias Released = [(topic: Topic, events: [MarketEvent])]

    let wire: any WireProtocol
    /// The most outages a topic keeps waiting for a fill; an older one is given up (its holders had the
    /// notice), as is one older than `lifetime` (the fill's longest window by default: a union reaching
    /// further back would only be skipped, taking the new outage with it).
    var gapsPerTopic = 8
    var lifetime: Int64 = 900_000
    /// The most recovered events held for topics whose first live event has not come (a fill brings
    /// at most its settings' events; a cluster node's come from NATS). Past it, what is held is
    /// delivered at once, as it would be without a bound for it. The same past ``heldBytesLimit`` of
    /// their bytes (a REST host's or a NATS publisher's events may each be up to the largest event).
    var heldLimit = 200_000
    var heldBytesLimit = 64 << 20

    private(set) var pending: [Topic: [PendingGap]] = [:]
    /// The newest recovered event delivered per topic (what a later fill starts after).
    private(set) var recoveredThrough: [Topic: MarketEvent] = [:]
    /// Recovered events held in `pending` until their topic's first live event (or the fill's end).
    private(set) var held = 0
    private(set) var heldBytes = 0
    /// Topics whose first live event after an outage has not come.
    private(set) var watched: Set<Topic> = []
    /// The request generation of the latest outage (a cluster node names it in its fill request).
    private(set) var generation = 0
    /// The fills since start, as they ended.
    var counts = GapFillCounts()

    init(wire: any WireProtocol) {
        self.wire = wire
    }

    /// An outage from `from` to `through` (Unix ms) ended: each topic held by name (`holders`, with its
    /// last live event) gets a pending gap and is watched for its first live event; old gaps are given
    /// up. Returns one request covering every gap not filled yet (an earlier outage's fill cut short is
    /// taken up for the union of both windows), most held topics first, and what giving up released.
    mutating func open(
        from: Int64, through: Int64, holders: [(topic: Topic, count: Int, last: MarketEvent?)]
    ) -> (request: GapFillRequest, released: Released) {
        generation += 1
        var released: Released = []
        // Every topic's old outages go, held or not (a topic nobody holds keeps none for long).
        for (topic, gaps) in pending {
            // What a given-up gap still held goes out first (its topic has had no live event since).
            _ = release(topic, gaps.filter { through - $0.through >= lifetime }, into: &released)
            let kept = gaps.filter { through - $0.through < lifetime }
            pending[topic] = kept.isEmpty ? nil : kept
        }
        let heldTopics = Set(holders.map(\.topic))
        recoveredThrough = recoveredThrough.filter { heldTopics.contains($0.key) }
        var requested: [GapFillRequest.Held] = []
        var earliest = from
        for holder in holders {
            let topic = holder.topic
            var gaps = pending[topic] ?? []
            // After what the topic's holders have or are held for them: its last live event, or a
            // recovered one past it (a quiet topic's last live event can be older than what an earlier
            // fill brought, delivered or held in a gap still open).
            let order = wire.recoveryOrder(of: topic.eventType)
            let candidates = [holder.last, recoveredThrough[topic]] + gaps.filter { $0.before == nil }.map(\.after)
            let after = candidates.compactMap { $0 }.max { value(order, $0, else: .min) < value(order, $1, else: .min) }
            gaps.append(PendingGap(generation: generation, from: from, through: through, after: after, before: nil))
            if gaps.count > gapsPerTopic {
                _ = release(topic, Array(gaps.prefix(gaps.count - gapsPerTopic)), into: &released)
                gaps.removeFirst(gaps.count - gapsPerTopic)
            }
            pending[topic] = gaps
            watched.insert(topic)
            earliest = Swift.min(earliest, gaps[0].from)
            requested.append(GapFillRequest.Held(topic: topic, holders: holder.count, lastBefore: gaps[0].after))
        }
        requested.sort { GapFillRequest.Held.fillsFirst(($0, $0.lastBefore != nil), ($1, $1.lastBefore != nil)) }
        return (GapFillRequest(from: earliest, through: through, topics: requested, generation: generation), released)
    }

    /// A new epoch begins (a cluster's new leadership term): the recovered events still held are the
    /// former term's, with its positions, and no live event of that term will come to bound them. They
    /// go out now, ahead of the new epoch's notice; the gaps stay pending for the next leader's fill.
    mutating func releaseHeld() -> Released {
        var released: Released = []
        guard held > 0 else { return released }
        for (topic, gaps) in pending where gaps.contains(where: { !$0.held.isEmpty }) {
            pending[topic] = release(topic, gaps, into: &released)
        }
        return released
    }

    /// A topic's first live event after an outage closes its open gaps: the recovered events held for
    /// them that lie before it are released (to go ahead of it), the rest were on their way live.
    mutating func firstLive(_ events: [MarketEvent]) -> Released {
        var released: Released = []
        for event in events where watched.contains(event.topic) {
            watched.remove(event.topic)
            guard var gaps = pending[event.topic] else { continue }
            let first = event.compacted()
            for index in gaps.indices where gaps[index].before == nil { gaps[index].before = first }
            let bound = wire.orderValue(wire.recoveryOrder(of: event.topic.eventType), of: first)
            pending[event.topic] = release(event.topic, gaps, before: bound, into: &released)
        }
        return released
    }

    /// A topic's recovered events (oldest first): those that fall in one of its pending gaps (after
    /// what the hub had, before the first live event, not delivered yet) are accepted, so nothing
    /// arrives twice however often a window is fetched. Those of a gap whose first live event came go
    /// out now; the others are held. Returns how many were accepted and what goes out.
    mutating func accept(_ topic: Topic, _ events: [MarketEvent], order: RecoveryOrder) -> (accepted: Int, released: Released) {
        guard var gaps = pending[topic], !gaps.isEmpty else { return (0, []) }
        var bounds = gaps.map { gap in (value(order, gap.after, else: .min), value(order, gap.before, else: .max)) }
        var raised: [Int: MarketEvent] = [:]
        var now: [MarketEvent] = []
        var accepted = 0
        for event in events {
            guard let value = wire.orderValue(order, of: event), let index = bounds.firstIndex(where: { $0.0 < value && value < $0.1 }) else { continue }
            bounds[index].0 = value
            raised[index] = event
            accepted += 1
            if gaps[index].before == nil {
                // Its own bytes: a held event must not hold a whole NATS message or REST page alive.
                gaps[index].held.append(event.compacted())
                held += 1
                heldBytes += event.bytes.readableBytes
            } else {
                gaps[index].delivered += 1
                now.append(event)
            }
        }
        for (index, event) in raised { gaps[index].after = event.compacted() }
        // Oldest first: the gaps whose first live event came lie before those still open.
        var released: Released = []
        passing(topic, now, into: &released)
        if held > heldLimit || heldBytes > heldBytesLimit {
            for (other, open) in pending where other != topic { pending[other] = release(other, open, into: &released) }
            gaps = release(topic, gaps, into: &released)
        }
        pending[topic] = gaps
        return (accepted, released)
    }

    /// A fill is over: the gaps of request `generation` and earlier are settled (what they still held
    /// is released: the fill is over and the topic stayed quiet). Returns them per topic.
    mutating func settle(through generation: Int) -> (settled: [Topic: [PendingGap]], released: Released) {
        var settled: [Topic: [PendingGap]] = [:]
        var released: Released = []
        for (topic, gaps) in pending {
            let (done, left) = (gaps.filter { $0.generation <= generation }, gaps.filter { $0.generation > generation })
            guard !done.isEmpty else { continue }
            settled[topic] = release(topic, done, into: &released)
            if left.isEmpty {
                pending[topic] = nil
                watched.remove(topic)
            } else {
                pending[topic] = left
            }
        }
        return (settled, released)
    }

    /// Takes the held recovered events of `topic`'s `gaps` out, those ordered before `bound` when there
    /// is one (the rest were on their way live), into `released`; returns the gaps emptied.
    private mutating func release(_ topic: Topic, _ gaps: [PendingGap], before bound: Int64? = nil, into released: inout Released) -> [PendingGap] {
        let order = wire.recoveryOrder(of: topic.eventType)
        var gaps = gaps
        var passed: [MarketEvent] = []
        for index in gaps.indices where !gaps[index].held.isEmpty {
            let heldHere = gaps[index].held
            held -= heldHere.count
            heldBytes -= heldHere.reduce(0) { $0 + $1.bytes.readableBytes }
            gaps[index].held = []
            let kept = bound.map { bound in heldHere.filter { value(order, $0, else: .max) < bound } } ?? heldHere
            gaps[index].delivered += kept.count
            passed += kept
        }
        passing(topic, passed, into: &released)
        return gaps
    }

    /// `events` go out to `topic`'s holders: noted as how far recovery reached, and released.
    private mutating func passing(_ topic: Topic, _ events: [MarketEvent], into released: inout Released) {
        guard !events.isEmpty else { return }
        let order = wire.recoveryOrder(of: topic.eventType)
        if let newest = events.max(by: { value(order, $0, else: .min) < value(order, $1, else: .min) }),
            value(order, newest, else: .min) > value(order, recoveredThrough[topic], else: .min)
        {
            recoveredThrough[topic] = newest.compacted()
        }
        released.append((topic, events))
    }

    private func value(_ order: RecoveryOrder, _ event: MarketEvent?, else missing: Int64) -> Int64 {
        event.flatMap { wire.orderValue(order, of: $0) } ?? missing
    }
}
