import Foundation
import MarketCore
import NIOCore

/// A message a client sends to a Polygon server: `{"action":"auth","params":"KEY"}`,
/// `{"action":"subscribe","params":"Q.AAPL,T.*"}`, `{"action":"unsubscribe",…}`.
///
/// Value type, `Sendable`. Decoded with Codable: client messages are few and small, off the hot path.
public struct ClientAction: Sendable, Equatable {
    public enum Kind: String, Sendable {
        case auth, subscribe, unsubscribe
    }

    public var kind: Kind
    public var params: String
    /// A subscribe that resumes (the relay's extension; Polygon's clients never send it): the positions
    /// the client has per topic, or a time to replay from.
    public var resume: Resume?
    /// A subscribe that asks for conflated state events: at most one per symbol per this interval
    /// (the relay's extension). `.zero` asks for the key's default interval.
    public var conflate: Duration?
    /// A subscribe that asks for each event's receive and send times (the relay's extension,
    /// `"timestamps":true`; ``EventTimes``): from then on, for the whole connection.
    public var timestamps = false

    public init(_ kind: Kind, params: String, resume: Resume? = nil, conflate: Duration? = nil) {
        self.kind = kind
        self.params = params
        self.resume = resume
        self.conflate = conflate
    }

    /// Where a resuming subscribe starts: `"since":{"epoch":"…","T.AAPL":812,"Q.*":90211}` (per topic,
    /// the last position the client has) or `"sinceTime": <Unix ms>`.
    public typealias Resume = ResumeRequest

    /// Why a client message could not be understood; `message` is what the client is told.
    public struct DecodingError: Error, Sendable, Equatable {
        public var message: String
    }

    private struct Wire: Decodable {
        var action: String?
        var params: String?
        var since: [String: SinceValue]?
        var sinceTime: Int64?
        var conflate: ConflateValue?
        var timestamps: Bool?
    }

    /// A value of `since`: the epoch's string or a position.
    private enum SinceValue: Decodable {
        case text(String)
        case number(UInt64)

        init(from decoder: any Decoder) throws {
            let container = try decoder.singleValueContainer()
            if let number = try? container.decode(UInt64.self) {
                self = .number(number)
            } else {
                self = .text(try container.decode(String.self))
            }
        }
    }

    /// `conflate`: milliseconds, or `true` for the key's default.
    private enum ConflateValue: Decodable {
        case milliseconds(Int)
        case on(Bool)

        init(from decoder: any Decoder) throws {
            let container = try decoder.singleValueContainer()
            if let flag = try? container.decode(Bool.self) {
                self = .on(flag)
            } else {
                self = .milliseconds(try container.decode(Int.self))
            }
        }
    }

    /// Decodes one client message. Every failure names what was wrong, so it can be sent back as an
    /// `error` status.
    public static func decode(_ buffer: ByteBuffer) throws(DecodingError) -> ClientAction {
        let wire: Wire
        do {
            wire = try JSONDecoder().decode(Wire.self, from: Data(buffer.readableBytesView))
        } catch {
            throw DecodingError(message: "malformed message: expected a JSON object with \"action\" and \"params\"")
        }
        guard let actionName = wire.action else {
            throw DecodingError(message: "malformed message: missing \"action\"")
        }
        guard let kind = Kind(rawValue: actionName.trimmingCharacters(in: .whitespaces).lowercased()) else {
            throw DecodingError(message: "unknown action: \(VisibleText.visible(actionName, limit: 64))")
        }
        var action = ClientAction(kind, params: wire.params ?? "")
        if kind == .subscribe {
            action.resume = try resume(since: wire.since, sinceTime: wire.sinceTime)
            action.timestamps = wire.timestamps ?? false
            switch wire.conflate {
            case nil, .on(false): break
            case .on(true): action.conflate = .zero
            case .milliseconds(let milliseconds):
                guard (1...60_000).contains(milliseconds) else {
                    throw DecodingError(message: "conflate: an interval in milliseconds from 1 to 60000, or true")
                }
                action.conflate = .milliseconds(milliseconds)
            }
        }
        return action
    }

    private static func resume(since: [String: SinceValue]?, sinceTime: Int64?) throws(DecodingError) -> Resume? {
        if let since {
            guard sinceTime == nil else { throw DecodingError(message: "since and sinceTime: give one of them") }
            var epoch: String?
            var positions: [Topic: UInt64] = [:]
            for (key, value) in since {
                switch (key, value) {
                case ("epoch", .text(let text)): epoch = text
                case ("epoch", .number): throw DecodingError(message: "since: epoch is a string")
                case (_, .number(let position)):
                    guard let topic = Topic(parsing: key) else {
                        throw DecodingError(message: "since: \(VisibleText.visible(key, limit: 64)) is no topic (expected EVENT.TICKER)")
                    }
                    positions[topic] = position
                case (_, .text):
                    throw DecodingError(message: "since: the position of \(VisibleText.visible(key, limit: 64)) is a number")
                }
            }
            return .positions(epoch: epoch, positions)
        }
        if let sinceTime {
            guard sinceTime >= 0 else { throw DecodingError(message: "sinceTime: Unix milliseconds") }
            return .time(milliseconds: sinceTime)
        }
        return nil
    }

    /// Decodes a text message.
    public static func decode(_ text: String) throws(DecodingError) -> ClientAction {
        try decode(ByteBuffer(string: text))
    }

    /// This action as the JSON text a Polygon server expects.
    public var json: String {
        #"{"action":"\#(kind.rawValue)","params":"\#(JSONText.escape(params))"}"#
    }
}
