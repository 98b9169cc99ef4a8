/// Errors the upstream client reports to its owner.
public enum UpstreamError: Error, Sendable, CustomStringConvertible {
    case contextCreationFailed
    case invalidURL(String)

    public var description: String {
        switch self {
        case .contextCreationFailed: "libwebsockets could not create its context (TLS setup or CA file?)"
        case .invalidURL(let url): "not a ws:// or wss:// URL: \(url)"
        }
    }
}
