import CoreMetrics
import MarketCore

/// Where a resuming subscription starts. Value type, `Sendable`.
public enum HubResume: Sendable, Equatable {
    /// Per topic, the last position the client has (a ticker topic's topic sequence, a wildcard's market
    /// sequence) in `epoch`; topics not named are added plainly.
    case positions(epoch: String?, [Topic: UInt64])
    /// Every event that arrived at or after this Unix ms.
    case time(milliseconds: Int64)
    /// Every event after this market sequence of `epoch` (a tagged session coming back: where its
    /// connection broke); a topic in `floors` only after its own, when later (the sequence at which the
    /// session added it: nothing of it before was the client's).
    case marketSequence(epoch: String, UInt64, floors: [Topic: UInt64] = [:])
    /// Nothing to resume these topics (of those added) from, for `why`: they are told so in one `gap`
    /// status, then `resumed`; every topic is subscribed live.
    case unavailable(Set<Topic>, why: String)
}

/// What a resume did: what each topic got. Value type, `Sendable`.
public struct HubResumeOutcome: Sendable, Equatable {
    /// Events replayed per topic that resumed whole.
    public var replayed: [Topic: Int] = [:]
    /// Topics whose missed events were not all held (or whose epoch had changed): told `gap`.
    public var gaps: [Topic] = []
    /// The market position as the topics were added live (the same step): the subscriber has every event
    /// of them after it.
    public var epoch: String?
    public var sequence: UInt64 = 0
    /// The market sequence (of ``epoch``) just before the first of this term's events replayed: a
    /// connection that already stands past it holds there until its client has the replay. `nil`: none
    /// replayed.
    public var replayedFrom: UInt64?

    public init(replayed: [Topic: Int] = [:], gaps: [Topic] = []) {
        self.replayed = replayed
        self.gaps = gaps
    }
}

/// What a hub's resumes and conflation did since start. Value type, `Sendable`.
public struct ResumeCounts: Sendable, Equatable, Encodable {
    public var resumes = 0
    public var withGaps = 0
    public var replayed = 0
    public var gaps = 0
    public var conflated = 0
    /// Resumes that read the archive (the tape) for positions older than the memory.
    public var fromArchive = 0
}

/// The history's metrics. `Sendable` (metric handles).
struct HubHistoryMetrics: Sendable {
    let memory: Gauge
    let events: Gauge
    let replayed: Counter
    let gaps: Counter
    let conflated: Counter
    let resumed: Counter
    let resumedWithGaps: Counter
    /// Resumes that asked the archive (the tape), and events it gave them.
    let archiveResumes: Counter
    let archiveReplayed: Counter
    /// Events a cluster node received and did not keep in its history (they were delivered live).
    let notKeptOutOfOrder: Counter
    let notKeptImplausible: Counter
    let notKeptPastLeader: Counter

    init(factory: any MetricsFactory, limit: Int) {
        // What the memory may reach (0: no history), beside what it holds: an alert compares the two.
        Gauge(label: "relay_history_bytes_limit", factory: factory).record(limit)
        memory = Gauge(label: "relay_history_bytes", factory: factory)
        events = Gauge(label: "relay_history_events", factory: factory)
        replayed = Counter(label: "relay_events_replayed_total", factory: factory)
        gaps = Counter(label: "relay_resume_gaps_total", factory: factory)
        conflated = Counter(label: "relay_events_conflated_total", factory: factory)
        resumed = Counter(label: "relay_resumes_total", dimensions: [("result", "resumed")], factory: factory)
        resumedWithGaps = Counter(label: "relay_resumes_total", dimensions: [("result", "gap")], factory: factory)
        archiveResumes = Counter(label: "relay_tape_resumes_total", factory: factory)
        archiveReplayed = Counter(label: "relay_tape_events_replayed_total", factory: factory)
        notKeptOutOfOrder = Counter(label: "relay_history_events_not_kept_total", dimensions: [("reason", "out_of_order")], factory: factory)
        notKeptImplausible = Counter(label: "relay_history_events_not_kept_total", dimensions: [("reason", "implausible")], factory: factory)
        notKeptPastLeader = Counter(label: "relay_history_events_not_kept_total", dimensions: [("reason", "past_leader")], factory: factory)
    }

    func record(_ history: EventHistory) {
        memory.record(history.memory)
        events.record(history.eventCount)
    }
}

