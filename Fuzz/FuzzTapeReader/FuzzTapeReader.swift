#if canImport(Glibc)
    import Glibc
#endif
import FuzzSupport
import Tape

/// A tape file of any bytes (a torn, damaged or hostile file on disk): indexed and read without a crash;
/// whatever it reads is whole records of blocks that checked, and a seek lands inside the index.
@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzTapeReader(_ start: UnsafeRawPointer, _ count: Int) -> CInt {
    let path = "/tmp/relay-fuzz-tape-\(getpid()).tape"
    let descriptor = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0o600)
    guard descriptor >= 0 else { return 0 }
    _ = write(descriptor, start, count)
    close(descriptor)
    guard let reader = try? TapeReader(path: path) else { return 0 }
    var read = 0
    for index in reader.blocks.indices {
        if let records = reader.records(inBlock: index) { read += records.count }
    }
    let readable = reader.blocks.indices.filter { !reader.skippedBlocks.contains($0) }.reduce(0) { $0 + Int(reader.blocks[$1].header.records) }
    if read != readable { fatalError("read \(read) records of blocks that say \(readable)") }
    for probe in [Int64.min, 0, Int64.max] where reader.firstBlock(atOrAfter: probe) > reader.blocks.count {
        fatalError("a seek past the index")
    }
    return 0
}

@_cdecl("FuzzTapeReader_main")
func entry(_ argc: CInt, _ argv: UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>?) -> CInt {
    runLibFuzzer(argc, argv) { data, count in data.map { fuzzTapeReader($0, count) } ?? 0 }
}
