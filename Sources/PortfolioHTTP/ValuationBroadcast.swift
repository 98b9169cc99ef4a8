import Foundation
import MarketCore
import NIOCore
import Portfolio
import PortfolioDomain

/// The live valuation as WebSocket text frames for every `/v1/portfolio/stream` connection: one
/// subscription to the sidecar's valuations; connections whose keys have the same rights share each
/// frame, encoded once (a `ByteBuffer` is shared, not copied). A key that may read every price gets the
/// sidecar's valuation as it is; a key limited to some topics gets one valued with the prices it may
/// read (``PriceAccess``), once per push for all its connections. Runs while at least one connection
/// watches; a new connection gets its rights' latest frame at once.
actor ValuationBroadcast {
    private let service: PortfolioService
    /// The connections of one set of rights, and the last frame they were sent.
    private struct Group {
        let access: PriceAccess
        var watchers: [UUID: AsyncStream<ByteBuffer>.Continuation] = [:]
        var latest: ByteBuffer?
        /// Frames sent so far: a first frame valued for a newcomer is not sent after a newer one.
        var sent = 0
    }

    /// By rights (every key that reads every price shares ``Entitlement/everything``'s group).
    private var groups: [Entitlement: Group] = [:]
    private var pump: Task<Void, Never>?

    init(service: PortfolioService) {
        self.service = service
    }

    /// A connection's frames: the latest valuation, then each new one (the newest only, if it falls behind).
    func frames(for entitlement: Entitlement) async -> AsyncStream<ByteBuffer> {
        let (frames, continuation) = AsyncStream.makeStream(of: ByteBuffer.self, bufferingPolicy: .bufferingNewest(1))
        let id = UUID()
        let access = service.priceAccess(for: entitlement)
        let rights = access.rights
        groups[rights, default: Group(access: access)].watchers[id] = continuation
        continuation.onTermination = { _ in Task { await self.remove(id, of: rights) } }
        guard pump != nil else {
            // The subscription's first valuation comes at once, for every group.
            pump = Task { await self.forward() }
            return frames
        }
        if let latest = groups[rights]?.latest {
            continuation.yield(latest)
        } else if let sent = groups[rights]?.sent, let frame = await frame(for: access) {
            // New rights: valued now rather than at the next change, unless a push came meanwhile (it
            // is kept for the group's next newcomer as a push's would be).
            if groups[rights]?.sent == sent {
                groups[rights]?.latest = frame
                continuation.yield(frame)
            }
        }
        return frames
    }

    private func frame(for access: PriceAccess, given valuation: Valuation? = nil) async -> ByteBuffer? {
        let shown: Valuation
        if access.isWhole, let valuation {
            shown = valuation
        } else {
            guard let valued = try? await service.valuation(access: access) else { return nil }
            shown = valued
        }
        return (try? PortfolioJSON.encoder.encode(shown)).map { ByteBuffer(bytes: $0) }
    }

    private func forward() async {
        for await valuation in await service.valuationUpdates() {
            if Task.isCancelled { return }
            for rights in Array(groups.keys) {
                guard let access = groups[rights]?.access, let frame = await frame(for: access, given: valuation) else { continue }
                // Nobody watched meanwhile, and a newer pump may run: this one's frames are old.
                guard !Task.isCancelled else { return }
                guard var group = groups[rights] else { continue }
                group.latest = frame
                group.sent += 1
                groups[rights] = group
                for watcher in group.watchers.values { watcher.yield(frame) }
            }
        }
        guard !Task.isCancelled else { return }
        // The sidecar stopped: so do the connections' streams.
        let ended = groups.values.flatMap(\.watchers.values)
        groups = [:]
        pump = nil
        for watcher in ended { watcher.finish() }
    }

    private func remove(_ id: UUID, of rights: Entitlement) {
        groups[rights]?.watchers[id] = nil
        if groups[rights]?.watchers.isEmpty == true { groups[rights] = nil }
        guard groups.isEmpty else { return }
        // Nobody watches: the sidecar's subscription ends with the task.
        pump?.cancel()
        pump = nil
    }
}
