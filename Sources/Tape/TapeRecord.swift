import MarketCore
import NIOCore

/// One thing the tape holds, in the order the relay received it: a market event as it came from the
/// upstream (its vendor's own bytes, so a replay speaks the vendor's protocol), or a gap: a window in
/// which the relay did not record (it was down, or recording paused on a full disk).
public enum TapeRecord: Sendable, Equatable {
    case event(TapeEvent)
    /// Nothing was recorded from `from` to `to` (UTC nanoseconds).
    case gap(from: Int64, to: Int64)
    /// The events after it are positioned in `epoch` (their sequences count in it): written when the
    /// relay's epoch begins or changes, and first in each day file, so a file tells its own epochs.
    case epoch(String, at: Int64)
    /// The events after it came from this vendor's upstream (``WireVendor/name``), at `path` on its host
    /// when known (Alpaca's feed is in the path): how a replay knows which protocol to speak. Written
    /// when recording begins, and first in each day file after the epoch.
    case source(vendor: String, path: String?, at: Int64)
    /// The relay began (`true`) or stopped receiving a topic (`T.AAPL`, or a wildcard `T.*`): whether a
    /// topic's events on the tape are whole depends on it (a restart's history is rebuilt from these).
    case wanted(topic: String, Bool, at: Int64)
    /// The upstream was lost: events after this may be missing (every topic whole again only from its
    /// next event).
    case interrupted(at: Int64)
    /// The relay stopped cleanly: every position it gave before this is on the tape (or in a gap
    /// recorded before it), so its next start may go on counting in the same epoch.
    case stopped(at: Int64)
    /// The topics (and wildcards) the relay receives now, all of them: written at the start of a block
    /// every few seconds, so a reader starting there knows what was wanted without reading from the
    /// day's start (a restart rebuilding its recent history).
    case holding([String], at: Int64)

    /// When it was received (an event) or when the hole began (a gap): UTC nanoseconds.
    public var time: Int64 {
        switch self {
        case .event(let event): event.receivedAt
        case .gap(let from, _): from
        case .epoch(_, let at): at
        case .source(_, _, let at): at
        case .wanted(_, _, let at): at
        case .interrupted(let at): at
        case .stopped(let at): at
        case .holding(_, let at): at
        }
    }
}

extension EventCheck {
    /// Why a tape's event is none the relay takes, or `nil`.
    public func problem(of event: TapeEvent) -> String? {
        event.bytes.withUnsafeReadableBytes { problem(eventType: event.eventType, ticker: event.ticker, bytes: $0) }
    }

    /// Why the first event of `records` that is none the relay takes is not, or `nil` when all are.
    public func problem(in records: [TapeRecord]) -> String? {
        for case .event(let event) in records {
            if let found = problem(of: event) { return found }
        }
        return nil
    }
}

/// A market event on the tape.
public struct TapeEvent: Sendable, Equatable {
    /// When the relay read the frame it came in (UTC nanoseconds).
    public var receivedAt: Int64
    /// Its place in its market's arrival order.
    public var sequence: UInt64
    /// Its place in its topic's order (`_s`); 0: not recorded.
    public var topicSequence: UInt64
    /// The vendor's event type (`Q`, `t`, …) and the symbol it routes by.
    public var eventType: String
    public var ticker: String
    /// The event's own bytes as the upstream sent them (read from a tape: a slice of its block, so a
    /// block's events share one buffer).
    public var bytes: ByteBuffer

    public init(receivedAt: Int64, sequence: UInt64, topicSequence: UInt64 = 0, eventType: String, ticker: String, bytes: ByteBuffer) {
        self.receivedAt = receivedAt
        self.sequence = sequence
        self.topicSequence = topicSequence
        self.eventType = eventType
        self.ticker = ticker
        self.bytes = bytes
    }

    public init(receivedAt: Int64, sequence: UInt64, topicSequence: UInt64 = 0, eventType: String, ticker: String, bytes: [UInt8]) {
        self.init(
            receivedAt: receivedAt, sequence: sequence, topicSequence: topicSequence, eventType: eventType, ticker: ticker, bytes: ByteBuffer(bytes: bytes))
    }
}

/// How records are laid out in a block before compression: each record is a kind byte, then
/// LEB128 varints and length-prefixed bytes. Times and sequences are deltas from the block's first
/// (a block's events are close in both, so most deltas take one to three bytes before zstd sees them).
enum RecordLayout {
    static let event: UInt8 = 1
    static let gap: UInt8 = 2
    static let epoch: UInt8 = 3
    static let source: UInt8 = 4
    /// An event with its topic sequence too.
    static let positionedEvent: UInt8 = 5
    static let wanted: UInt8 = 6
    static let interrupted: UInt8 = 7
    static let stopped: UInt8 = 8
    static let holding: UInt8 = 9
    /// The most records (or a holding record's topics) a count read from a block makes room for before
    /// they are read.
    static let mostRecordsReserved = 16_384

