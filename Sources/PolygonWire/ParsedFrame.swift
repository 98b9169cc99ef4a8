/// What one server frame held, in order of kind: market events, status objects, and how many
/// elements were well-formed JSON but neither (no `ev`, no ticker, not an object).
public struct ParsedFrame: Sendable {
    public var events: [MarketEvent] = []
    public var statuses: [StatusMessage] = []
    public var skipped = 0

    public init() {}
}
