import AlpacaWire
import NIOCore
import MarketCore
import PolygonWire

/// The vendors whose stream the upstream client speaks. Known from the endpoint's host for Polygon's
/// and Alpaca's own servers, given for any other (a test server, a proxy).
public enum UpstreamVendor: String, Sendable, CaseIterable {
    case polygon
    case alpaca

    /// The vendor of a vendor's own host (`socket.polygon.io`, `stream.data.alpaca.markets` …); `nil` for
    /// any other host.
    public static func of(host: String) -> UpstreamVendor? {
        let host = host.lowercased()
        if host.hasSuffix("alpaca.markets") { return .alpaca }
        if host.hasSuffix("polygon.io") || host.hasSuffix("massive.com") { return .polygon }
        return nil
    }
}

/// A control message of the upstream server, in its vendor's form.
enum UpstreamControl: Sendable {
    case polygon(StatusMessage)
    case alpaca(MessagePack.Value)
}

/// One server message as the glue hands it on: its events, and its control messages in order.
struct UpstreamReading: Sendable {
    var events: [MarketEvent] = []
    var controls: [UpstreamControl] = []
}

/// The vendor's side of one upstream connection, without I/O: reading frames (off the lock), and the
/// conversation (auth, subscriptions) that ``UpstreamConnectionMachine`` drives. Value type,
/// `Sendable`.
enum UpstreamConversation: Sendable {
    case polygon(ClientSession)
    case alpaca(AlpacaClientSession)

    init(vendor: UpstreamVendor, key: String, secret: String?) {
        switch vendor {
        case .polygon: self = .polygon(ClientSession(apiKey: key))
        case .alpaca: self = .alpaca(AlpacaClientSession(key: key, secret: secret ?? ""))
        }
    }

    /// Whether this vendor's client messages go as binary frames (Alpaca's MessagePack).
    var sendsBinary: Bool {
        if case .alpaca = self { true } else { false }
    }

    /// A header the upgrade request carries (Alpaca: MessagePack frames, please).
    var upgradeHeader: (name: String, value: String)? {
        if case .alpaca = self { ("content-type:", "application/msgpack") } else { nil }
    }

    var subscribed: Set<Topic> {
        switch self {
        case .polygon(let session): session.subscribed
        case .alpaca(let session): session.subscribed
        }
    }

    /// What a control message means, and what to send.
    mutating func receive(_ control: UpstreamControl) -> (send: [[UInt8]], event: ClientSession.Event) {
        switch (self, control) {
        case (.polygon(var session), .polygon(let status)):
            let reaction = session.receive(status)
            self = .polygon(session)
            return (reaction.send.map { Array($0.utf8) }, reaction.event)
        case (.alpaca(var session), .alpaca(let value)):
            let reaction = session.receive(value)
            self = .alpaca(session)
            let event: ClientSession.Event =
                switch reaction.event {
                case .connected: .connected
                case .authenticated: .authenticated
                case .authFailed(let message): .authFailed(message)
                case .connectionLimit(let message): .maxConnections(message)
                case .authTimeout(let message): .authTimeout(message)
                case .subscribed(let message): .acknowledged(message)
                case .refused(let code, let message, let topics): .refused(code: code, message: message, topics: topics)
                case .error(let code, let message): .error("\(code) \(message)")
                case .other(let message): .other(status: "alpaca", message: message)
                }
            return (reaction.send, event)
        default:
            return ([], .other(status: "mismatch", message: "a control message of another vendor's protocol"))
        }
    }

    mutating func setWanted(_ topics: Set<Topic>) -> [[UInt8]] {
        switch self {
        case .polygon(var session):
            let messages = session.setWanted(topics)
            self = .polygon(session)
            return messages.map { Array($0.utf8) }
        case .alpaca(var session):
            let messages = session.setWanted(topics)
            self = .alpaca(session)
            return messages
        }
    }

    mutating func connectionEnded() {
        switch self {
        case .polygon(var session):
            session.connectionEnded()
            self = .polygon(session)
        case .alpaca(var session):
            session.connectionEnded()
            self = .alpaca(session)
        }
    }

    /// Reads one whole server message of `vendor`'s protocol (off the lock: no conversation state).
    static func read(_ message: ByteBuffer, vendor: UpstreamVendor, receivedAt: UInt64, market: Market) throws -> UpstreamReading {
        switch vendor {
        case .polygon:
            let parsed = try FrameParser.parse(message, receivedAt: receivedAt, market: market)
            return UpstreamReading(events: parsed.events, controls: parsed.statuses.map { .polygon($0) })
        case .alpaca:
            var reading = UpstreamReading()
            let items = try message.withUnsafeReadableBytes { try AlpacaFrame.read($0) }
            for item in items {
                switch item {
                case .event(let type, let symbol, let range):
                    guard let bytes = message.getSlice(at: message.readerIndex + range.lowerBound, length: range.count) else { continue }
                    reading.events.append(MarketEvent(eventType: type, ticker: symbol, bytes: bytes, receivedAt: receivedAt))
                case .control(let value): reading.controls.append(.alpaca(value))
                case .unknown: break
                }
            }
            return reading
        }
    }
}
