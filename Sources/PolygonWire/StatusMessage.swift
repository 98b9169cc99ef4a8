import MarketCore
import NIOCore

/// A Polygon status object, `{"ev":"status","status":"…","message":"…"}`.
///
/// Value type, `Sendable`. The relay both reads these from the upstream and writes them downstream.
public struct StatusMessage: Sendable, Equatable, CustomStringConvertible {
    public var status: String
    public var message: String
    /// Extra numeric fields, written after `message` in key order (the relay's notices carry times).
    public var numbers: [String: Int64]
    /// Extra fields whose values are JSON text already (strings quoted, objects, lists), written after
    /// `numbers` in key order.
    public var fields: [String: String]

    public init(status: String, message: String, numbers: [String: Int64] = [:], fields: [String: String] = [:]) {
        self.status = status
        self.message = message
        self.numbers = numbers
        self.fields = fields
    }

    /// The status values Polygon uses, plus the relay's own notices.
    public enum Kind {
        public static let connected = "connected"
        public static let authSuccess = "auth_success"
        public static let authFailed = "auth_failed"
        public static let authTimeout = "auth_timeout"
        public static let success = "success"
        public static let error = "error"
        public static let maxConnections = "max_connections"
        // The relay's notices keep the names of the neutral notice they render (``Notice/Kind``).
        /// Relay notice: this connection fell behind and lost events; `dropped` says how many.
        public static let lagging = Notice.Kind.lagging.rawValue
        /// Relay notice: the upstream connection was lost; events stop until it is back.
        public static let upstreamDisconnected = Notice.Kind.upstreamDisconnected.rawValue
        /// Relay notice: the upstream is back; the numbers name the window with no events.
        public static let upstreamReconnected = Notice.Kind.upstreamReconnected.rawValue
        /// Relay notice: a resume's missed events were all sent (this status marks the seam: live events
        /// follow it); `replayed` counts them per topic.
        public static let resumed = Notice.Kind.resumed.rawValue
        /// Relay notice: a topic's missed events are no longer all held (or the epoch changed): none of
        /// them are sent, its last value follows, then live events.
        public static let gap = Notice.Kind.gap.rawValue
        /// The relay's own: after an upstream outage, the events it recovered from the REST API for the
        /// connection's topics (each flagged `"_r":1`), sent once the fill is done.
        public static let recovered = Notice.Kind.recovered.rawValue
        /// Relay notice: the market's positions start again under a new epoch (a cluster's new
        /// leadership term); a later `since` names it.
        public static let epoch = Notice.Kind.epoch.rawValue
    }

    /// A JSON string value for ``fields``.
    public static func quoted(_ text: String) -> String { "\"" + JSONText.escape(text) + "\"" }

    public static let connected = StatusMessage(status: Kind.connected, message: "Connected Successfully")
    public static let authSuccess = StatusMessage(status: Kind.authSuccess, message: "authenticated")
    public static let authFailed = StatusMessage(status: Kind.authFailed, message: "authentication failed")
    public static let authTimeout = StatusMessage(status: Kind.authTimeout, message: "No authentication request received.")

    public static func error(_ message: String) -> StatusMessage {
        StatusMessage(status: Kind.error, message: message)
    }

    /// This status as one JSON object.
    public var json: String {
        var text = #"{"ev":"status","status":"\#(JSONText.escape(status))","message":"\#(JSONText.escape(message))""#
        for (key, value) in numbers.sorted(by: { $0.key < $1.key }) {
            text += #","\#(JSONText.escape(key))":\#(value)"#
        }
        for (key, value) in fields.sorted(by: { $0.key < $1.key }) {
            text += #","\#(JSONText.escape(key))":"# + value
        }
        return text + "}"
    }

    public var description: String { "\(status): \(message)" }

    /// Statuses encoded as one server frame (a JSON array).
    public static func frame(_ statuses: [StatusMessage]) -> ByteBuffer {
        ByteBuffer(string: "[" + statuses.map(\.json).joined(separator: ",") + "]")
    }

    /// One status as its own server frame.
    public var frame: ByteBuffer { StatusMessage.frame([self]) }
}
