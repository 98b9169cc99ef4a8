import AsyncSupport
import Foundation
import RelayTestSupport
import Synchronization
import Testing

@Suite("Bounded inbox: a C thread's queue into Swift concurrency")
struct BoundedInboxTests {
    enum Message: Sendable, Equatable {
        case data([Int])
        case control(String)
    }

    static func weight(_ message: Message) -> Int {
        if case .data(let values) = message { return values.count }
        return 0
    }

    static func noteDrop(_ lost: inout [Int], _ message: Message) {
        if case .data(let values) = message { lost += values }
    }

    static func merge(_ last: inout Message, _ next: Message) -> Bool {
        guard case .data(var values) = last, case .data(let more) = next else { return false }
        values += more
        last = .data(values)
        return true
    }

    func inbox(capacity: Int, merge: Bool = false) -> BoundedInbox<Message, [Int]> {
        BoundedInbox(
            capacity: capacity, emptyLoss: [], weight: Self.weight, noteDrop: Self.noteDrop, merge: merge ? Self.merge : nil)
    }

    func drained(_ inbox: BoundedInbox<Message, [Int]>) async -> [String] {
        let out = Mutex<[String]>([])
        await inbox.drain { items in
            for item in items {
                switch item {
                case .element(let message): out.withLock { $0.append("\(message)") }
                case .lost(let values, let count): out.withLock { $0.append("lost \(count) \(values)") }
                }
            }
        }
        return out.withLock { $0 }
    }

    /// Control messages have a bound of their own: past it they are dropped, and one element in their
    /// place says how many, before what is kept next; once taken, there is room again.
    @Test func controlMessagesPastTheirBoundAreDroppedAndToldOnceInTheirPlace() async throws {
        let inbox = BoundedInbox<Message, [Int]>(
            capacity: 10, emptyLoss: [], weight: Self.weight, noteDrop: Self.noteDrop,
            controlBound: (3, { _ in true }, { .control("\($0) dropped") }))
        for name in ["a", "b", "c"] { #expect(inbox.push(.control(name))) }
        #expect(!inbox.push(.control("d")), "past the bound")
        #expect(!inbox.push(.control("e")))
        #expect(inbox.push(.data([1])), "events have their own bound")
        #expect(!inbox.push(.control("f")), "the one telling of the drops is queued past the bound: still full")
        inbox.finish()
        #expect(
            await drained(inbox) == [
                "control(\"a\")", "control(\"b\")", "control(\"c\")", "control(\"2 dropped\")", "data([1])",
                "control(\"1 dropped\")",
            ], "told where they were dropped, and at the end for those after the last kept")
        let again = BoundedInbox<Message, [Int]>(
            capacity: 10, emptyLoss: [], weight: Self.weight, noteDrop: Self.noteDrop,
            controlBound: (1, { _ in true }, { .control("\($0) dropped") }))
        #expect(again.push(.control("x")))
        #expect(!again.push(.control("y")))
        let taken = Task { await drained(again) }
        try await eventually("the first control message to be taken") { again.push(.control("z")) }
        again.finish()
        #expect(await taken.value.contains("control(\"z\")"), "once taken, there is room again")
        // A producer that can wait waits for room under the control bound, as under the capacity.
        let waits = BoundedInbox<Message, [Int]>(
            capacity: 10, emptyLoss: [], weight: Self.weight, noteDrop: Self.noteDrop,
            controlBound: (1, { _ in true }, { .control("\($0) dropped") }))
        #expect(waits.push(.control("first")))
        let second = Task { await waits.push(.control("second"), waitingBelow: 10) }
        let all = Task { await drained(waits) }
        #expect(await second.value, "queued once the first was taken")
        waits.finish()
        #expect(await all.value == ["control(\"first\")", "control(\"second\")"], "nothing dropped")
    }

    /// A producer's own word about itself goes past the control bound, in order after the drops it
    /// follows (told first), and counts in the bound: what others send is still refused.
    @Test func aProducersOwnControlMessageIsQueuedPastTheBound() async {
        let inbox = BoundedInbox<Message, [Int]>(
            capacity: 10, emptyLoss: [], weight: Self.weight, noteDrop: Self.noteDrop,
            controlBound: (2, { _ in true }, { .control("\($0) dropped") }))
        for name in ["a", "b"] { #expect(inbox.push(.control(name))) }
        #expect(!inbox.push(.control("flood")), "past the bound")
        #expect(inbox.push(.control("link lost"), pastControlBound: true))
        #expect(!inbox.push(.control("more flood")), "still full: it counted")
        inbox.finish()
        #expect(
            await drained(inbox) == [
                "control(\"a\")", "control(\"b\")", "control(\"1 dropped\")", "control(\"link lost\")", "control(\"1 dropped\")",
            ])
    }

