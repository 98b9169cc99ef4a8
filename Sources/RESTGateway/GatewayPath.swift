import Foundation
import MarketCore

/// A request's path and query checked once for every vendor: one plain path on the vendor's host, the
/// client's key left out, parameters in a fixed order.
public enum GatewayPath {
    /// A request's checked segments and the request to send upstream (``segments(of:)``,
    /// ``checkedQuery(_:)``, ``upstream(_:_:)``), or why it has none.
    public static func parse(_ request: GatewayRequest) -> Result<(segments: [String], upstream: String), GatewayProblem> {
        segments(of: request.path).flatMap { segments in
            checkedQuery(request.query).map { query in (segments, upstream(segments, query)) }
        }
    }

    /// The path's segments, decoded; refused: anything that is not one plain path on the vendor's host
    /// (`//`, `..`, an encoded `/` or `\`, control characters, an absolute URL).
    public static func segments(of path: String) -> Result<[String], GatewayProblem> {
        // Bytes, here and below, not `contains(_:)` of a string (Foundation's search: about 3% of a
        // live answer's time).
        guard path.hasPrefix("/"), !path.hasPrefix("//"), !path.utf8.contains(UInt8(ascii: "\\")), path.utf8.count <= 2048 else {
            return .failure(.badRequest("not a path of the vendor's REST API: \(path.prefix(100))"))
        }
        let bytes = Array(path.utf8)
        for index in bytes.indices where bytes[index] == UInt8(ascii: "%") && index + 2 < bytes.count {
            let code = (bytes[index + 1] | 0x20, bytes[index + 2] | 0x20)
            // %2F, %5C, %00
            if code == (UInt8(ascii: "2"), UInt8(ascii: "f")) || code == (UInt8(ascii: "5"), UInt8(ascii: "c")) || code == (UInt8(ascii: "0"), UInt8(ascii: "0")) {
                return .failure(.badRequest("an encoded / or \\ is not allowed in a path"))
            }
        }
        var segments: [String] = []
        for raw in path.dropFirst().split(separator: "/", omittingEmptySubsequences: false) {
            let decoded = raw.utf8.contains(UInt8(ascii: "%")) ? raw.removingPercentEncoding : String(raw)
            guard let decoded, !decoded.isEmpty, decoded != ".", decoded != "..",
                decoded.utf8.allSatisfy({ $0 > 0x20 && $0 != 0x7F && $0 != UInt8(ascii: "?") && $0 != UInt8(ascii: "#") && $0 != UInt8(ascii: "@") })
            else {
                return .failure(.badRequest("not a path of the vendor's REST API: \(path.prefix(100))"))
            }
            segments.append(decoded)
        }
        return .success(segments)
    }

