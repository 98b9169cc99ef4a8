import Foundation
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

    public init(_ kind: Kind, params: String) {
        self.kind = kind
        self.params = params
    }

    /// Why a client message could not be understood; `message` is what the client is told.
    public struct DecodingError: Error, Sendable, Equatable {
        public var message: String
    }

    private struct Wire: Codable {
        var action: String?
        var params: String?
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
            throw DecodingError(message: "unknown action: \(actionName)")
        }
        return ClientAction(kind, params: wire.params ?? "")
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
