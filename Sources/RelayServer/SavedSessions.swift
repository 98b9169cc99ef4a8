import MarketCore
import MarketDataHub

/// A broken tagged session as a stopping relay saves it for its next start: its name (key name and
/// tag, never the key), where it broke (a market sequence of an epoch) and its topics. Value type,
/// `Sendable`, `Codable` (the composition root writes it beside the market's tape).
public struct SavedSession: Sendable, Codable, Equatable {
    public var name: String
    public var epoch: String
    public var resumeAfter: UInt64
    public var topics: [String]
    /// Topics added after the session's start, each with the market sequence it was added at, where
    /// later than `resumeAfter` (absent in files written before it was saved: none).
    public var floors: [String: UInt64]?

    public init(name: String, epoch: String, resumeAfter: UInt64, topics: [String], floors: [String: UInt64]? = nil) {
        self.name = name
        self.epoch = epoch
        self.resumeAfter = resumeAfter
        self.topics = topics
        self.floors = floors
    }
}

extension RelayServer {
    /// Each market's broken tagged sessions, once the connections the stop closed have shelved theirs
    /// (a stopping relay saves them: its clients come back to the next start).
    /// Connections still open then (the close gave up on them) are saved where they stand, as the
    /// running relay's checkpoint saves them.
    public func savedSessions() async -> [Market: [SavedSession]] {
        for route in markets { await route.shelf.settled() }
        return checkpointSessions()
    }

    /// Each market's tagged sessions, kept and open, where each stands now (no waiting): what a running
    /// relay saves every second, so that a start after a crash takes them back too (an open one from
    /// where its client had acknowledged: a little may be replayed twice, nothing skipped).
    public func checkpointSessions() -> [Market: [SavedSession]] {
        var saved: [Market: [SavedSession]] = [:]
        for route in markets {
            saved[route.market] = route.shelf.checkpoint().map { name, standing in
                SavedSession(
                    name: name, epoch: standing.epoch, resumeAfter: standing.resumeAfter, topics: standing.topics.map(\.description).sorted(),
                    floors: standing.floors.isEmpty ? nil : Dictionary(standing.floors.map { ($0.key.description, $0.value) }, uniquingKeysWith: max))
            }.sorted { $0.name < $1.name }
        }
        return saved
    }

    /// Shelves sessions a previous run saved, before any client connects, each for a whole resume window
    /// from now and parked as a broken connection's is (its topics wanted from the first event, and held
    /// in its key's topic budget). A session of another epoch (a failover, or a start that could not go
    /// on in the saved one) is shelved too: its reconnect resumes across the terms, or is told `gap`.
    /// What is not restored (past the shelf's bound, or topics past their key's limits) is remembered
    /// for the window: a reconnect under the name is told `gap` for it. Returns how many were shelved.
    @discardableResult
    public func restore(_ sessions: [SavedSession], market: Market) async -> Int {
        guard let route = markets.first(where: { $0.market == market }) else { return 0 }
        let until = ContinuousClock.now + configuration.resume.window
        var restored = 0
        for (index, saved) in sessions.enumerated() where !saved.name.isEmpty {
            let topics = Array(Set(saved.topics.compactMap { Topic(parsing: $0) }))
            guard !topics.isEmpty else { continue }
            guard index < configuration.resume.sessions else {
                route.shelf.forgotten.forget(
                    saved.name, topics: Set(topics),
                    why: "its session was not restored after the restart: more were saved than the relay keeps (resume.sessions)", until: until)
                continue
            }
            // Held in the key's budget as the connection held them (a budget that shrank meanwhile
            // refuses some: those are not restored, and told).
            let refused = Set(route.ledger.reserve(topics, for: SessionShelf.key(of: saved.name)).refused)
            if !refused.isEmpty {
                route.shelf.forgotten.forget(
                    saved.name, topics: refused, why: "not restored after the restart: past its key's topic limits", until: until)
            }
            let kept = topics.filter { !refused.contains($0) }
            guard !kept.isEmpty else { continue }
            let parked = await route.hub.subscribe(to: Set(kept))
            await route.hub.park(parked.id)
            var floors: [Topic: UInt64] = [:]
            for (text, sequence) in saved.floors ?? [:] {
                if let topic = Topic(parsing: text), kept.contains(topic), sequence > saved.resumeAfter { floors[topic] = sequence }
            }
            route.shelf.keep(
                SessionShelf.Session(
                    epoch: saved.epoch, resumeAfter: saved.resumeAfter, topics: Set(kept), brokeAt: .now, parked: parked.id, floors: floors),
                as: saved.name)
            restored += 1
        }
        return restored
    }
}
