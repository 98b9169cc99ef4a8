/// What a protocol folds from one topic's events so that a subscriber who joins late starts whole: an
/// order book built from its increments (Alpaca's crypto `orderbooks`), where the last event alone is a
/// change that means nothing.
///
/// The hub keeps one per topic of a type its ``TopicFolding`` names, folds every event of the topic into
/// it as it publishes, and gives a new subscriber ``whole()`` where it would give another topic's last
/// event. A fold knows when it is not whole (it has not seen the vendor's whole state since it began, or
/// since the events stopped) and then gives nothing: the relay never serves a state it knows is partial.
///
/// A class confined to its hub (not `Sendable`): the hub changes it in place on its own executor.
public protocol TopicFold: AnyObject {
    /// Takes the topic's next event (already positioned, if the hub positions events).
    func apply(_ event: MarketEvent)

    /// The whole state as one event, marked as whole as the vendor marks it (Alpaca's `"r":true`) and
    /// carrying the position of the last event folded in; `nil` while the state is not known whole.
    func whole() -> MarketEvent?

    /// Events stopped (an outage, a loss before the hub): not whole until the vendor sends a whole
    /// state again.
    func interrupt()

    /// Whether ``whole()`` would give a state.
    var isWhole: Bool { get }

    /// About how many bytes the state holds (its measurements).
    var footprint: Int { get }
}

/// Bounds of a fold's state, from the settings.
public struct FoldLimits: Sendable, Equatable {
    /// The most price levels an order book keeps per side (the best ones).
    public var bookLevels: Int

    public static let defaultBookLevels = 1000

    public init(bookLevels: Int = Self.defaultBookLevels) {
        self.bookLevels = max(bookLevels, 1)
    }
}

/// Which event types of a market are folded and how a topic's fold is made: asked of the market's
/// protocol once (``WireProtocol/folding(of:limits:)``) and handed to its hub.
public struct TopicFolding: Sendable {
    /// The event types whose topics are folded.
    public let eventTypes: Set<String>
    private let make: @Sendable (Topic) -> any TopicFold

    public init(eventTypes: Set<String>, make: @escaping @Sendable (Topic) -> any TopicFold) {
        self.eventTypes = eventTypes
        self.make = make
    }

    /// A new, not yet whole fold for `topic`, if its type is folded.
    public func fold(for topic: Topic) -> (any TopicFold)? {
        guard !topic.isWildcard, eventTypes.contains(topic.eventType) else { return nil }
        return make(topic)
    }
}