    static func append(_ record: TapeRecord, to payload: inout [UInt8], baseTime: Int64, baseSequence: UInt64) {
        switch record {
        case .event(let event):
            event.bytes.withUnsafeReadableBytes { bytes in
                appendEvent(
                    receivedAt: event.receivedAt, sequence: event.sequence, topicSequence: event.topicSequence, eventType: event.eventType,
                    ticker: event.ticker, bytes: bytes, to: &payload, baseTime: baseTime, baseSequence: baseSequence)
            }
        case .gap(let from, let to):
            payload.append(Self.gap)
            appendVarint(zigzag(from &- baseTime), to: &payload)
            appendVarint(zigzag(to &- from), to: &payload)
        case .epoch(let epoch, let at):
            payload.append(Self.epoch)
            appendVarint(zigzag(at &- baseTime), to: &payload)
            appendVarint(UInt64(epoch.utf8.count), to: &payload)
            payload.append(contentsOf: epoch.utf8)
        case .source(let vendor, let path, let at):
            payload.append(Self.source)
            appendVarint(zigzag(at &- baseTime), to: &payload)
            appendVarint(UInt64(vendor.utf8.count), to: &payload)
            payload.append(contentsOf: vendor.utf8)
            // No path: an empty one (a path always begins with `/`).
            appendVarint(UInt64(path?.utf8.count ?? 0), to: &payload)
            payload.append(contentsOf: (path ?? "").utf8)
        case .wanted(let topic, let wanted, let at):
            payload.append(Self.wanted)
            appendVarint(zigzag(at &- baseTime), to: &payload)
            payload.append(wanted ? 1 : 0)
            appendVarint(UInt64(topic.utf8.count), to: &payload)
            payload.append(contentsOf: topic.utf8)
        case .interrupted(let at):
            payload.append(Self.interrupted)
            appendVarint(zigzag(at &- baseTime), to: &payload)
        case .stopped(let at):
            payload.append(Self.stopped)
            appendVarint(zigzag(at &- baseTime), to: &payload)
        case .holding(let topics, let at):
            payload.append(Self.holding)
            appendVarint(zigzag(at &- baseTime), to: &payload)
            appendVarint(UInt64(topics.count), to: &payload)
            for topic in topics {
                appendVarint(UInt64(topic.utf8.count), to: &payload)
                payload.append(contentsOf: topic.utf8)
            }
        }
    }

    /// An event's record, its bytes copied once, straight from where they are (the recorder's path).
    static func appendEvent(
        receivedAt: Int64, sequence: UInt64, topicSequence: UInt64 = 0, eventType: String, ticker: String, bytes: UnsafeRawBufferPointer,
        to payload: inout [UInt8], baseTime: Int64, baseSequence: UInt64
    ) {
        payload.append(topicSequence == 0 ? Self.event : Self.positionedEvent)
        appendVarint(zigzag(receivedAt &- baseTime), to: &payload)
        appendVarint(sequence &- baseSequence, to: &payload)
        if topicSequence != 0 { appendVarint(topicSequence, to: &payload) }
        appendVarint(UInt64(eventType.utf8.count), to: &payload)
        payload.append(contentsOf: eventType.utf8)
        appendVarint(UInt64(ticker.utf8.count), to: &payload)
        payload.append(contentsOf: ticker.utf8)
        appendVarint(UInt64(bytes.count), to: &payload)
        payload.append(contentsOf: bytes)
    }

    /// The records of a block's payload; `nil` when it does not parse to its end (a block whose zstd
    /// checksum matched but whose records do not is still refused, never half read).
    static func records(in payload: [UInt8], baseTime: Int64, baseSequence: UInt64) -> [TapeRecord]? {
        records(in: ByteBuffer(bytes: payload), baseTime: baseTime, baseSequence: baseSequence)
    }

    /// The records of a block's payload, read where it lies: events' bytes are slices of `block` (one
    /// allocation a block, not one an event).
    /// `expected`: how many records its header says (room is made for them at once); `most`: past
    /// that many the block is refused as it is read, not once a hostile payload's records are all made.
    static func records(in block: ByteBuffer, baseTime: Int64, baseSequence: UInt64, expected: Int = 0, most: Int = .max) -> [TapeRecord]? {
        block.withUnsafeReadableBytes { payload in
            var records: [TapeRecord] = []
            // A header's count is read from a file (or a stream's message): room for what a real block
            // holds at most (256 KB of records, a few thousand), never what a hostile count claims.
            records.reserveCapacity(min(max(expected, 0), payload.count / 2, Self.mostRecordsReserved))
            return self.records(in: payload, of: block, into: &records, baseTime: baseTime, baseSequence: baseSequence, most: most)
                ? records : nil
        }
    }

