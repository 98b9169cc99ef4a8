import PolygonWire

/// The leader's upstream refused topics (Alpaca's 405 symbol limit, 409 insufficient subscription): a
/// control message on `<cluster>.ctl.<market>` so every node tells its clients of those topics,
/// `refused:<code> <topic,topic,…> <reason>`. Pure; what comes from NATS is checked whole.
package enum RefusalWire {
    /// What starts a refusal.
    static let prefix = "refused:"
    /// Topics one refusal message names at most (a longer refusal goes as several).
    static let topicsPerMessage = 500

    /// The control messages telling every node's clients that the upstream refused `topics`.
    package static func controls(_ topics: Set<Topic>, code: Int, reason: String) -> [String] {
        let sorted = topics.sorted().map(\.description)
        // The reason within 200 bytes, cut between characters.
        var shortReason = ""
        for character in reason where shortReason.utf8.count + character.utf8.count <= 200 { shortReason.append(character) }
        return stride(from: 0, to: sorted.count, by: topicsPerMessage).map { start in
            let names = sorted[start..<min(start + topicsPerMessage, sorted.count)].joined(separator: ",")
            return "\(prefix)\(code) \(names) \(shortReason)"
        }
    }

    /// Reads a refusal control message (``controls(_:code:reason:)``), checking everything: a
    /// 4xx code, at most ``topicsPerMessage`` valid topics, a reason of at most 200 bytes (shown to
    /// clients printable only, ``ClusterText``).
    package static func read(_ text: String) -> (topics: Set<Topic>, code: Int, reason: String)? {
        guard text.hasPrefix(prefix) else { return nil }
        let parts = text.dropFirst(prefix.count).split(separator: " ", maxSplits: 2, omittingEmptySubsequences: false)
        guard parts.count == 3, let code = Int(parts[0]), (400...499).contains(code), parts[2].utf8.count <= 200 else { return nil }
        let names = parts[1].split(separator: ",")
        guard (1...topicsPerMessage).contains(names.count) else { return nil }
        var topics = Set<Topic>()
        for name in names {
            guard let topic = Topic(parsing: name) else { return nil }
            topics.insert(topic)
        }
        return (topics, code, ClusterText.visible(parts[2]))
    }
}
