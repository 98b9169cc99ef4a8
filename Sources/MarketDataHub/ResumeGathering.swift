import HeapModule
import MarketCore

/// What a resume found of a topic whose client's position the memory no longer held: the archive's
/// answer (through the market sequence the memory had let go through when it was asked), then the
/// memory's events after that through market sequence `through`, copied when the archive was asked
/// (the memory may let them go while the archive reads); the memory answers the rest, after `through`.
struct ArchivedTopic {
    let answer: ArchiveAnswer
    let held: [MarketEvent]
    let through: UInt64
}

/// What one resume gathers before anything is queued (``MarketDataHub/add(_:to:resuming:)``): each
/// topic's missed events (and, across a cluster's leadership terms, the former term's), the notices of
/// the topics that cannot resume whole, and how many events came from the tape. The hub fills it in
/// steps, in the order their notices are told, then trims it to the resume's bound and turns it into
/// one delivery. A plain value; it touches no hub state.
struct ResumeGathering {
    /// The hub's epoch, named in every `gap`.
    let epoch: String?
    /// How many events this resume may replay.
    let limit: Int
    /// Why a topic past ``limit`` is not replayed ("more than one resume replays (…)").
    let why: String
    /// Each topic's missed events of this term and of the former one: within ``limit`` as they come,
    /// by giving up the largest topics whole (a resume of many topics never holds each one's events
    /// before it is trimmed, only about twice the limit at most).
    /// A topic given up after it was gathered leaves its place empty (`nil`).
    private(set) var found: [(topic: Topic, events: [MarketEvent], former: [MarketEvent])?] = []
    /// The gathered topics' sizes and places in ``found``, the largest on top: a topic is given up in
    /// O(log n), so a resume of many topics is never quadratic in them.
    private var bySize = Heap<Gathered>()
    /// The events of ``found``.
    private var gathered = 0
    /// The topics given up past ``limit`` as they came, with their counts; and the fewest events of
    /// one: a topic of as many or more is given up as it comes (``trim(into:)`` gives up the largest).
    private var givenUp: [(topic: Topic, count: Int)] = []
    private var givenUpFrom = Int.max
    /// The topics told `gap` (each followed by its last values where it has them and they fit), in the
    /// order told.
    private(set) var gapNotices: [(Topic, Notice)] = []
    /// Topics resuming from before a restart: the time nothing was received, told between the previous
    /// run's events and this run's.
    private(set) var acrossRestart: [Topic: Notice] = [:]
    /// Topics resuming from a cluster's former term, found whole on its tape: that term's events and the
    /// gap naming the time between the terms (then this term's events).
    private(set) var acrossTerms: [Topic: (former: [MarketEvent], notice: Notice)] = [:]
    /// Events read from the archive (the tape).
    private(set) var fromTape = 0
    /// Events scanned for wildcards found to have more than ``limit`` (each up to the limit; a ticker's
    /// count is known without a scan, but for a resume from before a restart, which walks its events
    /// and is not charged this): a resume that replays none of them still cost that.
    private(set) var scannedPastLimit = 0

    /// `byKey`: the limit is what the connection's key may still be replayed this minute.
    init(epoch: String?, limit: Int, resumeBound: Int, queued: Int, byKey: Bool = false) {
        self.epoch = epoch
        self.limit = limit
        why =
            limit == resumeBound
            ? "more than one resume replays (\(resumeBound))"
            : byKey
                ? "more than this key's connections may be replayed now (\(limit) left of what they may be replayed a minute)"
                : "more than this connection may be replayed now (\(limit): one resume replays \(resumeBound), less what the connection has not read yet (\(queued)) and what it was replayed in the last minute)"
    }

    private var afresh: String { "the relay's history of this market started afresh (epoch \(epoch ?? "none"))" }

