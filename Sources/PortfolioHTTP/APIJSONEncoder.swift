import Foundation
import PortfolioDomain

/// The API's one JSON encoding, for every model it answers with: `Encodable` values written with
/// sorted keys, every `Decimal` as a string of its exact decimal text (`"189.05"`, never a binary
/// floating-point number a client could round), every `Date` in ISO 8601 (`2025-01-02T15:04:05Z`).
/// Absent optionals are omitted, as `JSONEncoder` does.
///
/// `JSONEncoder` has no strategy for `Decimal`, which is why this exists: the models conform to plain
/// `Encodable` and this encoder writes them, instead of a hand-written string-typed copy of each model.
struct APIJSONEncoder: Sendable {
    struct Failure: Error, CustomStringConvertible {
        var description: String
    }

    func encode(_ value: some Encodable) throws -> Data {
        let root = Node()
        try Node.put(value, into: root, path: [])
        var out: [UInt8] = []
        out.reserveCapacity(1024)
        root.write(to: &out)
        return Data(out)
    }
}

/// One value of the tree being built. A class so that a container handed out earlier keeps writing
/// into its place after the caller has moved on (how `Encoder` containers work).
private final class Node {
    enum Kind { case unset, scalar, array, object }

    var kind = Kind.unset
    /// Already JSON text (`scalar`): a number, `true`, `false`, `null` or a quoted string.
    var text: [UInt8] = []
    var items: [Node] = []
    var members: [String: Node] = [:]

    func setScalar(_ text: [UInt8]) { (kind, self.text) = (.scalar, text) }

    func becomeObject() { if kind != .object { (kind, members) = (.object, [:]) } }
    func becomeArray() { if kind != .array { (kind, items) = (.array, []) } }

    func member(_ key: String) -> Node {
        becomeObject()
        let child = Node()
        members[key] = child
        return child
    }

    func appended() -> Node {
        becomeArray()
        let child = Node()
        items.append(child)
        return child
    }

    static func put<T: Encodable>(_ value: T, into node: Node, path: [any CodingKey]) throws {
        switch value {
        case let decimal as Decimal: node.setScalar(quoted(DecimalText.format(decimal)))
        case let date as Date: node.setScalar(quoted(date.formatted(.iso8601)))
        default: try value.encode(to: TreeEncoder(node: node, codingPath: path))
        }
    }

    static func quoted(_ text: String) -> [UInt8] {
        var out: [UInt8] = [UInt8(ascii: "\"")]
        for byte in text.utf8 {
            switch byte {
            case UInt8(ascii: "\""): out += [UInt8(ascii: "\\"), UInt8(ascii: "\"")]
            case UInt8(ascii: "\\"): out += [UInt8(ascii: "\\"), UInt8(ascii: "\\")]
            case UInt8(ascii: "\n"): out += [UInt8(ascii: "\\"), UInt8(ascii: "n")]
            case UInt8(ascii: "\r"): out += [UInt8(ascii: "\\"), UInt8(ascii: "r")]
            case UInt8(ascii: "\t"): out += [UInt8(ascii: "\\"), UInt8(ascii: "t")]
            case 0..<0x20:
                let hex = Array("0123456789abcdef".utf8)
                out += Array(#"\u00"#.utf8) + [hex[Int(byte >> 4)], hex[Int(byte & 0xF)]]
            default: out.append(byte)
            }
        }
        out.append(UInt8(ascii: "\""))
        return out
    }

    func write(to out: inout [UInt8]) {
        switch kind {
        case .unset: out += Array("{}".utf8)
        case .scalar: out += text
        case .array:
            out.append(UInt8(ascii: "["))
            for (index, item) in items.enumerated() {
                if index > 0 { out.append(UInt8(ascii: ",")) }
                item.write(to: &out)
            }
            out.append(UInt8(ascii: "]"))
        case .object:
            out.append(UInt8(ascii: "{"))
            for (index, key) in members.keys.sorted().enumerated() {
                if index > 0 { out.append(UInt8(ascii: ",")) }
                out += Node.quoted(key)
                out.append(UInt8(ascii: ":"))
                members[key]?.write(to: &out)
            }
            out.append(UInt8(ascii: "}"))
        }
    }
}

private struct TreeEncoder: Encoder {
    let node: Node
    let codingPath: [any CodingKey]
    var userInfo: [CodingUserInfoKey: Any] { [:] }

