import AsyncSupport
import MarketCore

/// Feeds a hub from its source's inbox: the one loop between any source and ``MarketDataHub``, beside
/// the hub rather than in the composition root. A run of queued messages goes to the hub as few calls as
/// order allows (consecutive events as one ``MarketDataHub/publish(_:)``), each of at most
/// ``publishLimit`` events.
package enum HubPump {
    /// The most events one publish carries. A backlog the pump catches up on (the hub fell behind its
    /// source for a moment) goes to the hub in turns a subscriber's buffer holds several of, its reader
    /// taking the first while the next are published: one publish larger than the buffer would drop the
    /// rest for every subscriber of those events, however fast it reads. (The size a source inbox merges
    /// runs of events up to, and a replay's batch.)
    package static let publishLimit = 256

    /// Drains `inbox` into `hub` until the inbox finishes. `lossReason` names why the source's own
    /// queue overflowed (told to the subscribers of the topics lost).
    /// - Parameters:
    ///   - published: told how many events each publish carried (a source's own counters).
    ///   - dropped: told how many events the inbox dropped, as it reports them.
    package static func run(
        _ inbox: SourceInbox, into hub: MarketDataHub, lossReason: String, published: (Int) -> Void = { _ in },
        dropped: (Int) -> Void = { _ in }
    ) async {
        await inbox.drain { items in
            var events: [MarketEvent] = []
            func publish(_ run: [MarketEvent]) async {
                published(run.count)
                await hub.publish(run)
            }
            for item in items {
                switch item {
                case .element(.events(let more)):
                    if events.isEmpty { events = more } else { events += more }
                    // A run larger than a publish: in turns of the limit, the rest joining what comes next.
                    var start = 0
                    while events.count - start > publishLimit {
                        await publish(Array(events[start..<(start + publishLimit)]))
                        start += publishLimit
                    }
                    if start > 0 { events = Array(events[start...]) }
                    continue
                default:
                    break
                }
                if !events.isEmpty {
                    await publish(events)
                    events = []
                }
                switch item {
                case .element(.events): break
                case .element(.authenticated): break  // the first event after it ends an outage
                case .element(.connectionLost(let reason)): await hub.upstreamLost(reason: reason)
                case .element(.seed(let event)): await hub.seed(event)
                case .element(.epoch(let epoch)): await hub.startEpoch(epoch)
                case .element(.leaderStamped(let epoch, let through, let freshFor)):
                    await hub.leaderStamped(through: through, epoch: epoch, freshFor: freshFor)
                case .element(.notice(let notice)): await hub.sourceSays(notice)
                case .element(.recovered(let topic, let recovered, let order)): _ = await hub.deliverRecovered(topic, recovered, order: order)
                case .element(.recoveryEnded(let end, let generation)):
                    switch end {
                    case .filled(let summary): await hub.announceRecovered(summary, generation: generation)
                    case .skipped: await hub.noteFillSkipped(generation: generation)
                    case .nothing: await hub.finishFill(generation: generation)
                    }
                case .element(.lost(let count, let topics, let reason)): await hub.reportLoss(count, topics: topics, reason: reason)
                case .element(.refused(let topics, let code, let reason)): await hub.upstreamRefused(topics, code: code, reason: reason)
                case .lost(let lost, _):
                    dropped(lost.count)
                    await hub.reportLoss(lost.count, topics: lost.topics, reason: lossReason)
                }
            }
            if !events.isEmpty { await publish(events) }
        }
    }
}
