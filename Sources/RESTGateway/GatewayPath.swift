import Foundation

/// A request's path and query checked once for every vendor: one plain path on the vendor's host, the
/// client's key left out, parameters in a fixed order.
public enum GatewayPath {
    /// The path's segments, decoded; refused: anything that is not one plain path on the vendor's host
    /// (`//`, `..`, an encoded `/` or `\`, control characters, an absolute URL).
    public static func segments(of path: String) -> Result<[String], GatewayProblem> {
        guard path.hasPrefix("/"), !path.hasPrefix("//"), !path.contains("\\"), path.utf8.count <= 2048 else {
            return .failure(.badRequest("not a path of the vendor's REST API: \(path.prefix(100))"))
        }
        let lowered = path.lowercased()
        guard !lowered.contains("%2f"), !lowered.contains("%5c"), !lowered.contains("%00") else {
            return .failure(.badRequest("an encoded / or \\ is not allowed in a path"))
        }
        var segments: [String] = []
        for raw in path.dropFirst().split(separator: "/", omittingEmptySubsequences: false) {
            guard let decoded = raw.removingPercentEncoding, !decoded.isEmpty, decoded != ".", decoded != "..",
                decoded.unicodeScalars.allSatisfy({ $0.value > 0x20 && $0.value != 0x7F && $0 != "?" && $0 != "#" && $0 != "@" })
            else {
                return .failure(.badRequest("not a path of the vendor's REST API: \(path.prefix(100))"))
            }
            segments.append(decoded)
        }
        return .success(segments)
    }

    /// The query without the client's key, every name checked, in a fixed order (so identical requests
    /// are one cache entry and one flight).
    public static func checkedQuery(_ query: [(name: String, value: String)]) -> Result<[(name: String, value: String)], GatewayProblem> {
        var kept: [(name: String, value: String)] = []
        for item in query where item.name != "apiKey" {
            guard !item.name.isEmpty, item.name.utf8.count <= 64,
                item.name.unicodeScalars.allSatisfy({ CharacterSet.alphanumerics.contains($0) || $0 == "." || $0 == "_" })
            else { return .failure(.badRequest("query parameter \"\(item.name.prefix(64))\" is not one of the API's")) }
            guard item.value.utf8.count <= 4096 else { return .failure(.badRequest("query parameter \(item.name): longer than 4096 bytes")) }
            if item.name == "limit", Int(item.value).map({ $0 < 1 }) ?? true {
                return .failure(.badRequest("limit: a whole number ≥ 1, got \(item.value.prefix(40))"))
            }
            kept.append(item)
        }
        kept.sort { $0.name < $1.name }
        return .success(kept)
    }

    /// The request upstream: the segments encoded again, the checked query.
    public static func upstream(_ segments: [String], _ query: [(name: String, value: String)]) -> String {
        let path = "/" + segments.map(escaped).joined(separator: "/")
        guard !query.isEmpty else { return path }
        var components = URLComponents()
        components.queryItems = query.map { URLQueryItem(name: $0.name, value: $0.value) }
        // `+` is a space to most servers: encoded, as in a timestamp's offset.
        let text = (components.percentEncodedQuery ?? "").replacingOccurrences(of: "+", with: "%2B")
        return "\(path)?\(text)"
    }

    /// A path segment percent-encoded (letters, digits and `:.-_` as they are).
    public static func escaped(_ segment: String) -> String {
        segment.addingPercentEncoding(withAllowedCharacters: .alphanumerics.union(CharacterSet(charactersIn: ":.-_"))) ?? segment
    }
}

/// When a market day's data can no longer change (US sessions), for what the gateway may cache.
public enum GatewayCalendar {
    public static let dayMs: Int64 = 86_400_000

    /// A day is closed 6 hours after it ends in UTC: every US session of it (after-hours end at 20:00 in
    /// New York, 01:00 UTC in winter) is over, and the late corrections with it.
    public static func isClosed(day: Int64, now: Int64) -> Bool { now >= (day + 1) * dayMs + 6 * 3_600_000 }

    /// The next 08:00 UTC after `now`: before a US pre-market opens (09:00 UTC in winter), after New
    /// York's midnight, so a previous day's bar and split adjustments are the new day's.
    public static func next0800(after now: Int64) -> Int64 {
        let today0800 = now / dayMs * dayMs + 8 * 3_600_000
        return today0800 > now ? today0800 : today0800 + dayMs
    }

}
