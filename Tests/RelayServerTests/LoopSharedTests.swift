import NIOCore
import NIOEmbedded
import Testing

@testable import RelayServer

/// A target of a deadline queue: counts what it was told.
private final class Pinged {
    var told = 0
    var again = false
}

@Suite("What a loop's connections share: one deadline queue per delay, a limit on hub changes under way")
struct LoopSharedTests {
    @Test func eachTargetIsToldOnceItsDelayHasPassedInTheOrderAdded() {
        let loop = EmbeddedEventLoop()
        var order: [ObjectIdentifier] = []
        let queue = LoopDeadlineQueue<Pinged>(loop: loop, delay: .seconds(30)) { target in
            target.told += 1
            order.append(ObjectIdentifier(target))
        }
        let first = Pinged()
        let second = Pinged()
        queue.add(first)
        loop.advanceTime(by: .seconds(10))
        queue.add(second)
        loop.advanceTime(by: .seconds(19))
        #expect(first.told == 0, "29 s in: not yet")
        loop.advanceTime(by: .seconds(1))
        #expect(first.told == 1)
        #expect(second.told == 0, "its 30 s end 10 s later")
        loop.advanceTime(by: .seconds(10))
        #expect(second.told == 1)
        #expect(order == [ObjectIdentifier(first), ObjectIdentifier(second)])
        loop.advanceTime(by: .seconds(120))
        #expect(first.told == 1 && second.told == 1, "once each: a target that wants more adds itself again")
        #expect(queue.count == 0)
    }

    @Test func aTargetThatAddsItselfAgainIsToldEveryInterval() {
        let loop = EmbeddedEventLoop()
        var queue: LoopDeadlineQueue<Pinged>?
        queue = LoopDeadlineQueue<Pinged>(loop: loop, delay: .seconds(30)) { target in
            target.told += 1
            if target.again { queue?.add(target) }
        }
        let pinged = Pinged()
        pinged.again = true
        queue?.add(pinged)
        for round in 1...4 {
            loop.advanceTime(by: .seconds(30))
            #expect(pinged.told == round)
        }
        pinged.again = false
        loop.advanceTime(by: .seconds(90))
        #expect(pinged.told == 5, "told once more, then no longer in the queue")
    }

    @Test func aTargetGoneBeforeItsDeadlineIsNotKeptAliveNorTold() {
        let loop = EmbeddedEventLoop()
        var told = 0
        let queue = LoopDeadlineQueue<Pinged>(loop: loop, delay: .seconds(5)) { _ in told += 1 }
        weak var gone: Pinged?
        do {
            let target = Pinged()
            gone = target
            queue.add(target)
        }
        #expect(gone == nil, "the queue holds its targets weakly")
        let kept = Pinged()
        queue.add(kept)
        loop.advanceTime(by: .seconds(5))
        #expect(told == 1, "only the target still alive")
        #expect(queue.count == 0, "and the entry of the one gone dropped off")
    }

    @Test func hubChangesPastTheLimitWaitInLineAndStartAsSlotsFree() {
        let slots = HubChangeSlots<Pinged>(limit: 2)
        let connections = (0..<4).map { _ in Pinged() }
        #expect(slots.start(connections[0], urgent: false))
        #expect(slots.start(connections[1], urgent: false))
        #expect(!slots.start(connections[2], urgent: false), "the third waits")
        #expect(!slots.start(connections[3], urgent: false))
        #expect(slots.running == 2 && slots.waitingCount == 2)
        let next = slots.finished()
        #expect(next === connections[2], "first in line, first out")
        #expect(slots.running == 2 && slots.waitingCount == 1)
        // A connection in line whose session is shelved starts at once, over the limit.
        slots.startNow(connections[3])
        #expect(slots.running == 3 && slots.waitingCount == 0)
        #expect(slots.finished() == nil, "over the limit: a finish frees no slot for anyone")
        #expect(slots.running == 2)
        #expect(slots.start(connections[0], urgent: true), "a shelve never waits")
        #expect(slots.running == 3)
    }
}