extension MarketDataHub {
    /// Adds topics to a subscriber, the ones `resume` names starting from there: in one step on the hub,
    /// the subscriber gets every missed event (in arrival order, each once, outside its bound: a resume
    /// is bounded by ``HistoryLimits/eventsPerResume``), then for each topic that cannot resume whole a
    /// `gap` status and its last value, then a `resumed` status (the seam: what follows is live), and
    /// from then on the live events of all its topics, nothing lost or doubled at the seam.
    ///
    /// Never partial: a topic whose missed events are not all held gets `gap` and none of them.
    ///
    /// A position older than the memory holds is asked of the market's archive (its tape) first: the
    /// hub serves everything else while the archive reads, then the archive's events, the memory's
    /// from where the archive stopped, and live follow as one.
    @discardableResult
    public func add(_ topics: [Topic], to id: SubscriberID, resuming resume: HubResume) async -> HubResumeOutcome {
        // What the tape's reads cost past the tenth each (charged as each is read) is charged once this
        // resume is gathered, so the read it paid for is not given up for its own cost.
        let limits = history?.limits ?? HistoryLimits()
        let resumeBound = limits.eventsPerResume
        let owner = subscribers[id]?.owner
        var archiveCost = 0
        var archived = await fromArchive(topics, to: id, owner: owner, resuming: resume, cost: &archiveCost)
        let term = history
        var former = await fromFormerEpoch(topics, to: id, owner: owner, resuming: resume, cost: &archiveCost)
        defer { if archiveCost > 0 { chargeReplay(archiveCost, to: id, owner: owner, limits: limits, now: WallClock.nowMilliseconds()) } }
        // A term that ended while the tape was read: the one read is not the former term any more, and
        // its events then this term's would skip a whole term between; the tape's answer of this term
        // is of the term that ended (both told `gap`, or the new term's memory answers).
        if history !== term { (archived, former) = (nil, nil) }
        guard let subscriber = subscribers[id] else { return HubResumeOutcome() }
        let (wanted, epochGaps, plain) = resumeRequests(topics, of: subscriber, resume)
        if case .unavailable(let unresumed, let why) = resume {
            let told = unresumed.intersection(plain)
            guard told.isEmpty else { return notResumed(told, plain: plain, subscriber: subscriber, why: why) }
            // None of them new here: a plain add, no status.
            add(plain, to: id, snapshot: { _ in true })
            var outcome = HubResumeOutcome()
            (outcome.epoch, outcome.sequence) = position
            return outcome
        }
        // What this subscriber may be replayed now: one resume's bound, less what it has queued and not
        // read yet (replays, recovered events), and within its budget over time (one resume's bound a
        // minute, and its key's connections together ``HistoryLimits/resumesPerKey`` of them), so
        // neither repeated resumes, nor many connections, nor a client that never reads make the hub
        // hold more.
        let now = WallClock.nowMilliseconds()
        // Without a history a resume still queues a `gap` and last values (every ticker's, for a
        // wildcard) outside the buffer: bounded the same way, at the default bound (`resumeBound`).
        let queued = subscriber.queue.replaying.load(ordering: .relaxed)
        let (available, byKey) = replayAllowance(of: subscriber, owner: owner, limits: limits, now: now)
        if !Self.mayBeReplayed(queued: queued, available: available, bound: resumeBound), !(wanted.isEmpty && epochGaps.isEmpty) {
            return notResumed(
                Set(wanted.map(\.topic)).union(epochGaps), plain: plain, subscriber: subscriber,
                why: queued >= resumeBound
                    ? "this connection has \(queued) replayed events it has not read yet (one resume replays at most \(resumeBound))"
                    : byKey
                        ? "this key's connections were replayed \(limits.keyReplayCapacity) events (notices, last values and scans included) in the last minute"
                        : "this connection was replayed \(resumeBound) events (notices, last values and scans included) in the last minute")
        }
        // Every topic's missed events (a former term's first), then trimmed to the bound by giving up
        // the largest whole.
        var gathering = ResumeGathering(
            epoch: epoch, limit: max(0, min(resumeBound - queued, available)), resumeBound: resumeBound, queued: queued,
            byKey: byKey && available < resumeBound - queued)
        for topic in epochGaps { gathering.formerTerm(topic, former?[topic], through: epochAdoptedAt ?? now) }
        gathering.thisTerm(of: history, now: now)
        for (topic, since) in wanted { gathering.missed(topic, since: since, archived: archived?[topic], history: history, now: now) }
        var outcome = HubResumeOutcome()
        let (replay, formerReplay) = gathering.trim(into: &outcome)
        outcome.replayedFrom = replay.lazy.map(\.sequence).filter { $0 > 0 }.min().map { $0 - 1 }
        let (delivery, withheld) = resumeDelivery(gathering, replay: replay, former: formerReplay, outcome: &outcome)
        // The notices and last values count too: they are queued outside the buffer like the replay; so
        // does what a wildcard of too many events cost to find so (its scan, up to the limit).
        chargeReplay(delivery.count + min(gathering.scannedPastLimit, gathering.limit), to: id, owner: owner, limits: limits, now: now)
        countResume(outcome, replayed: replay.count + formerReplay.count, fromTape: gathering.fromTape)
        if yield(HubDelivery(replay: delivery), count: 0, to: subscriber) {}
        // Live from here: the resumed and gap topics without a snapshot (they had theirs), the rest plainly,
        // and so a wildcard whose last values were withheld (a book's whole state through the buffer).
        let resumedTopics = Set(wanted.map(\.topic)).union(epochGaps)
        add(resumedTopics.union(plain), to: id, snapshot: { !resumedTopics.contains($0) || withheld.contains($0) })
        (outcome.epoch, outcome.sequence) = position
        return outcome
    }

