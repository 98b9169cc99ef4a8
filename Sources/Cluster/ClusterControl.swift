import MarketCore

/// What a cluster's leader tells every node of a market on `<cluster>.ctl.<market>`, in order with the
/// events (one publisher): one typed value per message, and one codec for every kind.
///
/// On the wire each message is text, `<kind>:<fields>`, readable with `nats sub`; a message is read
/// whole or refused (and counted by the caller), never half-used:
/// - `epoch:<token>` — the positions of the events that follow are of this epoch (1 to 32 letters
///   and digits). The leader announces it before a term's first event, then before its next events
///   at least a second after the last.
/// - `down:<reason>` — the leader's upstream is gone (lost, handed on, the leader stopping): events
///   stop until a leader has one. The reason reaches clients, so it is read printable and bounded.
/// - `loss:<count>` — the leader fell behind its upstream and dropped this many events.
/// - `refused:<code> <topic,…> <reason>` — the leader's upstream refused these topics (Alpaca's 405
///   symbol limit, 409 insufficient subscription): a 4xx code, at most ``topicsPerRefusal`` topics
///   (more go as several messages), a reason of at most ``maxReasonBytes``.
/// - `forgotten:<node token>` — the leader forgot that node's interest (not heard within its TTL).
///
/// A leader of the release before this codec wrote `down` without its prefix, as bare text: such text
/// still reads as `down`, so a cluster can be upgraded one node at a time.
///
/// Value type, `Sendable`; the codec is pure.
package enum ClusterControl: Sendable, Equatable {
    case epoch(String)
    case upstreamDown(reason: String)
    case loss(count: Int)
    case refused(topics: Set<Topic>, code: Int, reason: String)
    case forgotten(node: String)

    /// The most bytes of one message read (no message the leader writes is longer; the rest is not read).
    static let maxBytes = 64 * 1024
    /// The most events one loss report may claim (the leader's queue holds far fewer).
    static let maxLoss = 1_000_000_000
    /// Topics one refusal message names at most.
    static let topicsPerRefusal = 500
    /// The longest refusal reason, and the longest `down` reason shown to clients.
    static let maxReasonBytes = 200

    private enum Kind: String, CaseIterable {
        case epoch, down, loss, refused, forgotten
    }

    /// Why a message was refused.
    package enum Rejection: Error, Sendable, Equatable, CustomStringConvertible {
        case malformed(kind: String, why: String)

        package var description: String {
            switch self {
            case .malformed(let kind, let why): "a malformed \(kind) (\(why))"
            }
        }
    }

    // MARK: writing

    /// The message(s) for this value: one, except a refusal of more topics than one message names.
    package var messages: [String] {
        switch self {
        case .epoch(let epoch): return ["\(Kind.epoch.rawValue):\(epoch)"]
        case .upstreamDown(let reason): return ["\(Kind.down.rawValue):\(Self.cut(reason, to: ClusterText.maxBytes))"]
        case .loss(let count): return ["\(Kind.loss.rawValue):\(count)"]
        case .forgotten(let node): return ["\(Kind.forgotten.rawValue):\(ClusterSubjects.token(node))"]
        case .refused(let topics, let code, let reason):
            let sorted = topics.sorted().map(\.description)
            let shortReason = Self.cut(reason, to: Self.maxReasonBytes)
            return stride(from: 0, to: sorted.count, by: Self.topicsPerRefusal).map { start in
                let names = sorted[start..<min(start + Self.topicsPerRefusal, sorted.count)].joined(separator: ",")
                return "\(Kind.refused.rawValue):\(code) \(names) \(shortReason)"
            }
        }
    }

    /// `text` within `bytes` UTF-8 bytes, cut between characters.
    private static func cut(_ text: String, to bytes: Int) -> String {
        var out = ""
        for character in text {
            guard out.utf8.count + character.utf8.count <= bytes else { break }
            out.append(character)
        }
        return out
    }

    // MARK: reading

    /// Reads one message as NATS delivered it (only its first ``maxBytes`` are looked at).
    package static func read(_ payload: UnsafeRawBufferPointer) -> Result<ClusterControl, Rejection> {
        read(String(decoding: UnsafeRawBufferPointer(rebasing: payload.prefix(maxBytes)), as: UTF8.self))
    }

    /// Reads one message, checking every field.
    package static func read(_ text: String) -> Result<ClusterControl, Rejection> {
        guard let colon = text.firstIndex(of: ":"), let kind = Kind(rawValue: String(text[..<colon])) else {
            // The earlier release's `down`: bare text. Shown to clients, so printable and bounded.
            return .success(.upstreamDown(reason: ClusterText.visible(text)))
        }
        let body = text[text.index(after: colon)...]
        func malformed(_ why: String) -> Result<ClusterControl, Rejection> { .failure(.malformed(kind: kind.rawValue, why: why)) }
        switch kind {
        case .epoch:
            // A token the leader made, or it is refused.
            guard (1...32).contains(body.utf8.count), body.utf8.allSatisfy({ Topic.isTickerByte($0) && $0 != UInt8(ascii: ".") && $0 != UInt8(ascii: "@") }) else {
                return malformed("an epoch is 1 to 32 letters and digits")
            }
            return .success(.epoch(String(body)))
        case .down:
            return .success(.upstreamDown(reason: ClusterText.visible(body)))
        case .loss:
            guard let count = Int(body), (1...maxLoss).contains(count) else { return malformed("a count of 1 to \(maxLoss) events") }
            return .success(.loss(count: count))
        case .forgotten:
            guard let node = ClusterSubjects.decodeToken(body), !node.isEmpty else { return malformed("a node name as a subject token") }
            return .success(.forgotten(node: node))
        case .refused:
            let parts = body.split(separator: " ", maxSplits: 2, omittingEmptySubsequences: false)
            guard parts.count == 3, let code = Int(parts[0]), (400...499).contains(code) else { return malformed("a 4xx code, topics and a reason") }
            guard parts[2].utf8.count <= maxReasonBytes else { return malformed("a reason of at most \(maxReasonBytes) bytes") }
            let names = parts[1].split(separator: ",")
            guard (1...topicsPerRefusal).contains(names.count) else { return malformed("1 to \(topicsPerRefusal) topics") }
            var topics = Set<Topic>()
            for name in names {
                guard let topic = Topic(parsing: name) else { return malformed("a topic that is none") }
                topics.insert(topic)
            }
            return .success(.refused(topics: topics, code: code, reason: ClusterText.visible(parts[2])))
        }
    }
}
