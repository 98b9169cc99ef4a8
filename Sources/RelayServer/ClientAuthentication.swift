#if canImport(Glibc)
    import Glibc
#endif

/// Which keys downstream clients may authenticate with: the relay's own client keys, never the
/// upstream key. Value type, `Sendable`.
public enum ClientAuthentication: Sendable, Equatable {
    /// Only these keys are accepted.
    case keys(Set<String>)
    /// Any non-empty key is accepted: only allowed when the relay listens on loopback.
    case anyKeyOnLoopback

    /// Why the relay refuses to start with this configuration.
    public struct RefusedError: Error, Sendable, CustomStringConvertible {
        public var host: String
        public var description: String {
            "refusing to listen on \(host) without client keys: anyone who can reach it could read the feed. "
                + "Set --client-keys (or RELAY_CLIENT_KEYS, or client.keys in the config file), or listen on 127.0.0.1."
        }
    }

    /// The policy for a set of configured keys and a listen address. With no keys, any key is accepted
    /// on a loopback address and the relay refuses to start on any other.
    public static func resolve(keys: [String], listenHost: String) throws(RefusedError) -> ClientAuthentication {
        let cleaned = Set(keys.map { String($0.trimmingWhitespaceASCII()) }.filter { !$0.isEmpty })
        if !cleaned.isEmpty { return .keys(cleaned) }
        guard isLoopback(listenHost) else { throw RefusedError(host: listenHost) }
        return .anyKeyOnLoopback
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

    /// Whether a client key is accepted. Compares in time independent of where keys differ.
    public func accepts(_ key: String) -> Bool {
        switch self {
        case .anyKeyOnLoopback:
            return !key.isEmpty
        case .keys(let keys):
            var found = false
            for candidate in keys where Self.constantTimeEquals(candidate, key) { found = true }
            return found
        }
    }

    static func constantTimeEquals(_ a: String, _ b: String) -> Bool {
        let x = Array(a.utf8)
        let y = Array(b.utf8)
        var difference = UInt8(truncatingIfNeeded: x.count ^ y.count)
        for index in 0..<max(x.count, y.count) {
            let p = index < x.count ? x[index] : 0
            let q = index < y.count ? y[index] : 0
            difference |= p ^ q
        }
        return difference == 0
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