    /// What a resume queues, in order: a former term's events, the time between the terms, this term's
    /// events (with a restart's gaps where the previous run's end), each `gap` with its topic's last
    /// values, and `resumed`. Adds the topics told a gap to `outcome`; `withheld`: the wildcards whose
    /// last values did not fit.
    private func resumeDelivery(
        _ gathering: ResumeGathering, replay: [MarketEvent], former: [MarketEvent], outcome: inout HubResumeOutcome
    ) -> (delivery: [MarketEvent], withheld: Set<Topic>) {
        var delivery = replay
        let restarted = gathering.acrossRestart.filter { outcome.replayed[$0.key] != nil }
        if !restarted.isEmpty, let marker = history?.restart?.marker {
            // The previous run's events, the restart's gaps, this run's events.
            let seam = replay.firstIndex { $0.sequence >= marker } ?? replay.endIndex
            delivery.insert(contentsOf: restarted.sorted { $0.key < $1.key }.map { wire.render($0.value) }, at: seam)
            outcome.gaps += restarted.keys.sorted()
        }
        if !gathering.acrossTerms.isEmpty {
            // The former term's events first, the time between, then this term's. Their positions are
            // the former term's, in their bytes; none is one of this term's, so they carry no market
            // sequence here (a tagged connection takes the newest it writes as where its client stands
            // in this term: the former term's numbers there would stand it past everything this term
            // has, and its next resume would be a `gap`).
            let formerOnly = former.map { $0.withoutSequence() }
            delivery = formerOnly + gathering.acrossTerms.sorted { $0.key < $1.key }.map { wire.render($0.value.notice) } + delivery
            outcome.gaps += gathering.acrossTerms.keys.sorted()
        }
        // A wildcard's last values (every ticker's) only within what the resume may still replay: counted
        // before they are gathered, and past it the `gap` says they are not sent.
        var room = gathering.limit - delivery.count
        var withheld = Set<Topic>()
        for (topic, notice) in gathering.gapNotices {
            outcome.gaps.append(topic)
            room -= 1
            let held = topic.isWildcard && givesLastValues(topic.eventType) ? entriesOfType[topic.eventType]?.count ?? 0 : 0
            guard held <= max(room, 0) else {
                var told = notice
                let why = "up to \(held) tickers' are more than this resume may replay now (\(max(room, 0)))"
                // A book's whole state still comes, through the client's buffer (the live add below).
                told.details["last_values"] = .text(folds(topic.eventType) ? "through the client's buffer: \(why)" : "not sent: \(why)")
                delivery.append(wire.render(told))
                withheld.insert(topic)
                continue
            }
            delivery.append(wire.render(notice))
            let values = lastValues(of: topic)
            delivery += values
            room -= values.count
        }
        delivery.append(wire.render(resumedStatus(outcome)))
        return (delivery, withheld)
    }

    /// Counts a resume in the metrics and in ``resumeCounts``.
    private func countResume(_ outcome: HubResumeOutcome, replayed: Int, fromTape: Int) {
        metrics.replayed.increment(by: replayed)
        if fromTape > 0 { metrics.archiveReplayed.increment(by: fromTape) }
        if !outcome.gaps.isEmpty { metrics.gaps.increment(by: outcome.gaps.count) }
        (outcome.gaps.isEmpty ? metrics.resumed : metrics.resumedWithGaps).increment()
        resumeCounts.resumes += 1
        if !outcome.gaps.isEmpty { resumeCounts.withGaps += 1 }
        resumeCounts.replayed += replayed
        resumeCounts.gaps += outcome.gaps.count
    }

