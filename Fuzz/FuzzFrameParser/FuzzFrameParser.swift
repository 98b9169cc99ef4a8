import NIOCore
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

// SwiftPM links an executable's entry as `<Target>_main` and makes `main` an alias of it; libFuzzer
// brings its own `main`. This entry hands the command line to libFuzzer's driver instead.
@_silgen_name("LLVMFuzzerRunDriver")
func LLVMFuzzerRunDriver(
    _ argc: UnsafeMutablePointer<CInt>, _ argv: UnsafeMutablePointer<UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>?>,
    _ callback: @convention(c) (UnsafeRawPointer?, Int) -> CInt
) -> CInt

@_cdecl("FuzzFrameParser_main")
func fuzzEntry(_ argc: CInt, _ argv: UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>?) -> CInt {
    var argc = argc
    var argv = argv
    return LLVMFuzzerRunDriver(&argc, &argv) { data, count in
        guard let data else { return 0 }
        return fuzzFrameParser(data, count)
    }
}
