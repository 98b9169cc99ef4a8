#if canImport(Glibc)
    import Glibc
#endif

/// The fixed 64-byte header in front of each block of a tape file (little-endian):
///
/// | offset | field |
/// | --- | --- |
/// | 0 | magic `RTB1` |
/// | 4 | compressed length (the zstd frame that follows) |
/// | 8 | uncompressed length (the records) |
/// | 12 | records |
/// | 16, 24 | first and last receive time (UTC ns) |
/// | 32, 40 | first and last market sequence of its events (0 when it holds none) |
/// | 48 | reserved (0) |
/// | 56 | FNV-1a 64 of bytes 0 to 55 |
///
/// The header says where the next block starts and what the block spans, so the index of a file is its
/// headers (read 64 bytes a block, never decompressing) and a seek is a binary search over them. Its own
/// check finds a torn or flipped header; the zstd frame's checksum finds a flipped payload.
public struct TapeBlockHeader: Sendable, Equatable {
    public static let size = 64
    /// The most records' bytes a block may claim.
    static let largestBlock: UInt32 = 64 << 20
    /// The most a block's zstd frame may take: zstd's bound for the largest block.
    static let largestFrame: UInt32 = largestBlock + largestBlock >> 8 + (1 << 16)
    /// The most records a block may claim: a block is 256 KB of records (one record may pass that) and
    /// a record takes two bytes at least, so a real one holds fewer than a fifth of this.
    static let mostRecords: UInt32 = 1 << 20
    static let magic: (UInt8, UInt8, UInt8, UInt8) = (0x52, 0x54, 0x42, 0x31)  // RTB1
    /// The shortest zstd frame: its magic, a frame header and a block header.
    static let smallestFrame: UInt32 = 9

    public var compressedLength: UInt32
    public var uncompressedLength: UInt32
    public var records: UInt32
    public var firstTime: Int64
    public var lastTime: Int64
    public var firstSequence: UInt64
    public var lastSequence: UInt64

    var bytes: [UInt8] {
        var bytes: [UInt8] = [Self.magic.0, Self.magic.1, Self.magic.2, Self.magic.3]
        bytes.reserveCapacity(Self.size)
        for value in [compressedLength, uncompressedLength, records] { Self.put(value, into: &bytes) }
        for value in [UInt64(bitPattern: firstTime), UInt64(bitPattern: lastTime), firstSequence, lastSequence, 0] { Self.put(value, into: &bytes) }
        Self.put(Self.check(bytes), into: &bytes)
        return bytes
    }

    /// The header in `bytes` (64 of them), `nil` when its magic or check is wrong.
    init?(_ bytes: UnsafeRawBufferPointer) {
        guard bytes.count >= Self.size, bytes[0] == Self.magic.0, bytes[1] == Self.magic.1, bytes[2] == Self.magic.2, bytes[3] == Self.magic.3
        else { return nil }
        func word(_ offset: Int) -> UInt64 { UInt64(littleEndian: bytes.loadUnaligned(fromByteOffset: offset, as: UInt64.self)) }
        func half(_ offset: Int) -> UInt32 { UInt32(littleEndian: bytes.loadUnaligned(fromByteOffset: offset, as: UInt32.self)) }
        guard Self.check(Array(bytes[0..<56])) == word(56) else { return nil }
        compressedLength = half(4)
        uncompressedLength = half(8)
        records = half(12)
        // A block is a flush interval or 256 KB of records (one record may pass that): a header that
        // claims more (bytes, frame or records) would make a reader allocate it before the frame is
        // checked, and a record count is what its records take in memory.
        guard uncompressedLength <= Self.largestBlock, compressedLength <= Self.largestFrame, records <= Self.mostRecords else { return nil }
        // A writer's block holds a record at least, in a zstd frame no longer than zstd's bound for its
        // bytes: a header claiming nothing (a 64-byte entry of the index each) or a frame far larger
        // than its records (read whole before zstd refuses it) is no writer's.
        guard records > 0, uncompressedLength > 0, compressedLength >= Self.smallestFrame,
            UInt64(compressedLength) <= UInt64(uncompressedLength) + UInt64(uncompressedLength >> 8) + (1 << 16)
        else { return nil }
        firstTime = Int64(bitPattern: word(16))
        lastTime = Int64(bitPattern: word(24))
        firstSequence = word(32)
        lastSequence = word(40)
        // The writer's last time and sequence are the greatest of its records'.
        guard firstTime <= lastTime, firstSequence <= lastSequence else { return nil }
    }

    init(compressedLength: Int, uncompressedLength: Int, records: Int, firstTime: Int64, lastTime: Int64, firstSequence: UInt64, lastSequence: UInt64) {
        self.compressedLength = UInt32(compressedLength)
        self.uncompressedLength = UInt32(uncompressedLength)
        self.records = UInt32(records)
        self.firstTime = firstTime
        self.lastTime = lastTime
        self.firstSequence = firstSequence
        self.lastSequence = lastSequence
    }

