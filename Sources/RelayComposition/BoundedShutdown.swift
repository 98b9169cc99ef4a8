import Logging
import ServiceLifecycle
import Synchronization

/// Runs one part of the relay so that, once graceful shutdown reaches it, it has `deadline` to finish;
/// after that it is cancelled and abandoned (no longer waited for) with an error log naming it, so
/// one stuck part never keeps the process from exiting.
///
/// `Sendable`; a `Service` wrapping another.
struct BoundedShutdown: Service {
    let name: String
    let service: any Service
    let deadline: Duration
    let logger: Logger

    struct Abandoned: Error, CustomStringConvertible {
        var name: String
        var deadline: Duration
        var description: String { "\(name) did not stop within \(deadline) of shutdown and was abandoned" }
    }

    func run() async throws {
        let service = self.service
        // Unstructured, so it can be left behind; it inherits the graceful-shutdown context.
        let part = Task { try await service.run() }
        let (outcomes, outcome) = AsyncStream.makeStream(of: Result<Void, any Error>.self, bufferingPolicy: .bufferingNewest(1))
        let finisher = Task {
            do {
                try await part.value
                outcome.yield(.success(()))
            } catch {
                outcome.yield(.failure(error))
            }
        }
        let watchdog = Task { [name, deadline, logger] in
            do {
                try await gracefulShutdown()
                try await Task.sleep(for: deadline)
            } catch {
                return
            }
            logger.error("\(name) did not stop within \(deadline) of shutdown; abandoned")
            part.cancel()
            outcome.yield(.failure(Abandoned(name: name, deadline: deadline)))
        }
        defer {
            watchdog.cancel()
            finisher.cancel()
        }
        let result = await withTaskCancellationHandler {
            var iterator = outcomes.makeAsyncIterator()
            return await iterator.next() ?? .success(())
        } onCancel: {
            part.cancel()
        }
        switch result {
        case .success:
            return
        case .failure(is Abandoned):
            // Logged by the watchdog; not a failure of the relay: the rest still stops in order.
            return
        case .failure(let error):
            throw error
        }
    }
}