    /// A topic whose client's epoch is the former term's: that term's events from its tape (`answer`),
    /// whole through the term's end, or a `gap`. `through`: when this node began its term (Unix ms).
    mutating func formerTerm(_ topic: Topic, _ answer: ArchiveAnswer?, through: Int64) {
        switch answer {
        case .throughEnd(let events, let positions, let endedAt):
            let seconds = Double(max(through - endedAt, 0) / 100) / 10
            acrossTerms[topic] = (
                EventPosition.stamp(events, positions),
                gapStatus(
                    topic, message: "nothing was received for \(seconds) s between two leadership terms (\(afresh)); the events before and after are replayed",
                    from: (UInt64(max(endedAt, 0)), UInt64(max(through, 0)), EventHistory.GapUnit.unixMilliseconds.rawValue)))
        case .gap(_, _, _, let reason):
            gapNotices.append((topic, gapStatus(topic, message: "\(afresh); the former term's tape has not all its missed events (\(reason)); none are replayed", from: nil)))
        default:
            gapNotices.append((topic, gapStatus(topic, message: "\(afresh); nothing can be replayed", from: nil)))
        }
    }

    /// This term's events of each topic found whole on the former term's tape, from its first (whole
    /// only if `history` holds them all); a topic whose term is not all held becomes a `gap`.
    mutating func thisTerm(of history: EventHistory?, now: Int64) {
        for (topic, (earlier, _)) in acrossTerms.sorted(by: { $0.key < $1.key }) {
            // A ticker this history has no line of, once the term has had events, was not received here.
            var missed = history?.missed(topic, since: topic.isWildcard ? .market(0) : .topic(0), limit: max(limit - earlier.count, 0), now: now)
            if let history, !topic.isWildcard, !history.hasLine(topic), history.nextMarketSequence > 1 {
                missed = .gap(from: 1, through: 1, unit: .topicSequence, reason: "this node did not receive it this term")
            }
            switch missed {
            case .events(let events):
                add(topic, events, former: earlier)
                fromTape += earlier.count
            case .gap(_, _, _, let reason):
                acrossTerms[topic] = nil
                gapNotices.append((topic, gapStatus(topic, message: "\(afresh); this term's events are not all held (\(reason)); none are replayed", from: nil)))
            default:
                acrossTerms[topic] = nil
                if case .tooMany = missed, topic.isWildcard { scannedPastLimit += max(limit - earlier.count, 0) }
                gapNotices.append((topic, gapStatus(topic, message: "its missed events are \(why); none are replayed", from: nil)))
            }
        }
    }

    /// A topic of this epoch: its missed events since `since`, from the archive's answer (`archived`:
    /// the tape's events, the memory's copied when the tape was asked, then the memory's after those) or
    /// from the memory alone.
    mutating func missed(_ topic: Topic, since: EventHistory.Since, archived: ArchivedTopic?, history: EventHistory?, now: Int64) {
        guard let history else {
            take(topic, .gap(from: 0, through: 0, unit: .marketSequence, reason: "this relay keeps no history"))
            return
        }
        guard let archived else {
            take(topic, history.missed(topic, since: since, limit: limit, now: now))
            return
        }
        switch archived.answer {
        case .events(let events, let positions), .throughEnd(let events, let positions, _):
            let older = EventPosition.stamp(events, positions)
            let rest = history.missed(topic, since: .market(archived.through), limit: max(limit - older.count - archived.held.count, 0), now: now)
            take(topic, rest, after: older, held: archived.held)
        case .gap(let from, let through, let unit, let reason):
            gapNotices.append(
                (topic, gapStatus(topic, message: "missed events \(reason) (read from the tape); none are replayed", from: (from, through, unit))))
        case .tooMany:
            take(topic, .tooMany)
        }
    }

