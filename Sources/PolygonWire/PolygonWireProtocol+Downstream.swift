import MarketCore
import NIOCore

extension PolygonWireProtocol {
    /// Each market at its own path, `/<market>`.
    public func servedPaths(of market: Market) -> [String] { ["/\(market)"] }

    public func downstreamSession(_ context: DownstreamContext) -> any DownstreamSession {
        ServerSession(limits: context.limits, market: context.market, budget: context.budget, grants: context.grants)
    }

    /// A topic as `/v1/last` names it, checked against the market's event types and in its ticker form.
    public func lastValueTopic(_ topic: Topic, market: Market) -> Result<Topic, WireRejection> {
        if let problem = market.problem(with: topic) { return .failure(WireRejection(problem)) }
        return .success(market.normalized(topic))
    }

    public func exampleTopic(of market: Market) -> String { market.exampleTopic }

    /// The event's own JSON.
    public func httpAnswer(_ event: MarketEvent, accept: String?) -> (body: ByteBuffer, contentType: String, negotiated: Bool)? {
        (event.bytes, "application/json", false)
    }
}

extension ServerSession: DownstreamSession {
    public var framing: any DownstreamFraming { PolygonFraming() }

    public mutating func respond(to message: ByteBuffer) -> DownstreamReaction {
        let reaction: Reaction = receive(message, at: .now)
        return DownstreamReaction(
            frames: reaction.frames, added: reaction.added, removed: reaction.removed, close: reaction.close,
            marketRefused: reaction.marketRefused, resume: reaction.resume, conflate: reaction.conflate)
    }

    public var connectedFrame: ByteBuffer { StatusMessage.connected.frame }
    public var authTimeoutFrame: ByteBuffer { StatusMessage.authTimeout.frame }

    public func connectionLimitFrame(_ message: String) -> ByteBuffer {
        StatusMessage(status: StatusMessage.Kind.maxConnections, message: message).frame
    }

    public func refusalFrame(_ message: String) -> ByteBuffer { StatusMessage.error(message).frame }
}

/// Polygon's frames: a JSON array of the events' own bytes, built straight into one whole WebSocket
/// frame (``WireFrameBuilder``), several only past the frame limit.
public struct PolygonFraming: DownstreamFraming {
    public init() {}

    public var isBinary: Bool { false }

    public func frames(payloadBytes: Int, events: TurnEvents, converted: ConvertedTurnEvents) -> FramedTurn? {
        if payloadBytes <= FrameEncoder.maxFrameBytes {
            let built = WireFrameBuilder.build(payload: payloadBytes) { builder in
                events { builder.append($0) }
            }
            return FramedTurn(first: built.frame, oldestReceivedAt: built.oldestReceivedAt)
        }
        // Past the frame limit (a burst queued while the connection was not writable): split.
        var all: [MarketEvent] = []
        events { all.append($0.pointee) }
        let oldest = all.lazy.map(\.receivedAt).filter { $0 != 0 }.min() ?? 0
        let frames = WireFrame.frames(for: all)
        guard let first = frames.first else { return nil }
        return FramedTurn(first: first, more: Array(frames.dropFirst()), oldestReceivedAt: oldest)
    }

    public func evictedFrame(bufferLimit: Int) -> ByteBuffer {
        let notice = StatusMessage(
            status: StatusMessage.Kind.lagging,
            message: "disconnected: this connection did not keep up and its buffer of \(bufferLimit) events was full")
        return WireFrame.text(notice.frame)
    }

    public func errorFrame(_ error: DownstreamError) -> ByteBuffer { StatusMessage.error(error.message).frame }
}