    @Test func overflowIsDroppedCountedAndReportedInPlace() async {
        let inbox = inbox(capacity: 3)
        #expect(inbox.push(.data([1, 2])))
        #expect(!inbox.push(.data([3, 4])), "would pass the capacity")
        #expect(!inbox.push(.data([5, 6])))
        #expect(inbox.push(.control("reconnected")), "control messages weigh nothing and are always kept")
        #expect(inbox.push(.data([7])))
        #expect(inbox.queuedWeight == 3)
        inbox.finish()
        #expect(!inbox.push(.data([8])), "nothing after finish")
        #expect(
            await drained(inbox) == [
                "data([1, 2])", "lost 4 [3, 4, 5, 6]", "control(\"reconnected\")", "data([7])",
            ], "the loss comes where it happened, before what was kept after it")
    }

    @Test func aLossAtTheEndIsReportedWhenTheQueueEmpties() async {
        let inbox = inbox(capacity: 1)
        inbox.push(.data([1]))
        inbox.push(.data([2]))
        inbox.finish()
        #expect(await drained(inbox) == ["data([1])", "lost 1 [2]"])
    }

    @Test func runsMergeIntoOneItem() async {
        let inbox = inbox(capacity: 100, merge: true)
        for value in 1...5 { inbox.push(.data([value])) }
        inbox.push(.control("x"))
        inbox.push(.data([6]))
        inbox.finish()
        #expect(await drained(inbox) == ["data([1, 2, 3, 4, 5])", "control(\"x\")", "data([6])"])
    }

    /// A producer that can wait (a REST fill) takes at most the room it is given and drops nothing: the
    /// live producer sharing the inbox keeps the rest of the capacity.
    @Test func aWaitingProducerQueuesWithinItsRoomAndNeverDrops() async throws {
        let inbox = inbox(capacity: 10)
        let released = AsyncStream<Void>.makeStream()
        let taken = AsyncStream<Void>.makeStream()
        let runs = Mutex<[String]>([])
        let consumer = Task {
            var gate = released.stream.makeAsyncIterator()
            await inbox.drain(limit: 1) { items in
                for item in items { if case .element(let message) = item { runs.withLock { $0.append("\(message)") } } }
                taken.continuation.yield()
                _ = await gate.next()  // one run at a time, when the test says
            }
        }
        let producer = Task {
            var kept = 0
            for value in 0..<4 where await inbox.push(.data([value, value, value]), waitingBelow: 5) { kept += 1 }
            return kept
        }
        // The first part is taken; the second waits in the queue (3 + 3 > 5 counting what is in hand).
        var takenRuns = taken.stream.makeAsyncIterator()
        _ = await takenRuns.next()
        #expect(inbox.queuedWeight == 3, "only the part in hand: the next one waits for room")
        #expect(inbox.push(.data([100, 101])), "the live producer still has room")
        for _ in 0..<6 { released.continuation.yield() }
        #expect(await producer.value == 4, "every part queued, none dropped")
        inbox.finish()
        released.continuation.finish()
        await consumer.value
        #expect(runs.withLock { $0 } == ["data([0, 0, 0])", "data([100, 101])", "data([1, 1, 1])", "data([2, 2, 2])", "data([3, 3, 3])"])
    }

    /// A producer that waits for room is never left waiting while the queue is empty: the consumer lowers
    /// what it has in hand and wakes the waiters in one step under the lock the producer checks and waits
    /// under (before, the two could pass each other, and a lone producer, such as a replay, slept forever).
    @Test func aLoneProducerWaitingForRoomIsAlwaysWoken() async throws {
        let inbox = inbox(capacity: 1_000)
        let consumed = Atomic<Int>(0)
        let consumer = Task {
            await inbox.drain { items in
                for item in items { if case .element(.data(let values)) = item { consumed.add(values.count, ordering: .relaxed) } }
                await Task.yield()
            }
        }
        let parts = 20_000
        let producer = Task {
            for part in 0..<parts { _ = await inbox.push(.data([part, part]), waitingBelow: 2) }
        }
        let deadline = ContinuousClock.now + .seconds(30)
        while consumed.load(ordering: .relaxed) < parts * 2, ContinuousClock.now < deadline { try await Task.sleep(for: .milliseconds(5)) }
        #expect(consumed.load(ordering: .relaxed) == parts * 2, "every part through: the producer was never left asleep")
        producer.cancel()
        inbox.finish()
        await consumer.value
    }

    @Test func theConsumerWaitsForAProducerOnAnotherThread() async throws {
        let inbox = inbox(capacity: 1_000)
        let consumer = Task { await drained(inbox) }
        let producer = Thread {
            for value in 0..<100 { inbox.push(.data([value])) }
            inbox.finish()
        }
        producer.start()
        let seen = await consumer.value
        #expect(seen.count == 100 && seen.first == "data([0])" && seen.last == "data([99])")
    }
}
