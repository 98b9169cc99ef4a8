import FuzzSupport
import PolygonWire

/// Topic lists as a client or a config file writes them: parsed without a crash, and every topic that
/// parses prints back to text that parses to itself; the client side of the protocol splits any set
/// into messages under its params limit.
@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzTopics(_ start: UnsafeRawPointer, _ count: Int) -> CInt {
    let text = String(decoding: UnsafeRawBufferPointer(start: start, count: count), as: UTF8.self)
    let (topics, _) = Topic.parseList(text)
    for topic in topics where Topic(parsing: topic.description) != topic {
        fatalError("\(topic) does not survive printing")
    }
    _ = SessionLimits(eventTypes: SessionLimits.eventTypes(ofMarket: "stocks")).problem(with: topics.first ?? .wildcard("Q"))
    for message in ClientSession.actions(.subscribe, Set(topics)) where message.utf8.count > ClientSession.maxParamsBytes + 64 {
        fatalError("a subscribe message is over the params limit")
    }
    return 0
}

@_cdecl("FuzzTopics_main")
func entry(_ argc: CInt, _ argv: UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>?) -> CInt {
    runLibFuzzer(argc, argv) { data, count in data.map { fuzzTopics($0, count) } ?? 0 }
}
