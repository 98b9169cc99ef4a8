import NIOCore

/// Builds server frames from events by concatenating their original bytes: an event is serialised
/// once, by Polygon, and never again. Pure functions, safe from any thread.
public enum FrameEncoder {
    /// Polygon's Go client refuses frames of 1,000,000 bytes or more.
    public static let maxFrameBytes = 999_999

    /// Encodes events into as few frames as possible, each a JSON array under `maxFrameBytes`.
    /// An event that alone exceeds the limit gets a frame of its own (there is no smaller form of it).
    public static func frames(
        for events: some Sequence<MarketEvent>,
        maxFrameBytes: Int = FrameEncoder.maxFrameBytes,
        allocator: ByteBufferAllocator = ByteBufferAllocator()
    ) -> [ByteBuffer] {
        var frames: [ByteBuffer] = []
        var current: ByteBuffer?
        for event in events {
            let size = event.bytes.readableBytes
            if var buffer = current, buffer.readableBytes + size + 2 <= maxFrameBytes {
                current = nil  // keep the buffer uniquely referenced while appending
                buffer.writeInteger(UInt8(ascii: ","))
                buffer.writeImmutableBuffer(event.bytes)
                current = buffer
                continue
            }
            if var done = current {
                done.writeInteger(UInt8(ascii: "]"))
                frames.append(done)
            }
            var buffer = allocator.buffer(capacity: min(maxFrameBytes, max(256, size * 8)))
            buffer.writeInteger(UInt8(ascii: "["))
            buffer.writeImmutableBuffer(event.bytes)
            current = buffer
        }
        if var done = current {
            done.writeInteger(UInt8(ascii: "]"))
            frames.append(done)
        }
        return frames
    }

    /// One event as a frame of its own.
    public static func frame(for event: MarketEvent) -> ByteBuffer {
        var buffer = ByteBuffer()
        buffer.reserveCapacity(event.bytes.readableBytes + 2)
        buffer.writeInteger(UInt8(ascii: "["))
        buffer.writeImmutableBuffer(event.bytes)
        buffer.writeInteger(UInt8(ascii: "]"))
        return buffer
    }
}