    private static func records(
        in payload: UnsafeRawBufferPointer, of block: ByteBuffer, into records: inout [TapeRecord], baseTime: Int64, baseSequence: UInt64,
        most: Int
    ) -> Bool {
        func text(_ range: Range<Int>) -> String { String(decoding: UnsafeRawBufferPointer(rebasing: payload[range]), as: UTF8.self) }
        /// A name (an epoch, a source, a topic) no longer than any the relay writes.
        func name(_ index: inout Int) -> String? {
            guard let range = readRange(payload, &index), range.count <= Self.longestName else { return nil }
            return text(range)
        }
        // Topics named by the block's `holding` records so far: each is a string in memory, from as
        // little as a byte of the block.
        var named: UInt64 = 0
        var index = 0
        while index < payload.count {
            guard records.count < most else { return false }
            let kind = payload[index]
            index += 1
            switch kind {
            case Self.event, Self.positionedEvent:
                guard let time = readVarint(payload, &index), let sequence = readVarint(payload, &index) else { return false }
                var topicSequence: UInt64 = 0
                if kind == Self.positionedEvent {
                    guard let read = readVarint(payload, &index) else { return false }
                    topicSequence = read
                }
                guard let type = readRange(payload, &index), let ticker = readRange(payload, &index), let bytes = readRange(payload, &index),
                    let slice = block.getSlice(at: block.readerIndex + bytes.lowerBound, length: bytes.count)
                else { return false }
                records.append(
                    .event(
                        TapeEvent(
                            receivedAt: baseTime &+ unzigzag(time), sequence: baseSequence &+ sequence, topicSequence: topicSequence,
                            eventType: text(type), ticker: text(ticker), bytes: slice)))
            case Self.gap:
                guard let from = readVarint(payload, &index), let length = readVarint(payload, &index) else { return false }
                let start = baseTime &+ unzigzag(from)
                records.append(.gap(from: start, to: start &+ unzigzag(length)))
            case Self.epoch:
                guard let at = readVarint(payload, &index), let epoch = name(&index) else { return false }
                records.append(.epoch(epoch, at: baseTime &+ unzigzag(at)))
            case Self.source:
                guard let at = readVarint(payload, &index), let vendor = name(&index), let path = name(&index) else { return false }
                records.append(.source(vendor: vendor, path: path.isEmpty ? nil : path, at: baseTime &+ unzigzag(at)))
            case Self.wanted:
                guard let at = readVarint(payload, &index), index < payload.count, payload[index] <= 1 else { return false }
                let wanted = payload[index] == 1
                index += 1
                guard let topic = name(&index) else { return false }
                records.append(.wanted(topic: topic, wanted, at: baseTime &+ unzigzag(at)))
            case Self.interrupted, Self.stopped:
                guard let at = readVarint(payload, &index) else { return false }
                let time = baseTime &+ unzigzag(at)
                records.append(kind == Self.stopped ? .stopped(at: time) : .interrupted(at: time))
            case Self.holding:
                // Each topic takes at least its length byte: a count past what is left is damage.
                guard let at = readVarint(payload, &index), let count = readVarint(payload, &index), count <= UInt64(payload.count - index),
                    count <= Self.mostHoldingTopics - named
                else { return false }
                named += count
                var topics: [String] = []
                // Room for what a real wanted set holds, never what a hostile count claims (up to a byte a topic).
                topics.reserveCapacity(min(Int(count), Self.mostRecordsReserved))
                for _ in 0..<count {
                    guard let topic = name(&index) else { return false }
                    topics.append(topic)
                }
                records.append(.holding(topics, at: baseTime &+ unzigzag(at)))
            default:
                return false
            }
        }
        return true
    }

    /// The most topics a block's `holding` records may name together: more than any wanted set the
    /// relay's limits allow (each a string in memory as it is read).
    static let mostHoldingTopics: UInt64 = 1 << 20
    /// The longest name (an epoch, a source's vendor or path, a topic) a record may hold: far more than
    /// any the relay writes (a 64 MB topic in a few bytes of zstd would else be a 64 MB string).
    static let longestName = 1_024

    static func zigzag(_ value: Int64) -> UInt64 { UInt64(bitPattern: (value << 1) ^ (value >> 63)) }
    static func unzigzag(_ value: UInt64) -> Int64 { Int64(bitPattern: value >> 1) ^ -Int64(bitPattern: value & 1) }

    static func appendVarint(_ value: UInt64, to payload: inout [UInt8]) {
        var value = value
        while value >= 0x80 {
            payload.append(UInt8(truncatingIfNeeded: value) | 0x80)
            value >>= 7
        }
        payload.append(UInt8(value))
    }

    static func readVarint(_ payload: UnsafeRawBufferPointer, _ index: inout Int) -> UInt64? {
        var value: UInt64 = 0
        var shift: UInt64 = 0
        while index < payload.count, shift < 64 {
            let byte = payload[index]
            index += 1
            value |= UInt64(byte & 0x7F) << shift
            if byte < 0x80 { return value }
            shift += 7
        }
        return nil
    }

    /// Where the next length-prefixed bytes lie in `payload` (read past them), without copying them.
    static func readRange(_ payload: UnsafeRawBufferPointer, _ index: inout Int) -> Range<Int>? {
        guard let count = readVarint(payload, &index), count <= UInt64(payload.count - index) else { return nil }
        defer { index += Int(count) }
        return index..<index + Int(count)
    }
}
