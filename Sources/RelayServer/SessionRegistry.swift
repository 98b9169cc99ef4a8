import HummingbirdWebSocket
import NIOWebSocket
import Synchronization

/// The open downstream connections, so the server can close them all with a code of its choosing.
///
/// `Sendable`, state behind a `Mutex`. Hummingbird's own shutdown closes WebSockets with 1000, which
/// tells Polygon's official clients to stop for good; the relay closes them first with 1012 ("service
/// restart") so they reconnect to the restarted relay.
final class SessionRegistry: Sendable {
    private let sessions = Mutex<(next: Int, open: [Int: WebSocketOutboundWriter])>((0, [:]))

    func register(_ outbound: WebSocketOutboundWriter) -> Int {
        sessions.withLock { state in
            state.next += 1
            state.open[state.next] = outbound
            return state.next
        }
    }

    func unregister(_ id: Int) {
        _ = sessions.withLock { $0.open.removeValue(forKey: id) }
    }

    var count: Int { sessions.withLock { $0.open.count } }

    /// Sends a close frame with `code` to every open session, concurrently, waiting at most `timeout`.
    func closeAll(code: WebSocketErrorCode, reason: String, timeout: Duration) async {
        let open = sessions.withLock { Array($0.open.values) }
        guard !open.isEmpty else { return }
        await withTaskGroup(of: Bool.self) { group in
            for outbound in open {
                group.addTask {
                    try? await outbound.close(code, reason: reason)
                    return true
                }
            }
            group.addTask {
                try? await Task.sleep(for: timeout)
                return false
            }
            var closed = 0
            for await sent in group {
                guard sent else { break }  // the timeout came first
                closed += 1
                if closed == open.count { break }
            }
            group.cancelAll()
        }
    }
}