    /// The query without the client's key, every name checked and given once (a second value could
    /// reach the vendor unchecked), at most 64 parameters and 8 KiB, in a fixed order (so identical
    /// requests are one cache entry and one flight).
    public static func checkedQuery(_ query: [(name: String, value: String)]) -> Result<[(name: String, value: String)], GatewayProblem> {
        var kept: [(name: String, value: String)] = []
        guard query.count <= 64, query.reduce(0, { $0 + $1.name.utf8.count + $1.value.utf8.count + 2 }) <= 8192 else {
            return .failure(.badRequest("the query is too long (at most 64 parameters, 8 KiB)"))
        }
        var names = Set<String>()
        for item in query where item.name != "apiKey" {
            guard names.insert(item.name).inserted else { return .failure(.badRequest("query parameter \(item.name.prefix(64)) is given twice")) }
            guard !item.name.isEmpty, item.name.utf8.count <= 64,
                item.name.utf8.allSatisfy({ Self.isAlphanumeric($0) || $0 == UInt8(ascii: ".") || $0 == UInt8(ascii: "_") })
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

    /// The request upstream: the segments encoded again, the checked query (every byte but letters,
    /// digits and `-._~` percent-encoded, `+` included: most servers read it as a space).
    public static func upstream(_ segments: [String], _ query: [(name: String, value: String)]) -> String {
        var out = ""
        out.reserveCapacity(64)
        for segment in segments {
            out += "/"
            out += escaped(segment)
        }
        for (index, item) in query.enumerated() {
            out += index == 0 ? "?" : "&"
            out += encoded(item.name, keeping: Self.unreserved)
            out += "="
            out += encoded(item.value, keeping: Self.unreserved)
        }
        return out
    }

    /// A path segment percent-encoded (letters, digits and `:.-_` as they are).
    public static func escaped(_ segment: String) -> String { encoded(segment, keeping: Self.segmentSafe) }

    private static func isAlphanumeric(_ byte: UInt8) -> Bool {
        (UInt8(ascii: "a")...UInt8(ascii: "z")).contains(byte) || (UInt8(ascii: "A")...UInt8(ascii: "Z")).contains(byte)
            || (UInt8(ascii: "0")...UInt8(ascii: "9")).contains(byte)
    }

    private static let unreserved: [Bool] = (0..<256).map { byte in
        isAlphanumeric(UInt8(byte)) || Array("-._~".utf8).contains(UInt8(byte))
    }
    private static let segmentSafe: [Bool] = (0..<256).map { byte in
        isAlphanumeric(UInt8(byte)) || Array(":.-_".utf8).contains(UInt8(byte))
    }

    private static func encoded(_ text: String, keeping safe: [Bool]) -> String {
        if text.utf8.allSatisfy({ safe[Int($0)] }) { return text }
        let hex = Array("0123456789ABCDEF".utf8)
        var bytes: [UInt8] = []
        bytes.reserveCapacity(text.utf8.count * 3)
        for byte in text.utf8 {
            if safe[Int(byte)] {
                bytes.append(byte)
            } else {
                bytes += [UInt8(ascii: "%"), hex[Int(byte >> 4)], hex[Int(byte & 0x0F)]]
            }
        }
        return String(decoding: bytes, as: UTF8.self)
    }
}

/// When a market day's data can no longer change (US sessions), for what the gateway may cache.
public enum GatewayCalendar {
    public static let dayMs: Int64 = 86_400_000

    /// A day is closed 6 hours after it ends in UTC: every US session of it (after-hours end at 20:00 in
    /// New York, 01:00 UTC in winter) is over, and the late corrections with it.
    public static func isClosed(day: Int64, now: Int64) -> Bool { day < (now - 6 * 3_600_000) / dayMs }

    /// The last closed day at `now`.
    public static func lastClosedDay(now: Int64) -> Int64 { (now - 6 * 3_600_000) / dayMs - 1 }

    /// `YYYY-MM-DD`, or an RFC 3339 time (its offset applied), or Unix milliseconds, as days since
    /// 1970-01-01 in UTC; `nil` for anything else or past the year 9999.
    public static func day(_ text: some StringProtocol, millisecondsAllowed: Bool) -> Int64? {
        if millisecondsAllowed, let milliseconds = Int64(text) {
            return (0...253_402_300_799_999).contains(milliseconds) ? milliseconds / dayMs : nil
        }
        guard text.count >= 10, let date = CivilDay.days(text.prefix(10)) else { return nil }
        guard text.count > 10 else { return date }
        // HH:MM[:SS[.fraction]] then Z or ±HH:MM.
        let time = Array(text.dropFirst(11).utf8)
        guard text.dropFirst(10).first == "T" || text.dropFirst(10).first == " ", time.count >= 6 else { return nil }
        func number(_ range: Range<Int>) -> Int64? {
            guard range.upperBound <= time.count else { return nil }
            return Int64(String(decoding: time[range], as: UTF8.self))
        }
        guard let hour = number(0..<2), let minute = number(3..<5), hour < 24, minute < 60 else { return nil }
        var index = 5
        if index < time.count, time[index] == UInt8(ascii: ":") {
            guard number(6..<8) != nil else { return nil }
            index = 8
            if index < time.count, time[index] == UInt8(ascii: ".") {
                index += 1
                while index < time.count, (UInt8(ascii: "0")...UInt8(ascii: "9")).contains(time[index]) { index += 1 }
            }
        }
        var offsetMinutes: Int64 = 0
        if index < time.count, time[index] == UInt8(ascii: "Z") || time[index] == UInt8(ascii: "z") {
            index += 1
        } else if index < time.count, time[index] == UInt8(ascii: "+") || time[index] == UInt8(ascii: "-") {
            guard let hours = number(index + 1..<index + 3), let minutes = number(index + 4..<index + 6) else { return nil }
            offsetMinutes = (hours * 60 + minutes) * (time[index] == UInt8(ascii: "-") ? -1 : 1)
            index += 6
        }
        guard index == time.count else { return nil }
        let minutes = date * 1440 + hour * 60 + minute - offsetMinutes
        return minutes >= 0 ? minutes / 1440 : (minutes - 1439) / 1440
    }

    /// The next 08:00 UTC after `now`: before a US pre-market opens (09:00 UTC in winter), after New
    /// York's midnight, so a previous day's bar and split adjustments are the new day's.
    public static func next0800(after now: Int64) -> Int64 {
        let today0800 = now / dayMs * dayMs + 8 * 3_600_000
        return today0800 > now ? today0800 : today0800 + dayMs
    }

}
