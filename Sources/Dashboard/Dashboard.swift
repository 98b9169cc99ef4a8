import Crypto
import Foundation

/// The web dashboard's files: plain HTML, CSS and JavaScript modules written for the relay, embedded
/// in the binary (no build step, no CDN: the page works with the relay offline).
///
/// Every asset is served under `/ui/<version>/`, where the version is a hash of all the files, so a
/// new build's page never runs an old cached script; `index.html` (served at `/`) is never cached
/// and names the current version. For work on the page itself, `directory` serves the files from
/// disk instead, read at each request (`RELAY_DASHBOARD_DIR`). `Sendable`, a value type.
public struct Dashboard: Sendable {
    public struct Asset: Sendable {
        public let bytes: [UInt8]
        public let contentType: String
    }

    /// The hash of the embedded files (12 hex digits).
    public let version: String
    private let embedded: [String: [UInt8]]
    private let directory: String?

    static let names: [(String, [UInt8])] = [
        ("index.html", PackageResources.index_html),
        ("style.css", PackageResources.style_css),
        ("icon.svg", PackageResources.icon_svg),
        ("app.js", PackageResources.app_js),
        ("api.js", PackageResources.api_js),
        ("charts.js", PackageResources.charts_js),
        ("overview.js", PackageResources.overview_js),
        ("quotes.js", PackageResources.quotes_js),
        ("portfolio.js", PackageResources.portfolio_js),
        ("security.js", PackageResources.security_js),
    ]

    public init(directory: String? = nil) {
        var files: [String: [UInt8]] = [:]
        var hash = SHA256()
        for (name, bytes) in Self.names {
            files[name] = bytes
            hash.update(data: Array(name.utf8))
            hash.update(data: bytes)
        }
        self.embedded = files
        self.directory = directory
        self.version = hash.finalize().prefix(6).map { String(format: "%02x", $0) }.joined()
    }

    /// The prefix every asset is served under.
    public var assetPrefix: String { "/ui/\(version)/" }

    /// The page: `index.html` with `{{assets}}` replaced by the versioned prefix and `{{keys}}` by
    /// `required` when the relay asks for client keys (so the page asks for one before any call).
    public func page(keysRequired: Bool) -> Asset? {
        guard let bytes = bytes(of: "index.html") else { return nil }
        let text = String(decoding: bytes, as: UTF8.self).replacingOccurrences(of: "{{assets}}", with: assetPrefix)
            .replacingOccurrences(of: "{{keys}}", with: keysRequired ? "required" : "none")
        return Asset(bytes: Array(text.utf8), contentType: "text/html; charset=utf-8")
    }

    /// An asset by its file name (no paths: `app.js`).
    public func asset(_ name: String) -> Asset? {
        guard name != "index.html", let bytes = bytes(of: name) else { return nil }
        return Asset(bytes: bytes, contentType: Self.contentType(of: name))
    }

    private func bytes(of name: String) -> [UInt8]? {
        guard let known = embedded[name] else { return nil }
        guard let directory else { return known }
        return FileManager.default.contents(atPath: directory + "/" + name).map { Array($0) } ?? known
    }

    static func contentType(of name: String) -> String {
        switch name.split(separator: ".").last {
        case "js": "text/javascript; charset=utf-8"
        case "css": "text/css; charset=utf-8"
        case "svg": "image/svg+xml"
        case "html": "text/html; charset=utf-8"
        default: "application/octet-stream"
        }
    }
}
