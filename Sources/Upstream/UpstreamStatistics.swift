/// Counters of the upstream connection since start. Value type, `Sendable`.
public struct UpstreamStatistics: Sendable, Equatable {
    public var connectAttempts = 0
    public var messagesReceived = 0
    public var eventsReceived = 0
    public var malformedMessages = 0
    public var oversizedMessages = 0
    /// Events dropped for their size, their ticker's length or a type the market does not have.
    public var refusedEvents = 0
    /// Events dropped because the queue to the hub was full.
    public var droppedEvents = 0
    /// Connections that ended other than by shutdown, by cause (`closed`, `failed`, `dead`,
    /// `handshake_timeout`, `auth_failed`, `max_connections`).
    public var reconnectsByCause: [String: Int] = [:]
    /// The last `error` or `auth_timeout` status the upstream sent.
    public var lastError: String?
    /// Connections closed by the service thread because the deadline (``UpstreamClient/setDeadline(_:)``)
    /// passed, and when the last such close happened.
    public var deadlineCloses = 0
    public var lastDeadlineClose: ContinuousClock.Instant?
}
