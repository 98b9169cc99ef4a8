/// Where a market's older events are kept beyond the hub's memory (the tape is one): a resume from a
/// position the hub no longer holds is answered from it, then from memory, then live. The hub asks it
/// only for positions of its own epoch, and only up to where its memory takes over. `Sendable`; a read
/// may take a while (it waits on the disk off the hub: the hub serves everything else meanwhile).
public protocol EventArchive: Sendable {
    /// What each topic missed after where its client stands, through market sequence `until`, in
    /// `epoch`: every event (whole: the topic was received all that time), or why not. At most `limit`
    /// events in all; a topic past it is ``ArchiveAnswer/tooMany``.
    func missed(_ requests: [ArchiveRequest], epoch: String, until: UInt64, limit: Int) async -> [Topic: ArchiveAnswer]
}

/// One topic a resume asks the archive for, and where its client stands. Value type, `Sendable`.
public struct ArchiveRequest: Sendable, Equatable {
    public enum Since: Sendable, Equatable {
        /// A ticker topic's topic sequence (`_s`) of the last event the client has.
        case topic(UInt64)
        /// The market sequence (`_m`) of the last event the client has.
        case market(UInt64)
        /// Every event that arrived at or after this Unix ms.
        case time(Int64)
    }

    public var topic: Topic
    public var since: Since

    public init(topic: Topic, since: Since) {
        self.topic = topic
        self.since = since
    }
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
}
