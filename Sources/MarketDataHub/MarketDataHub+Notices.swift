import Logging
import MarketCore

// What the hub tells its subscribers beside the events: losses before the hub, refusals, and the
// upstream's outages, each as a notice in the market's protocol (``MarketDataHub/wire``).
extension MarketDataHub {
    /// Events were lost before they reached the hub (e.g. NATS dropped them for this node): the
    /// subscribers of `topics` (every subscriber with topics when `nil`) get a `lagging` notice at once.
    public func reportLoss(_ count: Int, topics: Set<Topic>?, reason: String) {
        // On the tape too: what follows is not whole.
        tap?.interrupted(epoch: history?.epoch)
        interruptFolds(topics)
        let notice = wire.render(
            Notice(
                .lagging, message: "\(count == 1 ? "1 event was" : "\(count) events were") lost before reaching this relay (\(reason))",
                details: ["dropped": .number(Int64(count))]))
        let lostTypes = topics.map { Set($0.map(\.eventType)) }
        for subscriber in subscribers.values where !subscriber.topics.isEmpty {
            if let topics, let lostTypes, subscriber.topics.isDisjoint(with: topics),
                !subscriber.topics.contains(where: { $0.isWildcard && lostTypes.contains($0.eventType) })
            {
                continue
            }
            enqueue(HubDelivery([notice]), to: subscriber)
        }
        tell(subscribers.values)
    }

    /// The upstream refused `topics` (e.g. Alpaca's 405 symbol limit, 409 insufficient subscription):
    /// each subscriber holding one of them (or a ticker a refused wildcard covers: the upstream is asked
    /// for it through the wildcard) is told at once, with the topics it holds among them, in an `error`
    /// status carrying the upstream's `code`. Its subscription stays: interest that changes or a new
    /// connection asks again.
    /// A subscriber that takes a refused topic later is told the same (``tellRefusals(of:to:)``): the
    /// upstream is not asked again while the wanted set does not change.
    public func upstreamRefused(_ topics: Set<Topic>, code: Int, reason: String) {
        wanted.refused(topics, code: code, reason: reason)
        // A ticker its type's wildcard covers is asked for through the wildcard: refused with it.
        let wildcards = Set(topics.lazy.filter(\.isWildcard).map(\.eventType))
        var told: [Subscriber] = []
        for subscriber in subscribers.values {
            let held = subscriber.topics.intersection(topics)
            let covered: Set<Topic> = wildcards.isEmpty ? [] : subscriber.topics.filter { !$0.isWildcard && wildcards.contains($0.eventType) && !topics.contains($0) }
            guard !held.isEmpty || !covered.isEmpty else { continue }
            enqueue(HubDelivery([refusalNotice(held: held, covered: covered, code: code, reason: reason)]), to: subscriber)
            told.append(subscriber)
        }
        tell(told)
    }

    /// Tells `subscriber` of the refusals standing for `topics` it just took. Not sent on (the caller tells).
    func tellRefusals(of topics: [Topic], to subscriber: Subscriber) {
        guard !wanted.refusals.isEmpty else { return }
        var standing: [WantedSet.Refusal: (held: Set<Topic>, covered: Set<Topic>)] = [:]
        for topic in topics {
            guard let (refused, refusal) = wanted.refusal(of: topic) else { continue }
            if refused == topic { standing[refusal, default: ([], [])].held.insert(topic) } else { standing[refusal, default: ([], [])].covered.insert(topic) }
        }
        for (refusal, topics) in standing {
            enqueue(HubDelivery([refusalNotice(held: topics.held, covered: topics.covered, code: refusal.code, reason: refusal.reason)]), to: subscriber)
        }
    }

    /// An `error` status naming the refused topics a subscriber holds (`covered`: tickers that come
    /// through a refused wildcard), with the upstream's code.
    private func refusalNotice(held: Set<Topic>, covered: Set<Topic>, code: Int, reason: String) -> MarketEvent {
        func list(_ topics: Set<Topic>) -> String {
            topics.sorted().prefix(20).map(\.description).joined(separator: ",") + (topics.count > 20 ? " and \(topics.count - 20) more" : "")
        }
        let names = [held.isEmpty ? nil : list(held), covered.isEmpty ? nil : "\(list(covered)) (asked for through a wildcard)"]
            .compactMap { $0 }.joined(separator: ", ")
        return wire.render(Notice(.refused, message: "the upstream refused \(names) (\(reason))", details: ["code": .number(Int64(code))]))
    }

