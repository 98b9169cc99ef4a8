import AsyncSupport
import Dispatch
import Foundation
import NIOPosix
import RelayTestSupport
import Synchronization
import Testing

@Suite("BlockingWork: blocking calls off the cooperative pool")
struct BlockingWorkTests {
    struct Refused: Error, Equatable { let code: Int }

    /// Shared by the test, its blocked calls and its watchdog.
    final class Held: Sendable {
        let count: Int
        let gate = DispatchSemaphore(value: 0)
        let running = Atomic<Int>(0)
        let released = Atomic<Bool>(false)
        init(count: Int) { self.count = count }

        func release() {
            guard !released.exchange(true, ordering: .relaxed) else { return }
            for _ in 0..<count { gate.signal() }
        }
    }

    /// More blocked calls than the cooperative pool has threads: tasks, timers and the caller's own
    /// loop go on meanwhile. (Had the calls blocked cooperative threads, nothing could run until the
    /// watchdog below let them go, after 10 s.)
    @Test func heldCallsLeaveTheCooperativePoolFree() async throws {
        // Far more than any machine's cooperative pool has threads (one per core).
        let held = Held(count: max(64, ProcessInfo.processInfo.activeProcessorCount + 2))
        let pool = NIOThreadPool(numberOfThreads: held.count)
        pool.start()
        // A failure ends the test instead of hanging the suite.
        DispatchQueue(label: "blocking-work-watchdog").asyncAfter(deadline: .now() + 10) { held.release() }
        let calls = Task {
            await withTaskGroup(of: Int.self) { group in
                for index in 0..<held.count {
                    group.addTask {
                        await BlockingWork.run(in: pool) {
                            held.running.add(1, ordering: .relaxed)
                            held.gate.wait()
                            return index
                        }
                    }
                }
                return await group.reduce(0, +)
            }
        }
        try await eventually("every call to get a thread of the pool", timeout: .seconds(5)) { held.running.load(ordering: .relaxed) == held.count }
        let slept = ContinuousClock.now
        try await Task.sleep(for: .milliseconds(100))
        #expect(ContinuousClock.now - slept < .seconds(3), "a 100 ms sleep ended while \(held.count) calls were held")
        #expect(await Task { 42 }.value == 42, "a new task ran while the calls were held")
        let watchdogFired = held.released.load(ordering: .relaxed)
        #expect(!watchdogFired, "all this happened before the watchdog let the calls go")
        held.release()
        #expect(await calls.value == (0..<held.count).reduce(0, +), "each caller got its own call's answer")
        try await pool.shutdownGracefully()
    }

    /// A caller cancelled while its call waits for a thread is still answered, and the call runs (a
    /// save at shutdown is not skipped).
    @Test func aCancelledCallerStillHasItsWorkRun() async throws {
        let pool = NIOThreadPool(numberOfThreads: 1)
        pool.start()
        let occupying = Held(count: 1)
        let occupied = Task {
            await BlockingWork.run(in: pool) {
                occupying.running.add(1, ordering: .relaxed)
                occupying.gate.wait()
            }
        }
        try await eventually("the pool's one thread to be held") { occupying.running.load(ordering: .relaxed) == 1 }
        let ran = Held(count: 0)
        let caller = Task {
            await BlockingWork.run(in: pool) {
                ran.running.add(1, ordering: .relaxed)
                return "saved"
            }
        }
        caller.cancel()
        occupying.release()
        #expect(await caller.value == "saved")
        let runs = ran.running.load(ordering: .relaxed)
        #expect(runs == 1, "the cancelled caller's work ran once")
        await occupied.value
        try await pool.shutdownGracefully()
    }

    /// What the work throws reaches its caller with its type; `on:` runs the work on that queue.
    @Test func errorsAndQueues() async throws {
        await #expect(throws: Refused(code: 7)) {
            try await BlockingWork.run { () throws(Refused) -> Int in throw Refused(code: 7) }
        }
        let queue = DispatchQueue(label: "blocking-work-test")
        let key = DispatchSpecificKey<String>()
        queue.setSpecific(key: key, value: "the queue")
        #expect(await BlockingWork.run(on: queue) { DispatchQueue.getSpecific(key: key) } == "the queue")
        await #expect(throws: Refused(code: 9)) {
            try await BlockingWork.run(on: queue) { () throws(Refused) -> Int in throw Refused(code: 9) }
        }
    }
}