    /// The archive's answers for the topics whose positions the memory no longer holds (of this epoch),
    /// each with the memory's events after where it was asked to end, copied when it was asked: the
    /// memory goes on evicting while the archive reads (a read of a cluster's stream takes tens of ms
    /// and more), and what it lets go meanwhile is in the copy, so the two meet after one read. `nil`:
    /// none asked.
    private func fromArchive(
        _ topics: [Topic], to id: SubscriberID, owner: String?, resuming resume: HubResume, cost: inout Int
    ) async -> [Topic: ArchivedTopic]? {
        guard let history, let epoch, !epoch.isEmpty, let subscriber = subscribers[id], mayReadArchive(for: subscriber, owner: owner, history.limits)
        else { return nil }
        var archived: [Topic: ArchivedTopic] = [:]
        // Per topic asked: the memory's events after `until`, and through which market sequence; copies
        // of one resume's bound in all (past it, the memory answers from `until` as it is then).
        var held: [Topic: (events: [MarketEvent], through: UInt64)] = [:]
        var copied = 0
        let requests = resumeRequests(topics, of: subscriber, resume).wanted.compactMap { topic, since -> ArchiveRequest? in
            guard case .gap(_, _, _, let reason) = history.missed(topic, since: since, limit: 0), reason == EventHistory.noLongerHeld else { return nil }
            // A `_s` of a ticker this history has no line of (not received lately, or never: any name
            // a client makes up) is not looked for on the tape: it would be read back block by block.
            if case .topic = since, !topic.isWildcard, !history.hasLine(topic) { return nil }
            let until = history.archiveBoundary(of: topic)
            switch history.missed(topic, since: .market(until), limit: history.limits.eventsPerResume) {
            case .events(let events) where copied + events.count <= history.limits.eventsPerResume:
                held[topic] = (events, history.nextMarketSequence - 1)
                copied += events.count
            case .events:
                held[topic] = ([], until)
            case .tooMany:
                // The memory's part alone is more than a resume replays: the tape is not read.
                archived[topic] = ArchivedTopic(answer: .tooMany, held: [], through: until)
                return nil
            case .gap, .acrossRestart:
                // (Not whole, or a position before a restart: the memory answers from `until` as it is then.)
                held[topic] = ([], until)
            }
            return ArchiveRequest(topic: topic, since: since, until: until)
        }
        if !requests.isEmpty {
            guard let answers = await readArchive(requests, epoch: epoch, for: id, owner: owner, cost: &cost) else { return nil }
            for request in requests {
                guard let answer = answers[request.topic], let (events, through) = held[request.topic] else { continue }
                archived[request.topic] = ArchivedTopic(answer: answer, held: events, through: through)
            }
        }
        // A term that ended while the tape was read (a new history: epochs are names, and a late one
        // may come back): its answers are of a term that is not this one any more, and the memory's
        // events would follow them by this term's numbers (the memory answers alone: a `gap` where it
        // does not hold them, never the other term's events as this one's).
        guard self.history === history, !archived.isEmpty else { return nil }
        return archived
    }

    /// A cluster node's resume from the leadership term before this one (the epoch this node adopted
    /// last before the current): what the tape holds of each topic after the client's position, through
    /// the term's end; `nil`: none asked (no archive, no history of adopted positions, or an epoch that
    /// is this one, or not the one before: an older one would skip a whole term).
    private func fromFormerEpoch(
        _ topics: [Topic], to id: SubscriberID, owner: String?, resuming resume: HubResume, cost: inout Int
    ) async -> [Topic: ArchiveAnswer]? {
        guard adoptsPositions, let history, let previousEpoch, let subscriber = subscribers[id] else { return nil }
        let fresh = topics.filter { !subscriber.topics.contains($0) }
        let requests: [ArchiveRequest]
        switch resume {
        case .positions(previousEpoch?, let positions):
            requests = fresh.compactMap { topic in
                // As for a resume of this epoch, a ticker with no line here is not looked for (it would
                // be read back block by block, and this term's part of it is not held anyway).
                guard let position = positions[topic], topic.isWildcard || history.hasLine(topic) || history.nextMarketSequence == 1 else { return nil }
                return ArchiveRequest(topic: topic, since: topic.isWildcard ? .market(position) : .topic(position), until: ArchiveRequest.epochEnd)
            }
        case .marketSequence(previousEpoch, let sequence, let floors):
            requests = fresh.map { ArchiveRequest(topic: $0, since: .market(max(sequence, floors[$0] ?? 0)), until: ArchiveRequest.epochEnd) }
        default:
            return nil
        }
        return await readArchive(requests, epoch: previousEpoch, for: id, owner: owner, cost: &cost)
    }

