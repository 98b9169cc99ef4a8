/// Where a market's older events are kept beyond the hub's memory (the tape is one): a resume from a
/// position the hub no longer holds is answered from it, then from memory, then live. The hub asks it
/// only for positions of its own epoch, and only up to where its memory takes over. `Sendable`; a read
/// may take a while (it waits on the disk off the hub: the hub serves everything else meanwhile).
public protocol EventArchive: Sendable {
    /// What each topic missed after where its client stands, through its request's `until`, in
    /// `epoch`: every event (whole: the topic was received all that time, every market sequence
    /// between on the archive), or why not. At most `limit` events in all; a topic past it is
    /// ``ArchiveAnswer/tooMany``. With it, the share of what one read may cost (its blocks, 0 through
    /// 1) it took: what the client that asked is charged.
    func reading(_ requests: [ArchiveRequest], epoch: String, limit: Int) async -> (answers: [Topic: ArchiveAnswer], cost: Double)
}

extension EventArchive {
    /// ``reading(_:epoch:limit:)``'s answers alone.
    public func missed(_ requests: [ArchiveRequest], epoch: String, limit: Int) async -> [Topic: ArchiveAnswer] {
        await reading(requests, epoch: epoch, limit: limit).answers
    }
}

/// Where a resuming client stands on a topic. Value type, `Sendable`.
public enum ResumePoint: Sendable, Equatable {
    /// A ticker topic's topic sequence (`_s`) of the last event the client has.
    case topic(UInt64)
    /// The market sequence (`_m`) of the last event the client has.
    case market(UInt64)
    /// Every event that arrived at or after this Unix ms.
    case time(Int64)
}

/// One topic a resume asks the archive for, where its client stands, and the market sequence through
/// which it is asked (the hub's memory holds the topic's events after it). Value type, `Sendable`.
public struct ArchiveRequest: Sendable, Equatable {
    public var topic: Topic
    public var since: ResumePoint
    public var until: UInt64

    public init(topic: Topic, since: ResumePoint, until: UInt64) {
        self.topic = topic
        self.since = since
        self.until = until
    }

    /// `until` for an epoch that is over (a cluster's former leadership term): every event after the
    /// client's through the end of the epoch on the archive, answered ``ArchiveAnswer/throughEnd(_:_:endedAt:)``.
    public static let epochEnd = UInt64.max
}

/// What the archive has of a topic. `Sendable`.
public enum ArchiveAnswer: Sendable {
    /// Its events as received (the upstream's bytes) and their positions, oldest first; possibly none.
    case events([MarketEvent], [EventPosition])
    /// Not whole: why, and the range in the position's own numbering (`unit`: `topic_sequence`,
    /// `market_sequence` or `unix_ms`).
    case gap(from: UInt64, through: UInt64, unit: String, reason: String)
    /// More than the limit.
    case tooMany
    /// For ``ArchiveRequest/epochEnd``: its events through the end of the epoch on the archive (its
    /// positions as ``events(_:_:)``), and when the archive's record of the epoch ends (Unix ms): what
    /// came after is not on it.
    case throughEnd([MarketEvent], [EventPosition], endedAt: Int64)

    /// Each request's topic answered `gap` for `reason`, nothing read (the archive, or the client's
    /// share of it, is busy).
    public static func notRead(_ requests: [ArchiveRequest], because reason: String) -> [Topic: ArchiveAnswer] {
        Dictionary(
            requests.map { ($0.topic, ArchiveAnswer.gap(from: 0, through: 0, unit: "market_sequence", reason: reason)) },
            uniquingKeysWith: { first, _ in first })
    }
}
