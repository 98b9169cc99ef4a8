import Crypto
import Foundation

/// NATS NKeys, as far as the relay needs them: the public key of a user seed (libnats signs with the
/// seed file itself but must be told the public key). Pure functions, `Sendable`.
///
/// An NKey is base32 (RFC 4648, no padding) of a prefix, the key bytes and a CRC-16 (XMODEM, little
/// endian). A user's public key has the prefix `U` (20 << 3); its seed starts `SU`: the seed prefix
/// (18 << 3) and the user prefix spread over two bytes, then the 32-byte Ed25519 seed.
public enum NKey {
    static let seedPrefix: UInt8 = 18 << 3
    static let userPrefix: UInt8 = 20 << 3

    /// The user public key (`U…`) of the seed in `file` (the first line that starts with `SU`).
    public static func publicKey(fromSeedFile file: String) throws(NKeyError) -> String {
        guard let text = try? String(contentsOfFile: file, encoding: .utf8) else { throw .unreadable }
        guard
            let line = text.split(whereSeparator: \.isNewline).map({ $0.trimmingCharacters(in: .whitespaces) }).first(where: {
                $0.hasPrefix("SU")
            })
        else { throw .noUserSeed }
        return try publicKey(fromSeed: line)
    }

    public static func publicKey(fromSeed seed: String) throws(NKeyError) -> String {
        guard let raw = base32Decode(seed), raw.count == 2 + 32 + 2 else { throw .malformed }
        let body = Array(raw[0..<34])
        guard crc16(body) == UInt16(raw[34]) | UInt16(raw[35]) << 8 else { throw .malformed }
        guard raw[0] & 0xF8 == seedPrefix, (raw[0] & 0x07) << 5 | (raw[1] & 0xF8) >> 3 == userPrefix else { throw .noUserSeed }
        guard let key = try? Curve25519.Signing.PrivateKey(rawRepresentation: body[2...]) else { throw .malformed }
        return encode(prefix: [userPrefix], key.publicKey.rawRepresentation)
    }

    /// A user seed (`SU…`) for 32 seed bytes (tests make keys with it).
    public static func userSeed(_ bytes: some Collection<UInt8>) -> String {
        encode(prefix: [seedPrefix | userPrefix >> 5, (userPrefix & 0x1F) << 3], bytes)
    }

    static func encode(prefix: [UInt8], _ key: some Collection<UInt8>) -> String {
        let body = prefix + Array(key)
        let crc = crc16(body)
        return base32Encode(body + [UInt8(crc & 0xFF), UInt8(crc >> 8)])
    }

    static func crc16(_ bytes: [UInt8]) -> UInt16 {
        var crc: UInt16 = 0
        for byte in bytes {
            crc ^= UInt16(byte) << 8
            for _ in 0..<8 { crc = crc & 0x8000 != 0 ? (crc << 1) ^ 0x1021 : crc << 1 }
        }
        return crc
    }

    private static let alphabet = Array("ABCDEFGHIJKLMNOPQRSTUVWXYZ234567".utf8)

    static func base32Encode(_ bytes: [UInt8]) -> String {
        var out: [UInt8] = []
        var buffer: UInt32 = 0
        var bits = 0
        for byte in bytes {
            buffer = buffer << 8 | UInt32(byte)
            bits += 8
            while bits >= 5 {
                out.append(alphabet[Int(buffer >> UInt32(bits - 5) & 0x1F)])
                bits -= 5
            }
        }
        if bits > 0 { out.append(alphabet[Int(buffer << UInt32(5 - bits) & 0x1F)]) }
        return String(decoding: out, as: UTF8.self)
    }

    static func base32Decode(_ text: String) -> [UInt8]? {
        var out: [UInt8] = []
        var buffer: UInt32 = 0
        var bits = 0
        for character in text.utf8 {
            guard let value = alphabet.firstIndex(of: character) else { return nil }
            buffer = buffer << 5 | UInt32(value)
            bits += 5
            if bits >= 8 {
                out.append(UInt8(buffer >> UInt32(bits - 8) & 0xFF))
                bits -= 8
            }
        }
        return out
    }
}

/// Why an NKey seed file cannot be used.
public enum NKeyError: Error, Sendable, CustomStringConvertible {
    case unreadable, noUserSeed, malformed

    public var description: String {
        switch self {
        case .unreadable: "cannot be read"
        case .noUserSeed: "holds no user seed (a line starting SU)"
        case .malformed: "the seed is not a valid NKey"
        }
    }
}
