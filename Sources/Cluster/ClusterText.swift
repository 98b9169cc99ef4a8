import MarketCore

/// Text from NATS that a client may see (a notice's reason, a node's name, why a topic was not filled):
/// anyone who may publish on the cluster's subjects writes it, so it is bounded and printable before it
/// reaches a status. Pure, `Sendable`.
enum ClusterText {
    /// The most UTF-8 bytes of such text in a client's status.
    static let maxBytes = 200

    /// `text` as a client may see it (``VisibleText/visible(_:limit:)``), at most `limit` bytes.
    static func visible(_ text: some StringProtocol, limit: Int = maxBytes) -> String {
        VisibleText.visible(text, limit: limit)
    }
}
