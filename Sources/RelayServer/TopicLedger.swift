import MarketCore
import Synchronization

/// Distinct topics held by the market connections of each key and by all of them, so that no key,
/// and no crowd of connections, can make the upstream subscription grow without bound: a topic new to
/// its key past `perKey`, or new to the relay past `total`, is refused with an error status (the
/// connection goes on). Counted by reference: a topic is held while any connection of the key (or
/// any connection at all) holds it.
///
/// And the subscriptions themselves, each topic as many times as it is held (by open connections and
/// by sessions kept on the shelf for a resume), per key and in all: what the relay's memory holds for
/// them grows with that sum, which distinct topics do not bound (a key's thousand connections of the
/// same ten thousand topics). A session shelved takes its connection's holds over unchecked (the
/// connection gives them back at once), and a connection that took a session back subscribes its
/// topics again unchecked (the session gives them back as they are), so a hold moves, never doubles.
/// `Sendable`; the tables sit behind a `Mutex`.
final class TopicLedger: Sendable {
    private struct State {
        var all: [Topic: Int] = [:]
        var keys: [String: [Topic: Int]] = [:]
        /// Holds per key (the sum of its topics' counts), and in all.
        var subscriptions: [String: Int] = [:]
        var allSubscriptions = 0
        /// Ticker → its topics held of the capped event types.
        var capped: [String: Int] = [:]
    }

    /// The vendor's per-connection ticker cap on some event types (`WireProtocol.cappedEventTypes(of:)`:
    /// Polygon's options `Q` and `FMV`, 1,000 contracts):
    /// the upstream is asked for at most `tickers` distinct tickers of `eventTypes`. Tickers held keep
    /// their place (the ones wanted longest); a new one past the cap is refused, and so is a wildcard
    /// of a capped type, which would ask for every ticker.
    struct TickerCap: Sendable {
        var eventTypes: Set<String>
        var tickers: Int
        var market: Market
        /// Whose cap it is, as the message names it (`Polygon`).
        var vendor: String
    }

    let perKey: Int
    let total: Int
    /// Subscriptions (holds) one key's connections and kept sessions may have together, and all.
    let subscriptionsPerKey: Int
    let subscriptions: Int
    let cap: TickerCap?
    private let state = Mutex(State())

    init(perKey: Int, total: Int, subscriptionsPerKey: Int = .max, subscriptions: Int = .max, cap: TickerCap? = nil) {
        self.perKey = perKey
        self.total = total
        self.subscriptionsPerKey = subscriptionsPerKey
        self.subscriptions = subscriptions
        self.cap = cap.flatMap { $0.eventTypes.isEmpty ? nil : $0 }
    }

    private func capReason(_ cap: TickerCap) -> String {
        "\(cap.vendor)'s \(cap.market) cap reached: \(cap.eventTypes.sorted().joined(separator: " and ")) allow at most \(cap.tickers) "
            + "distinct tickers per upstream connection (the ones subscribed first keep their place)"
    }

    /// What a ``ServerSession`` asks before it subscribes new topics. `transferring`: the topics of a
    /// session its connection took back and has not subscribed again (their holds move, unchecked).
    func budget(transferring: @escaping @Sendable () -> Set<Topic> = { [] }) -> TopicBudget {
        TopicBudget(reserve: { self.reserve($0, for: $1.name, transferring: transferring()) }, release: { self.release($0, for: $1.name) })
    }

    /// Takes `topics` (each new to the connection asking) for `key`; returns those refused and why.
    /// Topics in `transferring`, or all unless `checked`, are held whatever the subscription limits say
    /// (a hold that moves: another gives it back at once).
    func reserve(_ topics: [Topic], for key: String, transferring: Set<Topic> = [], checked: Bool = true) -> (refused: [Topic], reason: String?) {
        state.withLock { state in
            // Taken out and put back, so it is changed in place rather than copied.
            var held = state.keys.removeValue(forKey: key) ?? [:]
            var holds = state.subscriptions.removeValue(forKey: key) ?? 0
            defer { state.subscriptions[key] = holds == 0 ? nil : holds }
            var refused: [Topic] = []
            var reason: String?
            for topic in topics {
                let newToKey = held[topic] == nil
                let newToAll = state.all[topic] == nil
                if checked, holds >= subscriptionsPerKey || state.allSubscriptions >= subscriptions, !transferring.contains(topic) {
                    refused.append(topic)
                    reason =
                        reason
                        ?? (holds >= subscriptionsPerKey
                            ? "subscription limit reached: the connections and kept sessions of key \"\(key)\" hold at most \(subscriptionsPerKey) subscriptions together"
                            : "subscription limit reached: the relay holds at most \(subscriptions) subscriptions of this market")
                    continue
                }
                if newToKey, held.count >= perKey {
                    refused.append(topic)
                    reason = "topic limit reached: the connections of key \"\(key)\" hold at most \(perKey) distinct topics"
                    continue
                }
                if newToAll, state.all.count >= total {
                    refused.append(topic)
                    reason = reason ?? "topic limit reached: the relay holds at most \(total) distinct topics"
                    continue
                }
                if newToAll, let cap, cap.eventTypes.contains(topic.eventType) {
                    if topic.isWildcard || (state.capped[topic.ticker] == nil && state.capped.count >= cap.tickers) {
                        refused.append(topic)
                        reason = reason ?? capReason(cap)
                        continue
                    }
                    state.capped[topic.ticker, default: 0] += 1
                }
                held[topic, default: 0] += 1
                state.all[topic, default: 0] += 1
                holds += 1
                state.allSubscriptions += 1
            }
            state.keys[key] = held.isEmpty ? nil : held
            return (refused, reason)
        }
    }

    func release(_ topics: [Topic], for key: String) {
        state.withLock { state in
            guard var held = state.keys.removeValue(forKey: key) else { return }
            var holds = state.subscriptions.removeValue(forKey: key) ?? 0
            defer { state.subscriptions[key] = holds == 0 ? nil : holds }
            for topic in topics {
                guard let count = held[topic] else { continue }
                held[topic] = count > 1 ? count - 1 : nil
                holds -= 1
                state.allSubscriptions -= 1
                if let all = state.all[topic] {
                    state.all[topic] = all > 1 ? all - 1 : nil
                    if all == 1, let cap, cap.eventTypes.contains(topic.eventType), let tickers = state.capped[topic.ticker] {
                        state.capped[topic.ticker] = tickers > 1 ? tickers - 1 : nil
                    }
                }
            }
            state.keys[key] = held.isEmpty ? nil : held
        }
    }

    /// Distinct topics held in all, and by `key`.
    func counts(key: String) -> (all: Int, key: Int) {
        state.withLock { ($0.all.count, $0.keys[key]?.count ?? 0) }
    }

    /// Subscriptions (holds) in all, and of `key`.
    func subscriptionCounts(key: String) -> (all: Int, key: Int) {
        state.withLock { ($0.allSubscriptions, $0.subscriptions[key] ?? 0) }
    }
}

/// The topics a connection's budget holds whatever the subscription limits say: those of the session it
/// took back and has not subscribed again, whose holds they take over (``TopicLedger``). Written on the
/// connection's loop, read by its session's budget: `Sendable` behind a `Mutex`.
final class TransferableTopics: Sendable {
    private let box = Mutex<Set<Topic>>([])

    var topics: Set<Topic> {
        get { box.withLock { $0 } }
        set { box.withLock { $0 = newValue } }
    }
}
