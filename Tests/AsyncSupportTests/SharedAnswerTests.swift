import AsyncSupport
import RelayTestSupport
import Synchronization
import Testing

@Suite("SharedAnswer: one answer made at a time, shared by those who ask meanwhile")
struct SharedAnswerTests {
    /// What the callers and the making saw.
    final class Seen: Sendable {
        let makes = Mutex(0)
        let started = Mutex(0)
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
                seen.started.withLock { $0 += 1 }
                let answer = try await shared.value(make)
                seen.answers.withLock { $0.append(answer) }
            }
        }
        try await eventually("every caller to ask") { seen.started.withLock { $0 } == 50 && seen.makes.withLock { $0 } == 1 }
        gate.succeed(())
        for caller in callers { try await caller.value }
        #expect(seen.makes.withLock { $0 } == 1, "fifty callers at once: one answer made")
        #expect(seen.answers.withLock { $0 } == Array(repeating: 1, count: 50))
        // Asked after it was made: a new answer, not the old one.
        #expect(try await shared.value(make) == 2)
    }
}