    /// The archive's answers to `requests` of `epoch` for a connection that may be replayed now (one
    /// that may not gets `gap`, not a read); `nil`: nothing asked. A read costs the connection (and its
    /// key) a tenth of a resume's budget at once, whatever it found (asking again and again reads at most
    /// ten times a minute per connection), and the rest of its share of a read's blocks (`cost`,
    /// charged once the resume is gathered): a read of every block a read may take, once a minute. A
    /// key's connections have at most ``tapeReadsPerKey`` reads under way at once; past it, `gap`.
    private func readArchive(
        _ requests: [ArchiveRequest], epoch: String, for id: SubscriberID, owner: String?, cost: inout Int
    ) async -> [Topic: ArchiveAnswer]? {
        guard !requests.isEmpty, let archive, let history, let subscriber = subscribers[id], mayReadArchive(for: subscriber, owner: owner, history.limits)
        else { return nil }
        let limits = history.limits
        let bound = limits.eventsPerResume
        guard let (answers, share) = await readingTape(requests, of: archive, epoch: epoch, limit: bound, owner: owner) else {
            return ArchiveAnswer.notRead(
                requests, because: "this key's connections have \(Self.tapeReadsPerKey) tape reads under way (at most \(Self.tapeReadsPerKey) at once)")
        }
        resumeCounts.fromArchive += 1
        metrics.archiveResumes.increment()
        let tenth = max(bound / 10, 1)
        chargeReplay(tenth, to: id, owner: owner, limits: limits, now: WallClock.nowMilliseconds())
        cost += max(Self.charge(share, of: bound) - tenth, 0)
        return answers
    }

    /// Whether the archive may be read for `subscriber` now: there is one, and the connection may be
    /// replayed now (one that may not gets `gap`, not a read).
    private func mayReadArchive(for subscriber: Subscriber, owner: String?, _ limits: HistoryLimits) -> Bool {
        let available = replayAllowance(of: subscriber, owner: owner, limits: limits, now: WallClock.nowMilliseconds()).events
        return archive != nil
            && Self.mayBeReplayed(queued: subscriber.queue.replaying.load(ordering: .relaxed), available: available, bound: limits.eventsPerResume)
    }

    /// The tape reads one client key's connections may have under way at once (of the
    /// ``TapeArchive``'s line of 8): one key's resumes never fill the line.
    static let tapeReadsPerKey = 2

    /// A read of `archive`, counted as `owner`'s while under way; `nil`, not read: its key's
    /// connections have ``tapeReadsPerKey`` reads under way already.
    private func readingTape(
        _ requests: [ArchiveRequest], of archive: any EventArchive, epoch: String, limit: Int, owner: String?
    ) async -> (answers: [Topic: ArchiveAnswer], cost: Double)? {
        if let owner {
            guard keyReplays[owner, default: KeyReplays()].reading < Self.tapeReadsPerKey else { return nil }
            keyReplays[owner, default: KeyReplays()].reading += 1
        }
        defer { if let owner { keyReplays[owner]?.reading -= 1 } }
        return await archive.reading(requests, epoch: epoch, limit: limit)
    }

    /// Who a subscriber's replays are charged to from now on: the client key it was admitted with
    /// (its name), whose connections share ``HistoryLimits/resumesPerKey`` resumes a minute and
    /// ``tapeReadsPerKey`` tape reads at once; `nil`: its own budget only.
    public func setOwner(_ key: String?, for id: SubscriberID) {
        subscribers[id]?.owner = key
    }

    /// What `subscriber` may be replayed at `now`: the less of its own budget and its key's
    /// (`owner`'s, as the resume charges it), and whether that is its key's.
    private func replayAllowance(of subscriber: Subscriber, owner: String?, limits: HistoryLimits, now: Int64) -> (events: Int, byKey: Bool) {
        let own = subscriber.replayBudget.available(capacity: limits.eventsPerResume, now: now)
        guard let owner, let shared = keyReplays[owner] else { return (own, false) }
        let key = shared.budget.available(capacity: limits.keyReplayCapacity, now: now)
        return key < own ? (key, true) : (own, false)
    }

    /// Charges `events` replayed to a subscriber (if it is still here) and to its key (even if not).
    private func chargeReplay(_ events: Int, to id: SubscriberID, owner: String?, limits: HistoryLimits, now: Int64) {
        subscribers[id]?.replayBudget.spend(events, capacity: limits.eventsPerResume, now: now)
        if let owner { keyReplays[owner, default: KeyReplays()].budget.spend(events, capacity: limits.keyReplayCapacity, now: now) }
    }

    /// A read's share of its blocks (0 through 1; anything else counts as nothing) of a resume's bound.
    static func charge(_ share: Double, of bound: Int) -> Int {
        guard share.isFinite, share > 0 else { return 0 }
        return Int((min(share, 1) * Double(bound)).rounded(.up))
    }

