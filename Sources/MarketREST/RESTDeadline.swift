/// A bound on a whole REST exchange, body included: AsyncHTTPClient's own timeout ends at the head,
/// and a body trickled a byte at a time would hold the request for ever.
public enum RESTDeadline {
    /// The whole of `operation` within `limit`, else ``TimedOut`` (the operation is cancelled: an
    /// AsyncHTTPClient request closes its connection).
    public static func within<T: Sendable>(_ limit: Duration, _ operation: @escaping @Sendable () async throws -> T) async throws -> T {
        try await withThrowingTaskGroup(of: T.self) { group in
            group.addTask { try await operation() }
            group.addTask {
                try await Task.sleep(for: limit)
                throw TimedOut(limit: limit)
            }
            defer { group.cancelAll() }
            guard let first = try await group.next() else { throw CancellationError() }
            return first
        }
    }

    public struct TimedOut: Error, CustomStringConvertible {
        public var limit: Duration
        public var description: String { "no whole answer within \(limit.components.seconds) s" }
    }
}
