import NIOCore

/// Builds server frames from events by concatenating their original bytes: an event is serialised
/// once, by Polygon, and never again. Pure functions, safe from any thread.
public enum FrameEncoder {
    /// Polygon's Go client refuses frames of 1,000,000 bytes or more.
    public static let maxFrameBytes = 999_999

    /// Encodes events into as few frames as possible, each a JSON array under `maxFrameBytes`.
    /// An event that alone exceeds the limit gets a frame of its own (there is no smaller form of it).
    /// Each buffer keeps `headroom` bytes free in front of its reader index, where a WebSocket frame
    /// encoder can write the frame header in place instead of in a buffer of its own.
    /// Concrete `[MarketEvent]` (not a generic collection): called across modules, a generic version
    /// runs unspecialised and boxes every event it touches.
    public static func frames(
        for events: [MarketEvent],
        maxFrameBytes: Int = FrameEncoder.maxFrameBytes,
        headroom: Int = 0,
        allocator: ByteBufferAllocator = ByteBufferAllocator()
    ) -> [ByteBuffer] {
        guard !events.isEmpty else { return [] }
        // Sized once: the events plus a comma each and the brackets, so appending never reallocates.
        var remaining = events.reduce(2) { $0 + $1.bytes.readableBytes + 1 }
        var frames: [ByteBuffer] = []
        // One buffer, always uniquely owned: appending writes in place, never copies.
        var buffer = Self.buffer(capacity: min(maxFrameBytes, remaining), headroom: headroom, allocator: allocator)
        var count = 0
        for event in events {
            let size = event.bytes.readableBytes
            if count > 0, buffer.readableBytes + size + 2 > maxFrameBytes {
                buffer.writeInteger(UInt8(ascii: "]"))
                frames.append(buffer)
                buffer = Self.buffer(capacity: min(maxFrameBytes, max(remaining, size + 2)), headroom: headroom, allocator: allocator)
                count = 0
            }
            buffer.writeInteger(UInt8(ascii: count == 0 ? "[" : ","))
            buffer.writeImmutableBuffer(event.bytes)
            remaining -= size + 1
            count += 1
        }
        buffer.writeInteger(UInt8(ascii: "]"))
        frames.append(buffer)
        return frames
    }

    private static func buffer(capacity: Int, headroom: Int, allocator: ByteBufferAllocator) -> ByteBuffer {
        var buffer = allocator.buffer(capacity: capacity + headroom)
        if headroom > 0 {
            buffer.moveWriterIndex(forwardBy: headroom)
            buffer.moveReaderIndex(forwardBy: headroom)
        }
        return buffer
    }
}