    /// Whether a connection may be replayed now: less than one resume's bound queued and unread, and at
    /// least 1% of its budget left (spent, a resume could replay next to nothing while its gaps' notices
    /// and last values would still be queued).
    private static func mayBeReplayed(queued: Int, available: Int, bound: Int) -> Bool {
        queued < bound && available * 100 >= bound
    }

    /// Per topic not held yet, where the client stands (`wanted`), or that its epoch is not this one's,
    /// or that it resumes from nowhere (`plain`).
    private func resumeRequests(
        _ topics: [Topic], of subscriber: Subscriber, _ resume: HubResume
    ) -> (wanted: [(topic: Topic, since: EventHistory.Since)], epochGaps: [Topic], plain: [Topic]) {
        let fresh = topics.filter { !subscriber.topics.contains($0) }
        var wanted: [(topic: Topic, since: EventHistory.Since)] = []
        var epochGaps: [Topic] = []
        var plain: [Topic] = []
        for topic in fresh {
            switch resume {
            case .positions(let epoch, let positions):
                guard let position = positions[topic] else {
                    plain.append(topic)
                    continue
                }
                if let epoch, epoch != self.epoch {
                    epochGaps.append(topic)
                } else {
                    wanted.append((topic, topic.isWildcard ? .market(position) : .topic(position)))
                }
            case .time(let milliseconds):
                wanted.append((topic, .time(milliseconds)))
            case .marketSequence(let epoch, let sequence, let floors):
                if epoch != self.epoch { epochGaps.append(topic) } else { wanted.append((topic, .market(max(sequence, floors[topic] ?? 0)))) }
            case .unavailable:
                plain.append(topic)
            }
        }
        return (wanted, epochGaps, plain)
    }

    /// A resume asked of a connection that has a whole resume's worth of replayed events (and notices)
    /// queued and not read, or was replayed that much in the last minute, or one with nothing to resume
    /// from (``HubResume/unavailable(_:why:)``): not made. One `gap` status says so, then `resumed`
    /// naming the topics; they are subscribed live, their last values through the connection's bounded
    /// buffer like any subscribe's, so repeating the ask makes the hub hold nothing more.
    private func notResumed(_ asked: Set<Topic>, plain: [Topic], subscriber: Subscriber, why: String) -> HubResumeOutcome {
        let names = asked.sorted()
        let shown = names.first.map { names.count > 1 ? "\($0) and \(names.count - 1) more" : "\($0)" } ?? ""
        var details: [String: Notice.Value] = [:]
        if let epoch { details["epoch"] = .text(epoch) }
        let notice = Notice(.gap, message: "not resumed (\(shown)): \(why); subscribed live", details: details)
        var outcome = HubResumeOutcome(replayed: [:], gaps: names)
        enqueue(HubDelivery([wire.render(notice), wire.render(resumedStatus(outcome))]), to: subscriber)
        metrics.gaps.increment(by: names.count)
        metrics.resumedWithGaps.increment()
        resumeCounts.resumes += 1
        resumeCounts.withGaps += 1
        resumeCounts.gaps += names.count
        add(asked.union(plain), to: subscriber.id, snapshot: { _ in true })
        (outcome.epoch, outcome.sequence) = position
        return outcome
    }

    /// The last values a topic's `gap` is followed by: a ticker's own, or every ticker's of a wildcard's
    /// type (a folded topic's: its whole state, so a book's holder starts it again whole), never a
    /// derived bar's (those belong to who names them); of the types a ticker's subscribe gives one of:
    /// none of a type that never gets one (a correction, a cancel: an old one would be applied as new),
    /// none without snapshots on subscribe, a folded topic's whole state always.
    private func lastValues(of topic: Topic) -> [MarketEvent] {
        let givesLast = snapshotOnSubscribe && !snapshotless.contains(topic.eventType)
        func value(_ entry: TopicEntry?) -> MarketEvent? { entry?.fold != nil || givesLast ? entry?.value : nil }
        if !topic.isWildcard { return value(entries[topic]).map { [$0] } ?? [] }
        return (entriesOfType[topic.eventType] ?? []).filter { topic.matches(eventType: $0.eventType, ticker: $0.ticker) }.compactMap { value(entries[$0]) }
            .sorted { ($0.sequence, $0.receivedAt, $0.ticker) < ($1.sequence, $1.receivedAt, $1.ticker) }
    }

    /// Whether a `gap` of this type is followed by last values (``lastValues(of:)``).
    private func givesLastValues(_ eventType: String) -> Bool {
        folds(eventType) || (snapshotOnSubscribe && !snapshotless.contains(eventType))
    }

