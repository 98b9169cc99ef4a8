import NIOCore

/// Builds server frames from events by concatenating their original bytes: an event is serialised
/// once, by Polygon, and never again. Pure functions, safe from any thread.
public enum FrameEncoder {
    /// Polygon's Go client refuses frames of 1,000,000 bytes or more.
    public static let maxFrameBytes = 999_999

    /// The events as one frame (a JSON array of their bytes), or `nil` when together they reach
    /// `maxFrameBytes` (then use ``frames(for:maxFrameBytes:allocator:)``). The hot path: one allocation,
    /// one copy per event, no event copied out of the array.
    public static func frame(
        for events: [MarketEvent], maxFrameBytes: Int = FrameEncoder.maxFrameBytes,
        allocator: ByteBufferAllocator = ByteBufferAllocator()
    ) -> ByteBuffer? {
        guard !events.isEmpty else { return nil }
        return events.withUnsafeBufferPointer { events -> ByteBuffer? in
            var size = 1 + events.count
            for index in events.indices { size += events[index].bytes.readableBytes }
            guard size <= maxFrameBytes else { return nil }
            var buffer = allocator.buffer(capacity: size)
            for index in events.indices {
                buffer.writeInteger(UInt8(ascii: index == 0 ? "[" : ","))
                buffer.writeImmutableBuffer(events[index].bytes)
            }
            buffer.writeInteger(UInt8(ascii: "]"))
            return buffer
        }
    }

    /// Encodes events into as few frames as possible, each a JSON array under `maxFrameBytes`.
    /// An event that alone exceeds the limit gets a frame of its own (there is no smaller form of it).
    /// Concrete `[MarketEvent]` (not a generic collection): called across modules, a generic version
    /// runs unspecialised and boxes every event it touches.
    public static func frames(
        for events: [MarketEvent],
        maxFrameBytes: Int = FrameEncoder.maxFrameBytes,
        allocator: ByteBufferAllocator = ByteBufferAllocator()
    ) -> [ByteBuffer] {
        if let one = frame(for: events, maxFrameBytes: maxFrameBytes, allocator: allocator) { return [one] }
        guard !events.isEmpty else { return [] }
        var remaining = events.reduce(2) { $0 + $1.bytes.readableBytes + 1 }
        var frames: [ByteBuffer] = []
        var buffer = allocator.buffer(capacity: min(maxFrameBytes, remaining))
        var count = 0
        for event in events {
            let size = event.bytes.readableBytes
            if count > 0, buffer.readableBytes + size + 2 > maxFrameBytes {
                buffer.writeInteger(UInt8(ascii: "]"))
                frames.append(buffer)
                buffer = allocator.buffer(capacity: min(maxFrameBytes, max(remaining, size + 2)))
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
}
