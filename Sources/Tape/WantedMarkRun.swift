/// The recorder's newest run of wanted-set marks with no events between them, kept as few marks that
/// say no more than the run did: for each topic its first mark if that was a drop (the topic stopped
/// being received then) and its last if that was a take (received from then). A topic taken and dropped
/// within the run leaves nothing, one dropped and taken again leaves both. What it drops only ever
/// shortens what the tape says was received, never lengthens it, and no event came between. So a
/// client churning topics costs the tape one or two marks a topic a flush, not one a change.
struct WantedMarkRun {
    /// The epoch the marks count in.
    let epoch: String?
    private var marks: [String: (first: Mark, last: Mark)] = [:]
    private var count = 0

    private struct Mark {
        var wanted: Bool
        var at: Int64
        var order: Int
    }

    init(epoch: String?) {
        self.epoch = epoch
    }

    /// The topics the run holds a mark of.
    var topicCount: Int { marks.count }

    /// The hub began (`true`) or stopped receiving `topic` at `at`.
    mutating func add(_ topic: String, wanted: Bool, at: Int64) {
        let mark = Mark(wanted: wanted, at: at, order: count)
        count += 1
        if marks[topic] == nil { marks[topic] = (mark, mark) } else { marks[topic]?.last = mark }
    }

    /// The marks that say what the run said, in the order they came.
    func records() -> [TapeRecord] {
        var kept: [(topic: String, mark: Mark)] = []
        kept.reserveCapacity(marks.count)
        for (topic, pair) in marks {
            if !pair.first.wanted { kept.append((topic, pair.first)) }
            if pair.last.wanted { kept.append((topic, pair.last)) }
        }
        kept.sort { $0.mark.order < $1.mark.order }
        return kept.map { .wanted(topic: $0.topic, $0.mark.wanted, at: $0.mark.at) }
    }
}