    /// Whether this type's topics are kept folded (an order book's whole state).
    private func folds(_ eventType: String) -> Bool { folding?.eventTypes.contains(eventType) == true }

    private func resumedStatus(_ outcome: HubResumeOutcome) -> Notice {
        var details: [String: Notice.Value] = [
            "replayed": Notice.counts(outcome.replayed),
            "market_sequence": .number(Int64(clamping: (history?.nextMarketSequence ?? 1) - 1)),
        ]
        if !outcome.gaps.isEmpty { details["gaps"] = Notice.topics(outcome.gaps) }
        if let epoch { details["epoch"] = .text(epoch) }
        let count = outcome.replayed.values.reduce(0, +)
        let message =
            outcome.gaps.isEmpty
            ? "resumed: \(count) missed events replayed; live from here"
            : "resumed: \(count) missed events replayed, \(outcome.gaps.count) topics with a gap; live from here"
        return Notice(.resumed, message: message, details: details)
    }

    // MARK: going on after a restart

    /// Goes on from the previous run of this market (before anything is published or subscribed): its
    /// epoch is kept, its recent events are read back into the history (with their positions, and
    /// their topics' last values), and the restart is marked, so that a resume from before it gets what
    /// that run received, a `gap` naming the time nothing was received, then this run's events. Blocks
    /// the hub while the run is read (once, at start). Returns the events read back; 0 and nothing
    /// changed when this hub keeps no history of its own, or has published already.
    @discardableResult
    public func goOn(from prior: some PriorRun) -> Int {
        guard !adoptsPositions, let limits = historyLimits, (history?.nextMarketSequence ?? 1) == 1, !prior.epoch.isEmpty else { return 0 }
        let rebuilt = EventHistory(limits: limits, epoch: prior.epoch)
        var count = 0
        var steps = prior.steps()
        while let step = steps.next() {
            switch step {
            case .events(let all, let allPositions, let allArrivals):
                guard all.count == allPositions.count, all.count == allArrivals.count else { continue }
                // Read from a file: a position that is not plausible, or a topic's number past the
                // market's (which no relay gives), is not kept.
                let kept = all.indices.filter { allPositions[$0].isPlausible && allPositions[$0].topic <= allPositions[$0].market }
                let positions = kept.map { allPositions[$0] }
                let stamped = EventPosition.stamp(kept.map { all[$0] }, positions)
                rebuilt.append(stamped, positions: positions, arrivals: kept.map { allArrivals[$0] })
                if keepsLastValues { for event in stamped { entry(for: event.topic).keepLast(event) } }
                count += stamped.count
            case .wanted(let topic, let wanted, let at):
                if wanted { rebuilt.wanted(topic, now: at) } else { rebuilt.unwanted(topic, now: at) }
            case .holding(let topics, let at):
                rebuilt.holding(Set(topics), now: at)
            case .interrupted(let at):
                // As the run did: a loss took a market sequence of its own (a restart, a hole likewise).
                rebuilt.interruptAll(now: at, marked: true)
            }
        }
        let now = WallClock.nowMilliseconds()
        rebuilt.restarted(after: prior.lastMarketSequence, stoppedAt: prior.stoppedAt, now: now, leap: !prior.clean)
        rebuilt.evict(now: now)
        history = rebuilt
        epochBox.withLock { $0 = prior.epoch }
        metrics.record(rebuilt)
        return count
    }

    // MARK: reading

    /// The market sequence of the oldest event the history holds in memory (`nil`: no history); a
    /// resume from before it is answered from the archive, if there is one.
    public var oldestHeldSequence: UInt64? { history?.oldestSequence }

    /// The market sequence of the newest event (0: none, or no history).
    public var lastMarketSequence: UInt64 { (history?.nextMarketSequence ?? 1) - 1 }

    /// Where the market stands now: its epoch and the newest event's market sequence in it, read
    /// together (a new epoch cannot come between the two).
    public var position: (epoch: String?, sequence: UInt64) { (epoch, lastMarketSequence) }

    /// Resumes since start: how many, how many had a gap, events replayed, topics told `gap`, and state
    /// events merged by conflation.
    public var resumeStatistics: ResumeCounts { resumeCounts }

    /// The history's size: memory counted, events held, topics seen this epoch.
    public var historyStatistics: (memory: Int, events: Int, topics: Int)? {
        history.map { ($0.memory, $0.eventCount, $0.topicCount) }
    }
}

/// One client key's share of its connections' replays: their budget together, and their tape reads
/// under way. Kept per key name for as long as the hub lives (the key file's keys: a few bytes each).
struct KeyReplays {
    var budget = ReplayBudget()
    var reading = 0
}

