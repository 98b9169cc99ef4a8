import MarketREST
import RelayTestSupport
import Synchronization
import Testing

/// The bound on a REST call holds even when the call does not honour its cancellation.
@Suite("REST deadline", .timeLimit(.minutes(1)))
struct RESTDeadlineTests {
    /// An operation that ends only when told to, whatever cancellation says (as a request that
    /// missed its cancellation does).
    final class Stubborn: Sendable {
        private let waiting = Mutex<CheckedContinuation<Void, Never>?>(nil)
        private let released = Mutex(false)
        private let endedFlag = Atomic(false)
        private let cancelledFlag = Atomic(false)
        var ended: Bool { endedFlag.load(ordering: .relaxed) }
        /// Yields once the operation runs.
        let started: AsyncStream<Void>
        private let start: AsyncStream<Void>.Continuation

        init() { (started, start) = AsyncStream.makeStream(of: Void.self) }

        var cancelled: Bool { cancelledFlag.load(ordering: .relaxed) }

        func run() async -> Int {
            start.yield()
            await withTaskCancellationHandler {
                await withCheckedContinuation { continuation in
                    let now = released.withLock { released in
                        if !released { waiting.withLock { $0 = continuation } }
                        return released
                    }
                    if now { continuation.resume() }
                }
            } onCancel: {
                cancelledFlag.store(true, ordering: .relaxed)
            }
            endedFlag.store(true, ordering: .relaxed)
            return 1
        }

        func release() {
            released.withLock { $0 = true }
            waiting.withLock { $0.take() }?.resume()
        }
    }

    @Test func aCallThatIgnoresItsCancellationStillEndsAtTheDeadline() async throws {
        let stubborn = Stubborn()
        try await withBackstop(stubborn) {
            await #expect(throws: RESTDeadline.TimedOut.self) {
                _ = try await RESTDeadline.within(.milliseconds(100)) { await stubborn.run() }
            }
            #expect(!stubborn.ended, "the caller waited for the operation to end")
            try await eventually("the operation to be cancelled") { stubborn.cancelled }
        }
    }

    @Test func aCancelledCallerIsFreedAtOnce() async throws {
        let stubborn = Stubborn()
        try await withBackstop(stubborn) {
            let caller = Task { try await RESTDeadline.within(.seconds(30)) { await stubborn.run() } }
            // Cancelled while the operation runs.
            var started = stubborn.started.makeAsyncIterator()
            await started.next()
            caller.cancel()
            await #expect(throws: CancellationError.self) { _ = try await caller.value }
            #expect(!stubborn.ended, "the caller waited for the operation to end")
            try await eventually("the operation to be cancelled") { stubborn.cancelled }
        }
    }

    /// Runs `body`, releasing `stubborn` after 20 s if nothing did: a caller that waits for the
    /// operation then fails the checks above instead of hanging the suite.
    private func withBackstop(_ stubborn: Stubborn, _ body: () async throws -> Void) async throws {
        let backstop = Task {
            try await Task.sleep(for: .seconds(20))
            stubborn.release()
        }
        defer {
            backstop.cancel()
            stubborn.release()
        }
        try await body()
    }

    @Test func anAnswerInTimeIsReturnedAndAnErrorPassedOn() async throws {
        #expect(try await RESTDeadline.within(.seconds(10)) { 42 } == 42)
        struct Refused: Error {}
        await #expect(throws: Refused.self) { _ = try await RESTDeadline.within(.seconds(10)) { () async throws -> Int in throw Refused() } }
    }
}
