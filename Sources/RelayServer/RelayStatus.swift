import MarketCore
import NIOCore

/// The relay's own status objects, on the streams that are the relay's own (the portfolio's push
/// streams) and before a connection's protocol is known: `[{"ev":"status","status":…,"message":…}]`.
/// A market connection speaks its protocol's words instead (``DownstreamSession``). Pure.
enum RelayStatus {
    static func frame(status: String, message: String) -> ByteBuffer {
        ByteBuffer(string: #"[{"ev":"status","status":"\#(JSONText.escape(status))","message":"\#(JSONText.escape(message))"}]"#)
    }
}
