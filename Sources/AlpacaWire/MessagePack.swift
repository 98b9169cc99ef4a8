/// MessagePack (the msgpack.org format), as Alpaca's stream and its SDKs speak it: a value type for
/// whole messages, a reader that walks bytes without copying them (so an event's own bytes can be passed
/// on as they came), and a writer. No package on this machine's mirror does MessagePack, so it is here,
/// with the format's whole value set and bounds on everything an input can make it do.
///
/// Pure, `Sendable` value types.
public enum MessagePack {
    /// The deepest nesting read (Alpaca's messages are two levels deep; an order book three).
    public static let maxDepth = 32
    /// The most elements reserved up front for an array or map read: a count from the wire is a claim,
    /// and a larger container grows as its elements actually arrive.
    public static let maxReserved = 1_024

    /// A decoded value. Maps keep their order (and any repeated key) as sent.
    public enum Value: Sendable, Equatable {
        case null
        case bool(Bool)
        case int(Int64)
        case uint(UInt64)
        case double(Double)
        case string(String)
        case binary([UInt8])
        case array([Value])
        case map([Entry])
        /// The timestamp extension (type −1): seconds since the Unix epoch and nanoseconds.
        case timestamp(seconds: Int64, nanoseconds: UInt32)
        /// Any other extension type.
        case ext(type: Int8, data: [UInt8])

        public struct Entry: Sendable, Equatable {
            public var key: Value
            public var value: Value

            public init(_ key: Value, _ value: Value) {
                self.key = key
                self.value = value
            }
        }

        /// A map's value for a string key (the first, if repeated).
        public subscript(key: String) -> Value? {
            guard case .map(let entries) = self else { return nil }
            return entries.first { $0.key == .string(key) }?.value
        }

        public var string: String? {
            if case .string(let text) = self { return text }
            return nil
        }

        /// An integer value of either sign, if it fits an `Int64`.
        public var integer: Int64? {
            switch self {
            case .int(let value): value
            case .uint(let value): value <= UInt64(Int64.max) ? Int64(value) : nil
            default: nil
            }
        }

        public var array: [Value]? {
            if case .array(let values) = self { return values }
            return nil
        }
    }

    /// Why bytes are not MessagePack (or not the value asked for).
    public enum ReadError: Error, Sendable, Equatable, CustomStringConvertible {
        case truncated
        case invalidByte(UInt8)
        case tooDeep
        case invalidUTF8
        case unexpected(String)

        public var description: String {
            switch self {
            case .truncated: "MessagePack: the input ends inside a value"
            case .invalidByte(let byte): "MessagePack: 0x\(String(byte, radix: 16)) starts no value"
            case .tooDeep: "MessagePack: nested deeper than \(MessagePack.maxDepth)"
            case .invalidUTF8: "MessagePack: a string that is not UTF-8"
            case .unexpected(let what): "MessagePack: expected \(what)"
            }
        }
    }
}

extension MessagePack {
    /// Walks MessagePack bytes. Every length is checked against what is left before it is used.
    public struct Reader {
        public let bytes: UnsafeRawBufferPointer
        public private(set) var offset: Int

        public init(_ bytes: UnsafeRawBufferPointer, offset: Int = 0) {
            self.bytes = bytes
            self.offset = offset
        }

        public var isAtEnd: Bool { offset >= bytes.count }

        private mutating func byte() throws(ReadError) -> UInt8 {
            guard offset < bytes.count else { throw .truncated }
            defer { offset += 1 }
            return bytes[offset]
        }

        private mutating func big(_ count: Int) throws(ReadError) -> UInt64 {
            guard count <= bytes.count - offset else { throw .truncated }
            var value: UInt64 = 0
            for index in offset..<(offset + count) { value = value << 8 | UInt64(bytes[index]) }
            offset += count
            return value
        }

        private mutating func take(_ count: Int) throws(ReadError) -> UnsafeRawBufferPointer {
            guard count >= 0, count <= bytes.count - offset else { throw .truncated }
            defer { offset += count }
            return UnsafeRawBufferPointer(rebasing: bytes[offset..<(offset + count)])
        }

        /// The next value's header: for an array or a map, its count (the elements follow).
        enum Header {
            case scalar(Value)
            case array(Int)
            case map(Int)
        }

