import Hummingbird
import HummingbirdWebSocket
import NIOCore
import MarketCore

/// Faults the demo feed can inflict on the connections it has now, for testing how a client recovers.
/// New connections after a fault are served normally. `POST /faults/{name}` on the feed triggers one.
public enum DemoFeedFault: String, Sendable, CaseIterable {
    /// Reset the TCP connection mid-stream: no close frame, no goodbye.
    case drop
    /// Say `max_connections` (another consumer took the account's slot), then close with 1008.
    case maxConnections = "max-connections"
    /// Stop sending and stop reading: no data and no pongs, the connection left hanging.
    case silence
    /// Keep the connection, answer pings and messages, but send no more events: a silent upstream.
    case mute
    /// Send a frame that is not valid JSON.
    case malformed
    /// Send one 5 MB frame.
    case oversized
    /// Greet and accept the login again, 1,000 times in one frame, on a connection already logged in
    /// (a client that logs in or subscribes anew at each is at the server's mercy).
    case relogin
    /// Send one frame of events the relay must not take: a type the market does not have, a ticker of
    /// 100 characters, an event of 100 KB, a quote of the ticker `*` and one of `AAPL@1s` (the relay's
    /// own topics); then one good quote, `Q.JUNKOK`.
    case junk
    /// Send one trade of AAPL stamped at the start of 1970 (a clock gone wrong, or a replayed frame).
    case ancient
    /// Send one trade of AAPL stamped 59 minutes ago (what a delayed feed could send, or a replay).
    case stale
    /// Accept the login and refuse it, 500 times over in one frame, then once in each of 500 frames (the
    /// connection ends at the first refusal: what follows it is not taken).
    case authFlip = "auth-flip"

    /// The raw frame this fault sends, for those that send one.
    var frame: ByteBuffer? {
        switch self {
        case .malformed:
            return ByteBuffer(string: #"[{"ev":"Q","sym":"AAPL","bp":189.1,"#)
        case .oversized:
            return ByteBuffer(string: #"[{"ev":"Q","sym":"PAD","pad":""# + String(repeating: "x", count: 5_000_000) + #""}]"#)
        case .junk:
            let long = String(repeating: "L", count: 100)
            let big = String(repeating: "x", count: 100_000)
            return ByteBuffer(
                string: #"[{"ev":"ZZ","sym":"AAPL"},{"ev":"Q","sym":"\#(long)","bp":1},{"ev":"Q","sym":"BIG","pad":"\#(big)"},"#
                    + #"{"ev":"Q","sym":"*","bp":1},{"ev":"Q","sym":"AAPL@1s","bp":1},"#
                    + #"{"ev":"Q","sym":"JUNKOK","bx":4,"bp":1.5,"bs":1,"ax":4,"ap":1.6,"as":1,"t":1700000000000,"q":1,"z":3}]"#)
        case .ancient:
            return ByteBuffer(string: #"[{"ev":"T","sym":"AAPL","i":"1","x":4,"p":189.5,"s":100,"c":[],"t":1000,"q":1,"z":3}]"#)
        case .stale:
            let time = WallClock.nowMilliseconds() - 59 * 60_000
            return ByteBuffer(string: #"[{"ev":"T","sym":"AAPL","i":"1","x":4,"p":189.5,"s":100,"c":[],"t":\#(time),"q":1,"z":3}]"#)
        default:
            return nil
        }
    }
}

/// What a connection's writer is asked to do, in order.
enum FeedOutput: Sendable {
    case frame(ByteBuffer)
    case fault(DemoFeedFault)
}

/// The feed's request context: Hummingbird's basic one plus the connection's channel, which the `drop`
/// fault resets.
struct FeedRequestContext: RequestContext, WebSocketRequestContext {
    var coreContext: CoreRequestContextStorage
    let webSocket: WebSocketHandlerReference<Self>
    let channel: any Channel

    init(source: ApplicationRequestContextSource) {
        coreContext = .init(source: source)
        webSocket = .init()
        channel = source.channel
    }
}
