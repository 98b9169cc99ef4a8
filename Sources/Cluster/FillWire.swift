import MarketDataHub
import NIOCore
import MarketCore

/// The cluster's gap-fill messages on NATS, as bytes. Pure, `Sendable` values.
///
/// - A node's **ask** (`<cluster>.ctl.<market>.fill-ask`): `A <node> <generation> <from> <through>\n`,
///   then per topic `<type> <ticker> <holders> <length>\n` and the topic's last event before the outage
///   (`length` bytes, 0 when the node had none).
/// - The leader's **events** (`<cluster>.ctl.<market>.fill`): `E <order> <type> <ticker>\n`, then per
///   event `<length>\n` and its bytes (positions written in).
/// - The leader's **end** (same subject): `S <filled|skipped|nothing> <from> <through> <node>/<generation>,…\n`,
///   then `R <type> <ticker> <count>\n` per topic recovered and `M <type> <ticker> <reason>\n` per topic
///   missing.
///
/// Names are subject tokens (``ClusterSubjects/token(_:)``): no space or line break. Every reader checks
/// what it reads and answers `nil` for anything else.
enum FillWire {
    /// The most bytes of one message (NATS refuses more than its `max_payload`, 1 MB by default).
    static let maxMessageBytes = 900_000

    /// A node's request for a fill: its hub's ``GapFillRequest``, named by node and generation.
    struct Ask: Sendable {
        var node: String
        var generation: Int
        var from: Int64
        var through: Int64
        var topics: [GapFillRequest.Held]

        var id: String { "\(ClusterSubjects.token(node))/\(generation)" }
    }

    // MARK: writing

    /// An ask; topics past ``maxMessageBytes`` are left out (the fill takes the most held first anyway).
    static func ask(_ ask: Ask) -> [UInt8] {
        var out = Array("A \(ClusterSubjects.token(ask.node)) \(ask.generation) \(ask.from) \(ask.through)\n".utf8)
        for held in ask.topics {
            let last = held.lastBefore.map { Array($0.bytes.readableBytesView) } ?? []
            let header = Array("\(name(held.topic)) \(held.holders) \(last.count)\n".utf8)
            guard out.count + header.count + last.count <= maxMessageBytes else { break }
            out += header
            out += last
        }
        return out
    }

    /// A topic's recovered events, as few messages as ``maxMessageBytes`` allows.
    static func events(_ topic: Topic, order: RecoveryOrder, _ events: [MarketEvent]) -> [[UInt8]] {
        let header = Array("E \(order.rawValue) \(name(topic))\n".utf8)
        var messages: [[UInt8]] = []
        var out = header
        for event in events {
            let length = Array("\(event.bytes.readableBytes)\n".utf8)
            if out.count > header.count, out.count + length.count + event.bytes.readableBytes > maxMessageBytes {
                messages.append(out)
                out = header
            }
            out += length
            out += event.bytes.readableBytesView
        }
        if out.count > header.count { messages.append(out) }
        return messages
    }

    /// How a fill answered the asks `ids`.
    static func end(_ end: RecoveryEnd, from: Int64, through: Int64, answering ids: [String]) -> [UInt8] {
        let kind: String
        var lines: [String] = []
        switch end {
        case .filled(let summary):
            kind = "filled"
            for (topic, count) in summary.recovered.sorted(by: { $0.key < $1.key }) { lines.append("R \(name(topic)) \(count)") }
            for (topic, reason) in summary.missing.sorted(by: { $0.key < $1.key }) {
                lines.append("M \(name(topic)) \(reason.filter { $0 != "\n" && $0 != "\r" })")
            }
        case .skipped: kind = "skipped"
        case .nothing: kind = "nothing"
        }
        var out = Array("S \(kind) \(from) \(through) \(ids.joined(separator: ","))\n".utf8)
        for line in lines {
            let bytes = Array((line + "\n").utf8)
            // One line too long for the room left leaves it for the shorter ones after it.
            guard out.count + bytes.count <= maxMessageBytes else { continue }
            out += bytes
        }
        return out
    }

    // MARK: reading

    /// An ask; its topics must pass `rules` and its events `check`.
    static func readAsk(_ bytes: UnsafeRawBufferPointer, check: EventCheck, rules: SessionLimits) -> Ask? {
        var reader = Reader(bytes)
        guard let head = reader.line(), head.count == 5, head[0] == "A", let node = ClusterSubjects.decodeToken(head[1]),
            let generation = Int(head[2]), let from = Int64(head[3]), let through = Int64(head[4]), Self.plausible(from, through)
        else { return nil }
        var topics: [GapFillRequest.Held] = []
        while !reader.isAtEnd {
            guard let fields = reader.line(), fields.count == 4, let topic = topic(fields[0], fields[1]), rules.problem(with: topic) == nil,
                !topic.isWildcard, let holders = Int(fields[2]), (1...Self.maxHolders).contains(holders), let length = Int(fields[3]),
                let last = reader.bytes(length)
            else { return nil }
            var lastBefore: MarketEvent?
            if length > 0 {
                guard case .success(let event) = last.withUnsafeBytes({ check.event($0, topic: topic) }) else { return nil }
                lastBefore = event
            }
            topics.append(GapFillRequest.Held(topic: topic, holders: holders, lastBefore: lastBefore))
        }
        return Ask(node: node, generation: generation, from: from, through: through, topics: topics)
    }

    /// The topic of a message of recovered events, read from its first line alone: whether anyone
    /// asked for it is known before its events are read.
    static func eventsTopic(_ bytes: UnsafeRawBufferPointer) -> Topic? {
        var reader = Reader(bytes)
        return head(&reader)?.topic
    }

