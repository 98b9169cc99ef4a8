/// With no client keys the relay listens on loopback and answers anyone who reaches it, so a web page
/// of another site the user opens must not: a browser sends a page's `Origin` with every cross-origin
/// request and WebSocket upgrade (which CORS does not guard), and a site's name rebound to 127.0.0.1
/// arrives with that site's `Host`. A request is refused when its `Host` names no loopback address, its
/// `Origin` is of no loopback host (`null` included: a sandboxed or local file's page), or the browser
/// says another site's page made a request that carries no `Origin` (`Sec-Fetch-Site: cross-site`).
/// Pages served on this machine (the relay's own, a local app's) and clients other than browsers (no
/// `Origin`, or one of the loopback address they dialled) pass. With client keys a page would need a key: nothing is
/// checked.
enum LoopbackOrigin {
    /// Why a request with these headers is refused (`nil`: it is not).
    static func problem(host: String?, origin: String?, fetchSite: String? = nil) -> String? {
        // A browser's request made by a page of another site that carries no `Origin` (an image, a
        // script, a link followed: they would spend the vendor's quota through the gateway). With an
        // `Origin` that one judges: a browser counts `localhost` and 127.0.0.1 as different sites.
        if origin == nil, fetchSite?.lowercased() == "cross-site" {
            return "a page of another site may not use this relay (Sec-Fetch-Site: cross-site): with no client keys, only pages on this machine may; configure client keys to serve others"
        }
        if let host, !isLoopback(authority: host) {
            return "Host \(quoted(host)) is not this relay's loopback address (with no client keys, only loopback names are served)"
        }
        guard let origin else { return nil }
        let authority = origin.range(of: "://").map { String(origin[$0.upperBound...].prefix { $0 != "/" }) }
        guard let authority, isLoopback(authority: authority) else {
            return "a page of another origin (\(quoted(origin))) may not use this relay: with no client keys, only pages on this machine may; configure client keys to serve others"
        }
        return nil
    }

    /// Whether `authority` (`host[:port]`, an IPv6 address in brackets) names a loopback address, as a
    /// listen address is judged loopback (``ClientAuthentication/isLoopback(_:)``).
    static func isLoopback(authority: String) -> Bool {
        var host = Substring(authority)
        if host.hasPrefix("[") {
            guard let end = host.firstIndex(of: "]") else { return false }
            host = host[host.startIndex...end]
        } else if let colon = host.lastIndex(of: ":") {
            host = host[..<colon]
        }
        return ClientAuthentication.isLoopback(String(host))
    }

    /// At most 100 visible characters of a header, quoted.
    private static func quoted(_ text: String) -> String {
        "\"" + String(text.unicodeScalars.prefix(100).map { $0.properties.isWhitespace || $0.value < 0x20 || $0.value == 0x7F ? " " : Character($0) }) + "\""
    }
}
