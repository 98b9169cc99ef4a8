import MarketCore
import NIOCore

/// The leader's folded topics (order books) as it publishes their events: each one's whole state goes
/// to the last-value store in place of its last change (a change alone means nothing to a node that
/// starts on it), written with the other last values, so a node that begins receiving a book late takes
/// it whole from there and brings it up to date by position (``MarketDataHub/seed(_:)``).
///
/// A fold that is not whole (before the vendor's whole book, after a loss, once its topic left the
/// upstream set) empties its entry in the store: no node takes a book the leader cannot vouch for.
/// Held in the leader's lock: its folds are classes confined to it.
///
/// Bounded by count and by bytes (each book's ``TopicFold/footprint``, as the hub counts its own): a
/// publisher of many books, or of deep ones, cannot make the leader hold more than ``bytesLimit``. Past
/// it, the books changed longest ago are let go (emptied in the store) down to nine tenths of it.
struct FoldedLastValues {
    private struct Book {
        let fold: any TopicFold
        /// Its footprint as last counted.
        var bytes: Int
        /// When it last changed, in changes to any book.
        var changedAt: UInt64
    }

    private var folds: [Topic: Book] = [:]
    private var changed: Set<Topic> = []
    /// Every book's footprint, as last counted.
    private(set) var bytes = 0
    private var changes: UInt64 = 0
    /// Books let go for room: taken again from a whole book, or from a change once the books are under
    /// seven tenths of the bound (at most ``limit`` × 10 names; past that it starts afresh).
    private var resting: Set<Topic> = []
    let bytesLimit: Int

    /// The most books kept; past it they start afresh (each whole again at its vendor's next reset).
    static let limit = 10_000
    /// The most bytes of books kept by default (the hub's own last values are bounded alike).
    static let defaultBytesLimit = 256 << 20

    init(bytesLimit: Int = Self.defaultBytesLimit) {
        self.bytesLimit = bytesLimit
    }

    /// How many books it holds.
    var count: Int { folds.count }

    mutating func apply(_ event: MarketEvent, folding: TopicFolding) {
        let topic = event.topic
        changes += 1
        var book: Book
        if let known = folds[topic] {
            book = known
            book.fold.apply(event)
        } else {
            guard let fold = folding.fold(for: topic) else { return }
            fold.apply(event)
            // A book let go for room is taken again only from a whole book (the vendor's next) while
            // room is short: made again from a change, it would be asked of the upstream anew and push
            // another one out.
            if resting.contains(topic) {
                // With room again (under seven tenths), made again from a change (and asked of the
                // upstream whole, paced, as any book not whole).
                guard fold.isWhole || bytes <= bytesLimit / 10 * 7 else { return }
                resting.remove(topic)
            }
            if folds.count >= Self.limit {
                // Emptied in the store too (each is marked changed and has no fold left).
                interruptAll()
                folds.removeAll()
                bytes = 0
            }
            book = Book(fold: fold, bytes: 0, changedAt: changes)
        }
        recount(&book)
        book.changedAt = changes
        folds[topic] = book
        changed.insert(topic)
        if bytes > bytesLimit { letGoOfTheOldest() }
    }

    /// Counts what `book` holds now in ``bytes``.
    private mutating func recount(_ book: inout Book) {
        let footprint = book.fold.footprint
        bytes += footprint - book.bytes
        book.bytes = footprint
    }

    /// Lets go of the books changed longest ago, down to nine tenths of the bound (the one just changed
    /// last of all): each is emptied in the store. Sorts, once per tenth of the bound in new bytes.
    private mutating func letGoOfTheOldest() {
        let target = bytesLimit / 10 * 9
        for (topic, book) in folds.sorted(by: { $0.value.changedAt < $1.value.changedAt }) where bytes > target {
            book.fold.interrupt()
            folds[topic] = nil
            bytes -= book.bytes
            changed.insert(topic)
            resting.insert(topic)
        }
        if resting.count > Self.limit * 10 { resting.removeAll() }
    }

    /// Events stopped (the upstream was lost, or events were dropped): nothing is vouched for.
    mutating func interruptAll() {
        for (topic, book) in folds {
            book.fold.interrupt()
            changed.insert(topic)
        }
    }

    /// Topics no longer in the upstream set stop coming: their books are no longer vouched for.
    mutating func interrupt(outside upstream: Set<Topic>) {
        for (topic, book) in folds where !upstream.covers(topic) {
            book.fold.interrupt()
            changed.insert(topic)
            folds[topic] = nil
            bytes -= book.bytes
        }
        resting = resting.filter { upstream.covers($0) }
    }

    /// The books it cannot vouch for (after a loss, an unreadable change): what the upstream is asked
    /// for whole again.
    func notWhole() -> [Topic] { folds.compactMap { $0.value.fold.isWhole ? nil : $0.key } }

    /// What changed since the last call: each book whole, or empty bytes for one that is not.
    mutating func takeChanged() -> [(Topic, ByteBuffer)] {
        var taken: [(Topic, ByteBuffer)] = []
        taken.reserveCapacity(changed.count)
        for topic in changed {
            guard var book = folds[topic] else {
                taken.append((topic, ByteBuffer()))
                continue
            }
            taken.append((topic, book.fold.whole()?.bytes ?? ByteBuffer()))
            // Its whole form is kept with it (rendered once per change): counted too.
            recount(&book)
            folds[topic] = book
        }
        changed.removeAll(keepingCapacity: true)
        // The whole forms rendered may have taken it past its bound: those let go are emptied next time.
        if bytes > bytesLimit { letGoOfTheOldest() }
        return taken
    }
}
