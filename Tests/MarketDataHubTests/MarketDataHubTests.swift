import NIOCore
import PolygonWire
import Synchronization
import Testing

@testable import MarketDataHub

func event(_ type: String, _ ticker: String, _ n: Int = 0) -> MarketEvent {
    MarketEvent(eventType: type, ticker: ticker, bytes: ByteBuffer(string: #"{"ev":"\#(type)","sym":"\#(ticker)","n":\#(n)}"#))
}

func topics(_ list: String...) -> Set<Topic> { Set(list.compactMap { Topic(parsing: $0) }) }

/// Runs `operation`, returning `nil` if it takes longer than `timeout`.
func within<T: Sendable>(_ timeout: Duration, _ operation: @escaping @Sendable () async -> T) async throws -> T? {
    try await withThrowingTaskGroup(of: T?.self) { group in
        group.addTask { await operation() }
        group.addTask {
            try await Task.sleep(for: timeout)
            return nil
        }
        defer { group.cancelAll() }
        return try await group.next() ?? nil
    }
}

/// Takes the next `count` events or fails after `timeout`.
func take(_ count: Int, from stream: HubSubscription.Events, timeout: Duration = .seconds(5)) async throws -> [MarketEvent] {
    let events = try await within(timeout) {
        var out: [MarketEvent] = []
        for await event in stream {
            out.append(event)
            if out.count == count { break }
        }
        return out
    }
    return try #require(events, "timed out after \(timeout) waiting for \(count) events")
}

/// Applies every change of the upstream topic set the hub reports, records each resulting set and
/// each change, and lets a test wait for a set.
final class WantedRecorder: Sendable {
    let history = Mutex<[Set<Topic>]>([])
    let changes = Mutex<[WantedTopicsChange]>([])
    let updates: AsyncStream<Set<Topic>>
    let continuation: AsyncStream<Set<Topic>>.Continuation

    init() {
        (updates, continuation) = AsyncStream.makeStream(of: Set<Topic>.self)
    }

    func record(_ change: WantedTopicsChange) {
        changes.withLock { $0.append(change) }
        let topics = history.withLock { history in
            var topics = history.last ?? []
            change.apply(to: &topics)
            history.append(topics)
            return topics
        }
        continuation.yield(topics)
    }

    /// Waits until the hub reports `expected`, or fails after `timeout`.
    func wait(for expected: Set<Topic>, timeout: Duration = .seconds(5)) async throws {
        let updates = self.updates
        let reached = try await within(timeout) {
            for await topics in updates where topics == expected { return true }
            return false
        }
        #expect(reached == true, "the upstream set never became \(expected.sorted())")
    }
}

@Suite("MarketDataHub")
struct MarketDataHubTests {
    @Test func subscriberReceivesOnlyItsTopics() async throws {
        let hub = MarketDataHub(wire: .polygon, history: nil)
        let sub = await hub.subscribe(to: topics("Q.AAPL"))
        await hub.publish([event("Q", "MSFT"), event("T", "AAPL"), event("Q", "AAPL", 1), event("Q", "AAPL", 2)])
        let got = try await take(2, from: sub.events)
        #expect(got.map(\.json) == [event("Q", "AAPL", 1).json, event("Q", "AAPL", 2).json])
    }

    @Test func aCachedLastValueHoldsItsOwnBytesNotItsWholeUpstreamMessage() async throws {
        let hub = MarketDataHub(wire: .polygon, history: nil)
        // One event sliced out of a 1 MB upstream message.
        var message = ByteBuffer(repeating: UInt8(ascii: " "), count: 1 << 20)
        let json = #"{"ev":"Q","sym":"AAPL","bp":1}"#
        message.setString(json, at: 0)
        let slice = try #require(message.getSlice(at: 0, length: json.utf8.count))
        await hub.publish([MarketEvent(eventType: "Q", ticker: "AAPL", bytes: slice)])
        let topic = try #require(Topic(parsing: "Q.AAPL"))
        let cached = try #require(await hub.lastEvent(for: topic))
        #expect(cached.json == json)
        #expect(cached.bytes.storageCapacity < 1024, "the cache keeps \(cached.bytes.storageCapacity) bytes for a \(json.utf8.count)-byte event")
    }

    @Test func whenQueuedTellsTheConsumerSoItReadsOnlyWhatIsThere() async throws {
        let hub = MarketDataHub(wire: .polygon, history: nil)
        let told = Atomic<Int>(0)
        let sub = await hub.subscribe(to: topics("Q.AAPL"), whenQueued: { told.add(1, ordering: .relaxed) })
        #expect(!sub.hasQueued)
        await hub.publish([event("Q", "MSFT")])
        #expect(told.load(ordering: .relaxed) == 0, "nothing for this subscriber, nothing told")
        await hub.publish([event("Q", "AAPL", 1), event("Q", "AAPL", 2)])
        #expect(told.load(ordering: .relaxed) == 1, "one publish, one call")
        #expect(sub.hasQueued)
        var reader = sub.makeReader()
        let batch = await reader.nextBatch()
        #expect(batch?.count == 2)
        #expect(!sub.hasQueued)
        await hub.remove(sub.id)
        #expect(told.load(ordering: .relaxed) == 2, "told when the stream finished")
        #expect(sub.hasQueued, "a finished stream reads without waiting")
        #expect(await reader.nextBatch() == nil)
    }

    @Test func wildcardSubscriberReceivesEverySymbolOfItsType() async throws {
        let hub = MarketDataHub(wire: .polygon, history: nil)
        let sub = await hub.subscribe(to: topics("Q.*"))
        await hub.publish([event("Q", "A"), event("T", "A"), event("Q", "B")])
        let got = try await take(2, from: sub.events)
        #expect(got.map(\.topic.description) == ["Q.A", "Q.B"])
    }

    @Test func twoSubscribersSharingATopicBothReceiveIt() async throws {
        let hub = MarketDataHub(wire: .polygon, history: nil)
        let a = await hub.subscribe(to: topics("Q.A"))
        let b = await hub.subscribe(to: topics("Q.A", "T.B"))
        await hub.publish([event("T", "B"), event("Q", "A")])
        #expect(try await take(1, from: a.events).map(\.topic.description) == ["Q.A"])
        #expect(try await take(2, from: b.events).map(\.topic.description) == ["T.B", "Q.A"])
    }

    @Test func tickerAndWildcardTogetherDeliverAnEventOnce() async throws {
        let hub = MarketDataHub(wire: .polygon, history: nil)
        let sub = await hub.subscribe(to: topics("Q.A", "Q.*"))
        await hub.publish([event("Q", "A", 1), event("Q", "B", 2)])
        let got = try await take(2, from: sub.events)
        #expect(got.map(\.json) == [event("Q", "A", 1).json, event("Q", "B", 2).json])
    }

    @Test func unsubscribingStopsDelivery() async throws {
        let hub = MarketDataHub(wire: .polygon, history: nil)
        let sub = await hub.subscribe(to: topics("Q.A", "Q.B"))
        await hub.remove(topics("Q.A"), from: sub.id)
        await hub.publish([event("Q", "A"), event("Q", "B")])
        #expect(try await take(1, from: sub.events).map(\.ticker) == ["B"])
    }

    @Test func upstreamSetIsReferenceCounted() async throws {
        let recorder = WantedRecorder()
        let hub = MarketDataHub(wire: .polygon) { recorder.record($0) }
        let a = await hub.subscribe(to: topics("Q.A"))
        let b = await hub.subscribe(to: topics("Q.A", "T.B"))
        #expect(await hub.wantedTopics == topics("Q.A", "T.B"))
        await hub.remove(a.id)
        #expect(await hub.wantedTopics == topics("Q.A", "T.B"), "Q.A still has a subscriber")
        await hub.remove(topics("T.B"), from: b.id)
        #expect(await hub.wantedTopics == topics("Q.A"))
        await hub.remove(b.id)
        #expect(await hub.wantedTopics == [])
        // One report per change, none for changes that left the set as it was.
        #expect(recorder.history.withLock { $0 } == [topics("Q.A"), topics("Q.A", "T.B"), topics("Q.A"), []])
    }

    @Test func aChangeReportsOnlyWhatItChanged() async throws {
        let recorder = WantedRecorder()
        let hub = MarketDataHub(wire: .polygon) { recorder.record($0) }
        let many = await hub.subscribe(to: Set((0..<10_000).map { Topic(eventType: "Q", ticker: "M\($0)")! }))
        let toggler = await hub.subscribe()
        await hub.add(topics("T.X"), to: toggler.id)
        await hub.remove(topics("T.X"), from: toggler.id)
        await hub.add(topics("Q.*"), to: toggler.id)
        await hub.remove(topics("Q.*"), from: toggler.id)
        let changes = recorder.changes.withLock { $0 }
        #expect(changes.count == 5)
        #expect(changes[1] == WantedTopicsChange(added: topics("T.X")))
        #expect(changes[2] == WantedTopicsChange(removed: topics("T.X")))
        // A wildcard stands in for its type's tickers, and gives them back when it goes.
        #expect(changes[3].added == topics("Q.*") && changes[3].removed.count == 10_000)
        #expect(changes[4].removed == topics("Q.*") && changes[4].added.count == 10_000)
        #expect(recorder.history.withLock { $0.last } == (await hub.wantedTopics))
        _ = many
    }

    /// A client taking and dropping a wildcard again and again: within the linger nothing changes
    /// upstream or in the history (another client's resume across it stays whole); after it, the
    /// wildcard goes and its tickers come back.
    @Test func aWildcardTakenAndDroppedWithinItsLingerChangesNothingUpstreamOrInTheHistory() async throws {
        let recorder = WantedRecorder()
        let hub = MarketDataHub(wire: .polygon, wildcardLinger: .milliseconds(500)) { recorder.record($0) }
        let holder = await hub.subscribe(to: topics("Q.A"))
        let toggler = await hub.subscribe(to: topics("Q.*"))
        await hub.publish((1...3).map { event("Q", "A", $0) })
        for _ in 0..<100 {
            await hub.remove(topics("Q.*"), from: toggler.id)
            await hub.add(topics("Q.*"), to: toggler.id)
        }
        await hub.remove(topics("Q.*"), from: toggler.id)
        await hub.publish([event("Q", "A", 4)])
        #expect(
            recorder.changes.withLock { $0 } == [WantedTopicsChange(added: topics("Q.A")), WantedTopicsChange(added: topics("Q.*"), removed: topics("Q.A"))],
            "no change past the wildcard's first")
        let later = await hub.subscribe()
        let outcome = await hub.add([Topic(parsing: "Q.A")!], to: later.id, resuming: .positions(epoch: hub.epoch, [Topic(parsing: "Q.A")!: 1]))
        #expect(outcome.gaps.isEmpty && outcome.replayed == [Topic(parsing: "Q.A")!: 3], "\(outcome)")
        // The third change, when the linger ends: the wildcard goes, the ticker held by name comes back.
        let updates = recorder.updates
        let third = try await within(.seconds(10)) { await updates.dropFirst(2).first { _ in true } }
        #expect(third == .some(topics("Q.A")), "the linger did not end within 10 s")
        #expect(recorder.changes.withLock { $0 }.last == WantedTopicsChange(added: topics("Q.A"), removed: topics("Q.*")))
        _ = holder
    }

    @Test func wildcardReplacesItsTickersUpstream() async throws {
        let hub = MarketDataHub(wire: .polygon, history: nil)
        let a = await hub.subscribe(to: topics("Q.A", "Q.B", "T.C"))
        let b = await hub.subscribe(to: topics("Q.*"))
        #expect(await hub.wantedTopics == topics("Q.*", "T.C"))
        await hub.remove(b.id)
        #expect(await hub.wantedTopics == topics("Q.A", "Q.B", "T.C"))
        _ = a
    }

    @Test func endingTheStreamRemovesTheSubscriber() async throws {
        let recorder = WantedRecorder()
        let hub = MarketDataHub(wire: .polygon) { recorder.record($0) }
        let reader = Task {
            let sub = await hub.subscribe(to: topics("Q.A"))
            for await _ in sub.events {}
        }
        try await recorder.wait(for: topics("Q.A"))
        reader.cancel()
        try await recorder.wait(for: [])
        #expect(await hub.subscriberCount == 0)
    }

    @Test func lastEventPerTopicIsCached() async throws {
        let hub = MarketDataHub(wire: .polygon, history: nil)
        await hub.publish([event("Q", "A", 1), event("Q", "A", 2), event("T", "A", 3)])
        #expect(await hub.lastEvent(for: Topic(eventType: "Q", ticker: "A")!)?.json == event("Q", "A", 2).json)
        #expect(await hub.lastEvent(for: Topic(eventType: "Q", ticker: "B")!) == nil)
    }

    @Test func aSubscriberThatDoesNotReadLosesItsNewestEventsOnlyAndTheyAreCounted() async throws {
        let hub = MarketDataHub(wire: .polygon, history: nil)
        let slow = await hub.subscribe(to: topics("Q.A"))
        let fast = await hub.subscribe(to: topics("Q.A"))
        let limit = MarketDataHub.defaultBufferLimit
        // The fast subscriber drains between batches; the slow one never reads.
        await hub.publish((0..<limit).map { event("Q", "A", $0) })
        #expect(try await take(limit, from: fast.events).count == limit)
        await hub.publish((limit..<(limit + 500)).map { event("Q", "A", $0) })
        #expect(try await take(500, from: fast.events).last?.json == event("Q", "A", limit + 499).json)
        #expect(await hub.droppedEvents(for: slow.id) == 500)
        #expect(await hub.droppedEvents(for: fast.id) == 0)
        // The slow one kept the oldest 1000, in order.
        let kept = try await take(MarketDataHub.defaultBufferLimit, from: slow.events)
        #expect(kept.first?.json == event("Q", "A", 0).json)
        #expect(kept.last?.json == event("Q", "A", MarketDataHub.defaultBufferLimit - 1).json)
    }

    @Test func aSubscriberGivenALargerBufferKeepsThatManyEventsAndOthersKeepTheHubs() async throws {
        let hub = MarketDataHub(wire: .polygon, bufferLimit: 3000, history: nil)
        let large = await hub.subscribe(to: topics("Q.A"))
        let usual = await hub.subscribe(to: topics("Q.A"))
        #expect(large.bufferLimit == 3000 && usual.bufferLimit == 3000, "the hub's bound unless told otherwise")
        await hub.setBufferLimit(5000, for: large.id)
        await hub.setBufferLimit(10, for: usual.id)
        #expect(large.bufferLimit == 5000)
        #expect(usual.bufferLimit == MarketDataHub.bufferLimitRange.lowerBound, "never below the range")
        // Neither reads: each keeps what its own buffer holds, the oldest first, and loses the rest.
        await hub.publish((0..<6000).map { event("Q", "A", $0) })
        #expect(await hub.droppedEvents(for: large.id) == 1000)
        #expect(await hub.droppedEvents(for: usual.id) == 5000)
        let kept = try await take(5000, from: large.events)
        #expect(kept.first?.json == event("Q", "A", 0).json)
        #expect(kept.last?.json == event("Q", "A", 4999).json)
        // Back to the hub's own bound: 3,000 queued, the first of them the notice of the 1,000 it lost.
        await hub.setBufferLimit(nil, for: large.id)
        #expect(large.bufferLimit == 3000)
        await hub.publish((6000..<10000).map { event("Q", "A", $0) })
        #expect(await hub.droppedEvents(for: large.id) == 1000 + 1001)
    }

    @Test func theLeastRoomIsTheReaderClosestToItsOwnWarningFill() async throws {
        let hub = MarketDataHub(wire: .polygon, history: nil)
        #expect(await hub.leastRoom == .max, "nobody reading: nothing to wait for")
        let large = await hub.subscribe(to: topics("Q.A"))
        await hub.setBufferLimit(5000, for: large.id)
        await hub.publish((0..<1000).map { event("Q", "A", $0) })
        #expect(await hub.leastRoom == 4000 - 1000, "80% of its own 5,000, less its 1,000 unread")
        let usual = await hub.subscribe(to: topics("Q.B"))
        await hub.publish((0..<700).map { event("Q", "B", $0) })
        #expect(await hub.leastRoom == 800 - 700, "the default buffer's reader is now the closest")
        // Both used to the end: a subscription released ends its stream and leaves the hub.
        #expect(large.bufferLimit == 5000 && usual.bufferLimit == MarketDataHub.defaultBufferLimit)
    }

    @Test func aNewSubscriptionGetsTheTopicsLastEventAtOnce() async throws {
        let hub = MarketDataHub(wire: .polygon, history: nil)
        await hub.publish([event("Q", "A", 1), event("Q", "A", 2), event("Q", "B", 3)])
        let sub = await hub.subscribe(to: topics("Q.A", "T.A", "Q.*"))
        // The snapshot of Q.A (T.A has none; wildcards get no snapshot), then live events.
        await hub.publish([event("Q", "C", 4)])
        let got = try await take(2, from: sub.events)
        #expect(got.map(\.json) == [event("Q", "A", 2).json, event("Q", "C", 4).json])
    }

    @Test func snapshotsCanBeTurnedOff() async throws {
        let hub = MarketDataHub(wire: .polygon, snapshotOnSubscribe: false, history: nil)
        await hub.publish([event("Q", "A", 1)])
        let sub = await hub.subscribe(to: topics("Q.A"))
        await hub.publish([event("Q", "A", 2)])
        #expect(try await take(1, from: sub.events).first?.json == event("Q", "A", 2).json)
    }

    @Test func theReaderTakesEverythingQueuedAsOneBatch() async throws {
        let hub = MarketDataHub(wire: .polygon, history: nil)
        let sub = await hub.subscribe(to: topics("Q.A"))
        var reader = sub.makeReader()
        await hub.publish((0..<300).map { event("Q", "A", $0) })
        let batch = await reader.nextBatch()
        #expect(batch?.count == 300)
        // Ten messages while the reader was away: one read takes them all, in order (the hub added
        // them to the element it had yielded), and the next message is the next read's.
        for n in 0..<10 { await hub.publish([event("Q", "A", n)]) }
        #expect(await reader.nextBatch()?.map(\.json) == (0..<10).map { event("Q", "A", $0).json })
        await hub.publish([event("Q", "A", 10)])
        #expect(await reader.nextBatch()?.map(\.json) == [event("Q", "A", 10).json])
    }

    @Test func aDrainedSubscriberIsToldHowManyEventsItLost() async throws {
        let hub = MarketDataHub(wire: .polygon, history: nil)
        let sub = await hub.subscribe(to: topics("Q.A"))
        var reader = sub.makeReader()
        let limit = MarketDataHub.defaultBufferLimit
        await hub.publish((0..<(limit + 250)).map { event("Q", "A", $0) })
        #expect(await hub.bufferStatistics.lagging == 1)
        // Drain, then the next event finds room: the notice comes first, where the gap is.
        #expect(await reader.nextBatch()?.count == limit)
        await hub.publish([event("Q", "A", 9999)])
        let after = try #require(await reader.nextBatch())
        #expect(after.count == 2)
        #expect(after[0].isNotice)
        #expect(after[0].json.contains(#""status":"lagging""#))
        #expect(after[0].json.contains(#""dropped":250"#))
        #expect(after[1].json == event("Q", "A", 9999).json)
        #expect(await hub.bufferStatistics.lagging == 0)
    }

    @Test func theDisconnectPolicyEndsASubscriberWhoseBufferIsFull() async throws {
        let recorder = WantedRecorder()
        let hub = MarketDataHub(wire: .polygon, policy: .disconnect, history: nil) { recorder.record($0) }
        let slow = await hub.subscribe(to: topics("Q.A"))
        let other = await hub.subscribe(to: topics("Q.B"))
        await hub.publish((0...MarketDataHub.defaultBufferLimit).map { event("Q", "A", $0) })
        #expect(slow.wasEvicted)
        #expect(!other.wasEvicted)
        #expect(await hub.subscriberCount == 1)
        #expect(await hub.wantedTopics == topics("Q.B"))
        // What was buffered is still readable, then the stream ends.
        var reader = slow.makeReader()
        #expect(await reader.nextBatch()?.count == MarketDataHub.defaultBufferLimit)
        #expect(await reader.nextBatch() == nil)
    }

    /// Under the `disconnect` policy a subscribe's snapshots can fill the buffer: the subscriber is
    /// evicted there, and the rest of its topics are not added to it (they would stay wanted by a
    /// subscriber that is gone, and each event of theirs would evict it again).
    @Test func aSubscriberEvictedByItsSnapshotsHoldsNoTopicAfterward() async throws {
        let hub = MarketDataHub(wire: .polygon, policy: .disconnect, history: nil)
        let tickers = (0..<(MarketDataHub.bufferLimitRange.lowerBound + 5)).map { "T\($0)" }
        await hub.publish(tickers.map { event("Q", $0, 1) })
        let slow = await hub.subscribe()
        await hub.setBufferLimit(MarketDataHub.bufferLimitRange.lowerBound, for: slow.id)
        await hub.add(Set(tickers.compactMap { Topic(parsing: "Q.\($0)") }), to: slow.id)
        #expect(slow.wasEvicted)
        #expect(await hub.subscriberCount == 0)
        let wanted = await hub.wantedTopics
        #expect(wanted.isEmpty, "\(wanted.count) topics still wanted")
    }

    @Test func aSubscriberThatComesDuringAnOutageIsToldAtOnceAndOnlyThoseToldAreToldItEnded() async throws {
        let hub = MarketDataHub(wire: .polygon, history: nil)
        let before = await hub.subscribe(to: topics("Q.A"))
        await hub.upstreamLost(reason: "test")
        let during = await hub.subscribe(to: topics("Q.A"))
        let later = await hub.subscribe()
        await hub.add(topics("Q.B"), to: later.id)
        let idle = await hub.subscribe()
        await hub.publish([event("Q", "A", 1)])
        let told = try await take(3, from: before.events)
        #expect(told[0].json.contains("upstream_disconnected"))
        #expect(told[1].json.contains("upstream_reconnected"))
        #expect(told[2].json == event("Q", "A", 1).json)
        // It subscribed during the outage: told as it did, with the outage's own start and reason.
        let joined = try await take(3, from: during.events)
        #expect(joined[0].json.contains("upstream_disconnected") && joined[0].json.contains("(test)") && joined[0].json == told[0].json)
        #expect(joined[1].json.contains("upstream_reconnected"))
        #expect(joined[2].json == event("Q", "A", 1).json)
        // Topics added later, during the outage, likewise; a subscriber with no topics hears nothing.
        let added = try await take(2, from: later.events)
        #expect(added.map { $0.json.contains("upstream_disconnected") } == [true, false])
        #expect(added[1].json.contains("upstream_reconnected"))
        #expect(!idle.hasQueued)
    }

    @Test func aClusterSeedIsTheSnapshotUnlessALiveEventCameFirst() async throws {
        let hub = MarketDataHub(wire: .polygon, keepsUnwantedLastValues: false, history: nil)
        let sub = await hub.subscribe(to: topics("Q.A", "Q.B"))
        await hub.seed(event("Q", "A", 1))
        await hub.publish([event("Q", "B", 2)])
        await hub.seed(event("Q", "B", 0))
        let got = try await take(2, from: sub.events)
        #expect(got.map(\.json) == [event("Q", "A", 1).json, event("Q", "B", 2).json])
        // A topic nobody subscribes to is not seeded.
        await hub.seed(event("Q", "C", 3))
        #expect(await hub.lastEvent(for: Topic(eventType: "Q", ticker: "C")!) == nil)
    }

    @Test func aClusterNodeForgetsTheLastValueOfATopicNobodyWants() async throws {
        let hub = MarketDataHub(wire: .polygon, keepsUnwantedLastValues: false, history: nil)
        let sub = await hub.subscribe(to: topics("Q.A"))
        await hub.publish([event("Q", "A", 1)])
        #expect(await hub.lastEvent(for: Topic(eventType: "Q", ticker: "A")!) != nil)
        await hub.remove(topics("Q.A"), from: sub.id)
        #expect(await hub.lastEvent(for: Topic(eventType: "Q", ticker: "A")!) == nil)
        // A straggler of the dropped topic is not kept either.
        await hub.publish([event("Q", "A", 2)])
        #expect(await hub.lastEvent(for: Topic(eventType: "Q", ticker: "A")!) == nil)
        // A single relay keeps it (its upstream is the only source).
        let single = MarketDataHub(wire: .polygon, history: nil)
        let other = await single.subscribe(to: topics("Q.A"))
        await single.publish([event("Q", "A", 1)])
        await single.remove(topics("Q.A"), from: other.id)
        #expect(await single.lastEvent(for: Topic(eventType: "Q", ticker: "A")!) != nil)
    }

    @Test func lossBeforeTheHubIsToldToTheSubscribersOfTheLostTopics() async throws {
        let hub = MarketDataHub(wire: .polygon, history: nil)
        let hit = await hub.subscribe(to: topics("Q.A"))
        let wildcard = await hub.subscribe(to: topics("Q.*"))
        let spared = await hub.subscribe(to: topics("T.B"))
        await hub.reportLoss(5, topics: topics("Q.A"), reason: "test")
        #expect(try await take(1, from: hit.events).first?.json.contains(#""dropped":5"#) == true)
        #expect(try await take(1, from: wildcard.events).first?.json.contains("lagging") == true)
        await hub.publish([event("T", "B", 1)])
        #expect(try await take(1, from: spared.events).first?.json == event("T", "B", 1).json)
    }

    @Test func topicsTheUpstreamRefusedAreToldToTheirHoldersOnlyWithTheCode() async throws {
        let hub = MarketDataHub(wire: .polygon, history: nil)
        let both = await hub.subscribe(to: topics("t.MSFT", "t.GOOG", "t.AAPL"))
        let one = await hub.subscribe(to: topics("t.MSFT"))
        let spared = await hub.subscribe(to: topics("t.AAPL"))
        await hub.upstreamRefused(topics("t.MSFT", "t.GOOG"), code: 405, reason: "symbol limit exceeded")
        let told = try #require(try await take(1, from: both.events).first?.json)
        #expect(told.contains("the upstream refused t.GOOG,t.MSFT (symbol limit exceeded)") && told.contains(#""code":405"#), "\(told)")
        #expect(try await take(1, from: one.events).first?.json.contains("refused t.MSFT (") == true)
        await hub.publish([event("t", "AAPL", 1)])
        #expect(try await take(1, from: spared.events).first?.json == event("t", "AAPL", 1).json, "first what it holds: no notice")
    }

    @Test func aRefusedWildcardIsToldToTheHoldersOfTheTickersItCovers() async throws {
        let hub = MarketDataHub(wire: .polygon, history: nil)
        // With the wildcard held, the upstream is asked for T.* alone: T.MSFT and T.GOOG come through it.
        let wildcard = await hub.subscribe(to: topics("T.*"))
        let tickers = await hub.subscribe(to: topics("T.MSFT", "T.GOOG"))
        let other = await hub.subscribe(to: topics("Q.MSFT"))
        await hub.upstreamRefused(topics("T.*"), code: 405, reason: "too many")
        #expect(try await take(1, from: wildcard.events).first?.json.contains("the upstream refused T.* (too many)") == true)
        let told = try #require(try await take(1, from: tickers.events).first?.json)
        #expect(told.contains("the upstream refused T.GOOG,T.MSFT (asked for through a wildcard) (too many)"), "\(told)")
        await hub.publish([event("Q", "MSFT", 1)])
        #expect(try await take(1, from: other.events).first?.json == event("Q", "MSFT", 1).json, "another type's holder is not told")
    }

    /// A refusal stands for later holders (the upstream is not asked again while the topic stays
    /// wanted) until the topic's events arrive or it leaves the wanted set (then it is asked anew).
    @Test func aLaterHolderOfARefusedTopicIsToldUntilItsEventsArrive() async throws {
        let hub = MarketDataHub(wire: .polygon, history: nil)
        let first = await hub.subscribe(to: topics("t.MSFT", "T.*"))
        await hub.upstreamRefused(topics("t.MSFT", "T.*"), code: 405, reason: "symbol limit exceeded")
        #expect(try await take(1, from: first.events).first?.json.contains("refused T.*,t.MSFT (") == true)
        let second = await hub.subscribe(to: topics("t.MSFT", "T.AAPL", "Q.AAPL"))
        // One notice for one refusal.
        let told = try #require(try await take(1, from: second.events).first?.json)
        #expect(told.contains("the upstream refused t.MSFT, T.AAPL (asked for through a wildcard) (symbol limit exceeded)"), "\(told)")
        #expect(told.contains(#""code":405"#), "\(told)")
        // The events came after all (the upstream took it since): no later holder is told.
        await hub.publish([event("t", "MSFT", 1)])
        let third = await hub.subscribe(to: topics("t.MSFT"))
        await hub.publish([event("t", "MSFT", 2)])
        // Its snapshot first (the event before), then the event: no notice.
        #expect(try await take(2, from: third.events).map(\.json) == [event("t", "MSFT", 1).json, event("t", "MSFT", 2).json], "told of a refusal that no longer stands")
        // A topic that left the wanted set is asked anew when it comes back: nothing stands for it.
        let quotes = await hub.subscribe(to: topics("q.GOOG"))
        await hub.upstreamRefused(topics("q.GOOG"), code: 405, reason: "x")
        _ = try await take(1, from: quotes.events)
        await hub.remove(topics("q.GOOG"), from: quotes.id)
        let again = await hub.subscribe(to: topics("q.GOOG"))
        await hub.publish([event("q", "GOOG", 3)])
        #expect(try await take(1, from: again.events).first?.json == event("q", "GOOG", 3).json)
    }

    /// A wildcard over ever new tickers (an options market, or an upstream naming junk) keeps the last
    /// values of at most the table's bound: past it the least recently updated of the topics nobody holds
    /// by name go, down to nine tenths; a topic held by name stays, and the wildcard's holder still gets
    /// every event.
    @Test func theTopicTableKeepsAtMostItsBoundOfLastValuesNobodyHolds() async throws {
        let hub = MarketDataHub(wire: .polygon, bufferLimit: 10_000, topicsKept: 100, history: nil)
        let wildcard = await hub.subscribe(to: topics("Q.*"))
        let named = await hub.subscribe(to: topics("Q.KEEP"))
        func quote(_ ticker: String, at time: UInt64) -> MarketEvent {
            MarketEvent(eventType: "Q", ticker: ticker, bytes: ByteBuffer(string: #"{"ev":"Q","sym":"\#(ticker)"}"#), receivedAt: time)
        }
        await hub.publish([quote("KEEP", at: 1)])
        for index in 0..<150 { await hub.publish([quote("T\(index)", at: UInt64(10 + index))]) }
        let count = await hub.topicEntryCount
        #expect(count <= 100 && count >= 90, "\(count) topics kept")
        #expect(await hub.lastEvent(for: Topic(eventType: "Q", ticker: "KEEP")!) != nil, "a topic held by name stays, however old")
        #expect(await hub.lastEvent(for: Topic(eventType: "Q", ticker: "T149")!) != nil, "the newest stay")
        #expect(await hub.lastEvent(for: Topic(eventType: "Q", ticker: "T0")!) == nil, "the oldest went")
        #expect(try await take(151, from: wildcard.events).count == 151, "the wildcard's holder got every event")
        #expect(try await take(1, from: named.events).first?.ticker == "KEEP")
    }

    /// Topics held by name past the bound raise the size that calls for a trim (no trim per publish);
    /// once they are let go and the table is within its bound again, the bound holds again.
    @Test func theTopicTablesBoundHoldsAgainOnceTopicsHeldPastItAreLetGo() async throws {
        let hub = MarketDataHub(wire: .polygon, bufferLimit: 10_000, topicsKept: 100, history: nil)
        func quote(_ ticker: String, at time: UInt64) -> MarketEvent {
            MarketEvent(eventType: "Q", ticker: ticker, bytes: ByteBuffer(string: #"{"ev":"Q","sym":"\#(ticker)"}"#), receivedAt: time)
        }
        let held = await hub.subscribe(to: Set((0..<150).map { Topic(eventType: "Q", ticker: "H\($0)")! }))
        await hub.publish([quote("H0", at: 1)])
        #expect(await hub.topicEntryCount == 150, "held by name: none trimmed")
        await hub.remove(held.id)
        let wildcard = await hub.subscribe(to: topics("Q.*"))
        for index in 0..<150 {
            await hub.publish([quote("T\(index)", at: UInt64(10 + index))])
            let count = await hub.topicEntryCount
            #expect(count <= 101, "\(count) topics kept after \(index + 1) new ones")
        }
        await hub.remove(wildcard.id)
    }

    @Test func topicsNobodyWantsAndWithNoLastValueLeaveNoEntry() async throws {
        let hub = MarketDataHub(wire: .polygon, history: nil)
        let sub = await hub.subscribe(to: Set((0..<500).map { Topic(eventType: "Q", ticker: "JUNK\($0)")! }))
        await hub.publish([event("Q", "JUNK1", 1)])
        #expect(await hub.topicEntryCount == 500)
        await hub.remove(sub.id)
        // JUNK1 had an event: a single relay keeps its last value; the 499 others are gone.
        #expect(await hub.topicEntryCount == 1)
    }
}

@Suite("Hub deliveries")
struct HubDeliveryTests {
    @Test func aPublishLargerThanOneWindowArrivesWholeInOrderAndOnceDespiteTickerAndWildcard() async throws {
        let hub = MarketDataHub(wire: .polygon, snapshotOnSubscribe: false, history: nil)
        let both = await hub.subscribe(to: topics("Q.A", "Q.*"))
        let onlyB = await hub.subscribe(to: topics("Q.B"))
        var reader = both.makeReader()
        var readerB = onlyB.makeReader()
        // 150 events: three windows of the hub's 64-event masks.
        let input = (0..<150).map { event("Q", $0 % 3 == 0 ? "A" : "B", $0) }
        await hub.publish(input)
        var deliveries: [HubDelivery] = []
        #expect(await reader.nextDeliveries(into: &deliveries))
        #expect(deliveries.count == 3)
        #expect(deliveries.reduce(0) { $0 + $1.count } == 150)
        // What the downstream builds from them is exactly the frame of the events, in order.
        let payload = deliveries.reduce(1) { $0 + $1.framedBytes }
        let built = WireFrameBuilder.build(payload: payload) { builder in
            for delivery in deliveries { delivery.forEachEventAddress { builder.append($0) } }
        }
        let expected = try #require(FrameEncoder.frame(for: input))
        #expect(built.frame.getSlice(at: WireFrame.headerLength(payload: payload), length: payload) == expected)
        let mine = try #require(await readerB.nextBatch())
        #expect(mine.map(\.json) == input.filter { $0.ticker == "B" }.map(\.json))
        #expect(both.hasQueued == false)
    }

    @Test func anEventsOtherFormIsMadeOncePerPublishAndSharedByEverySubscriber() async throws {
        let hub = MarketDataHub(wire: .polygon, snapshotOnSubscribe: false, history: nil)
        let first = await hub.subscribe(to: topics("Q.A", "Q.B"))
        let second = await hub.subscribe(to: topics("Q.A"))
        let third = await hub.subscribe(to: topics("Q.*"))
        await hub.publish([event("Q", "A", 1), event("Q", "B", 2)])
        var conversions = 0
        var seen: [[String]] = []
        for subscription in [first, second, third] {
            var reader = subscription.makeReader()
            var deliveries: [HubDelivery] = []
            #expect(await reader.nextDeliveries(into: &deliveries))
            var forms: [String] = []
            for delivery in deliveries {
                delivery.forEachEvent(convertedBy: { event in
                    conversions += 1
                    return ByteBuffer(string: "form of " + event.json)
                }) { event, form in
                    #expect(form.map { String(buffer: $0) } == "form of " + event.json)
                    forms.append(form.map { String(buffer: $0) } ?? "")
                }
            }
            seen.append(forms)
        }
        // Five deliveries of two events: two conversions.
        #expect(conversions == 2)
        #expect(seen.map(\.count) == [2, 1, 2])
    }

    @Test func aFullBufferKeepsTheOldestOfAWindow() async throws {
        let hub = MarketDataHub(wire: .polygon, snapshotOnSubscribe: false, history: nil)
        let sub = await hub.subscribe(to: topics("Q.A"))
        await hub.publish((0..<(MarketDataHub.defaultBufferLimit - 10)).map { event("Q", "A", $0) })
        // 40 more: 10 fit, in order; 30 are dropped.
        await hub.publish((0..<40).map { event("Q", "A", 5000 + $0) })
        #expect(await hub.droppedEvents(for: sub.id) == 30)
        var reader = sub.makeReader()
        let got = try #require(await reader.nextBatch())
        #expect(got.count == MarketDataHub.defaultBufferLimit)
        #expect(got.suffix(10).map(\.json) == (0..<10).map { event("Q", "A", 5000 + $0).json })
    }
}

/// The last value of a topic holds bytes of its own, written again in place publish after publish, and
/// never under a snapshot already queued for somebody.
@Suite("Hub last values: their own bytes")
struct HubLastValueTests {
    /// Events as slices of one message, as an upstream's are.
    private func message(_ texts: [String], type: String = "T", tickers: [String]) -> [MarketEvent] {
        var whole = ByteBuffer(string: String(repeating: " ", count: 4096))
        var events: [MarketEvent] = []
        for (text, ticker) in zip(texts, tickers) {
            let start = whole.writerIndex
            whole.writeString(text)
            events.append(MarketEvent(eventType: type, ticker: ticker, bytes: whole.getSlice(at: start, length: text.utf8.count)!))
        }
        return events
    }

    @Test func aLastValueDoesNotKeepItsMessageAndASnapshotQueuedBeforeANewerOneIsKept() async throws {
        let hub = MarketDataHub(wire: .polygon, history: nil)
        let holder = await hub.subscribe(to: topics("T.AAPL"))
        await hub.publish(message([#"{"ev":"T","sym":"AAPL","n":1}"#, #"{"ev":"T","sym":"AAPL","n":2}"#], tickers: ["AAPL", "AAPL"]))
        let first = try #require(await hub.lastEvent(for: Topic(parsing: "T.AAPL")!))
        #expect(String(buffer: first.bytes) == #"{"ev":"T","sym":"AAPL","n":2}"#, "the publish's last one")
        #expect(first.bytes.storageCapacity < 2 * 4096, "its own bytes, not the message's")
        // A new subscriber's snapshot is queued (it holds the last value's bytes), then newer events come.
        let late = await hub.subscribe(to: topics("T.AAPL"))
        for n in 3...5 { await hub.publish(message([#"{"ev":"T","sym":"AAPL","n":\#(n)}"#], tickers: ["AAPL"])) }
        let got = try await take(4, from: late.events)
        #expect(got.map { String(buffer: $0.bytes) } == (2...5).map { #"{"ev":"T","sym":"AAPL","n":\#($0)}"# }, "the snapshot as it was queued")
        #expect(String(buffer: first.bytes) == #"{"ev":"T","sym":"AAPL","n":2}"#, "a last value handed out is never written over")
        let now = try #require(await hub.lastEvent(for: Topic(parsing: "T.AAPL")!))
        #expect(String(buffer: now.bytes) == #"{"ev":"T","sym":"AAPL","n":5}"#)
        _ = holder
    }

    /// An event of the first 8 bytes of `message` (a slice of it, as an upstream's events are), for `ticker`.
    private func sliced(_ message: ByteBuffer, ticker: String) -> MarketEvent {
        MarketEvent(eventType: "T", ticker: ticker, bytes: message.getSlice(at: 0, length: 8)!)
    }

    @Test func aLastValueLetsGoOfItsMessageWithinEightPublishesUnread() async throws {
        let hub = MarketDataHub(wire: .polygon, history: nil)
        var message = ByteBuffer(repeating: UInt8(ascii: " "), count: 64 << 10)
        await hub.publish([sliced(message, ticker: "AAPL")])
        // Later publishes of other topics, each its own small message: none reads AAPL's last value.
        for index in 1..<MarketDataHub.sharedLastValuePublishes {
            await hub.publish([sliced(ByteBuffer(repeating: UInt8(ascii: " "), count: 64), ticker: "T\(index)")])
        }
        #expect(message.modifyIfUniquelyOwned { _ in true } != nil, "the hub still holds the 64 KB message after \(MarketDataHub.sharedLastValuePublishes) publishes")
        let last = try #require(await hub.lastEvent(for: Topic(parsing: "T.AAPL")!))
        #expect(last.bytes.readableBytes == 8 && last.bytes.storageCapacity < 1024)
    }

    @Test func aLastValueLetsGoOfMessagesPastFourMegabytesAtOnce() async throws {
        let hub = MarketDataHub(wire: .polygon, history: nil)
        var message = ByteBuffer(repeating: UInt8(ascii: " "), count: MarketDataHub.sharedLastValueBytes)
        await hub.publish([sliced(message, ticker: "AAPL")])
        #expect(message.modifyIfUniquelyOwned { _ in true } != nil, "a publish of a 4 MB message left the hub holding it")
    }
}
