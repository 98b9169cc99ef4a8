import Hummingbird
import NIOCore

/// A task executor that runs its jobs on one NIO event loop: a connection's request handling, started
/// with this as its preference, runs on the loop that reads and writes the connection, so a request
/// read by the loop is handled and its answer written there too, without two thread hand-offs (the
/// loop waking a pool thread, the pool thread waking the loop) per request. Actor-isolated calls still
/// go to their actors and come back here.
///
/// A job enqueued after the loop shut down is dropped (NIO logs it): its task never resumes. The relay's
/// loops live as long as the process.
///
/// `Sendable`: it holds only the loop, itself `Sendable`.
final class LoopTaskExecutor: TaskExecutor {
    let loop: any EventLoop

    init(loop: any EventLoop) {
        self.loop = loop
    }

    func enqueue(_ job: consuming ExecutorJob) {
        let job = UnownedJob(job)
        loop.execute { job.runSynchronously(on: self.asUnownedTaskExecutor()) }
    }
}

/// Runs the routes behind it on the global executor rather than on their connection's event loop
/// (``LoopTaskExecutor``): for routes whose work may be long (the portfolio's recomputing after a
/// change), so it does not hold up the loop's other connections.
struct OffTheLoopMiddleware<Context: RequestContext>: RouterMiddleware {
    func handle(_ request: Request, context: Context, next: (Request, Context) async throws -> Response) async throws -> Response {
        try await withTaskExecutorPreference(globalConcurrentExecutor) { try await next(request, context) }
    }
}
