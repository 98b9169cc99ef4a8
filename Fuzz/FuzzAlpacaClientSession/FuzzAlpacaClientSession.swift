import AlpacaWire
import FuzzSupport
import PolygonWire

/// What an upstream server (or anyone on the path) can send the client side of Alpaca's protocol,
/// interleaved with changes of interest: newline-separated chunks, each either a server message (any
/// bytes, read as MessagePack) or a new wanted set made from its bytes. Never a crash; what the session
/// believes stays consistent: the subscribed and the refused topics are wanted, and never both.
@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzAlpacaClientSession(_ start: UnsafeRawPointer, _ count: Int) -> CInt {
    let bytes = Array(UnsafeRawBufferPointer(start: start, count: count))
    var session = AlpacaClientSession(key: "k", secret: "s")
    for chunk in bytes.split(separator: UInt8(ascii: "\n"), omittingEmptySubsequences: false) {
        guard let kind = chunk.first else { continue }
        if kind & 1 == 0 {
            if let value = try? MessagePack.decode(Array(chunk.dropFirst())) { _ = session.receive(value) }
        } else if kind & 2 == 0 {
            // A new wanted set: each byte one topic of a few channels and symbols.
            let channels = ["t", "q", "b", "c", "x", "o"]
            let topics = Set(chunk.dropFirst().compactMap { Topic(eventType: channels[Int($0) % channels.count], ticker: "S\($0 / 6)") })
            for message in session.setWanted(topics) where (try? MessagePack.decode(message)) == nil { fatalError("a message that is not MessagePack") }
        } else {
            session.connectionEnded()
        }
        guard session.subscribed.isSubset(of: session.wanted), session.refused.isSubset(of: session.wanted) else {
            fatalError("a topic subscribed or refused that is not wanted")
        }
        guard session.subscribed.isDisjoint(with: session.refused) else { fatalError("a topic both subscribed and refused") }
    }
    return 0
}

@_cdecl("FuzzAlpacaClientSession_main")
func entry(_ argc: CInt, _ argv: UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>?) -> CInt {
    runLibFuzzer(argc, argv) { data, count in data.map { fuzzAlpacaClientSession($0, count) } ?? 0 }
}
