import NIOCore
import NIOWebSocket
import Synchronization

/// The open downstream WebSocket connections, so the server can close them all with a code of its
/// choosing.
///
/// `Sendable`, state behind a `Mutex`. The relay closes its WebSockets with 1012 ("service restart")
/// before it stops, so Polygon's official clients reconnect to the restarted relay (1000 and 1001
/// would stop them for good).
final class SessionRegistry: Sendable {
    struct Entry: Sendable {
        /// Starts the close handshake with a code and reason.
        let close: @Sendable (WebSocketErrorCode, String) -> Void
        /// Completes when the connection is closed.
        let closed: EventLoopFuture<Void>
    }

    private let sessions = Mutex<(next: Int, open: [Int: Entry])>((0, [:]))

    func register(_ entry: Entry) -> Int {
        sessions.withLock { state in
            state.next += 1
            state.open[state.next] = entry
            return state.next
        }
    }

    func unregister(_ id: Int) {
        _ = sessions.withLock { $0.open.removeValue(forKey: id) }
    }

    var count: Int { sessions.withLock { $0.open.count } }

    /// Whether ``closeAll(code:reason:timeout:)`` began: the server is stopping, and takes no new session.
    var isClosing: Bool { closing.load(ordering: .relaxed) }
    private let closing = Atomic<Bool>(false)

    /// Sends a close frame with `code` to every open session and waits until they are closed, at most
    /// `timeout`.
    func closeAll(code: WebSocketErrorCode, reason: String, timeout: Duration) async {
        closing.store(true, ordering: .relaxed)
        let open = sessions.withLock { Array($0.open.values) }
        guard !open.isEmpty else { return }
        for entry in open { entry.close(code, reason) }
        await withTaskGroup(of: Void.self) { group in
            group.addTask {
                for entry in open { try? await entry.closed.get() }
            }
            group.addTask { try? await Task.sleep(for: timeout) }
            await group.next()
            group.cancelAll()
        }
    }
}