        mutating func header() throws(ReadError) -> Header {
            let first = try byte()
            switch first {
            case 0x00...0x7F: return .scalar(.int(Int64(first)))
            case 0x80...0x8F: return .map(Int(first & 0x0F))
            case 0x90...0x9F: return .array(Int(first & 0x0F))
            case 0xA0...0xBF: return .scalar(try string(Int(first & 0x1F)))
            case 0xC0: return .scalar(.null)
            case 0xC2: return .scalar(.bool(false))
            case 0xC3: return .scalar(.bool(true))
            case 0xC4: return .scalar(.binary(Array(try take(Int(try big(1))))))
            case 0xC5: return .scalar(.binary(Array(try take(Int(try big(2))))))
            case 0xC6: return .scalar(.binary(Array(try take(Int(try big(4))))))
            case 0xC7: return .scalar(try ext(Int(try big(1))))
            case 0xC8: return .scalar(try ext(Int(try big(2))))
            case 0xC9: return .scalar(try ext(Int(try big(4))))
            case 0xCA: return .scalar(.double(Double(Float(bitPattern: UInt32(try big(4))))))
            case 0xCB: return .scalar(.double(Double(bitPattern: try big(8))))
            case 0xCC: return .scalar(.int(Int64(try big(1))))
            case 0xCD: return .scalar(.int(Int64(try big(2))))
            case 0xCE: return .scalar(.int(Int64(try big(4))))
            case 0xCF:
                let value = try big(8)
                return .scalar(value <= UInt64(Int64.max) ? .int(Int64(value)) : .uint(value))
            case 0xD0: return .scalar(.int(Int64(Int8(truncatingIfNeeded: try big(1)))))
            case 0xD1: return .scalar(.int(Int64(Int16(truncatingIfNeeded: try big(2)))))
            case 0xD2: return .scalar(.int(Int64(Int32(truncatingIfNeeded: try big(4)))))
            case 0xD3: return .scalar(.int(Int64(bitPattern: try big(8))))
            case 0xD4: return .scalar(try ext(1))
            case 0xD5: return .scalar(try ext(2))
            case 0xD6: return .scalar(try ext(4))
            case 0xD7: return .scalar(try ext(8))
            case 0xD8: return .scalar(try ext(16))
            case 0xD9: return .scalar(try string(Int(try big(1))))
            case 0xDA: return .scalar(try string(Int(try big(2))))
            case 0xDB: return .scalar(try string(Int(try big(4))))
            case 0xDC: return .array(Int(try big(2)))
            case 0xDD: return .array(Int(try big(4)))
            case 0xDE: return .map(Int(try big(2)))
            case 0xDF: return .map(Int(try big(4)))
            case 0xE0...0xFF: return .scalar(.int(Int64(Int8(bitPattern: first))))
            default: throw .invalidByte(first)
            }
        }

        private mutating func string(_ count: Int) throws(ReadError) -> Value {
            let raw = try take(count)
            guard let text = String(validating: raw, as: UTF8.self) else { throw .invalidUTF8 }
            return .string(text)
        }

        private mutating func ext(_ count: Int) throws(ReadError) -> Value {
            let type = Int8(bitPattern: try byte())
            let data = try take(count)
            guard type == -1 else { return .ext(type: type, data: Array(data)) }
            var reader = Reader(data)
            switch count {
            case 4: return .timestamp(seconds: Int64(try reader.big(4)), nanoseconds: 0)
            case 8:
                let both = try reader.big(8)
                guard both >> 34 < 1_000_000_000 else { throw .unexpected("a timestamp's nanoseconds under 10⁹") }
                return .timestamp(seconds: Int64(both & 0x3_FFFF_FFFF), nanoseconds: UInt32(both >> 34))
            case 12:
                let nanoseconds = UInt32(try reader.big(4))
                guard nanoseconds < 1_000_000_000 else { throw .unexpected("a timestamp's nanoseconds under 10⁹") }
                return .timestamp(seconds: Int64(bitPattern: try reader.big(8)), nanoseconds: nanoseconds)
            default: throw .unexpected("a timestamp of 4, 8 or 12 bytes, not \(count)")
            }
        }

        /// The next value, whole; at most `maxContainers` maps and arrays in it (each costs a value and an
        /// allocation: a 4 MiB message of empty maps would cost some 40 times its size).
        public mutating func value(maxContainers: Int = .max) throws(ReadError) -> Value {
            var left = maxContainers
            return try value(depth: 0, containers: &left)
        }

