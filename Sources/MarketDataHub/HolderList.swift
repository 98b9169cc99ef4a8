/// The holders of one topic (or of one event type's wildcard): an array, which a publish walks, and —
/// once it holds more than a few — each holder's place in it, so taking one out costs the same however
/// many hold the topic. Without the places, closing n connections that hold one popular topic cost n²
/// comparisons on the hub (10,000 dashboards on `T.SPY`: 50 million), all in one actor turn each.
///
/// Order is not kept: a holder taken out is replaced by the last one. Nothing depends on the order in
/// which a topic's holders get an event; each has a stream of its own.
struct HolderList<Holder: AnyObject>: Collection {
    private(set) var members: [Holder] = []
    /// Each holder's index in `members`, kept while there are more than ``placesFrom`` of them.
    private var places: [ObjectIdentifier: Int]?

    /// Below this many, a scan is as cheap as the table and costs no memory.
    static var placesFrom: Int { 32 }

    init() {}

    init(_ holders: some Sequence<Holder>) {
        for holder in holders { append(holder) }
    }

    var startIndex: Int { members.startIndex }
    var endIndex: Int { members.endIndex }
    var count: Int { members.count }
    var isEmpty: Bool { members.isEmpty }
    subscript(position: Int) -> Holder { members[position] }
    func index(after index: Int) -> Int { index + 1 }
    /// The array's own iterator: the publish walks it as fast as it walked the array before.
    func makeIterator() -> IndexingIterator<[Holder]> { members.makeIterator() }

    /// Adds a holder (the caller knows it is not in the list yet).
    mutating func append(_ holder: Holder) {
        members.append(holder)
        if places != nil {
            places?[ObjectIdentifier(holder)] = members.count - 1
        } else if members.count > Self.placesFrom {
            var table = [ObjectIdentifier: Int](minimumCapacity: members.count * 2)
            for (index, member) in members.enumerated() { table[ObjectIdentifier(member)] = index }
            places = table
        }
    }

    /// Takes a holder out; `false` when it was not in the list.
    @discardableResult
    mutating func remove(_ holder: Holder) -> Bool {
        let index: Int
        if places != nil {
            guard let place = places?.removeValue(forKey: ObjectIdentifier(holder)) else { return false }
            index = place
        } else {
            guard let place = members.firstIndex(where: { $0 === holder }) else { return false }
            index = place
        }
        let last = members.count - 1
        if index != last {
            members.swapAt(index, last)
            places?[ObjectIdentifier(members[index])] = index
        }
        members.removeLast()
        // Dropped again well below the threshold (not at it, so a count going up and down by one
        // there does not build and drop the table each time).
        if places != nil, members.count < Self.placesFrom / 2 { places = nil }
        return true
    }

    /// Whether the places table is kept (for tests).
    var isIndexed: Bool { places != nil }
}
