import MarketCore
import NIOCore

extension AlpacaWireProtocol {
    /// The feed's paths (and the older one an SDK still uses for it).
    public func servedPaths(of market: Market) -> [String] { feed.paths }

    /// In the codec the upgrade asked for (`Content-Type: application/msgpack`, else JSON).
    public func downstreamSession(_ context: DownstreamContext) -> any DownstreamSession {
        // Alpaca's channel letters are checked by the session itself (the feed's event types).
        AlpacaServerSession(
            codec: AlpacaCodec(contentType: context.contentType), feed: feed, market: context.market, limits: context.limits, budget: context.budget,
            grants: context.grants)
    }

    /// A topic of the feed's channels (`t.AAPL`), its symbol upper case as Alpaca's are.
    public func lastValueTopic(_ topic: Topic, market: Market) -> Result<Topic, WireRejection> {
        guard feed.eventTypes.contains(topic.eventType) else {
            let types = feed.channels.map(\.eventType).joined(separator: ", ")
            return .failure(WireRejection("no \(topic.eventType) events on \(feed.path) (Alpaca's channel letters: \(types); e.g. t.AAPL)"))
        }
        // As a subscription's symbol: no longer than a client could name (nothing is looked up for more).
        if let problem = SessionLimits().problem(with: topic) { return .failure(WireRejection("\(topic.description.prefix(60)): \(problem)")) }
        // A derived topic's size keeps its case (`AAPL@5m`).
        let ticker = topic.derivedBar.map { "\($0.symbol.uppercased())\(BarSpec.separator)\($0.spec)" } ?? topic.ticker.uppercased()
        return .success(Topic(eventType: topic.eventType, ticker: ticker) ?? topic)
    }

    /// A quote of the feed's usual symbol, in Alpaca's channel letters (`q.AAPL`, `q.BTC/USD`).
    public func exampleTopic(of market: Market) -> String {
        switch market {
        case .crypto: "q.BTC/USD"
        case .options: "q.SPY251219C00650000"
        default: "q.AAPL"
        }
    }

    /// Alpaca's JSON, or the event's MessagePack bytes when `accept` asks for `application/msgpack`.
    public func httpAnswer(_ event: MarketEvent, accept: String?) -> (body: ByteBuffer, contentType: String, negotiated: Bool)? {
        let codec = AlpacaCodec(contentType: accept)
        return AlpacaDelivery.elementBytes(event, codec: codec).map { ($0, codec == .messagePack ? "application/msgpack" : "application/json", true) }
    }
}

extension AlpacaServerSession: DownstreamSession {
    /// Alpaca's protocol names no epoch: a tagged session resumes within the relay's current one.
    public var epoch: String? {
        get { nil }
        set {}
    }

    public var framing: any DownstreamFraming { AlpacaFraming(codec: codec, newsSent: newsSent) }

    /// On the news feed, what the connection was sent lately: a resume (which sends again what the
    /// client may not have had) does not send a story the broken connection already did.
    public var carriedOver: (any Sendable)? { newsSent }

    public func adopt(carriedOver: any Sendable) {
        guard let newsSent, let earlier = carriedOver as? NewsSent else { return }
        newsSent.remember(earlier)
    }

    public mutating func respond(to message: ByteBuffer) -> DownstreamReaction {
        let reaction: Reaction = refusal(ofBytes: message.readableBytes, at: .now) ?? handle(Array(message.readableBytesView))
        return DownstreamReaction(
            frames: reaction.frames.map { ByteBuffer(bytes: $0) }, added: reaction.added, removed: reaction.removed, close: reaction.close,
            marketRefused: reaction.marketRefused)
    }

    public var connectedFrame: ByteBuffer { ByteBuffer(bytes: codec.frame([AlpacaControl.connected])) }
    public var authTimeoutFrame: ByteBuffer { ByteBuffer(bytes: codec.frame([AlpacaError.authTimeout.message])) }