    func container<Key: CodingKey>(keyedBy type: Key.Type) -> KeyedEncodingContainer<Key> {
        // A second request (a type adding keys after another's encode(to:)) keeps what is there.
        node.becomeObject()
        return KeyedEncodingContainer(KeyedContainer<Key>(node: node, codingPath: codingPath))
    }

    func unkeyedContainer() -> any UnkeyedEncodingContainer {
        node.becomeArray()
        return UnkeyedContainer(node: node, codingPath: codingPath)
    }

    func singleValueContainer() -> any SingleValueEncodingContainer {
        SingleContainer(node: node, codingPath: codingPath)
    }
}

/// JSON text of the standard library's scalars.
private func scalar(_ value: some Encodable & CustomStringConvertible) -> [UInt8] { Array(value.description.utf8) }

private func scalar(_ value: Double, path: [any CodingKey]) throws -> [UInt8] {
    guard value.isFinite else {
        throw EncodingError.invalidValue(value, .init(codingPath: path, debugDescription: "not a finite number"))
    }
    return Array(value.description.utf8)
}

private struct KeyedContainer<Key: CodingKey>: KeyedEncodingContainerProtocol {
    let node: Node
    let codingPath: [any CodingKey]

    private func child(_ key: Key) -> Node { node.member(key.stringValue) }
    private func set(_ text: [UInt8], _ key: Key) { child(key).setScalar(text) }

    mutating func encodeNil(forKey key: Key) throws { set(Array("null".utf8), key) }
    mutating func encode(_ value: Bool, forKey key: Key) throws { set(scalar(value), key) }
    mutating func encode(_ value: String, forKey key: Key) throws { set(Node.quoted(value), key) }
    mutating func encode(_ value: Double, forKey key: Key) throws { set(try scalar(value, path: codingPath + [key]), key) }
    mutating func encode(_ value: Float, forKey key: Key) throws { set(try scalar(Double(value), path: codingPath + [key]), key) }
    mutating func encode(_ value: Int, forKey key: Key) throws { set(scalar(value), key) }
    mutating func encode(_ value: Int8, forKey key: Key) throws { set(scalar(value), key) }
    mutating func encode(_ value: Int16, forKey key: Key) throws { set(scalar(value), key) }
    mutating func encode(_ value: Int32, forKey key: Key) throws { set(scalar(value), key) }
    mutating func encode(_ value: Int64, forKey key: Key) throws { set(scalar(value), key) }
    mutating func encode(_ value: UInt, forKey key: Key) throws { set(scalar(value), key) }
    mutating func encode(_ value: UInt8, forKey key: Key) throws { set(scalar(value), key) }
    mutating func encode(_ value: UInt16, forKey key: Key) throws { set(scalar(value), key) }
    mutating func encode(_ value: UInt32, forKey key: Key) throws { set(scalar(value), key) }
    mutating func encode(_ value: UInt64, forKey key: Key) throws { set(scalar(value), key) }
    mutating func encode<T: Encodable>(_ value: T, forKey key: Key) throws {
        try Node.put(value, into: child(key), path: codingPath + [key])
    }

    mutating func nestedContainer<NestedKey: CodingKey>(
        keyedBy keyType: NestedKey.Type, forKey key: Key
    ) -> KeyedEncodingContainer<NestedKey> {
        TreeEncoder(node: child(key), codingPath: codingPath + [key]).container(keyedBy: keyType)
    }

    mutating func nestedUnkeyedContainer(forKey key: Key) -> any UnkeyedEncodingContainer {
        TreeEncoder(node: child(key), codingPath: codingPath + [key]).unkeyedContainer()
    }

    mutating func superEncoder() -> any Encoder { TreeEncoder(node: node.member("super"), codingPath: codingPath) }

