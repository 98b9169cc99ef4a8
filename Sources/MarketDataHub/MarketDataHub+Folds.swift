import MarketCore

/// Snapshots from elsewhere and folded states (order books): a cluster node's seeds from its last-value
/// store, whole books adopted from it, and the whole states a new or recovering holder gets.
extension MarketDataHub {
    /// A topic's last event from elsewhere (a cluster's last-value store), for the snapshot on
    /// subscribe. Used only while the topic has subscribers and no event of its own yet: then it becomes
    /// the topic's last event and each of its subscribers gets it. A live event that arrived first wins,
    /// so a late seed never puts an older event after a newer one.
    public func seed(_ event: MarketEvent) {
        if let entry = entries[event.topic], let fold = entry.fold {
            adoptWhole(event, of: event.topic, into: entry, fold)
            return
        }
        guard snapshotOnSubscribe, !snapshotless.contains(event.eventType), let entry = entries[event.topic], entry.last == nil,
            !entry.subscribers.isEmpty
        else { return }
        entry.keepLast(event)
        for subscriber in entry.subscribers { enqueue(HubDelivery([event]), to: subscriber) }
        tell(entry.subscribers)
    }

    /// A folded topic's whole state from elsewhere (the cluster's store holds the leader's book, at the
    /// position of the last change in it): taken while this hub's own is not whole, brought up to date
    /// with the changes held back since that position, and sent to the topic's holders. Not taken when a
    /// change after it is missing (the next, newer one from the store will do).
    func adoptWhole(_ whole: MarketEvent, of topic: Topic, into entry: TopicEntry, _ fold: any TopicFold) {
        guard !fold.isWhole, let position = EventPosition.read(from: whole.bytes) else { return }
        // Only when the changes this node holds reach from at most the one right after the whole state to
        // at least the whole state's own: then nothing between went by unseen, and the whole state is of
        // the changes this node holds (not of a former term, whose sequences started afresh; with nothing
        // held yet, the next round of the store decides). Both sequences must agree: a change before the
        // whole state has a market sequence at most its, one after it a larger one.
        let held = entry.heldBack.compactMap { event in EventPosition.read(from: event.bytes).map { (event, $0) } }
        guard let first = held.first?.1, let last = held.last?.1, first.topic <= position.topic + 1, last.topic >= position.topic else { return }
        var later: [MarketEvent] = []
        var expected = position.topic + 1
        for (event, at) in held {
            guard at.topic > position.topic else {
                guard at.market <= position.market else { return }
                continue
            }
            guard at.topic == expected, at.market > position.market else { return }
            expected += 1
            later.append(event)
        }
        fold.apply(whole)
        for event in later { fold.apply(event) }
        guard let rendered = fold.whole() else { return }
        entry.releaseHeldBack()
        foldsAdopted.increment()
        let holders = entry.subscribers.members + (wildcards[topic.eventType]?.members ?? [])
        for subscriber in holders { enqueue(HubDelivery([rendered]), to: subscriber) }
        tell(holders)
    }

    /// The whole states (order books) of the folded topics in `topics`, a wildcard's being every one of
    /// its type.
    func wholeStates(held topics: Set<Topic>) -> [MarketEvent] {
        foldedEntries(held: topics).compactMap { entries[$0]?.fold?.whole() }
    }

    /// The folded topics `topics` names: a wildcard's type's entries and the topics held by name (not a
    /// walk of every entry).
    func foldedEntries(held topics: Set<Topic>) -> [Topic] {
        guard let folding else { return [] }
        let wildTypes = Set(topics.filter { $0.isWildcard && folding.eventTypes.contains($0.eventType) }.map(\.eventType))
        let candidates = wildTypes.flatMap { entriesOfType[$0] ?? [] } + topics.filter { !$0.isWildcard && !wildTypes.contains($0.eventType) }
        return candidates.filter { folding.eventTypes.contains($0.eventType) }
    }

    /// Folded topics someone here holds, whose events come, and whose state is not whole: what a source
    /// asks for anew (the upstream, or a cluster node's store). One whose events never came (a symbol
    /// the vendor does not have) is not asked for.
    public func foldsNotWhole() -> [Topic] {
        entries.compactMap { topic, entry in
            guard let fold = entry.fold, !fold.isWhole, entry.last != nil, !entry.subscribers.isEmpty || wildcards[topic.eventType] != nil else {
                return nil
            }
            return topic
        }
    }
}
