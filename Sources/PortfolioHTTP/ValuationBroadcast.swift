import Foundation
import NIOCore
import Portfolio

/// The live valuation as WebSocket text frames for every `/v1/portfolio/stream` connection: one
/// subscription to the sidecar's valuations, each encoded once, the same bytes handed to every
/// connection (a `ByteBuffer` is shared, not copied). Runs while at least one connection watches; a
/// new connection gets the latest frame at once.
actor ValuationBroadcast {
    private let service: PortfolioService
    private var watchers: [UUID: AsyncStream<ByteBuffer>.Continuation] = [:]
    private var latest: ByteBuffer?
    private var pump: Task<Void, Never>?

    init(service: PortfolioService) {
        self.service = service
    }

    /// A connection's frames: the latest valuation, then each new one (the newest only, if it falls behind).
    func frames() -> AsyncStream<ByteBuffer> {
        let (frames, continuation) = AsyncStream.makeStream(of: ByteBuffer.self, bufferingPolicy: .bufferingNewest(1))
        let id = UUID()
        watchers[id] = continuation
        continuation.onTermination = { _ in Task { await self.remove(id) } }
        if let latest { continuation.yield(latest) }
        if pump == nil { pump = Task { await self.forward() } }
        return frames
    }

    private func forward() async {
        for await valuation in await service.valuationUpdates() {
            if Task.isCancelled { return }
            guard let data = try? PortfolioJSON.encoder.encode(valuation) else { continue }
            let frame = ByteBuffer(bytes: data)
            latest = frame
            for watcher in watchers.values { watcher.yield(frame) }
        }
        guard !Task.isCancelled else { return }
        // The sidecar stopped: so do the connections' streams.
        let ended = watchers.values
        watchers = [:]
        pump = nil
        latest = nil
        for watcher in ended { watcher.finish() }
    }

    private func remove(_ id: UUID) {
        watchers[id] = nil
        guard watchers.isEmpty else { return }
        // Nobody watches: the sidecar's subscription ends with the task.
        pump?.cancel()
        pump = nil
        latest = nil
    }
}