    public func connectionLimitFrame(_ message: String) -> ByteBuffer {
        ByteBuffer(bytes: codec.frame([AlpacaError.connectionLimitExceeded.message(detail: message)]))
    }

    public func refusalFrame(_ message: String) -> ByteBuffer {
        ByteBuffer(bytes: codec.frame([AlpacaError.connectionLimitExceeded.message(detail: message)]))
    }
}

/// Alpaca's frames in a codec: MessagePack clients get the events' own bytes under an array header;
/// JSON clients each event converted once per publish (shared by every JSON client of the hub); each
/// notice alone in its frame (``AlpacaDelivery``). On the news feed each item goes once, however many
/// of its symbols the connection holds (``NewsSent``).
public struct AlpacaFraming: DownstreamFraming {
    public let codec: AlpacaCodec
    /// Each event gets its receive and send times (``EventTimes``).
    public let times: Bool
    /// The connection's sent news items (the news feed only).
    public let newsSent: NewsSent?

    public init(codec: AlpacaCodec, times: Bool = false, newsSent: NewsSent? = nil) {
        self.codec = codec
        self.times = times
        self.newsSent = newsSent
    }

    public var isBinary: Bool { codec == .messagePack }

    public func withTimes() -> any DownstreamFraming { AlpacaFraming(codec: codec, times: true, newsSent: newsSent) }

    public func frames(payloadBytes: Int, events: TurnEvents, converted: ConvertedTurnEvents) -> FramedTurn? {
        var elements: [AlpacaDelivery.Element] = []
        var oldest = UInt64.max
        let reading: EventTimes.Reading? = times ? EventTimes.Reading() : nil
        let newsSent = self.newsSent
        func add(_ event: borrowing MarketEvent, _ bytes: ByteBuffer?) {
            if event.receivedAt != 0 { oldest = min(oldest, event.receivedAt) }
            guard let bytes else { return }
            // An item routed by two symbols this connection holds (or by `*`) arrives once per symbol.
            if let newsSent, event.eventType == AlpacaNews.eventType, let version = AlpacaNews.version(of: event), !newsSent.firstTime(version) { return }
            if let reading, event.receivedAt != 0 {
                var timed = ByteBuffer()
                timed.reserveCapacity(bytes.readableBytes + EventTimes.maxGrowth)
                EventTimes.write(event, bytes: bytes, reading: reading, into: &timed)
                elements.append(AlpacaDelivery.Element(bytes: timed, isNotice: event.isNotice))
            } else {
                elements.append(AlpacaDelivery.Element(bytes: bytes, isNotice: event.isNotice))
            }
        }
        switch codec {
        case .json: converted({ AlpacaDelivery.elementBytes($0, codec: .json) }, add)
        case .messagePack: events { add($0.pointee, AlpacaDelivery.elementBytes($0.pointee, codec: .messagePack)) }
        }
        let frames = AlpacaDelivery.payloads(elements: elements, codec: codec).map { WireFrame.whole($0, binary: isBinary) }
        guard let first = frames.first else { return nil }
        return FramedTurn(first: first, more: Array(frames.dropFirst()), oldestReceivedAt: oldest == .max ? 0 : oldest)
    }

    /// Alpaca's own word for it: 407 slow client.
    public func evictedFrame(bufferLimit: Int) -> ByteBuffer {
        let error = AlpacaError.slowClient.message(detail: "this connection's buffer of \(bufferLimit) events was full")
        return WireFrame.whole(ByteBuffer(bytes: codec.frame([error])), binary: isBinary)
    }

    /// A message too large is Alpaca's 400 (invalid syntax); a client that does not read, its 407 (slow
    /// client), as its eviction is.
    public func errorFrame(_ error: DownstreamError) -> ByteBuffer {
        let code: AlpacaError =
            switch error {
            case .messageTooLarge: .invalidSyntax
            case .tooMuchUnread: .slowClient
            }
        return ByteBuffer(bytes: codec.frame([code.message(detail: error.message)]))
    }
}
