import MarketCore

/// The NATS names one cluster uses for one market: event subjects, control subjects, key-value
/// buckets and keys. Pure, value type, `Sendable`.
///
/// Events travel on `<cluster>.md.<market>.<EV>.<TICKER>`. A ticker is one subject token: characters
/// NATS gives a meaning (`.`, `*`, `>`, white space) and those a key-value key may not hold (`:` in
/// `O:SPY…` and `I:SPX`) are written `=XX` (hex), and `=` itself `=3D`, so `T.BRK.B` travels on
/// `….T.BRK=2EB` and every subject decodes back to exactly one topic. A wildcard topic `Q.*` is the
/// subject wildcard `….Q.*`.
public struct ClusterSubjects: Sendable, Equatable {
    public let cluster: String
    public let market: String
    /// `<cluster>.md.<market>.`, the prefix of every event subject.
    public let eventPrefix: String

    /// - Throws: when the cluster name or market is not a plain token (letters, digits, `-`, `_`).
    public init(cluster: String, market: String) throws(ClusterError) {
        for (what, name) in [("cluster name", cluster), ("market", market)] {
            guard !name.isEmpty, name.utf8.allSatisfy({ Self.isPlain($0) }) else {
                throw .invalidName("\(what) \"\(name)\": use letters, digits, - and _ only")
            }
        }
        self.cluster = cluster
        self.market = market
        eventPrefix = "\(cluster).md.\(market)."
    }

    // MARK: events

    /// The subject one event (or every event of a topic) travels on.
    public func subject(for topic: Topic) -> String {
        eventPrefix + Self.token(topic.eventType) + "." + (topic.isWildcard ? "*" : Self.token(topic.ticker))
    }

    /// The topic an event subject names; `nil` for a subject that is not one of ours.
    public func topic(fromSubject subject: String) -> Topic? {
        var subject = subject
        return subject.withUTF8 { topic(fromSubject: $0) }
    }

    /// The same, from the subject's bytes (libnats' delivery thread calls this once per message).
    public func topic(fromSubject subject: UnsafeBufferPointer<UInt8>) -> Topic? {
        let prefix = eventPrefix.utf8
        guard subject.count > prefix.count, subject.prefix(prefix.count).elementsEqual(prefix) else { return nil }
        let rest = subject[prefix.count...]
        guard let dot = rest.firstIndex(of: UInt8(ascii: ".")) else { return nil }
        guard let eventType = Self.decode(rest[..<dot]), let ticker = Self.decode(rest[(dot + 1)...]),
            !eventType.isEmpty, !ticker.isEmpty
        else { return nil }
        return Topic(eventType: eventType, ticker: ticker)
    }

    // MARK: control

    /// Where the leader says its upstream connection was lost (and why), in order with the events.
    public var upstreamControl: String { "\(cluster).ctl.\(market).upstream" }
    /// Where a node publishes the topics its clients want.
    public func interest(of node: String) -> String { "\(cluster).interest.\(market).\(Self.token(node))" }
    /// Every node's interest.
    public var allInterest: String { "\(cluster).interest.\(market).*" }
    /// Where a node asks the leader to fill an outage it had (gap fill).
    public var fillAsk: String { "\(cluster).ctl.\(market).fill-ask" }
    /// Where the leader publishes what its fills recovered, and how each ended.
    public var fillResult: String { "\(cluster).ctl.\(market).fill" }
    /// Asks every node to publish its interest now (a new leader does, so it starts with the union).
    public var interestRequest: String { "\(cluster).ctl.\(market).interest-request" }

    // MARK: key-value

    /// The bucket holding the upstream lease, one key per market.
    public var leaseBucket: String { "\(cluster)-lease" }
    public var leaseKey: String { market }
    /// The market whose ticker form events on these subjects are checked in.
    public var wireMarket: Market { Market(rawValue: market) ?? .stocks }

    /// The bucket holding each topic's last event, for snapshots on any node.
    public var lastValueBucket: String { "\(cluster)-last-\(market)" }
    public func lastValueKey(for topic: Topic) -> String { Self.token(topic.eventType) + "." + Self.token(topic.ticker) }

    // MARK: tokens

    static func isPlain(_ byte: UInt8) -> Bool {
        switch byte {
        case UInt8(ascii: "a")...UInt8(ascii: "z"), UInt8(ascii: "A")...UInt8(ascii: "Z"), UInt8(ascii: "0")...UInt8(ascii: "9"),
            UInt8(ascii: "-"), UInt8(ascii: "_"):
            true
        default: false
        }
    }

    /// One subject token for any text: plain characters and `/` as they are, anything else `=XX`.
    public static func token(_ text: String) -> String {
        if text.utf8.allSatisfy(isPlain) { return text }
        let hex = Array("0123456789ABCDEF".utf8)
        var out: [UInt8] = []
        out.reserveCapacity(text.utf8.count + 8)
        for byte in text.utf8 {
            if isPlain(byte) || byte == UInt8(ascii: "/") {
                out.append(byte)
            } else {
                out += [UInt8(ascii: "="), hex[Int(byte >> 4)], hex[Int(byte & 0xF)]]
            }
        }
        return String(decoding: out, as: UTF8.self)
    }

    /// The text a token stands for; `nil` when it is not a token ``token(_:)`` writes.
    public static func decodeToken(_ token: some StringProtocol) -> String? {
        var text = String(token)
        return text.withUTF8 { decode($0[...]) }
    }

    static func decode(_ token: Slice<UnsafeBufferPointer<UInt8>>) -> String? {
        guard token.contains(UInt8(ascii: "=")) else { return String(decoding: token, as: UTF8.self) }
        var out: [UInt8] = []
        var iterator = token.makeIterator()
        while let byte = iterator.next() {
            guard byte == UInt8(ascii: "=") else {
                out.append(byte)
                continue
            }
            guard let high = iterator.next().flatMap(hexValue), let low = iterator.next().flatMap(hexValue) else { return nil }
            out.append(high << 4 | low)
        }
        return String(validating: out, as: UTF8.self)
    }

    private static func hexValue(_ byte: UInt8) -> UInt8? {
        switch byte {
        case UInt8(ascii: "0")...UInt8(ascii: "9"): byte - UInt8(ascii: "0")
        case UInt8(ascii: "A")...UInt8(ascii: "F"): byte - UInt8(ascii: "A") + 10
        default: nil
        }
    }
}

/// Errors of the cluster layer, with messages a user can act on.
public enum ClusterError: Error, Sendable, CustomStringConvertible, Equatable {
    case invalidName(String)
    case invalidURL(String)
    /// The lease bucket exists with another TTL than this node's lease: nodes that disagree on the lease
    /// would take it from each other (two upstream connections).
    case leaseMismatch(bucket: String, bucketTTL: Duration, configured: Duration)
    /// A TLS or credentials setting that libnats cannot use.
    case natsSetup(String)

    public var description: String {
        switch self {
        case .invalidName(let text): "cluster: \(text)"
        case .invalidURL(let url): "cluster: not a nats:// or tls:// URL: \(url)"
        case .natsSetup(let text): "cluster: the NATS connection cannot be set up: \(text)"
        case .leaseMismatch(let bucket, let bucketTTL, let configured):
            "cluster: the lease bucket \(bucket) keeps the lease \(bucketTTL.milliseconds) ms but this node's lease is "
                + "\(configured.milliseconds) ms; every node of a cluster must use the same cluster.leaseSeconds "
                + "(set it to \(Double(bucketTTL.milliseconds) / 1000), or delete the bucket while no node runs)"
        }
    }
}