    /// The source says what it is (a replay's start or end): every subscriber with topics is told now,
    /// and each later one as it takes its first topics.
    public func sourceSays(_ notice: Notice) {
        let rendered = wire.render(notice)
        sourceNotice = rendered
        let told = subscribers.values.filter { !$0.topics.isEmpty && !$0.parked }
        for subscriber in told { enqueue(HubDelivery([rendered]), to: subscriber) }
        tell(told)
    }

    /// The fewest events any subscriber with topics can still take before it is warned of as falling
    /// behind (80% of its buffer, less what it has queued and not read; `Int.max` with none): what a
    /// source that paces itself by its slowest reader (a replay at full speed) waits on.
    public var leastRoom: Int {
        var least = Int.max
        for subscriber in subscribers.values where !subscriber.topics.isEmpty && !subscriber.parked {
            least = min(least, subscriber.warningFill - subscriber.queue.pending.load(ordering: .relaxed))
        }
        return least
    }

    // MARK: upstream outages

    /// The upstream connection was lost. Every subscriber with topics is told at once, once per outage;
    /// when events flow again each is told the window in which none arrived.
    public func upstreamLost(reason: String) {
        let now = WallClock.nowMilliseconds()
        guard let outage = outages.lost(reason: reason, at: now) else { return }
        // The next connection asks for every wanted topic again: what it refuses, it says again.
        wanted.forgetRefusals()
        // No publish comes to compact them while the upstream is away.
        compactLastValues()
        // Events of the outage never arrive: no resume reaches across it (a single relay's loss takes a
        // market sequence of its own: a client that stood just before it is told the gap).
        history?.interruptAll(now: now, marked: !adoptsPositions)
        tap?.interrupted(epoch: history?.epoch)
        interruptFolds(nil)
        tellOutageStarted(outage.notice)
        logger.debug("subscribers told the upstream is down", metadata: ["subscribers": "\(subscribers.count)"])
    }

    /// Folded states (order books) of `topics` (all when `nil`, or when a wildcard of their type lost
    /// events) missed events: none is served until the vendor sends it whole again.
    /// The topics looked at: those named, and a wildcard's (or, for all, every folded type's) entries,
    /// never a walk of every entry (a loss can be reported often).
    func interruptFolds(_ topics: Set<Topic>?) {
        guard let folding else { return }
        for topic in foldedEntries(held: topics ?? Set(folding.eventTypes.map(Topic.wildcard))) {
            guard let entry = entries[topic] else { continue }
            entry.fold?.interrupt()
            // What came before the loss cannot bring a later whole state up to date.
            entry.releaseHeldBack()
        }
    }

    /// The first events after an outage: those told of it are told the window, and gap fill is asked.
    func announce(_ recovery: OutageLedger.Recovery) {
        tellOutageEnded(recovery.notice(epoch: epoch))
        requestFill(from: recovery.start, through: recovery.firstEventAfter)
    }

    private func tellOutageStarted(_ status: Notice) {
        let notice = wire.render(status)
        for subscriber in subscribers.values where !subscriber.topics.isEmpty {
            subscriber.toldOfOutage = true
            enqueue(HubDelivery([notice]), to: subscriber)
        }
        tell(subscribers.values)
    }

    /// The end of an outage goes to those told of its start (a client that subscribed meanwhile was
    /// told as it subscribed; one that only connected, with no topics, was not).
    private func tellOutageEnded(_ status: Notice) {
        let notice = wire.render(status)
        for subscriber in subscribers.values where subscriber.toldOfOutage {
            subscriber.toldOfOutage = false
            enqueue(HubDelivery([notice]), to: subscriber)
        }
        tell(subscribers.values)
    }
}