        private mutating func value(depth: Int, containers: inout Int) throws(ReadError) -> Value {
            guard depth < MessagePack.maxDepth else { throw .tooDeep }
            /// One more map or array, within the bound.
            func spend() throws(ReadError) {
                guard containers > 0 else { throw .unexpected("at most so many maps and arrays") }
                containers -= 1
            }
            switch try header() {
            case .scalar(let value): return value
            case .array(let count):
                try spend()
                // Each element takes a byte at least: a count past what is left is a lie, not a reservation.
                guard count <= bytes.count - offset else { throw .truncated }
                var values: [Value] = []
                values.reserveCapacity(Swift.min(count, MessagePack.maxReserved))
                for _ in 0..<count { values.append(try value(depth: depth + 1, containers: &containers)) }
                return .array(values)
            case .map(let count):
                try spend()
                guard count <= (bytes.count - offset) / 2 else { throw .truncated }
                var entries: [Value.Entry] = []
                entries.reserveCapacity(Swift.min(count, MessagePack.maxReserved))
                for _ in 0..<count {
                    let key = try value(depth: depth + 1, containers: &containers)
                    entries.append(Value.Entry(key, try value(depth: depth + 1, containers: &containers)))
                }
                return .map(entries)
            }
        }

        /// Passes over the next value; returns the range of bytes it took.
        @discardableResult
        public mutating func skip() throws(ReadError) -> Range<Int> {
            let start = offset
            var pending = 1
            while pending > 0 {
                pending -= 1
                switch try header() {
                case .scalar: break
                case .array(let count):
                    guard count <= bytes.count - offset else { throw .truncated }
                    pending += count
                case .map(let count):
                    guard count <= (bytes.count - offset) / 2 else { throw .truncated }
                    pending += 2 * count
                }
            }
            return start..<offset
        }

        /// The count of the array that comes next.
        public mutating func arrayCount() throws(ReadError) -> Int {
            guard case .array(let count) = try header() else { throw .unexpected("an array") }
            return count
        }

        /// The count of the map that comes next.
        public mutating func mapCount() throws(ReadError) -> Int {
            guard case .map(let count) = try header() else { throw .unexpected("a map") }
            return count
        }

        /// The next value if it is a string (without decoding anything else).
        public mutating func stringBytes() throws(ReadError) -> UnsafeRawBufferPointer? {
            let start = offset
            let first = try byte()
            let count: Int
            switch first {
            case 0xA0...0xBF: count = Int(first & 0x1F)
            case 0xD9: count = Int(try big(1))
            case 0xDA: count = Int(try big(2))
            case 0xDB: count = Int(try big(4))
            default:
                offset = start
                return nil
            }
            return try take(count)
        }
    }
}

extension MessagePack {
    /// Appends MessagePack to a byte array, each value in its shortest form.
    public struct Writer {
        public var bytes: [UInt8]

        public init(capacity: Int = 64) {
            bytes = []
            bytes.reserveCapacity(capacity)
        }

        private mutating func big(_ value: UInt64, _ count: Int) {
            for shift in stride(from: (count - 1) * 8, through: 0, by: -8) { bytes.append(UInt8(truncatingIfNeeded: value >> UInt64(shift))) }
        }

        /// A length's header in the shortest of a type's forms: the fixed form (`fixed` with the count in
        /// its low bits, below `fixedLimit`), then 8-, 16- and 32-bit counts after their markers.
        private mutating func header(_ count: Int, fixed: UInt8?, fixedLimit: Int = 0, eight: UInt8?, sixteen: UInt8, thirtyTwo: UInt8) {
            if let fixed, count < fixedLimit {
                bytes.append(fixed | UInt8(count))
            } else if let eight, count < 256 {
                bytes += [eight, UInt8(count)]
            } else if count < 65_536 {
                bytes.append(sixteen)
                big(UInt64(count), 2)
            } else {
                bytes.append(thirtyTwo)
                big(UInt64(count), 4)
            }
        }

        public mutating func arrayHeader(_ count: Int) {
            header(count, fixed: 0x90, fixedLimit: 16, eight: nil, sixteen: 0xDC, thirtyTwo: 0xDD)
        }

        public mutating func mapHeader(_ count: Int) {
            header(count, fixed: 0x80, fixedLimit: 16, eight: nil, sixteen: 0xDE, thirtyTwo: 0xDF)
        }

        public mutating func string(_ text: String) {
            header(text.utf8.count, fixed: 0xA0, fixedLimit: 32, eight: 0xD9, sixteen: 0xDA, thirtyTwo: 0xDB)
            bytes += text.utf8
        }