    private static func put<T: FixedWidthInteger>(_ value: T, into bytes: inout [UInt8]) {
        withUnsafeBytes(of: value.littleEndian) { bytes.append(contentsOf: $0) }
    }

    /// FNV-1a, 64 bits: enough to tell a header from a torn write or a flipped byte.
    static func check(_ bytes: [UInt8]) -> UInt64 {
        var hash: UInt64 = 0xcbf2_9ce4_8422_2325
        for byte in bytes {
            hash ^= UInt64(byte)
            hash &*= 0x0000_0100_0000_01b3
        }
        return hash
    }
}

/// A block of a tape file as its index knows it: where it starts and what its header says.
public struct TapeBlock: Sendable, Equatable {
    public var offset: Int64
    public var header: TapeBlockHeader

    /// Where the next block starts.
    public var end: Int64 { offset + Int64(TapeBlockHeader.size) + Int64(header.compressedLength) }
}

/// Why the tape could not be read or written.
public struct TapeError: Error, CustomStringConvertible {
    public var description: String

    public init(_ description: String) {
        self.description = description
    }

    static func system(_ what: String, _ path: String) -> TapeError {
        TapeError("\(what) \(path): \(String(cString: strerror(errno)))")
    }
}

/// Reading a tape file's blocks by their headers: what the writer does on open (to find and cut a torn
/// tail) and what a reader does to build its index.
enum TapeScan {
    /// What a scan found: the whole blocks in order, and the byte ranges between them that are not
    /// blocks (a header that does not check: its block is lost, the scan goes on at the next header
    /// that does). What follows the last block is a torn tail (or nothing), not a damaged range.
    struct Found {
        var blocks: [TapeBlock] = []
        var damaged: [Range<Int64>] = []
    }

    static func blocks(descriptor: Int32, length: Int64) -> Found {
        var found = Found()
        var offset: Int64 = 0
        while offset + Int64(TapeBlockHeader.size) <= length {
            if let block = block(at: offset, descriptor: descriptor, length: length) {
                found.blocks.append(block)
                offset = block.end
                continue
            }
            // Not a block here: the next offset where one starts, if any (else this is the tail).
            guard let next = nextBlock(after: offset, descriptor: descriptor, length: length) else { break }
            found.damaged.append(offset..<next)
            offset = next
        }
        return found
    }

    /// The file's first whole block (what ``blocks(descriptor:length:)`` would find first), reading
    /// only as far as it, and looking for one that starts within the first `within` bytes only.
    static func firstBlock(descriptor: Int32, length: Int64, within: Int64 = .max) -> TapeBlock? {
        if let block = block(at: 0, descriptor: descriptor, length: length) { return block }
        return nextBlock(after: 0, descriptor: descriptor, length: length, before: within).flatMap { block(at: $0, descriptor: descriptor, length: length) }
    }

    private static func block(at offset: Int64, descriptor: Int32, length: Int64) -> TapeBlock? {
        var raw = [UInt8](repeating: 0, count: TapeBlockHeader.size)
        let read = raw.withUnsafeMutableBytes { pread(descriptor, $0.baseAddress, TapeBlockHeader.size, off_t(offset)) }
        guard read == TapeBlockHeader.size, let header = raw.withUnsafeBytes({ TapeBlockHeader($0) }) else { return nil }
        let block = TapeBlock(offset: offset, header: header)
        return block.end <= length ? block : nil
    }

    /// The first offset past `offset` (and before `end`) where a whole block starts: the magic, then a
    /// header that checks.
    private static func nextBlock(after offset: Int64, descriptor: Int32, length: Int64, before end: Int64 = .max) -> Int64? {
        let chunk = 64 << 10
        var start = offset + 1
        var buffer = [UInt8](repeating: 0, count: chunk + 3)
        while start + Int64(TapeBlockHeader.size) <= length, start < end {
            let count = buffer.withUnsafeMutableBytes { pread(descriptor, $0.baseAddress, $0.count, off_t(start)) }
            guard count >= 4 else { return nil }
            for index in 0...(count - 4)
            where buffer[index] == TapeBlockHeader.magic.0 && buffer[index + 1] == TapeBlockHeader.magic.1
                && buffer[index + 2] == TapeBlockHeader.magic.2 && buffer[index + 3] == TapeBlockHeader.magic.3
            {
                let candidate = start + Int64(index)
                // A header within what was read is checked there (a file of nothing but the magic costs
                // no read per candidate); one across the chunk's end is read.
                if index + TapeBlockHeader.size <= count {
                    let header = buffer.withUnsafeBytes { TapeBlockHeader(UnsafeRawBufferPointer(rebasing: $0[index..<(index + TapeBlockHeader.size)])) }
                    if let header, TapeBlock(offset: candidate, header: header).end <= length { return candidate }
                } else if block(at: candidate, descriptor: descriptor, length: length) != nil {
                    return candidate
                }
            }
            start += Int64(count - 3)
        }
        return nil
    }
}
