import MarketCore

/// What the hub wants from its source as subscribers come and go (``WantedSet``), and the history and
/// tape told of each change.
extension MarketDataHub {
    func unindex(_ topic: Topic, _ subscriber: Subscriber) {
        if topic.isWildcard {
            wildcards[topic.eventType]?.remove(subscriber)
            if wildcards[topic.eventType]?.isEmpty == true {
                wildcards[topic.eventType] = nil
                if wildcardLinger > .zero {
                    wanted.linger(topic.eventType, until: .now + wildcardLinger)
                    endLingersWhenDue()
                } else {
                    wildcardUnwanted(topic.eventType)
                }
            }
        } else if let entry = entries[topic] {
            entry.subscribers.remove(subscriber)
            if entry.subscribers.isEmpty { tickerUnwanted(topic) }
            // Unwanted, its events stop: a folded state kept would go stale unseen. (Not while its
            // type's wildcard is held or lingers: they still come.)
            let covered = wildcards[topic.eventType] != nil || wanted.lingers(topic.eventType)
            if entry.subscribers.isEmpty, !covered { entry.fold?.interrupt() }
            // Unwanted and nothing worth keeping (no last value, or a cluster node's): freed, so junk
            // topics leave no trace.
            if entry.subscribers.isEmpty, !covered, entry.last == nil || !keepsUnwantedLastValues {
                removeEntry(topic)
            }
        }
    }

    /// A ticker topic got its first subscriber.
    func tickerWanted(_ topic: Topic) { follow(wanted.tickerSubscribed(topic)) }

    /// A ticker topic lost its last subscriber.
    private func tickerUnwanted(_ topic: Topic) { follow(wanted.tickerUnsubscribed(topic)) }

    /// The wildcard of a type got its first subscriber: it replaces the type's tickers upstream (or it
    /// lingered, and nothing changes).
    func wildcardWanted(_ eventType: String) { follow(wanted.wildcardSubscribed(eventType)) }

    /// The wildcard of a type lost its last subscriber, and any linger ended: the type's tickers are
    /// wanted again.
    private func wildcardUnwanted(_ eventType: String) {
        follow(wanted.wildcardUnsubscribed(eventType))
        // Books nobody holds by name any more stop coming: no longer vouched for.
        for topic in entriesOfType[eventType] ?? [] {
            guard let entry = entries[topic], entry.subscribers.isEmpty else { continue }
            entry.fold?.interrupt()
            if !keepsUnwantedLastValues { removeEntry(topic) }
        }
    }

    /// Lets go of each lingering wildcard when its time is up (one task, for the first to end).
    private func endLingersWhenDue() {
        guard lingerTimer == nil, let due = wanted.nextLingerEnd else { return }
        lingerTimer = Task { [weak self] in
            try? await Task.sleep(until: due, clock: .continuous)
            await self?.lingersDue()
        }
    }

    private func lingersDue() {
        lingerTimer = nil
        for type in wanted.lingerEnded(by: .now) { wildcardUnwanted(type) }
        reportWantedChange()
        endLingersWhenDue()
    }

    /// The history keeps a topic whole from when it is wanted.
    private func follow(_ step: WantedSet.Step) {
        guard !step.isEmpty else { return }
        tap?.wantedChanged(step, epoch: history?.epoch)
        guard let history else { return }
        let now = WallClock.nowMilliseconds()
        for (topic, wanted) in step {
            if wanted { history.wanted(topic, now: now) } else { history.unwanted(topic, now: now) }
        }
    }
}