extension HistoryLimits {
    /// What one key's connections together may be replayed a minute.
    var keyReplayCapacity: Int {
        let (product, overflow) = eventsPerResume.multipliedReportingOverflow(by: max(resumesPerKey, 1))
        return overflow ? Int.max : product
    }
}

/// A subscriber's replays over time: a token bucket of events holding at most `capacity` (one resume's
/// bound), refilled at `capacity` a minute. Value type.
struct ReplayBudget {
    /// Events left, and when that was counted (Unix ms); `nil`: full.
    private var left: (events: Double, at: Int64)?

    /// Events it may replay at `now`.
    func available(capacity: Int, now: Int64) -> Int {
        guard let left else { return capacity }
        let refilled = Double(max(now - left.at, 0)) * Double(capacity) / 60_000
        return Int(min(Double(capacity), left.events + refilled))
    }

    mutating func spend(_ events: Int, capacity: Int, now: Int64) {
        guard events > 0 else { return }
        left = (Double(max(available(capacity: capacity, now: now) - events, 0)), now)
    }
}

extension MarketDataHub {
    /// The leader of a cluster began a new epoch (a new leadership term): this node's history starts
    /// afresh under it (a resume from the old epoch is answered across the terms from the tape, or
    /// as `gap`).
    public func startEpoch(_ epoch: String) {
        guard adoptsPositions, let limits = historyLimits, history?.epoch != epoch else { return }
        if let history, history.epoch.isEmpty {
            // The events already kept were this epoch's first (its notice came after them).
            history.epoch = epoch
            epochBox.withLock { $0 = epoch }
            applyLeaderMark()
            return
        }
        let replaced = history != nil
        // What conflation and the gap fill hold of the old term goes out now, ahead of the notices: every
        // position a connection is sent after the `epoch` notice is the new epoch's.
        if replaced {
            for subscriber in subscribers.values where !subscriber.parked {
                guard let conflation = subscriber.conflation, !conflation.isEmpty else { continue }
                enqueue(HubDelivery(conflation.takeAll()), to: subscriber)
            }
            releaseHeldRecoveries()
        }
        // A new leadership term: its first event may come before this node heard that the last leader
        // is gone (a kill -9 sends no word; the lease is read every 250 ms). The outage starts here, so
        // its notice comes before that event and the window (and the fill) reaches back to the last
        // event of the old term. Already in one: nothing more.
        if replaced { upstreamLost(reason: "a new cluster leader's term began; events between the last leader's and its own may be missing") }
        epochAdoptedAt = WallClock.nowMilliseconds()
        previousEpoch = history.map(\.epoch).flatMap { $0.isEmpty ? nil : $0 }
        if replaced { for entry in entries.values { entry.forgetPosition() } }
        let fresh = EventHistory(limits: limits, epoch: epoch)
        // What this node wants now is what it receives whole from the new epoch's first events.
        for topic in wantedTopics { fresh.wanted(topic, now: WallClock.nowMilliseconds()) }
        history = fresh
        epochBox.withLock { $0 = epoch }
        applyLeaderMark()
        metrics.record(fresh)
        // Clients that stay connected are told: their `_s` and `_m` start again, under this epoch.
        guard replaced else { return }
        let notice = wire.render(
            Notice(
                .epoch, message: "positions start again under epoch \(epoch) (a new leadership term); a later since names it",
                details: ["epoch": .text(epoch)]))
        let told = subscribers.values.filter { !$0.topics.isEmpty && !$0.parked }
        for subscriber in told { enqueue(HubDelivery(epochNotice: notice, epoch: epoch), to: subscriber) }
        tell(told)
    }

    /// A subscriber's stream ended (its reader let it go, or the last copy of its subscription went):
    /// it is removed, unless parked. A parked one holds a session's topics until its session lets it
    /// go (``remove(_:)``), whoever held its subscription: a session restored at start-up keeps only
    /// the id.
    func streamEnded(_ id: SubscriberID) {
        guard subscribers[id]?.parked != true else { return }
        remove(id)
    }

    /// Parks a subscriber: it keeps its topics (still wanted, so their history stays whole) and gets
    /// nothing until removed. A broken tagged session's until its client comes back or its window ends.
    /// `false`: no such subscriber (removed, or evicted as too slow).
    @discardableResult
    public func park(_ id: SubscriberID) -> Bool {
        guard let subscriber = subscribers[id] else { return false }
        subscriber.parked = true
        // What was queued for it and not read goes now: a parked session holds topics, not events.
        subscriber.batch.withdraw(queue: subscriber.queue)
        subscriber.conflation = nil
        if conflating.remove(id) != nil { conflationChanged() }
        return true
    }
}
