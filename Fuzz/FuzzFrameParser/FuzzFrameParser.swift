import NIOCore
import FuzzSupport
import PolygonWire

/// One upstream message: parsed or refused with a WireError, never a crash; what parses encodes again.
@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzFrameParser(_ start: UnsafeRawPointer, _ count: Int) -> CInt {
    let buffer = ByteBuffer(bytes: UnsafeRawBufferPointer(start: start, count: count))
    guard let parsed = try? FrameParser.parse(buffer, receivedAt: 0) else { return 0 }
    for frame in FrameEncoder.frames(for: parsed.events) {
        // Our own output must parse back to the same events.
        guard let again = try? FrameParser.parse(frame, receivedAt: 0), again.events.count <= parsed.events.count else {
            fatalError("an encoded frame did not parse back")
        }
    }
    return 0
}

@_cdecl("FuzzFrameParser_main")
func entry(_ argc: CInt, _ argv: UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>?) -> CInt {
    runLibFuzzer(argc, argv) { data, count in data.map { fuzzFrameParser($0, count) } ?? 0 }
}
