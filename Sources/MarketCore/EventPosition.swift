import NIOCore

/// Where an event stands in the relay's history of its market: the sequence of its topic (`EV.SYM`,
/// contiguous: 1, 2, 3 … for every event of that topic the relay received) and its market's arrival
/// sequence (contiguous over every event of the market, whatever its topic; what a wildcard resumes
/// from). Both are meaningful within one epoch (``epoch``), the token that changes when the relay's
/// history of the market starts afresh.
///
/// They travel inside each event as two fields Polygon's clients do not know and pass over (the Python
/// clients build their models from known keys; the Go client's `json.Unmarshal` skips unknown fields;
/// the JS client hands the object on): `"_s"` (topic sequence) and `"_m"` (market sequence), written
/// before the event's closing brace; in a MessagePack event (Alpaca's), as two more map entries at its
/// end, which Alpaca's SDKs pass over as they do any key they do not map. Value type, `Sendable`.
public struct EventPosition: Sendable, Hashable {
    /// The field holding the topic sequence.
    public static let topicField = "_s"
    /// The field holding the market sequence.
    public static let marketField = "_m"

    public var topic: UInt64
    public var market: UInt64

    /// The largest sequence a position may carry: 2⁵³, the largest integer every client can read exactly
    /// (JavaScript's numbers), and centuries of events at a million a second. A larger one read from the
    /// bytes of an event (NATS) is refused: the history adds one to a position, and a value near 2⁶⁴
    /// would overflow or leave the epoch's history unable to keep anything after it.
    public static let maxSequence: UInt64 = 1 << 53

    /// Both sequences from 1 through ``maxSequence``.
    public var isPlausible: Bool { (1...Self.maxSequence).contains(topic) && (1...Self.maxSequence).contains(market) }

    public init(topic: UInt64, market: UInt64) {
        self.topic = topic
        self.market = market
    }

    /// Events with their positions written in, into new buffers of a few KiB each (a few allocations per
    /// publish, not one per event); each returned event is a slice of one and carries `market` as its
    /// ``MarketEvent/sequence``. `positions[i]` belongs to `events[i]`. An event whose bytes do not end
    /// with `}` keeps its bytes.
    ///
    /// NIO gives a buffer the next power of two of the capacity asked for, so one buffer sized to a
    /// whole publish could be nearly twice what it holds, for as long as the history keeps any of its
    /// events; buffers of a power of two each, filled in turn (``chunkCapacity(left:next:)``), leave a
    /// few percent unused instead.
    public static func stamp(_ events: [MarketEvent], _ positions: [EventPosition], allocator: ByteBufferAllocator = ByteBufferAllocator())
        -> [MarketEvent]
    {
        var left = 0
        for index in events.indices { left += events[index].bytes.readableBytes + maxGrowth }
        var stamped: [MarketEvent] = []
        stamped.reserveCapacity(events.count)
        var buffer = ByteBuffer()
        // The events written into `buffer` so far: where each lies in it.
        var ranges: [(start: Int, length: Int)] = []
        ranges.reserveCapacity(events.count)
        // Slices are taken once a buffer is full: writing into a buffer a slice shares would copy it.
        func seal() {
            let first = stamped.count
            for (offset, range) in ranges.enumerated() {
                let event = events[first + offset]
                let slice = buffer.getSlice(at: range.start, length: range.length) ?? event.bytes
                stamped.append(
                    MarketEvent(
                        eventType: event.eventType, ticker: event.ticker, bytes: slice, receivedAt: event.receivedAt,
                        sequence: positions[first + offset].market))
            }
            ranges.removeAll(keepingCapacity: true)
        }
        for index in events.indices {
            let bytes = events[index].bytes
            let length = bytes.readableBytes
            if buffer.writableBytes < length + maxGrowth {
                seal()
                buffer = allocator.buffer(capacity: chunkCapacity(left: left, next: length + maxGrowth))
            }
            left -= length + maxGrowth
            let start = buffer.writerIndex
            if let first = bytes.getInteger(at: bytes.readerIndex, as: UInt8.self), first != UInt8(ascii: "{"),
                stampMessagePack(bytes, positions[index], into: &buffer)
            {
                ranges.append((start, buffer.writerIndex - start))
                continue
            }
            guard length >= 2, bytes.getInteger(at: bytes.readerIndex + length - 1, as: UInt8.self) == UInt8(ascii: "}") else {
                buffer.writeImmutableBuffer(bytes)
                ranges.append((start, buffer.writerIndex - start))
                continue
            }
            // One write per event into room the buffer has (checked above): its bytes up to the closing
            // brace, the two fields, the brace.
            let position = positions[index]
            bytes.withUnsafeReadableBytes { source in
                _ = buffer.writeWithUnsafeMutableBytes(minimumWritableBytes: length + maxGrowth) { target in
                    writeStamped(body: UnsafeRawBufferPointer(rebasing: source[..<(length - 1)]), position, into: target)
                }
            }
            ranges.append((start, buffer.writerIndex - start))
        }
        seal()
        return stamped
    }