    private static func head(_ reader: inout Reader) -> (order: RecoveryOrder, topic: Topic)? {
        guard let head = reader.line(), head.count == 4, head[0] == "E", let order = RecoveryOrder(rawValue: String(head[1])),
            let topic = topic(head[2], head[3]), !topic.isWildcard
        else { return nil }
        return (order, topic)
    }

    /// Recovered events of one topic, each passing `check`.
    static func readEvents(_ bytes: UnsafeRawBufferPointer, check: EventCheck) -> (Topic, RecoveryOrder, [MarketEvent])? {
        var reader = Reader(bytes)
        guard let (order, topic) = head(&reader) else { return nil }
        var events: [MarketEvent] = []
        while !reader.isAtEnd {
            guard let fields = reader.line(), fields.count == 1, let length = Int(fields[0]), length > 0, let bytes = reader.bytes(length),
                case .success(let event) = bytes.withUnsafeBytes({ check.event($0, topic: topic) })
            else { return nil }
            events.append(event)
        }
        // The leader sends none without events.
        return events.isEmpty ? nil : (topic, order, events)
    }

    /// A fill's end, and the asks it answered (`node/generation`).
    static func readEnd(_ bytes: UnsafeRawBufferPointer) -> (end: RecoveryEnd, answered: [String])? {
        var reader = Reader(bytes)
        // The first line names every ask answered: as long as the message allows.
        guard let head = reader.line(limit: maxMessageBytes), head.count == 5, head[0] == "S", let from = Int64(head[2]), let through = Int64(head[3]) else {
            return nil
        }
        let answered = head[4].split(separator: ",").map(String.init)
        switch head[1] {
        case "skipped": return (.skipped, answered)
        case "nothing": return (.nothing, answered)
        case "filled": break
        default: return nil
        }
        var summary = GapFillSummary(from: from, through: through)
        while !reader.isAtEnd {
            guard let text = reader.text(), let first = text.firstIndex(of: " ") else { return nil }
            let parts = text[text.index(after: first)...].split(separator: " ", maxSplits: 2, omittingEmptySubsequences: false)
            guard parts.count == 3, let topic = topic(parts[0], parts[1]) else { return nil }
            switch text[..<first] {
            case "R":
                guard let count = Int(parts[2]) else { return nil }
                summary.recovered[topic] = count
            // Told to clients as is: bounded and printable.
            case "M": summary.missing[topic] = ClusterText.visible(parts[2])
            default: return nil
            }
        }
        return (.filled(summary), answered)
    }

    /// The most holders one ask may claim for a topic (a node's clients; more is no node's).
    static let maxHolders = 10_000_000

    /// A window of Unix ms a node could have seen: from after 2000 to a day past now, in order.
    static func plausible(_ from: Int64, _ through: Int64, now: Int64 = WallClock.nowMilliseconds()) -> Bool {
        from >= 946_684_800_000 && from <= through && through <= now + 86_400_000
    }

    /// How far a node's clock and the delivery of its ask may put its window past the leader's clock.
    static let clockSlack: Int64 = 60_000

    /// Whether the leader fills `ask`, received at `now` (Unix ms): its window is no longer than the
    /// gap fill covers (`maxWindow`), reaches back no further than that before now, and ends no later
    /// than now (each give or take ``clockSlack``). Any other ask is answered `skipped`, as a single
    /// relay answers an outage longer than its fill covers: merged with the others it would widen their
    /// union past what the fill covers, and the whole fill would be skipped.
    static func fillable(_ ask: Ask, maxWindow: Duration, now: Int64 = WallClock.nowMilliseconds()) -> Bool {
        let window = maxWindow.milliseconds
        return ask.from <= ask.through && ask.through - ask.from <= window && ask.from >= now - window - clockSlack
            && ask.through <= now + clockSlack
    }

    // MARK: parts

    private static func name(_ topic: Topic) -> String {
        "\(ClusterSubjects.token(topic.eventType)) \(ClusterSubjects.token(topic.ticker))"
    }

    private static func topic(_ type: Substring, _ ticker: Substring) -> Topic? {
        guard let type = ClusterSubjects.decodeToken(type), let ticker = ClusterSubjects.decodeToken(ticker) else { return nil }
        return Topic(eventType: type, ticker: ticker)
    }

    /// Lines and counted byte runs of a message.
    private struct Reader {
        let bytes: UnsafeRawBufferPointer
        var index = 0

        init(_ bytes: UnsafeRawBufferPointer) { self.bytes = bytes }

        var isAtEnd: Bool { index >= bytes.count }

        /// The next line (at most `limit` bytes), whole.
        mutating func text(limit: Int = 4096) -> Substring? {
            guard let end = bytes[index...].prefix(limit).firstIndex(of: UInt8(ascii: "\n")) else { return nil }
            let line = String(decoding: UnsafeRawBufferPointer(rebasing: bytes[index..<end]), as: UTF8.self)
            index = end + 1
            return Substring(line)
        }

        /// The next line's space-separated fields.
        mutating func line(limit: Int = 4096) -> [Substring]? {
            text(limit: limit).map { $0.split(separator: " ", omittingEmptySubsequences: false) }
        }

        mutating func bytes(_ count: Int) -> UnsafeRawBufferPointer? {
            guard count >= 0, count <= bytes.count - index else { return nil }
            defer { index += count }
            return UnsafeRawBufferPointer(rebasing: bytes[index..<(index + count)])
        }
    }
}
