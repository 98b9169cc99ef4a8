import CZstd
import NIOCore

/// Why a block could not be compressed or read back.
public struct ZstdError: Error, CustomStringConvertible, Equatable {
    public var description: String

    init(_ code: Int) {
        description = String(cString: ZSTD_getErrorName(code))
    }

    init(_ description: String) {
        self.description = description
    }
}

/// One zstd compression context, reused for every block (a context costs about 1 MB and
/// takes time to set up). Each block is a whole zstd frame with its content size and a checksum
/// (XXH64 of the content), so a block decodes on its own and a flipped byte is found, not read.
///
/// Not `Sendable`: a context is one thread's at a time (the owner of the tape's writer). Freed with it.
final class ZstdCompressor {
    private let context: OpaquePointer

    init(level: Int32 = 1) throws {
        guard let context = ZSTD_createCCtx() else { throw ZstdError("no memory for a zstd context") }
        self.context = context
        for (parameter, value) in [(ZSTD_c_compressionLevel, level), (ZSTD_c_checksumFlag, 1), (ZSTD_c_contentSizeFlag, 1)] {
            let result = ZSTD_CCtx_setParameter(context, parameter, value)
            if ZSTD_isError(result) != 0 { throw ZstdError(result) }
        }
    }

    deinit {
        ZSTD_freeCCtx(context)
    }

    /// `input` as one zstd frame.
    func compress(_ input: UnsafeRawBufferPointer) throws -> [UInt8] {
        let bound = ZSTD_compressBound(input.count)
        var output = [UInt8](repeating: 0, count: bound)
        let written = output.withUnsafeMutableBytes { out in
            ZSTD_compress2(context, out.baseAddress, out.count, input.baseAddress, input.count)
        }
        if ZSTD_isError(written) != 0 { throw ZstdError(written) }
        output.removeLast(bound - written)
        return output
    }
}

/// One zstd decompression context, reused for every block read. Not `Sendable` (see ``ZstdCompressor``).
final class ZstdDecompressor {
    private let context: OpaquePointer

    init() throws {
        guard let context = ZSTD_createDCtx() else { throw ZstdError("no memory for a zstd context") }
        self.context = context
    }

    deinit {
        ZSTD_freeDCtx(context)
    }

    /// The content of the frame in `input`, which must be `expected` bytes (a block's header says how
    /// many); a frame whose checksum or size does not match is an error. Decompressed straight into the
    /// buffer its events will be slices of: no second copy of a block.
    func decompress(_ input: UnsafeRawBufferPointer, expected: Int) throws -> ByteBuffer {
        let declared = ZSTD_getFrameContentSize(input.baseAddress, input.count)
        guard declared == UInt64(expected) else { throw ZstdError("the frame holds \(declared) bytes, its block says \(expected)") }
        var output = ByteBufferAllocator().buffer(capacity: expected)
        var failure: Int?
        output.writeWithUnsafeMutableBytes(minimumWritableBytes: expected) { out in
            let read = ZSTD_decompressDCtx(context, out.baseAddress, expected, input.baseAddress, input.count)
            guard ZSTD_isError(read) == 0, read == expected else {
                failure = read
                return 0
            }
            return read
        }
        if let failure {
            if ZSTD_isError(failure) != 0 { throw ZstdError(failure) }
            throw ZstdError("the frame gave \(failure) bytes, its block says \(expected)")
        }
        return output
    }
}
