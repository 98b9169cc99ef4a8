import NIOCore
import FuzzSupport
import PolygonWire

/// A client's messages (split at newlines) to the server side of the protocol, under small limits:
/// answers only, never a crash, every frame a JSON array under the frame limit, limits holding.
@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzServerSession(_ start: UnsafeRawPointer, _ count: Int) -> CInt {
    let bytes = UnsafeRawBufferPointer(start: start, count: count)
    let limits = SessionLimits(topicsPerMessage: 50, topicsPerConnection: 100, messagesPerSecond: 1_000, eventTypes: ["Q", "T", "AM"])
    var session = ServerSession(limits: limits) { key in
        key == "k" ? ClientGrant(name: "k", entitlement: Entitlement(patterns: [.wildcard("Q"), Topic(eventType: "T", ticker: "A")!])) : nil
    }
    let now = ContinuousClock.now
    for line in bytes.split(separator: UInt8(ascii: "\n"), omittingEmptySubsequences: false) {
        let reaction = session.receive(ByteBuffer(bytes: line), at: now)
        for frame in reaction.frames {
            guard frame.readableBytes < FrameEncoder.maxFrameBytes, (try? FrameParser.parse(frame, receivedAt: 0)) != nil else {
                fatalError("an answer frame is not a valid Polygon frame")
            }
        }
        if session.topics.count > limits.topicsPerConnection { fatalError("the topic limit did not hold") }
        if let grant = session.grant, !session.topics.allSatisfy({ grant.entitlement.allows($0) }) {
            fatalError("a topic outside the entitlement was subscribed")
        }
    }
    return 0
}

@_cdecl("FuzzServerSession_main")
func entry(_ argc: CInt, _ argv: UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>?) -> CInt {
    runLibFuzzer(argc, argv) { data, count in data.map { fuzzServerSession($0, count) } ?? 0 }
}
