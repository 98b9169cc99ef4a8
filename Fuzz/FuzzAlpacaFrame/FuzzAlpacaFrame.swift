import AlpacaWire
import FuzzSupport

/// One upstream message of Alpaca's stream: read or refused, never a crash. Every event found lies
/// inside the message and is one MessagePack value; written again (and as JSON), it reads back the same.
@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzAlpacaFrame(_ start: UnsafeRawPointer, _ count: Int) -> CInt {
    let bytes = UnsafeRawBufferPointer(start: start, count: count)
    if let value = try? MessagePack.decode(bytes) {
        // Our own encoding of what was read reads back equal (NaN aside: it equals nothing).
        let again = MessagePack.encode(value)
        if let back = try? MessagePack.decode(again), "\(back)" != "\(value)" { fatalError("MessagePack did not round-trip") }
        _ = AlpacaJSON.text(value)
    }
    guard let items = try? AlpacaFrame.read(bytes) else { return 0 }
    for item in items {
        guard case .event(_, _, let range) = item else { continue }
        guard range.lowerBound >= 0, range.upperBound <= count else { fatalError("an event outside its message") }
        guard (try? MessagePack.decode(UnsafeRawBufferPointer(rebasing: bytes[range]))) != nil else {
            fatalError("an event that is not one value")
        }
    }
    return 0
}

@_cdecl("FuzzAlpacaFrame_main")
func entry(_ argc: CInt, _ argv: UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>?) -> CInt {
    runLibFuzzer(argc, argv) { data, count in data.map { fuzzAlpacaFrame($0, count) } ?? 0 }
}
