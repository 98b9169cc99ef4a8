import Foundation
import NIOCore
import MarketCore
import Upstream

/// What a node accepts from NATS. Anyone who may publish on the cluster's subjects reaches these
/// checks (NATS permissions, see README, are what keeps others out); what fails them is counted and
/// logged by the caller, never used. Pure functions, safe from any thread. (An event from NATS is
/// checked by its market's ``EventCheck``, which each node builds once.)
public enum ClusterChecks {
    /// The topic rules of a cluster's market (`market` as its subjects name it) in its protocol: the
    /// event types it has (any, for a market the relay does not know).
    public static func rules(ofMarket market: String, wire: any WireProtocol) -> SessionLimits {
        SessionLimits(eventTypes: Market(rawValue: market).map { wire.eventTypes(of: $0) })
    }

    /// The largest event a node takes from NATS, unless its market says otherwise (news: its setting).
    public static let maxEventBytes = UpstreamConfiguration.defaultMaxEventBytes

    /// A node's interest: the topics that pass the market's topic rules, and why the others did not.
    public static func interest(_ topics: [Topic], invalid: [String], limits: SessionLimits) -> (topics: Set<Topic>, refused: [String]) {
        var accepted = Set<Topic>()
        var refused = invalid.prefix(5).map { "\"\($0.prefix(50))\": not a topic" }
        var refusedCount = invalid.count
        for topic in topics {
            if let problem = limits.problem(with: topic) {
                refusedCount += 1
                if refused.count < 5 { refused.append("\(topic.description.prefix(50)): \(problem)") }
            } else {
                accepted.insert(topic)
            }
        }
        if refusedCount > refused.count { refused.append("and \(refusedCount - refused.count) more") }
        return (accepted, refused)
    }

    /// Why a message was refused. Value type, `Sendable`.
    public struct Rejection: Error, Sendable, Equatable, CustomStringConvertible {
        public var description: String
        init(_ description: String) { self.description = description }
    }
}

/// The lease's value: which node holds it, and the lease it runs with. JSON, so a value some other
/// publisher wrote (that is not a relay node's lease) is recognised as such and not obeyed. Value type,
/// `Sendable`.
public struct LeaseValue: Codable, Sendable, Equatable {
    public var node: String
    public var leaseMs: Int64
    /// Names one term (one take of the lease), so a node restarted under the same name that takes the
    /// lease again is seen as a new leader: the other nodes tell their clients the old one went. Absent
    /// in values of earlier versions.
    public var term: String?
    /// The market sequence of the last event the holder had stamped in its term when it wrote this
    /// value (absent before its first, and in values of earlier versions): a node keeps no event whose
    /// position leaps far past it (a forged one).
    public var through: UInt64?

    public init(node: String, leaseMs: Int64, term: String? = nil, through: UInt64? = nil) {
        self.node = node
        self.leaseMs = leaseMs
        self.term = term
        self.through = through
    }

    /// The value a node writes.
    public var text: String {
        let encoder = JSONEncoder()
        encoder.outputFormatting = .sortedKeys
        return (try? encoder.encode(self)).map { String(decoding: $0, as: UTF8.self) } ?? ""
    }

    /// A lease value a relay node wrote, or `nil`.
    public init?(parsing bytes: [UInt8]) {
        guard bytes.count <= 1024, let value = try? JSONDecoder().decode(LeaseValue.self, from: Data(bytes)),
            !value.node.isEmpty, value.node.count <= 128, value.leaseMs > 0, (value.term?.utf8.count ?? 0) <= 64,
            (value.through ?? 0) <= EventPosition.maxSequence
        else { return nil }
        self = value
    }
}
