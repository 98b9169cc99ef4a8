/// Reads a MessagePack frame of Alpaca's stream (an array of maps) without decoding its events: each
/// event is found by its `T` and `S` and kept as the range of its own bytes, so it can be passed on to
/// MessagePack clients as it came. Control messages (`success`, `error`, `subscription`) are decoded
/// whole. Pure.
public enum AlpacaFrame {
    public enum Item: Sendable, Equatable {
        /// An event: its type (`t`, `q`, `b` …), its symbol, and where its map lies in the frame.
        case event(type: String, symbol: String, bytes: Range<Int>)
        /// A news item (`T` `n`, no `S`): the symbols it names (at most ``AlpacaNews/maxSymbols`` read)
        /// and where its map lies.
        case news(symbols: [String], bytes: Range<Int>)
        /// A control message, whole.
        case control(MessagePack.Value)
        /// A map whose `T` is neither (counted, passed over), or an element that is no map.
        case unknown(String)
    }

    /// The control types; any other `T` with an `S` is an event.
    public static let controlTypes: Set<String> = ["success", "error", "subscription"]
    /// The most maps and arrays one control message is read with (a subscription's lists: one per channel).
    static let maxControlContainers = 256

    public static func read(_ bytes: UnsafeRawBufferPointer) throws(MessagePack.ReadError) -> [Item] {
        var reader = MessagePack.Reader(bytes)
        let count = try reader.arrayCount()
        guard count <= bytes.count else { throw .truncated }
        var items: [Item] = []
        // What is reserved is what a count can honestly need up front; a claimed count past that grows
        // as elements really arrive (a 4 MiB frame claiming 4 million elements reserved ~190 MB).
        items.reserveCapacity(min(count, MessagePack.maxReserved))
        for _ in 0..<count { items.append(try item(&reader, in: bytes)) }
        return items
    }

    /// Reads one map standing alone (an event as a cluster node receives it from NATS): `.unknown`
    /// when it is no map or bytes follow it.
    public static func readOne(_ bytes: UnsafeRawBufferPointer) throws(MessagePack.ReadError) -> Item {
        var reader = MessagePack.Reader(bytes)
        let read = try item(&reader, in: bytes)
        return reader.offset == bytes.count ? read : .unknown("bytes after the map")
    }

    /// Whether an array comes next.
    private static func isArray(at reader: MessagePack.Reader) -> Bool {
        var probe = reader
        return (try? probe.arrayCount()) != nil
    }

    /// The element at the reader, which moves past it.
    private static func item(_ reader: inout MessagePack.Reader, in bytes: UnsafeRawBufferPointer) throws(MessagePack.ReadError) -> Item {
        let start = reader.offset
        var probe = reader
        guard case .some = try? probe.mapCount() else {
            try reader.skip()
            return .unknown("an element that is no map")
        }
        let entries = try reader.mapCount()
        var type: String?
        var symbol: String?
        var symbols: [String]?
        for _ in 0..<entries {
            let key = try reader.stringBytes()
            if let key, key.count == 1, key[0] == UInt8(ascii: "T") || key[0] == UInt8(ascii: "S"),
                let value = try reader.stringBytes()
            {
                let text = String(decoding: value, as: UTF8.self)
                if key[0] == UInt8(ascii: "T") { type = text } else { symbol = text }
            } else if let key, symbols == nil, key.elementsEqual("symbols".utf8), isArray(at: reader) {
                // A news item's symbols: the first ones read, the rest passed over.
                let count = try reader.arrayCount()
                var names: [String] = []
                for _ in 0..<count {
                    if names.count < AlpacaNews.maxSymbols, let name = try reader.stringBytes() {
                        names.append(String(decoding: name, as: UTF8.self))
                    } else {
                        _ = try reader.skip()
                    }
                }
                symbols = names
            } else {
                if key == nil { try reader.skip() }
                try reader.skip()
            }
        }
        let range = start..<reader.offset
        guard let type else { return .unknown("a map without T") }
        if controlTypes.contains(type) {
            // Read whole, with few maps and arrays (a subscription's lists are a handful; each costs a
            // value and an allocation, and a message of empty ones would cost some 40 times its size).
            var whole = MessagePack.Reader(UnsafeRawBufferPointer(rebasing: bytes[range]))
            return .control(try whole.value(maxContainers: Self.maxControlContainers))
        }
        if type == AlpacaNews.eventType, symbol == nil { return .news(symbols: symbols ?? [], bytes: range) }
        if let symbol, !symbol.isEmpty { return .event(type: type, symbol: symbol, bytes: range) }
        return .unknown("T \(type.prefix(16)) without S")
    }
}
