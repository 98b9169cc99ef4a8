import NIOCore

/// A server text frame as it goes onto the socket: the WebSocket header (RFC 6455 §5.2: FIN, opcode
/// text, no mask, the length in its shortest form) followed by the payload, in one buffer. The
/// downstream writes these below NIO's `WebSocketFrameEncoder`: one buffer, one iovec, no header buffer
/// and no pipeline step per frame.
public enum WireFrame {
    /// The header's length for a payload of `length` bytes.
    public static func headerLength(payload length: Int) -> Int {
        length < 126 ? 2 : length <= Int(UInt16.max) ? 4 : 10
    }

    /// Writes the header of a final text (or binary) frame of `length` payload bytes.
    public static func writeHeader(payload length: Int, binary: Bool = false, into buffer: inout ByteBuffer) {
        buffer.writeInteger(UInt8(binary ? 0x82 : 0x81))  // FIN, text or binary
        if length < 126 {
            buffer.writeInteger(UInt8(length))
        } else if length <= Int(UInt16.max) {
            buffer.writeInteger(UInt8(126))
            buffer.writeInteger(UInt16(length))
        } else {
            buffer.writeInteger(UInt8(127))
            buffer.writeInteger(UInt64(length))
        }
    }

    /// `payload` as one whole text frame (a copy with the header in front).
    public static func text(_ payload: ByteBuffer, allocator: ByteBufferAllocator = ByteBufferAllocator()) -> ByteBuffer {
        whole(payload, binary: false, allocator: allocator)
    }

    /// `payload` as one whole text or binary frame.
    public static func whole(_ payload: ByteBuffer, binary: Bool, allocator: ByteBufferAllocator = ByteBufferAllocator()) -> ByteBuffer {
        var frame = allocator.buffer(capacity: headerLength(payload: payload.readableBytes) + payload.readableBytes)
        writeHeader(payload: payload.readableBytes, binary: binary, into: &frame)
        frame.writeImmutableBuffer(payload)
        return frame
    }

    /// Events as whole text frames, each a JSON array under `maxFrameBytes` (the frames of
    /// ``FrameEncoder/frames(for:maxFrameBytes:allocator:)``, each copied behind its header). For the
    /// rare burst past the limit; one frame is built in place with ``WireFrameBuilder``.
    public static func frames(
        for events: [MarketEvent], maxFrameBytes: Int = FrameEncoder.maxFrameBytes,
        allocator: ByteBufferAllocator = ByteBufferAllocator()
    ) -> [ByteBuffer] {
        FrameEncoder.frames(for: events, maxFrameBytes: maxFrameBytes, allocator: allocator).map { text($0, allocator: allocator) }
    }
}

/// Builds one text frame of events whose payload size is known up front (a JSON array: `[`, the
/// events' own bytes separated by `,`, `]`), straight into the buffer that goes to the socket: one
/// allocation, one `memcpy` per event, no event copied (``build(payload:allocator:_:)`` lends the
/// builder to a closure that appends them). The caller computes the size as 1 + Σ (event bytes + 1)
/// and appends exactly those events; the builder also learns the oldest arrival among them, for the
/// delivery latency.
public struct WireFrameBuilder: ~Copyable {
    private let base: UnsafeMutableRawPointer
    private let capacity: Int
    private var offset = 0
    private var count = 0
    /// An append that would have run past `capacity` (a caller's mistake): skipped, and the frame rebuilt.
    private var overflowed = false
    /// The earliest `receivedAt` of the events appended (0 when none had one).
    public private(set) var oldestReceivedAt: UInt64 = 0

    private init(base: UnsafeMutableRawPointer, capacity: Int) {
        self.base = base
        self.capacity = capacity
    }

    /// One whole frame of the events `body` appends, and the oldest `receivedAt` among them.
    /// - Parameter payload: 1 + Σ (event bytes + 1) of the events `body` appends (at least one).
    public static func build(
        payload: Int, allocator: ByteBufferAllocator = ByteBufferAllocator(), _ body: (inout WireFrameBuilder) -> Void
    ) -> (frame: ByteBuffer, oldestReceivedAt: UInt64) {
        let header = WireFrame.headerLength(payload: payload)
        var frame = allocator.buffer(capacity: header + payload)
        WireFrame.writeHeader(payload: payload, into: &frame)
        var oldest: UInt64 = 0
        var intact = true
        frame.writeWithUnsafeMutableBytes(minimumWritableBytes: payload) { memory in
            guard let base = memory.baseAddress else { return 0 }
            var builder = WireFrameBuilder(base: base, capacity: payload)
            body(&builder)
            if builder.count == 0, builder.offset < builder.capacity {
                base.storeBytes(of: UInt8(ascii: "["), toByteOffset: builder.offset, as: UInt8.self)
                builder.offset += 1
            }
            if builder.offset < builder.capacity {
                base.storeBytes(of: UInt8(ascii: "]"), toByteOffset: builder.offset, as: UInt8.self)
                builder.offset += 1
            } else {
                builder.overflowed = true
            }
            oldest = builder.oldestReceivedAt
            intact = !builder.overflowed && builder.offset == payload
            return builder.offset
        }
        // The events did not add up to the size given: the frame is rebuilt with the right header, so
        // the stream stays well formed (an event that did not fit is missing from it).
        guard intact else {
            return (WireFrame.text(frame.getSlice(at: frame.readerIndex + header, length: frame.readableBytes - header) ?? ByteBuffer()), oldest)
        }
        return (frame, oldest)
    }

    /// Appends the event at `event` (a ``TurnEvents`` address), its fields read in place.
    @inline(__always)
    public mutating func append(_ event: UnsafePointer<MarketEvent>) {
        let length = event.pointee.bytes.readableBytes
        guard offset + length + 2 <= capacity else {
            overflowed = true
            return
        }
        base.storeBytes(of: UInt8(ascii: count == 0 ? "[" : ","), toByteOffset: offset, as: UInt8.self)
        let target = base + offset + 1
        event.pointee.bytes.withUnsafeReadableBytes { source in
            if let from = source.baseAddress { target.copyMemory(from: from, byteCount: source.count) }
        }
        offset += 1 + length
        count += 1
        let received = event.pointee.receivedAt
        if received != 0, oldestReceivedAt == 0 || received < oldestReceivedAt { oldestReceivedAt = received }
    }

    @inline(__always)
    public mutating func append(_ event: borrowing MarketEvent) {
        withUnsafePointer(to: event) { append($0) }
    }
}