        public mutating func int(_ value: Int64) {
            switch value {
            case 0...0x7F: bytes.append(UInt8(value))
            case -32..<0: bytes.append(UInt8(bitPattern: Int8(value)))
            case 0x80...0xFF: bytes += [0xCC, UInt8(value)]
            case 0x100...0xFFFF:
                bytes.append(0xCD)
                big(UInt64(value), 2)
            case 0x1_0000...0xFFFF_FFFF:
                bytes.append(0xCE)
                big(UInt64(value), 4)
            case Int64(Int8.min)..<(-32): bytes += [0xD0, UInt8(bitPattern: Int8(value))]
            case Int64(Int16.min)..<Int64(Int8.min):
                bytes.append(0xD1)
                big(UInt64(UInt16(bitPattern: Int16(value))), 2)
            case Int64(Int32.min)..<Int64(Int16.min):
                bytes.append(0xD2)
                big(UInt64(UInt32(bitPattern: Int32(value))), 4)
            default:
                bytes.append(value > 0 ? 0xCF : 0xD3)
                big(UInt64(bitPattern: value), 8)
            }
        }

        public mutating func double(_ value: Double) {
            bytes.append(0xCB)
            big(value.bitPattern, 8)
        }

        /// The timestamp extension (type −1), in its shortest form.
        public mutating func timestamp(seconds: Int64, nanoseconds: UInt32) {
            if seconds >= 0, seconds >> 34 == 0 {
                if nanoseconds == 0, seconds <= 0xFFFF_FFFF {
                    bytes += [0xD6, 0xFF]
                    big(UInt64(seconds), 4)
                } else {
                    bytes += [0xD7, 0xFF]
                    big(UInt64(nanoseconds) << 34 | UInt64(seconds), 8)
                }
            } else {
                bytes += [0xC7, 12, 0xFF]
                big(UInt64(nanoseconds), 4)
                big(UInt64(bitPattern: seconds), 8)
            }
        }

        /// Bytes that already are one MessagePack value (an event as it came).
        public mutating func raw(_ value: some Sequence<UInt8>) { bytes += value }

        public mutating func value(_ value: Value) {
            switch value {
            case .null: bytes.append(0xC0)
            case .bool(let flag): bytes.append(flag ? 0xC3 : 0xC2)
            case .int(let number): int(number)
            case .uint(let number):
                if number <= UInt64(Int64.max) {
                    int(Int64(number))
                } else {
                    bytes.append(0xCF)
                    big(number, 8)
                }
            case .double(let number): double(number)
            case .string(let text): string(text)
            case .binary(let data):
                header(data.count, fixed: nil, eight: 0xC4, sixteen: 0xC5, thirtyTwo: 0xC6)
                bytes += data
            case .array(let values):
                arrayHeader(values.count)
                for element in values { self.value(element) }
            case .map(let entries):
                mapHeader(entries.count)
                for entry in entries {
                    self.value(entry.key)
                    self.value(entry.value)
                }
            case .timestamp(let seconds, let nanoseconds): timestamp(seconds: seconds, nanoseconds: nanoseconds)
            case .ext(let type, let data):
                switch data.count {
                case 1: bytes.append(0xD4)
                case 2: bytes.append(0xD5)
                case 4: bytes.append(0xD6)
                case 8: bytes.append(0xD7)
                case 16: bytes.append(0xD8)
                default: header(data.count, fixed: nil, eight: 0xC7, sixteen: 0xC8, thirtyTwo: 0xC9)
                }
                bytes.append(UInt8(bitPattern: type))
                bytes += data
            }
        }
    }

    /// One value's bytes.
    public static func encode(_ value: Value) -> [UInt8] {
        var writer = Writer()
        writer.value(value)
        return writer.bytes
    }

    /// The one value `bytes` hold (nothing may follow it), with at most `maxContainers` maps and arrays.
    public static func decode(_ bytes: some Collection<UInt8>, maxContainers: Int = .max) throws(ReadError) -> Value {
        let copy = Array(bytes)
        let result = copy.withUnsafeBytes { (raw: UnsafeRawBufferPointer) -> Result<Value, ReadError> in
            var reader = Reader(raw)
            do throws(ReadError) {
                let value = try reader.value(maxContainers: maxContainers)
                guard reader.isAtEnd else { return .failure(.unexpected("one value, not \(raw.count - reader.offset) more bytes after it")) }
                return .success(value)
            } catch {
                return .failure(error)
            }
        }
        return try result.get()
    }
}
