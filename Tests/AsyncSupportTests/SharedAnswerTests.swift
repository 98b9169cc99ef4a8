import AsyncSupport
import RelayTestSupport
import Synchronization
import Testing

@Suite("SharedAnswer: one answer made at a time, shared by those who ask meanwhile")
struct SharedAnswerTests {
    /// What the callers and the making saw.
    final class Seen: Sendable {
        let makes = Mutex(0)
        let answers = Mutex<[Int]>([])
    }

    @Test func callersWhileAnAnswerIsMadeShareItAndTheNextGetsANewOne() async throws {
        let shared = SharedAnswer<Int>()
        let seen = Seen()
        let gate = ReadySignal<Void>()
        let make: @Sendable () async throws -> Int = {
            let made = seen.makes.withLock { makes in
                makes += 1
                return makes
            }
            try await gate.wait()
            return made
        }
        let callers = (0..<50).map { _ in
            Task {
                let answer = try await shared.value(make)
                seen.answers.withLock { $0.append(answer) }
            }
        }
        try await eventually("every caller to wait for the answer") { shared.waiting == 50 && seen.makes.withLock { $0 } == 1 }
        gate.succeed(())
        for caller in callers { try await caller.value }
        #expect(seen.makes.withLock { $0 } == 1, "fifty callers at once: one answer made")
        #expect(seen.answers.withLock { $0 } == Array(repeating: 1, count: 50))
        // Asked after it was made: a new answer, not the old one.
        #expect(try await shared.value(make) == 2)
        #expect(shared.waiting == 0)
    }

    struct Failed: Error {}

    @Test func anErrorIsEveryWaitingCallersAndTheNextCallerMakesAnew() async throws {
        let shared = SharedAnswer<Int>()
        let gate = ReadySignal<Void>()
        let seen = Seen()
        let failing: @Sendable () async throws -> Int = {
            seen.makes.withLock { $0 += 1 }
            try await gate.wait()
            throw Failed()
        }
        let callers = (0..<5).map { _ in Task { try await shared.value(failing) } }
        try await eventually("every caller to wait for the answer") { shared.waiting == 5 }
        gate.succeed(())
        for caller in callers { await #expect(throws: Failed.self) { try await caller.value } }
        #expect(seen.makes.withLock { $0 } == 1)
        #expect(try await shared.value { 7 } == 7, "made anew after the error")
    }
}
