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
            marketRefused: reaction.marketRefused, resume: reaction.resume, conflate: reaction.conflate,
            timestamps: reaction.timestamps)
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
    /// Each event gets its receive and send times (``EventTimes``).
    public let times: Bool

    public init(times: Bool = false) {
        self.times = times
    }

    public var isBinary: Bool { false }

    public func withTimes() -> any DownstreamFraming { PolygonFraming(times: true) }

    public func frames(payloadBytes: Int, events: TurnEvents, converted: ConvertedTurnEvents) -> FramedTurn? {
        if times { return timedFrames(events: events) }
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

    /// The events with their times, each frame a JSON array under the frame limit: the events' bytes
    /// copied in with two fields more each (``EventTimes``), never serialised again.
    private func timedFrames(events: TurnEvents) -> FramedTurn? {
        let reading = EventTimes.Reading()
        var frames: [ByteBuffer] = []
        var payload = ByteBuffer()
        var oldest = UInt64.max
        events { event in
            let bytes = event.pointee.bytes
            if payload.readableBytes > 0, payload.readableBytes + bytes.readableBytes + EventTimes.maxGrowth + 2 > FrameEncoder.maxFrameBytes {
                payload.writeInteger(UInt8(ascii: "]"))
                frames.append(WireFrame.text(payload))
                payload.clear()
            }
            payload.writeInteger(UInt8(ascii: payload.readableBytes == 0 ? "[" : ","))
            EventTimes.write(event.pointee, bytes: bytes, reading: reading, into: &payload)
            if event.pointee.receivedAt != 0 { oldest = min(oldest, event.pointee.receivedAt) }
        }
        if payload.readableBytes > 0 {
            payload.writeInteger(UInt8(ascii: "]"))
            frames.append(WireFrame.text(payload))
        }
        guard let first = frames.first else { return nil }
        return FramedTurn(first: first, more: Array(frames.dropFirst()), oldestReceivedAt: oldest == .max ? 0 : oldest)
    }

    public func evictedFrame(bufferLimit: Int) -> ByteBuffer {
        let notice = StatusMessage(
            status: StatusMessage.Kind.lagging,
            message: "disconnected: this connection did not keep up and its buffer of \(bufferLimit) events was full")
        return WireFrame.text(notice.frame)
    }

    public func errorFrame(_ error: DownstreamError) -> ByteBuffer { StatusMessage.error(error.message).frame }
}
