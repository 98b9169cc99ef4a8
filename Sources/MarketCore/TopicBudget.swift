/// Distinct topics shared by every connection of a server: what a ``ServerSession`` reserves before it
/// subscribes new topics and releases when it gives them up. The server behind it bounds the distinct
/// topics per key and in all (the upstream is asked for their union), so many connections cannot add up
/// to an unbounded upstream subscription. Value type of two closures, `Sendable`.
public struct TopicBudget: Sendable {
    /// The part of `topics` (new to the connection) that may not be added for `grant`, and why.
    public var reserve: @Sendable (_ topics: [Topic], _ grant: ClientGrant) -> (refused: [Topic], reason: String?)
    /// Topics the connection holds no more.
    public var release: @Sendable (_ topics: [Topic], _ grant: ClientGrant) -> Void

    public init(
        reserve: @escaping @Sendable ([Topic], ClientGrant) -> (refused: [Topic], reason: String?),
        release: @escaping @Sendable ([Topic], ClientGrant) -> Void
    ) {
        self.reserve = reserve
        self.release = release
    }
}
