import NIOCore

/// A task executor that runs its jobs on one NIO event loop: a connection's request handling, started
/// with this as its preference, runs on the loop that reads and writes the connection, so a request
/// read by the loop is handled and its answer written there too, without two thread hand-offs (the
/// loop waking a pool thread, the pool thread waking the loop) per request. Actor-isolated calls still
/// go to their actors and come back here.
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
