import MarketCore
import Synchronization

/// Distinct topics held by the market connections of each key and by all of them, so that no key,
/// and no crowd of connections, can make the upstream subscription grow without bound: a topic new to
/// its key past `perKey`, or new to the relay past `total`, is refused with an error status (the
/// connection goes on). Counted by reference: a topic is held while any connection of the key (or
/// any connection at all) holds it. `Sendable`; the tables sit behind a `Mutex`.
final class TopicLedger: Sendable {
    private struct State {
        var all: [Topic: Int] = [:]
        var keys: [String: [Topic: Int]] = [:]
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
    let cap: TickerCap?
    private let state = Mutex(State())

    init(perKey: Int, total: Int, cap: TickerCap? = nil) {
        self.perKey = perKey
        self.total = total
        self.cap = cap.flatMap { $0.eventTypes.isEmpty ? nil : $0 }
    }

    private func capReason(_ cap: TickerCap) -> String {
        "\(cap.vendor)'s \(cap.market) cap reached: \(cap.eventTypes.sorted().joined(separator: " and ")) allow at most \(cap.tickers) "
            + "distinct tickers per upstream connection (the ones subscribed first keep their place)"
    }

    /// What a ``ServerSession`` asks before it subscribes new topics.
    var budget: TopicBudget {
        TopicBudget(reserve: { self.reserve($0, for: $1.name) }, release: { self.release($0, for: $1.name) })
    }

    /// Takes `topics` (each new to the connection asking) for `key`; returns those refused and why.
    func reserve(_ topics: [Topic], for key: String) -> (refused: [Topic], reason: String?) {
        state.withLock { state in
            // Taken out and put back, so it is changed in place rather than copied.
            var held = state.keys.removeValue(forKey: key) ?? [:]
            var refused: [Topic] = []
            var reason: String?
            for topic in topics {
                let newToKey = held[topic] == nil
                let newToAll = state.all[topic] == nil
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
            }
            state.keys[key] = held.isEmpty ? nil : held
            return (refused, reason)
        }
    }

    func release(_ topics: [Topic], for key: String) {
        state.withLock { state in
            guard var held = state.keys.removeValue(forKey: key) else { return }
            for topic in topics {
                guard let count = held[topic] else { continue }
                held[topic] = count > 1 ? count - 1 : nil
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
}