    /// The most a stamp adds to an event, and the room ``writeObject(body:_:_:_:_:into:)`` asks for: in
    /// JSON, a comma, two fields of 2-character keys and up to 20 characters each (52 bytes; a
    /// position's are 16 digits at most); in MessagePack, its tail and a wider map header (28).
    static let maxGrowth = 52

    /// The largest buffer ``stamp(_:_:allocator:)`` fills (an event larger than it gets one of its own).
    static let chunkBytes = 16 << 10

    /// The capacity of the next buffer, a power of two: the largest not above what is `left` to write
    /// (so it is filled), at most ``chunkBytes``; at least what the `next` event needs; the next one up
    /// for a small rest, whose rounding costs little.
    static func chunkCapacity(left: Int, next: Int) -> Int {
        func power(atLeast value: Int) -> Int { value <= 1 ? 1 : 1 << (Int.bitWidth - (value - 1).leadingZeroBitCount) }
        let fitting = left < 512 ? power(atLeast: left) : min(1 << (Int.bitWidth - 1 - left.leadingZeroBitCount), chunkBytes)
        return max(fitting, power(atLeast: next))
    }

    /// Writes a JSON object's `body` (its bytes but the closing brace) with the position's two fields and
    /// the brace after it into `target`, which has room for the whole event and ``maxGrowth`` bytes (the
    /// body, its brace and the growth); returns the bytes written.
    static func writeStamped(body: UnsafeRawBufferPointer, _ position: EventPosition, into target: UnsafeMutableRawBufferPointer) -> Int {
        writeObject(body: body, #""_s":"#, position.topic, #","_m":"#, position.market, into: target)
    }

    /// Writes a JSON object's `body` (its bytes but the closing brace), then two integer fields (`first`
    /// is the first one's key and colon, written after a comma unless the object is empty, `second` the
    /// second one's with its comma) and the brace, into `target`, which has room for the body, its brace
    /// and ``maxGrowth`` bytes (two fields of 2-character keys and up to 20 characters each fit);
    /// returns the bytes written. The positions' stamp and the receive and send times (``EventTimes``).
    static func writeObject(
        body: UnsafeRawBufferPointer, _ first: StaticString, _ firstValue: some BinaryInteger, _ second: StaticString,
        _ secondValue: some BinaryInteger, into target: UnsafeMutableRawBufferPointer
    ) -> Int {
        // Unchecked writes follow: the room is the caller's promise, checked once here.
        precondition(target.count >= body.count + 1 + maxGrowth, "room for a stamped event")
        UnsafeMutableRawBufferPointer(rebasing: target[..<body.count]).copyMemory(from: body)
        var at = body.count
        func put(_ text: StaticString) {
            let count = text.utf8CodeUnitCount
            UnsafeMutableRawBufferPointer(rebasing: target[at..<(at + count)])
                .copyMemory(from: UnsafeRawBufferPointer(start: text.utf8Start, count: count))
            at += count
        }
        func put(_ number: some BinaryInteger) {
            if number < 0 { put("-") }
            let value = UInt64(number.magnitude)
            var digits = 1
            var rest = value
            while rest >= 10 {
                rest /= 10
                digits += 1
            }
            rest = value
            for offset in stride(from: at + digits - 1, through: at, by: -1) {
                target[offset] = UInt8(ascii: "0") + UInt8(truncatingIfNeeded: rest % 10)
                rest /= 10
            }
            at += digits
        }
        // `{}`: no field before ours, so no comma.
        if !isEmptyObject(body) { put(",") }
        put(first)
        put(firstValue)
        put(second)
        put(secondValue)
        put("}")
        return at
    }

    /// The tail a MessagePack event gets: `"_s"` and `"_m"` as two more map entries, each a 64-bit
    /// unsigned integer in its fixed form (9 bytes), so a reader finds them at a known place.
    static let messagePackTail = 24

    /// What precedes a position's value in that tail: the 2-byte key `_s`/`_m` and the uint64 marker.
    private static func tailEntry(_ key: UInt8) -> [UInt8] { [0xA2, UInt8(ascii: "_"), key, 0xCF] }

    /// Writes a MessagePack map (an Alpaca event) with the two position entries added at its end and its
    /// header counting them; `false` (nothing written) for bytes that are not a map it can extend.
    private static func stampMessagePack(_ bytes: ByteBuffer, _ position: EventPosition, into buffer: inout ByteBuffer) -> Bool {
        // A map32 (a writer may use it for any size) is stamped like the others, or a cluster's
        // followers would get it without the leader's positions.
        guard let header = MessagePackMapHeader(bytes),
            let body = bytes.getSlice(at: bytes.readerIndex + header.length, length: bytes.readableBytes - header.length)
        else { return false }
        MessagePackMapHeader.write(count: header.count + 2, into: &buffer)
        buffer.writeImmutableBuffer(body)
        for (key, value) in [(UInt8(ascii: "s"), position.topic), (UInt8(ascii: "m"), position.market)] {
            buffer.writeBytes(tailEntry(key))
            buffer.writeInteger(value)
        }
        return true
    }

    /// The positions of a MessagePack event, from the tail ``stampMessagePack`` writes.
    private static func readMessagePack(_ bytes: ByteBuffer) -> EventPosition? {
        let topicEntry = bytes.readerIndex + bytes.readableBytes - messagePackTail
        let marketEntry = topicEntry + messagePackTail / 2
        guard bytes.readableBytes > messagePackTail,
            bytes.getBytes(at: topicEntry, length: 4) == tailEntry(UInt8(ascii: "s")),
            bytes.getBytes(at: marketEntry, length: 4) == tailEntry(UInt8(ascii: "m")),
            let topic = bytes.getInteger(at: topicEntry + 4, as: UInt64.self), let market = bytes.getInteger(at: marketEntry + 4, as: UInt64.self)
        else { return nil }
        return EventPosition(topic: topic, market: market)
    }

    /// The positions written in an event's bytes (`nil` when it has none, or they are not plausible): a
    /// cluster node adopts the leader's. Looks only at the object's last two fields, where
    /// ``stamp(_:_:allocator:)`` puts them.
    public static func read(from bytes: ByteBuffer) -> EventPosition? {
        guard let position = readWritten(from: bytes), position.isPlausible else { return nil }
        return position
    }

    /// The positions written in an event's bytes, plausible or not (`nil`: it has none).
    public static func readWritten(from bytes: ByteBuffer) -> EventPosition? {
        if let first = bytes.getInteger(at: bytes.readerIndex, as: UInt8.self), first != UInt8(ascii: "{") {
            return readMessagePack(bytes)
        }
        let view = bytes.readableBytesView
        guard let topicKey = lastRange(of: Array(#""_s":"#.utf8), in: view),
            let marketKey = lastRange(of: Array(#""_m":"#.utf8), in: view), topicKey < marketKey,
            let topic = decimal(in: view, from: topicKey + 5), let market = decimal(in: view, from: marketKey + 5)
        else { return nil }
        return EventPosition(topic: topic, market: market)
    }

    private static func lastRange(of needle: [UInt8], in view: ByteBufferView) -> Int? {
        guard view.count >= needle.count else { return nil }
        var index = view.endIndex - needle.count
        // Our fields are at the very end: a short look back suffices.
        let floor = max(view.startIndex, view.endIndex - 64)
        while index >= floor {
            if view[index] == needle[0], zip(view[index..<(index + needle.count)], needle).allSatisfy({ $0 == $1 }) { return index }
            index -= 1
        }
        return nil
    }

    private static func decimal(in view: ByteBufferView, from start: Int) -> UInt64? {
        var value: UInt64 = 0
        var index = start
        var digits = 0
        while index < view.endIndex, view[index] >= UInt8(ascii: "0"), view[index] <= UInt8(ascii: "9") {
            let (scaled, overflow1) = value.multipliedReportingOverflow(by: 10)
            let (sum, overflow2) = scaled.addingReportingOverflow(UInt64(view[index] - UInt8(ascii: "0")))
            guard !overflow1, !overflow2 else { return nil }
            value = sum
            index += 1
            digits += 1
        }
        return digits > 0 ? value : nil
    }

    /// Whether an object's bytes up to (not including) its closing brace hold no field: `{` and blanks.
    static func isEmptyObject(_ body: some Sequence<UInt8>) -> Bool {
        body.allSatisfy { $0 == UInt8(ascii: "{") || JSONText.isSpace($0) }
    }

    /// A fresh epoch: 12 characters of base 36 from the time and randomness, different at every start
    /// of a history.
    public static func newEpoch() -> String {
        var generator = SystemRandomNumberGenerator()
        let alphabet = Array("0123456789abcdefghijklmnopqrstuvwxyz".utf8)
        var value = generator.next() as UInt64
        var text: [UInt8] = []
        for _ in 0..<12 {
            text.append(alphabet[Int(value % 36)])
            value /= 36
        }
        return String(decoding: text, as: UTF8.self)
    }
}

extension ByteBuffer {
    /// Writes `value` in decimal digits, without an allocation.
    mutating func writeDecimal(_ value: UInt64) {
        var digits: (UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8,
                     UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8) = (0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)
        var count = 0
        var rest = value
        withUnsafeMutableBytes(of: &digits) { raw in
            repeat {
                raw[19 - count] = UInt8(ascii: "0") + UInt8(rest % 10)
                rest /= 10
                count += 1
            } while rest > 0
            writeBytes(UnsafeRawBufferPointer(rebasing: raw[(20 - count)...]))
        }
    }

    /// Writes `value` in decimal digits, with its sign.
    mutating func writeDecimal(_ value: Int64) {
        if value < 0 { writeInteger(UInt8(ascii: "-")) }
        writeDecimal(value.magnitude)
    }
}
