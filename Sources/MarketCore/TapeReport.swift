/// A market's recording, as `/healthz` and the dashboard show it: whether it records now, what it has
/// written and dropped, and why it is paused when it is.
public struct TapeReport: Sendable, Codable, Equatable {
    /// It records now (not paused by a failing disk).
    public var recording: Bool
    /// Events in blocks on disk.
    public var eventsRecorded: Int
    /// Events not recorded (a full queue, a paused recording).
    public var eventsDropped: Int
    public var blocksWritten: Int
    public var bytesWritten: Int
    /// The error that paused recording, while it is paused.
    public var pausedBecause: String?
    /// Where the tape is kept: `disk` (day files) or `jetstream` (a cluster's stream).
    public var store: String?
    /// What the tape holds now (looked at once a minute): its bytes, its UTC days (on a disk), and
    /// its oldest record's time (unix ms). `nil` until first looked at.
    public var heldBytes: Int64?
    public var heldDays: Int?
    public var heldSince: Int64?

    public init(eventsRecorded: Int, eventsDropped: Int, blocksWritten: Int, bytesWritten: Int, pausedBecause: String?) {
        recording = pausedBecause == nil
        self.eventsRecorded = eventsRecorded
        self.eventsDropped = eventsDropped
        self.blocksWritten = blocksWritten
        self.bytesWritten = bytesWritten
        self.pausedBecause = pausedBecause
    }
}