    mutating func superEncoder(forKey key: Key) -> any Encoder { TreeEncoder(node: child(key), codingPath: codingPath + [key]) }
}

private struct IndexKey: CodingKey {
    var intValue: Int?
    var stringValue: String { "\(intValue ?? 0)" }
    init(intValue: Int) { self.intValue = intValue }
    init?(stringValue: String) { nil }
}

private struct UnkeyedContainer: UnkeyedEncodingContainer {
    let node: Node
    let codingPath: [any CodingKey]

    var count: Int { node.items.count }
    private func next() -> Node { node.appended() }

    private var nextPath: [any CodingKey] { codingPath + [IndexKey(intValue: count)] }
    private func add(_ text: [UInt8]) { next().setScalar(text) }

    mutating func encodeNil() throws { add(Array("null".utf8)) }
    mutating func encode(_ value: Bool) throws { add(scalar(value)) }
    mutating func encode(_ value: String) throws { add(Node.quoted(value)) }
    mutating func encode(_ value: Double) throws { add(try scalar(value, path: nextPath)) }
    mutating func encode(_ value: Float) throws { add(try scalar(Double(value), path: nextPath)) }
    mutating func encode(_ value: Int) throws { add(scalar(value)) }
    mutating func encode(_ value: Int8) throws { add(scalar(value)) }
    mutating func encode(_ value: Int16) throws { add(scalar(value)) }
    mutating func encode(_ value: Int32) throws { add(scalar(value)) }
    mutating func encode(_ value: Int64) throws { add(scalar(value)) }
    mutating func encode(_ value: UInt) throws { add(scalar(value)) }
    mutating func encode(_ value: UInt8) throws { add(scalar(value)) }
    mutating func encode(_ value: UInt16) throws { add(scalar(value)) }
    mutating func encode(_ value: UInt32) throws { add(scalar(value)) }
    mutating func encode(_ value: UInt64) throws { add(scalar(value)) }
    mutating func encode<T: Encodable>(_ value: T) throws {
        let path = nextPath
        try Node.put(value, into: next(), path: path)
    }

    mutating func nestedContainer<NestedKey: CodingKey>(keyedBy keyType: NestedKey.Type) -> KeyedEncodingContainer<NestedKey> {
        let path = nextPath
        return TreeEncoder(node: next(), codingPath: path).container(keyedBy: keyType)
    }

    mutating func nestedUnkeyedContainer() -> any UnkeyedEncodingContainer {
        let path = nextPath
        return TreeEncoder(node: next(), codingPath: path).unkeyedContainer()
    }

    mutating func superEncoder() -> any Encoder {
        let path = nextPath
        return TreeEncoder(node: next(), codingPath: path)
    }
}

private struct SingleContainer: SingleValueEncodingContainer {
    let node: Node
    let codingPath: [any CodingKey]

    private func set(_ text: [UInt8]) { node.setScalar(text) }

    mutating func encodeNil() throws { set(Array("null".utf8)) }
    mutating func encode(_ value: Bool) throws { set(scalar(value)) }
    mutating func encode(_ value: String) throws { set(Node.quoted(value)) }
    mutating func encode(_ value: Double) throws { set(try scalar(value, path: codingPath)) }
    mutating func encode(_ value: Float) throws { set(try scalar(Double(value), path: codingPath)) }
    mutating func encode(_ value: Int) throws { set(scalar(value)) }
    mutating func encode(_ value: Int8) throws { set(scalar(value)) }
    mutating func encode(_ value: Int16) throws { set(scalar(value)) }
    mutating func encode(_ value: Int32) throws { set(scalar(value)) }
    mutating func encode(_ value: Int64) throws { set(scalar(value)) }
    mutating func encode(_ value: UInt) throws { set(scalar(value)) }
    mutating func encode(_ value: UInt8) throws { set(scalar(value)) }
    mutating func encode(_ value: UInt16) throws { set(scalar(value)) }
    mutating func encode(_ value: UInt32) throws { set(scalar(value)) }
    mutating func encode(_ value: UInt64) throws { set(scalar(value)) }
    mutating func encode<T: Encodable>(_ value: T) throws { try Node.put(value, into: node, path: codingPath) }
}
