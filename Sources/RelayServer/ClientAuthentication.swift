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

    /// Whether a host names only this machine.
    public static func isLoopback(_ host: String) -> Bool {
        let host = host.lowercased()
        return host == "localhost" || host == "::1" || host == "[::1]" || host.hasPrefix("127.")
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
