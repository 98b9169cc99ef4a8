import NIOCore

/// The times a client that asks for them gets in each event (a key's `timestamps`, or Polygon's
/// subscribe option `"timestamps":true`): `"_r"`, when the relay read the frame the event came in, and
/// `"_o"`, when the relay wrote the frame it goes out in, both Unix time in nanoseconds (UTC), written
/// as the event's last two fields (after its positions). Official clients pass over them as they pass
/// over `_s` and `_m`.
///
/// The receive time is taken once, as the frame is read (``MarketEvent/receivedAt``, monotonic), and
/// turned into Unix time as the event goes out, against the wall clock read for the send time, so the
/// two are on one clock. Nothing is serialised again: the event's bytes are copied into the client's
/// frame as for any client, with the two fields put before their closing brace (JSON) or as two more
/// map entries (MessagePack). Notices (no receive time) get neither.
public enum EventTimes {
    /// The field holding the receive time.
    public static let receivedField = "_r"
    /// The field holding the send time.
    public static let sentField = "_o"

    /// The most the two fields add to an event: in JSON, what the writer of a position's stamp adds,
    /// which writes them too (``EventPosition/writeObject(body:_:_:_:_:into:)``: two numbers and their
    /// keys, and the room it asks for); in MessagePack, two map entries and a wider header (30).
    public static let maxGrowth = EventPosition.maxGrowth

    /// The clocks read once for a frame: the send time, and what turns a monotonic receive time into
    /// Unix time. Value type, `Sendable`.
    public struct Reading: Sendable {
        /// Unix time in ns, now.
        public let sent: Int64
        /// Unix time minus monotonic time, in ns.
        let offset: Int64

        public init() {
            let monotonic = Int64(truncatingIfNeeded: MonotonicClock.nanoseconds())
            sent = WallClock.nowNanoseconds()
            offset = sent &- monotonic
        }

        /// A reading at fixed clocks (tests).
        public init(sent: Int64, monotonicNow: UInt64) {
            self.sent = sent
            offset = sent &- Int64(truncatingIfNeeded: monotonicNow)
        }

        /// The Unix time (ns) of a monotonic reading; `nil` for 0 (unknown).
        public func unix(ofMonotonic monotonic: UInt64) -> Int64? {
            monotonic == 0 ? nil : Int64(truncatingIfNeeded: monotonic) &+ offset
        }
    }

    /// Writes `event`'s bytes into `buffer` with its times added, when it has a receive time and its bytes
    /// are a JSON object or a MessagePack map; else its bytes as they are.
    public static func write(_ event: borrowing MarketEvent, bytes: ByteBuffer, reading: Reading, into buffer: inout ByteBuffer) {
        guard let received = reading.unix(ofMonotonic: event.receivedAt), let first = bytes.getInteger(at: bytes.readerIndex, as: UInt8.self)
        else {
            buffer.writeImmutableBuffer(bytes)
            return
        }
        if first == UInt8(ascii: "{") {
            writeJSON(bytes, received: received, sent: reading.sent, into: &buffer)
        } else if !writeMessagePack(bytes, received: received, sent: reading.sent, into: &buffer) {
            buffer.writeImmutableBuffer(bytes)
        }
    }

    private static func writeJSON(_ bytes: ByteBuffer, received: Int64, sent: Int64, into buffer: inout ByteBuffer) {
        let length = bytes.readableBytes
        guard length >= 2, bytes.getInteger(at: bytes.readerIndex + length - 1, as: UInt8.self) == UInt8(ascii: "}") else {
            buffer.writeImmutableBuffer(bytes)
            return
        }
        // One write, as a position's stamp is written (``EventPosition``): the bytes up to the closing
        // brace, the two fields, the brace.
        bytes.withUnsafeReadableBytes { source in
            _ = buffer.writeWithUnsafeMutableBytes(minimumWritableBytes: length + maxGrowth) { target in
                EventPosition.writeObject(
                    body: UnsafeRawBufferPointer(rebasing: source[..<(length - 1)]), #""_r":"#, received, #","_o":"#, sent, into: target)
            }
        }
    }

    /// Two more entries at the map's end (each a 2-byte key and an int64), its header counting them;
    /// `false` (nothing written) for bytes that are not a map.
    private static func writeMessagePack(_ bytes: ByteBuffer, received: Int64, sent: Int64, into buffer: inout ByteBuffer) -> Bool {
        guard let header = MessagePackMapHeader(bytes),
            let body = bytes.getSlice(at: bytes.readerIndex + header.length, length: bytes.readableBytes - header.length)
        else { return false }
        MessagePackMapHeader.write(count: header.count + 2, into: &buffer)
        buffer.writeImmutableBuffer(body)
        for (key, value) in [(UInt8(ascii: "r"), received), (UInt8(ascii: "o"), sent)] {
            buffer.writeBytes([0xA2, UInt8(ascii: "_"), key, 0xD3])
            buffer.writeInteger(value)
        }
        return true
    }
}

/// The header of a MessagePack map: its entry count and its length in bytes. Value type.
struct MessagePackMapHeader {
    let count: Int
    let length: Int

    /// The header at the start of `bytes`; `nil` when they do not start a map (or one too large to grow).
    init?(_ bytes: ByteBuffer) {
        guard let first = bytes.getInteger(at: bytes.readerIndex, as: UInt8.self) else { return nil }
        switch first {
        case 0x80...0x8F:
            count = Int(first & 0x0F)
            length = 1
        case 0xDE:
            guard let big = bytes.getInteger(at: bytes.readerIndex + 1, as: UInt16.self) else { return nil }
            count = Int(big)
            length = 3
        case 0xDF:
            guard let big = bytes.getInteger(at: bytes.readerIndex + 1, as: UInt32.self), big < UInt32.max - 2 else { return nil }
            count = Int(big)
            length = 5
        default:
            return nil
        }
    }

    /// Writes a map header of `count` entries in its shortest form.
    static func write(count: Int, into buffer: inout ByteBuffer) {
        if count < 16 {
            buffer.writeInteger(UInt8(0x80 | count))
        } else if count <= Int(UInt16.max) {
            buffer.writeInteger(UInt8(0xDE))
            buffer.writeInteger(UInt16(count))
        } else {
            buffer.writeInteger(UInt8(0xDF))
            buffer.writeInteger(UInt32(count))
        }
    }
}
