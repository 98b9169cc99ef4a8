import MarketCore
import NIOCore

extension MarketDataHub {
    /// One subscriber. A class so the hot path updates it in place; confined to the actor.
    final class Subscriber {
        let id: SubscriberID
        let continuation: AsyncStream<DeliveryBatch>.Continuation
        let queue: SubscriberQueue
        /// The events its buffer holds (the hub's ``MarketDataHub/bufferLimit``, or its key's:
        /// ``MarketDataHub/setBufferLimit(_:for:)``). Kept where its reader reads it too.
        var bufferLimit: Int {
            get { queue.limit.load(ordering: .relaxed) }
            set { queue.limit.store(newValue, ordering: .relaxed) }
        }
        /// Its fill at which it is reported as falling behind: 80% of its buffer.
        var warningFill: Int { bufferLimit * 8 / 10 }
        /// Its stream's element: added to until the reader takes it, then yielded again.
        let batch = DeliveryBatch()
        var topics: Set<Topic> = []
        /// The events of the current window of a `publish` it gets (bit i: the window's event i). A bit
        /// set twice (ticker and wildcard) is one delivery.
        var mask: UInt64 = 0
        var dropped = 0
        /// Dropped since the last `lagging` notice.
        var lostSinceNotice = 0
        var lastWarning: ContinuousClock.Instant?
        /// Told the upstream is down, and not yet that it is back.
        var toldOfOutage = false
        /// Called after something was queued on the stream, and after it finished.
        let whenQueued: (@Sendable () -> Void)?
        /// Something was queued and `whenQueued` not called yet (it is, at the end of the hub call).
        var untold = false
        /// Its state events merged per symbol (asked for, or while it lags if its key allows it).
        var conflation: Conflation?
        /// Holds its topics (they stay wanted, so the history of them stays whole) but gets nothing: a
        /// broken tagged session waiting for its client.
        var parked = false
        /// What its resumes may still replay (``ReplayBudget``).
        var replayBudget = ReplayBudget()
        /// The name of the client key it was admitted with, whose share of replays it takes from too
        /// (``MarketDataHub/keyReplays``); `nil`: its own budget only.
        var owner: String?

        init(
            id: SubscriberID, continuation: AsyncStream<DeliveryBatch>.Continuation, queue: SubscriberQueue,
            whenQueued: (@Sendable () -> Void)?
        ) {
            self.id = id
            self.continuation = continuation
            self.queue = queue
            self.whenQueued = whenQueued
        }
    }

    /// Everything about one ticker topic: its subscribers and its last event.
    final class TopicEntry {
        var subscribers = HolderList<Subscriber>()
        /// The rooms of the whole table: what its last values and books hold, and what its books hold back
        /// (each given back as its values change or go, and as the entry goes).
        private let lastValueRoom: ByteRoom
        private let heldBackRoom: ByteRoom
        /// What its last value and book hold, as counted in ``lastValueRoom`` (``recount()``).
        private(set) var lastBytes = 0
        var last: MarketEvent?
        /// Whether `last` still shares its message's bytes: set by a publish; the hub gives it bytes of its
        /// own after a few publishes (once per topic, however many of the topic's events they carried), or
        /// when it is read.
        var lastShared = false
        /// The bytes of the last event as compacted (the storage the next compaction may write into).
        private var previousLastBytes: ByteBuffer?
        /// The topic's state folded from its events (an order book), for a type the protocol folds.
        var fold: (any TopicFold)?
        /// A cluster node's events of a folded topic since its fold stopped being whole, so a whole state
        /// from the cluster's store, at an earlier position, can be brought up to date (at most
        /// ``heldBackLimit`` events and ``heldBackBytes`` bytes; past either the oldest half goes, and only
        /// a newer whole state helps; and within the room all the table's books share,
        /// ``LastValueBound/heldBack``).
        private(set) var heldBack: [MarketEvent] = []
        private(set) var heldBackSize = 0

        init(in bound: LastValueBound) {
            lastValueRoom = bound.lastValues
            heldBackRoom = bound.heldBack
        }

        deinit {
            lastValueRoom.give(lastBytes)
            heldBackRoom.give(heldBackSize)
        }

        /// Keeps `event` as its last value, with bytes of its own, counted.
        func keepLast(_ event: MarketEvent) {
            last = event.compacted()
            recount()
        }

        /// Counts what its last value and book hold now (as the process holds it: the storage).
        func recount() {
            let bytes = (last?.bytes.storageCapacity ?? 0) + (fold?.footprint ?? 0)
            lastValueRoom.count(bytes - lastBytes)
            lastBytes = bytes
        }

        /// Gives `last` bytes of its own (``MarketEvent/compacted()``), written into the storage the
        /// topic's previous last event had when nothing else holds that any more (no allocation per
        /// event), unless that storage is twice the size needed or more (then a compacted copy, so a
        /// last value stays under twice its bytes, as ``MarketEvent/compacted()`` keeps it).
        func compactLast() {
            guard lastShared else { return }  // compacted already (read since its publish)
            lastShared = false
            defer { recount() }
            guard let event = last, event.bytes.storageCapacity >= 2 * event.bytes.readableBytes else {
                previousLastBytes = nil
                return
            }
            guard var bytes = previousLastBytes, bytes.capacity < 2 * event.bytes.readableBytes else {
                last = event.compacted()
                previousLastBytes = last?.bytes
                return
            }
            previousLastBytes = nil
            // Unique now unless a delivery still holds it; then `clear` starts a new storage.
            bytes.clear(minimumCapacity: event.bytes.readableBytes)
            bytes.writeImmutableBuffer(event.bytes)
            last = MarketEvent(eventType: event.eventType, ticker: event.ticker, bytes: bytes, receivedAt: event.receivedAt, sequence: event.sequence)
            previousLastBytes = bytes
        }

        static let heldBackLimit = 4096
        static let heldBackBytes = 1 << 20

        /// Holds a change back; with no room left among all the books, lets go of what it held instead (a
        /// change missing, they could no longer bring a whole book up to date).
        func holdBack(_ event: MarketEvent) {
            let size = event.bytes.readableBytes
            if heldBack.count >= Self.heldBackLimit || heldBackSize + size > Self.heldBackBytes {
                let dropped = heldBack.prefix(max(heldBack.count / 2, 1))
                let droppedSize = dropped.reduce(0) { $0 + $1.bytes.readableBytes }
                heldBackSize -= droppedSize
                heldBackRoom.give(droppedSize)
                heldBack.removeFirst(dropped.count)
            }
            guard heldBackRoom.take(size) else {
                releaseHeldBack()
                return
            }
            heldBack.append(event.compacted())
            heldBackSize += size
        }

        /// A new epoch began: the last event's market sequence is the former epoch's, none of this one
        /// (a tagged connection sent it as a snapshot or a `gap`'s last value would take it for one).
        /// Its bytes keep their `_s` and `_m`.
        func forgetPosition() {
            guard let event = last, event.sequence != 0 else { return }
            last = event.withoutSequence()
        }

        func releaseHeldBack() {
            heldBackRoom.give(heldBackSize)
            heldBack = []
            heldBackSize = 0
        }

        /// What a new holder starts from: a folded topic's whole state (none while not whole), else the
        /// last event.
        var value: MarketEvent? {
            if let fold { return fold.whole() }
            return ownLast
        }

        /// The last event with bytes of its own: compacted now if publishes left it sharing its message's.
        var ownLast: MarketEvent? {
            compactLast()
            return last
        }
    }
}
