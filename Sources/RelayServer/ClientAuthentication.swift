#if canImport(Glibc)
    import Glibc
#endif

import MarketCore

/// Which keys downstream clients may authenticate with, and what each may do: the relay's own client
/// keys, never the upstream key. Value type, `Sendable`.
public enum ClientAuthentication: Sendable, Equatable {
    /// Only these keys are accepted.
    case keys([ClientKey])
    /// Any non-empty key is accepted, with every right: only allowed when the relay listens on loopback.
    case anyKeyOnLoopback

    /// Whether a client must present one of the configured keys.
    public var requiresKeys: Bool {
        if case .keys = self { true } else { false }
    }

    /// Why the relay refuses to start with this configuration.
    public struct RefusedError: Error, Sendable, CustomStringConvertible {
        public var host: String
        /// What is wrong with the keys themselves (`nil`: there are none, and `host` is no loopback address).
        public var problem: String?
        public var description: String {
            problem
                ?? "refusing to listen on \(host) without client keys: anyone who can reach it could read the feed. "
                + "Set --client-keys (or RELAY_CLIENT_KEYS, or client.keys in the config file), or listen on 127.0.0.1."
        }
    }

    /// The policy for plain keys (full rights each, named `key-1`, `key-2`, … in logs) and keys with
    /// rights, and a listen address. With no keys, any key is accepted on a loopback address and the
    /// relay refuses to start on any other. A key that is not one (`sha256:` and no digest) is refused,
    /// never left out (were it the only one, any key would be accepted), and so are two keys with the
    /// same secret (a client presenting it would get one of their rights, not the one meant).
    public static func resolve(keys: [String], withRights: [ClientKey] = [], listenHost: String) throws(RefusedError)
        -> ClientAuthentication
    {
        var all = withRights
        var seen = Set<String>()
        // A key's name is its identity (connection limits, topic budgets, tagged sessions are counted by
        // it): a plain key's never repeats a named key's (`key-1` named in the file makes the first plain
        // key `key-2`).
        var names = Set(withRights.map(\.name))
        var number = 0
        for key in keys.map({ String($0.trimmingWhitespaceASCII()) }) where !key.isEmpty && seen.insert(key).inserted {
            repeat { number += 1 } while names.contains("key-\(number)")
            names.insert("key-\(number)")
            do {
                all.append(try ClientKey(name: "key-\(number)", secret: key))
            } catch {
                throw RefusedError(host: listenHost, problem: "client.keys: \(error)")
            }
        }
        var holders: [[UInt8]: String] = [:]
        for key in all {
            if let other = holders.updateValue(key.name, forKey: key.digest) {
                throw RefusedError(
                    host: listenHost,
                    problem: "client.keys: \(other) and \(key.name) are the same key; every key must be different (a client presenting it would get the rights of one of them)")
            }
        }
        if !all.isEmpty { return .keys(all) }
        guard isLoopback(listenHost) else { throw RefusedError(host: listenHost) }
        return .anyKeyOnLoopback
    }

    /// The configured key a client presented, if any. Hashes the presented key once and compares it
    /// with every configured digest in constant time, whichever matches.
    public func identify(_ presented: String) -> ClientKey? {
        guard case .keys(let keys) = self, !presented.isEmpty else { return nil }
        let digest = ClientKey.digest(of: presented)
        var found: ClientKey?
        for key in keys where Self.constantTimeEquals(key.digest, digest) { found = key }
        return found
    }

    /// What a presented key may do on the Polygon WebSocket; `nil` when it is not accepted.
    public func grant(for presented: String) -> ClientGrant? {
        switch self {
        case .anyKeyOnLoopback: presented.isEmpty ? nil : ClientGrant(name: "loopback")
        case .keys: identify(presented)?.grant
        }
    }

    /// Whether a client key is accepted.
    public func accepts(_ key: String) -> Bool { grant(for: key) != nil }

    /// Compares two digests of equal length without stopping at the first difference.
    static func constantTimeEquals(_ x: [UInt8], _ y: [UInt8]) -> Bool {
        guard x.count == y.count else { return false }
        var difference: UInt8 = 0
        for index in x.indices { difference |= x[index] ^ y[index] }
        return difference == 0
    }

    /// Whether a host names only this machine: `localhost`, an IPv4 address in 127.0.0.0/8, or IPv6
    /// `::1` (also IPv4-mapped loopback), decided by parsing the address — `127.example.com` is not.
    public static func isLoopback(_ host: String) -> Bool {
        var host = host.lowercased()
        if host.hasPrefix("["), host.hasSuffix("]") { host = String(host.dropFirst().dropLast()) }
        if host == "localhost" { return true }
        var v4 = in_addr()
        if inet_pton(AF_INET, host, &v4) == 1 {
            return UInt32(bigEndian: v4.s_addr) >> 24 == 127
        }
        var v6 = in6_addr()
        if inet_pton(AF_INET6, host, &v6) == 1 {
            let bytes = withUnsafeBytes(of: &v6) { Array($0) }
            if bytes[0..<15].allSatisfy({ $0 == 0 }), bytes[15] == 1 { return true }
            // ::ffff:127.x.y.z
            if bytes[0..<10].allSatisfy({ $0 == 0 }), bytes[10] == 0xFF, bytes[11] == 0xFF { return bytes[12] == 127 }
        }
        return false
    }

}

extension String {
    func trimmingWhitespaceASCII() -> Substring {
        var slice = self[...]
        while let first = slice.first, first.isWhitespace { slice = slice.dropFirst() }
        while let last = slice.last, last.isWhitespace { slice = slice.dropLast() }
        return slice
    }
}