    /// What the memory answers for a topic, after what the archive found first (`older`) and what the
    /// memory held when the archive was asked (`held`).
    private mutating func take(_ topic: Topic, _ missed: EventHistory.Missed, after older: [MarketEvent] = [], held: [MarketEvent] = []) {
        switch missed {
        case .events(let events):
            add(topic, older + held + events)
            fromTape += older.count
        case .acrossRestart(let before, let downFrom, let downTo, let after):
            add(topic, older + held + before + after)
            fromTape += older.count
            let seconds = Double(max(downTo - downFrom, 0) / 100) / 10
            acrossRestart[topic] = gapStatus(
                topic,
                message: "nothing was received for \(seconds) s (the relay restarted); the events before and after are replayed",
                from: (UInt64(max(downFrom, 0)), UInt64(max(downTo, 0)), EventHistory.GapUnit.unixMilliseconds.rawValue))
        case .gap(let from, let through, let unit, let reason):
            gapNotices.append((topic, gapStatus(topic, message: "missed events \(reason); none are replayed", from: (from, through, unit.rawValue))))
        case .tooMany:
            if topic.isWildcard { scannedPastLimit += limit }
            gapNotices.append((topic, gapStatus(topic, message: "its missed events are \(why); none are replayed", from: nil)))
        }
    }

    /// A topic's events, unless they are past the limit with those gathered: then the largest topics are
    /// given up (this one, or others) until the rest are within it.
    private mutating func add(_ topic: Topic, _ events: [MarketEvent], former: [MarketEvent] = []) {
        let count = events.count + former.count
        guard count < givenUpFrom else {
            givenUp.append((topic, count))
            return
        }
        bySize.insert(Gathered(count: count, place: found.count))
        found.append((topic, events, former))
        gathered += count
        while gathered > limit, let largest = bySize.popMax(), let dropped = found[largest.place] {
            found[largest.place] = nil
            gathered -= largest.count
            givenUpFrom = min(givenUpFrom, largest.count)
            givenUp.append((dropped.topic, largest.count))
        }
    }

    /// A gathered topic's size and place in ``found``: the larger is given up first, and of two as
    /// large the one gathered first.
    private struct Gathered: Comparable {
        let count: Int
        let place: Int

        static func < (a: Self, b: Self) -> Bool { a.count != b.count ? a.count < b.count : a.place > b.place }
    }

    /// The events replayed, within ``limit`` by giving up the largest topics whole (each told `gap`):
    /// this term's and the former term's, each in arrival order and each event once (a ticker topic and
    /// its wildcard share events). Counts each replayed topic in `outcome`.
    mutating func trim(into outcome: inout HubResumeOutcome) -> (replay: [MarketEvent], former: [MarketEvent]) {
        // What was gathered is within the limit, and what was given up is larger: smallest first.
        for (topic, count) in givenUp.sorted(by: { $0.count < $1.count }) {
            acrossTerms[topic] = nil
            gapNotices.append((topic, gapStatus(topic, message: "\(count) missed events are \(why); none are replayed", from: nil)))
        }
        var replay: [MarketEvent] = []
        var seen = Set<UInt64>()
        var formerReplay: [MarketEvent] = []
        var formerSeen = Set<UInt64>()
        for case let (topic, events, former)? in found {
            outcome.replayed[topic] = events.count + former.count
            for event in events where seen.insert(event.sequence).inserted { replay.append(event) }
            for event in former where formerSeen.insert(event.sequence).inserted { formerReplay.append(event) }
        }
        replay.sort { $0.sequence < $1.sequence }
        formerReplay.sort { $0.sequence < $1.sequence }
        return (replay, formerReplay)
    }

    /// A topic's `gap` status, naming the epoch and, when known, the missing range.
    private func gapStatus(_ topic: Topic, message: String, from range: (UInt64, UInt64, String)?) -> Notice {
        var details: [String: Notice.Value] = ["topic": .text(topic.description)]
        if let epoch { details["epoch"] = .text(epoch) }
        if let (from, through, unit) = range {
            details["from"] = .number(Int64(clamping: from))
            details["through"] = .number(Int64(clamping: through))
            details["unit"] = .text(unit)
        }
        return Notice(.gap, message: "\(topic): \(message)", details: details)
    }
}
