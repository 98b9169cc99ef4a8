import AlpacaWire
import FuzzSupport
import PolygonWire

/// Client messages to the server side of Alpaca's protocol, in either codec (the first byte chooses),
/// newline-separated, under small limits and an entitlement: never a crash; every answer reads as one
/// array in the connection's codec; the topic limit and the entitlement hold.
@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzAlpacaSession(_ start: UnsafeRawPointer, _ count: Int) -> CInt {
    let bytes = Array(UnsafeRawBufferPointer(start: start, count: count))
    guard let first = bytes.first else { return 0 }
    let codec: AlpacaCodec = first & 1 == 0 ? .json : .messagePack
    var limits = SessionLimits()
    limits.topicsPerMessage = 20
    limits.topicsPerConnection = 30
    let allowed = Entitlement(patterns: [Topic(eventType: "t", ticker: "*")!, Topic(eventType: "q", ticker: "AAPL")!])
    var session = AlpacaServerSession(codec: codec, feed: first & 2 == 0 ? .iex : .crypto, market: .stocks, limits: limits) { key in
        key.isEmpty ? nil : ClientGrant(name: "fuzz", entitlement: allowed)
    }
    var clock = ContinuousClock.Instant.now
    for message in bytes.dropFirst().split(separator: UInt8(ascii: "\n"), omittingEmptySubsequences: false) {
        clock = clock.advanced(by: .milliseconds(30))
        let reaction = session.receive(Array(message), at: clock)
        for frame in reaction.frames where codec.decode(frame)?.array == nil { fatalError("an answer that is not one array") }
        guard session.topics.count <= limits.topicsPerConnection else { fatalError("the topic limit did not hold") }
        for topic in session.topics where !allowed.allows(topic) && topic.eventType != "c" && topic.eventType != "x" {
            fatalError("a topic past the entitlement: \(topic)")
        }
        if reaction.close { break }
    }
    return 0
}

@_cdecl("FuzzAlpacaSession_main")
func entry(_ argc: CInt, _ argv: UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>?) -> CInt {
    runLibFuzzer(argc, argv) { data, count in data.map { fuzzAlpacaSession($0, count) } ?? 0 }
}
