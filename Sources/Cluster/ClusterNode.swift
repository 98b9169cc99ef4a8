import AsyncSupport
import CoreMetrics
import Foundation
import Logging
import MarketDataHub
import NIOCore
import MarketCore
import ServiceLifecycle
import Synchronization
import Tape
import Upstream

/// One relay node of a cluster on NATS: it feeds its own hub from NATS, publishes what its hub wants,
/// and, while it holds the cluster's upstream lease, is the leader: the one node connected upstream,
/// publishing every upstream event's exact bytes to NATS.
///
/// The lease is a JetStream key-value entry, taken with create-if-absent and renewed with a
/// revision-checked update every fifth of its lifetime. The upstream connection is opened only after
/// the lease is taken, and closed when half the lease has passed without a renewal — before the lease
/// can lapse and another node take it — so two upstream connections never exist at once. That close
/// needs this node's tasks to run; as a backstop the upstream client's own service thread closes the
/// socket at 3/5 of the lease after the last renewal, whatever the cooperative pool is doing. A renewal
/// that shows the lease gone (the bucket lost, the key empty) or taken by another node closes the
/// upstream at once. The lapse alone does not protect against a bucket that loses its values (NATS
/// restarted with it in memory): a node that takes the lease without having watched it held connects
/// upstream only a whole lease after its view of the bucket began (``LeaseView``). On graceful shutdown
/// the leader closes upstream first, then deletes the lease, and a follower takes over within one poll
/// interval.
///
/// `Sendable`; a `Service`. State behind a `Mutex`; ``run()`` owns every task and the NATS connection.
public final class ClusterNode: Service, Sendable {
    /// What `/healthz` shows of the cluster: the feed report's cluster part.
    public typealias Status = ClusterReport

    private struct State {
        /// The last leader's term whose interest request this node answered.
        var answeredTerm = ""
        var connection: NATSConnection?
        var feed: ClusterFeed?
        var leading = false
        var leader: String?
        /// The term of the leader's lease (``LeaseValue/term``), and of this node's own last one.
        var leaderTerm: String?
        var ownTerm: String?
        var lastKnownLeader: String?
        /// The holders of the last terms this node read in the lease, by term: a term's epoch is named
        /// like it, so a new epoch's notice names the leader whose term ended.
        var termHolders = TermHolders()
        var upstream: UpstreamClient?
        /// This term's upstream set as last applied, and the topics it dropped since (a node's interest
        /// lapsed): one taken back skips a sequence (``TermSequencer/interrupt(_:)``).
        var upstreamApplied: Set<Topic> = []
        var upstreamDropped: Set<Topic> = []
        var interest: InterestTable
        var leaseBucket: KeyValueBucket?
        var lastValueBucket: KeyValueBucket?
        /// Tries to bind the last-value store again while there is none (``retryLastValues(_:)``).
        var lastValueRetry: Task<Void, Never>?
        var stopped = false
    }

    public let configuration: ClusterConfiguration
    /// The largest event this node takes from NATS (``ClusterChecks/maxEventBytes``; a news market's
    /// items are allowed more).
    let maxEventBytes: Int
    /// What an event from NATS or the cluster's tape must be (``EventCheck``): what the upstream takes.
    let eventCheck: EventCheck
    public let subjects: ClusterSubjects
    private let hub: MarketDataHub
    private let localInterest: LocalInterest
    private let makeUpstream: @Sendable () async throws -> UpstreamClient
    /// Whether the leader gives events their positions before publishing them (the nodes keep history).
    private let stampsPositions: Bool
    private let metrics: ClusterMetrics
    private let logger: Logger
    private let state: Mutex<State>
    /// Answers to a new leader's request for every node's interest: at most ten a second.
    private let termAnswers = Throttle(interval: .milliseconds(100))
    /// Changed last values waiting for the next write to the last-value store (leader only).
    private let pendingLastValues = Mutex<[Topic: ByteBuffer]>([:])
    /// The leader's order books (folded topics), whole in the last-value store (``FoldedLastValues``).
    private let foldedLastValues = Mutex(FoldedLastValues())
    /// The rules a topic in another node's interest must pass (a client's subscription passes the same).
    private let topicRules: SessionLimits
    /// The market this node serves (the lease's key).
    public let market: String
    /// Shared by this process's nodes of every market: leadership spreads across the cluster.
    private let spread: LeadershipSpread?
    /// The positions of this node's term as leader, given to live and recovered events alike.
    private let sequencer: TermSequencer
    /// Gap fill: this node asks after each outage, and fills the cluster's asks while it leads.
    private let fills: ClusterGapFill?
    /// The cluster's tape of this market (``JetStreamTape``), which this node records while it leads
    /// (`recorder`) and every node reads (``archive``).
    private let tape: JetStreamTape?
    /// What this node recorded on the cluster's tape while it led (`/healthz` shows its report).
    public let recorder: TapeRecorder?
    /// Resumes reaching further back than this node's memory read the cluster's tape.
    public let archive: TapeArchive?

    /// - Parameters:
    ///   - localInterest: where this node's hub reports the topics it wants.
    ///   - makeUpstream: a new upstream client, made each time this node becomes leader.
    package init(
        configuration: ClusterConfiguration, market: String, hub: MarketDataHub, localInterest: LocalInterest,
        metricsFactory: any MetricsFactory = MetricsSystem.factory, logger: Logger, spread: LeadershipSpread? = nil,
        stampsPositions: Bool = false, gapFill: ClusterGapFillHook? = nil, tape tapeSettings: ClusterTapeSettings? = nil,
        maxEventBytes: Int = ClusterChecks.maxEventBytes, check: EventCheck? = nil,
        makeUpstream: @escaping @Sendable () async throws -> UpstreamClient
    ) throws(ClusterError) {
        self.stampsPositions = stampsPositions
        self.maxEventBytes = maxEventBytes
        self.configuration = configuration
        self.market = market
        self.spread = spread
        subjects = try ClusterSubjects(cluster: configuration.name, market: market)
        eventCheck = check ?? EventCheck(market: subjects.wireMarket, wire: hub.wire, maxBytes: maxEventBytes)
        topicRules = ClusterChecks.rules(ofMarket: market, wire: hub.wire)
        self.hub = hub
        self.localInterest = localInterest
        self.makeUpstream = makeUpstream
        let metrics = ClusterMetrics(factory: metricsFactory)
        self.metrics = metrics
        self.logger = logger
        let tape = tapeSettings.map { [subjects] in JetStreamTape(subjects: subjects, settings: $0) }
        var recorder: TapeRecorder?
        if let tape {
            var recording = TapeRecorder.Settings(directory: "", market: market)
            recording.flushInterval = tape.settings.flushInterval
            recording.vendor = tape.settings.vendor
            recording.upstreamPath = tape.settings.upstreamPath
            recording.logger = logger
            do {
                recorder = try TapeRecorder(settings: recording, sink: JetStreamTapeSink(tape: tape), held: { tape.held() }, metricsFactory: metricsFactory)
            } catch {
                logger.warning("the cluster's tape is not recorded by this node: \(error)")
            }
        }
        self.tape = tape
        self.recorder = recorder
        let check = TapeEventCheck(check: eventCheck, metrics: metrics, logger: logger)
        archive = tape.map { tape in
            TapeArchive(market: market) { epoch, days, _ in days == 1 ? JetStreamTapeBlocks(tape: tape, epoch: epoch, check: check) : nil }
        }
        let sequencer = TermSequencer(tap: recorder)
        self.sequencer = sequencer
        fills = gapFill.map { [subjects] in
            ClusterGapFill(
                hook: $0, subjects: subjects, node: configuration.nodeID, hub: hub, sequencer: sequencer, check: check.check, metrics: metrics,
                logger: logger)
        }
        let interest = InterestTable(
            ttl: configuration.interestTTL, maxTopicsPerNode: configuration.maxTopicsPerNode, maxTopics: configuration.maxTopics)
        state = Mutex(State(interest: interest))
    }

    // MARK: reading

    /// Where this node stands in the cluster.
    public var status: Status {
        state.withLock { state in
            Status(
                role: state.stopped ? "stopped" : state.leading ? "leader" : "follower", node: configuration.nodeID,
                leader: state.leader, nats: state.connection?.state.rawValue ?? NATSState.connecting.rawValue,
                liveNodes: state.interest.liveNodes, subscriptions: state.feed?.subscriptionCount ?? 0)
        }
    }

    /// Whether this node can serve: NATS connected and a leader known.
    public var isHealthy: Bool {
        let status = self.status
        return status.nats == NATSState.connected.rawValue && status.leader != nil
    }

    /// This node's upstream client while it leads.
    public var upstream: UpstreamClient? { state.withLock { $0.upstream } }

    /// Whether the cluster's last-value store is bound (tests).
    var hasLastValueStore: Bool { state.withLock { $0.lastValueBucket != nil } }

    /// Lookups of the last-value store for clients (`/v1/last`): those under way by topic (each holds
    /// a thread of the NATS request pool, which other buckets' calls share, the lease's apart, so at
    /// most ``maxLastValueLookups`` at once; a request for a topic being looked up joins that lookup),
    /// and the answers of the last quarter second.
    private struct LastValueLookups {
        var flights: [Topic: Task<MarketEvent?, Never>] = [:]
        var recent = RecentLastValues()
    }

    private let lastValueLookups = Mutex(LastValueLookups())
    static let maxLastValueLookups = 8

    /// A topic's last event from the cluster's last-value store for `/v1/last` on a node whose clients do
    /// not want the topic: a recent answer, the lookup under way for it, or a new lookup; `.busy` past
    /// ``maxLastValueLookups`` lookups at once.
    public func lastValue(for topic: Topic) async -> LastValueLookup {
        enum Step {
            case known(MarketEvent?)
            case flight(Task<MarketEvent?, Never>, joined: Bool)
            case busy
        }
        let step: Step = lastValueLookups.withLock { lookups in
            if let known = lookups.recent.answer(for: topic, at: .now) { return .known(known) }
            if let flight = lookups.flights[topic] { return .flight(flight, joined: true) }
            guard lookups.flights.count < Self.maxLastValueLookups else { return .busy }
            let flight = Task { [weak self] () -> MarketEvent? in
                // An answer is as old as the moment the store was asked (a stalled NATS may take a second).
                let askedAt = ContinuousClock.now
                let read = await self?.storedEvent(for: topic) ?? .unanswered
                self?.lastValueLookups.withLock { lookups in
                    lookups.flights[topic] = nil
                    // What the store said is kept; a read that failed is not taken for "none".
                    if case .answered(let event) = read { lookups.recent.remember(event, for: topic, at: askedAt, now: .now) }
                }
                return read.event
            }
            lookups.flights[topic] = flight
            return .flight(flight, joined: false)
        }
        let event: MarketEvent?
        switch step {
        case .busy:
            metrics.lastValueLookup("refused")
            return .busy
        case .known(let known):
            metrics.lastValueLookup("recent")
            event = known
        case .flight(let flight, let joined):
            metrics.lastValueLookup(joined ? "joined" : "store")
            event = await flight.value
        }
        return event.map { .found($0) } ?? .none
    }

    /// A topic's last event from the cluster's last-value store.
    public func lastEvent(for topic: Topic) async -> MarketEvent? { await storedEvent(for: topic).event }

    /// What reading the last-value store gave: its answer (an event, or none), or no answer (no store
    /// yet, NATS failed or timed out).
    enum StoreRead {
        case answered(MarketEvent?)
        case unanswered

        var event: MarketEvent? {
            if case .answered(let event) = self { event } else { nil }
        }
    }

    private func storedEvent(for topic: Topic) async -> StoreRead {
        guard !topic.isWildcard else { return .answered(nil) }
        guard let bucket = state.withLock({ $0.lastValueBucket }) else { return .unanswered }
        let stored: KeyValueBucket.Entry?
        do { stored = try await bucket.get(subjects.lastValueKey(for: topic)) } catch { return .unanswered }
        guard let entry = stored, !entry.value.isEmpty else { return .answered(nil) }
        switch entry.value.withUnsafeBytes({ eventCheck.event($0, topic: topic) }) {
        case .success(let event): return .answered(event)
        case .failure(let rejection):
            metrics.rejected("event", "\(rejection) (last-value store, \(topic))", logger: logger)
            return .answered(nil)
        }
    }

    // MARK: running

    public func run() async throws {
        let connection = NATSConnection(
            servers: configuration.servers, name: "relay \(configuration.name)/\(configuration.nodeID)", security: configuration.security,
            logger: logger)
        if let problem = connection.setupError {
            state.withLock { $0.stopped = true }
            throw ClusterError.natsSetup(problem)
        }
        let feed = ClusterFeed(
            connection: connection, subjects: subjects, node: configuration.nodeID, hub: hub, metrics: metrics, logger: logger,
            check: eventCheck, epochHoldLimit: max(.seconds(2), configuration.renewInterval + .seconds(1)),
            holder: { [weak self] epoch in
                self?.state.withLock { $0.ownTerm == epoch ? .thisProcess : $0.termHolders.holder(of: epoch).map { .node($0) } }
            }
        ) {
            [weak self] topic in await self?.lastEvent(for: topic)
        }
        state.withLock { state in
            state.connection = connection
            state.feed = feed
        }
        tape?.use(connection)
        feed.start()
        await fills?.start(connection: connection, feed: feed)
        let interestSink = NATSMessageSink { [weak self] subject, payload in
            guard let self else { return }
            // Larger than any part a node sends: refused before it is decoded (on libnats' thread).
            guard payload.count <= InterestTable.Part.maxBytes else {
                metrics.rejected("interest", "a message of \(payload.count) bytes (a part is at most \(InterestTable.Part.maxBytes))", logger: logger)
                return
            }
            received(interestOf: String(cString: subject), payload: String(decoding: payload, as: UTF8.self))
        }
        // Parts of at most ``InterestTable/Part/maxBytes``: a flood waits in no more than this.
        _ = connection.subscribe(subjects.allInterest, sink: interestSink, pendingBytes: 64 << 20)
        answerInterestRequests(on: connection)

        // The hub tells each change of its wanted set, on the hub: nothing here costs it more than a
        // poke. The NATS subscriptions follow the set in batches of 20 ms (one diff of the whole set
        // each, off the hub), and the interest is published at once, then at most four times a second
        // however clients churn (each publish sorts and sends the whole set).
        let wantedBatch = Debouncer(delay: .milliseconds(20))
        let interestPublisher = Throttle(interval: .milliseconds(250))
        localInterest.listen { [weak self, weak feed] _ in
            wantedBatch.poke { [weak self, weak feed] in
                guard let localInterest = self?.localInterest, let feed else { return }
                feed.setWanted { localInterest.topics }
                interestPublisher.request { [weak self] in self?.publishInterest() }
            }
        }
        logger.info(
            "cluster node starting",
            metadata: [
                "node": "\(configuration.nodeID)", "cluster": "\(configuration.name)", "nats": "\(configuration.displayServers)",
                "lease_s": "\(configuration.leaseDuration)",
            ])

        // The link lost and back, told on libnats' thread as they happen: in order with the messages it
        // delivers around them (a watcher hears of them later; a quick reconnect's events could come first).
        connection.onChange { [weak feed] old, new in
            if new == .reconnecting {
                feed?.announceLost("this relay node lost its connection to NATS", linkDown: true)
            } else if new == .connected, old != .connected {
                feed?.linkBack()
            }
        }
        let helpers = [
            Task { await feed.run() },
            Task { await self.tick() },
            Task { await self.watch(connection, feed: feed) },
        ]
        let lease = Task { () async -> ClusterError? in
            do throws(ClusterError) {
                try await self.leaseLoop(feed: feed)
                return nil
            } catch {
                return error
            }
        }
        let fatal: ClusterError? = await withGracefulShutdownHandler {
            await withTaskCancellationHandler {
                await lease.value
            } onCancel: {
                lease.cancel()
            }
        } onGracefulShutdown: {
            lease.cancel()
        }
        let retry = state.withLock { state in
            state.stopped = true
            return state.lastValueRetry
        }
        retry?.cancel()
        for task in helpers { task.cancel() }
        feed.stop()
        await connection.close()
        if let fatal {
            logger.critical("\(fatal.description)", metadata: ["node": "\(configuration.nodeID)"])
            throw fatal
        }
        logger.info("cluster node stopped", metadata: ["node": "\(configuration.nodeID)"])
    }

    // MARK: interest

    /// The generation of this node's last interest publish (new process, higher start), held while the
    /// parts are published so two publishes never interleave.
    private let interestGeneration = Mutex<UInt64>(UInt64(Date().timeIntervalSince1970 * 1_000_000))

    /// Answers requests for this node's interest. Anyone who may publish on the cluster's subjects may
    /// ask: answered at once, then at most once a second, however many ask (each answer sorts and
    /// publishes the node's whole wanted set, and every node reads it). A new leader's request names its
    /// term: the term the lease holds, not answered yet, is answered at once whatever came before it (at
    /// most ten times a second); any other name waits its turn with the rest, so neither made-up terms
    /// nor two taken in turn undo the bound. (A new leader's request may come before this node's lease
    /// read shows its term: that read answers it, ``observe(leader:term:feed:)``.)
    private func answerInterestRequests(on connection: NATSConnection) {
        let requestAnswers = Throttle(interval: .seconds(1))
        let termAnswers = self.termAnswers
        let requestSink = NATSMessageSink { [weak self] _, payload in
            guard let self else { return }
            let term = String(decoding: payload.prefix(128), as: UTF8.self)
            let newTerm = !term.isEmpty && state.withLock { state in
                guard state.leaderTerm == term, state.answeredTerm != term else { return false }
                state.answeredTerm = term
                return true
            }
            (newTerm ? termAnswers : requestAnswers).request { [weak self] in self?.publishInterest() }
        }
        _ = connection.subscribe(subjects.interestRequest, sink: requestSink, pendingBytes: 16 << 20)
    }

    /// Publishes this node's wanted set in parts (see ``InterestTable/Part``), capped at
    /// ``ClusterConfiguration/maxTopicsPerNode`` (the leader would refuse more): past it, the first
    /// topics in order are asked for, and the rest is counted and logged, never dropped silently.
    private func publishInterest() {
        // Not connected yet: the first connection publishes it (``watch(_:feed:)``).
        guard let connection = state.withLock({ $0.stopped ? nil : $0.connection }), connection.state != .connecting else { return }
        var topics = localInterest.topics.sorted()
        if topics.count > configuration.maxTopicsPerNode {
            metrics.interestCapped(wanted: topics.count, cap: configuration.maxTopicsPerNode, logger: logger)
            topics.removeLast(topics.count - configuration.maxTopicsPerNode)
        }
        let subject = subjects.interest(of: configuration.nodeID)
        interestGeneration.withLock { generation in
            generation += 1
            for part in InterestTable.Part.split(topics, generation: generation) where !connection.publish(subject, part.text) {
                metrics.publishFailed("interest", logger: logger)
                return
            }
        }
    }

    private func received(interestOf subject: String, payload: String) {
        guard let token = subject.split(separator: ".").last,
            let node = ClusterSubjects.decodeToken(token)
        else {
            metrics.rejected("interest", "\(subject.prefix(200)): not a node's interest subject", logger: logger)
            return
        }
        guard node.utf8.count <= 128 else {
            metrics.rejected("interest", "a node name longer than 128 bytes", logger: logger)
            return
        }
        guard let header = InterestTable.Part.parse(payload) else {
            metrics.rejected("interest", "from node \(node): not an interest message (\(payload.utf8.count) bytes)", logger: logger)
            return
        }
        let list = Topic.parseList(String(header.topics))
        let (topics, refused) = ClusterChecks.interest(list.topics, invalid: list.invalid, limits: topicRules)
        if !refused.isEmpty {
            metrics.rejected("interest", "from node \(node): \(refused.joined(separator: "; "))", logger: logger)
        }
        guard topics.count <= InterestTable.Part.topicsPerPart else {
            metrics.rejected("interest", "from node \(node): \(topics.count) topics in one part (at most \(InterestTable.Part.topicsPerPart))", logger: logger)
            return
        }
        let part = InterestTable.Part(generation: header.generation, part: header.part, parts: header.parts, topics: Array(topics))
        let (outcome, upstream, leading) = state.withLock { state in
            (state.interest.receive(part, from: node, at: .now), state.upstream, state.leading)
        }
        switch outcome {
        case .gathering:
            break
        case .complete(let change):
            if change.changed, upstream != nil { updateUpstreamTopics() }
            // Every node keeps the table (a new leader starts from it); the leader speaks for it.
            guard !change.refused.isEmpty, leading else { break }
            metrics.interestPastTheUnion(change.refused.count, node: node, cap: configuration.maxTopics, logger: logger)
            // Every node's clients of these topics are told, as of topics the upstream refused (the
            // first ones by name; a hostile set's whole refusal would be a flood on the control subject).
            let named = Set(change.refused.sorted().prefix(Self.refusalsNamed))
            let reason = "the cluster asks its upstream for at most \(configuration.maxTopics) distinct topics"
            publish(control: .refused(topics: named, code: 405, reason: reason))
        case .outOfSequence:
            metrics.rejected(
                "interest", "from node \(node): a part out of sequence (one was lost); its next publish replaces it", logger: logger)
        case .tooManyTopics:
            metrics.rejected(
                "interest", "node \(node) wants more than \(configuration.maxTopicsPerNode) topics; its previous set stays", logger: logger)
        case .tooManyNodes:
            metrics.rejected("interest", "from node \(node): the cluster already counts the interest of 64 nodes", logger: logger)
        }
    }

    /// The most topics of one node's set past the union's bound the leader names to the clients.
    static let refusalsNamed = 2_000

    /// Upstream subscription changes, at most one batch per 50 ms.
    private let upstreamUpdate = Debouncer(delay: .milliseconds(50))

    private func updateUpstreamTopics() {
        upstreamUpdate.poke { [weak self] in
            guard let self else { return }
            let (union, upstream, back, changes) = state.withLock { state -> (Set<Topic>, UpstreamClient?, Set<Topic>, [(topic: Topic, wanted: Bool)]) in
                let union = state.interest.union
                guard state.upstream != nil else { return (union, nil, [], []) }
                let changes = union.subtracting(state.upstreamApplied).map { (topic: $0, wanted: true) }
                    + state.upstreamApplied.subtracting(union).map { (topic: $0, wanted: false) }
                state.upstreamDropped.formUnion(state.upstreamApplied.subtracting(union))
                let back = state.upstreamDropped.intersection(union)
                state.upstreamDropped.subtract(back)
                // Bounded: a term that dropped this many topics starts counting again.
                if state.upstreamDropped.count > 100_000 { state.upstreamDropped.removeAll() }
                state.upstreamApplied = union
                return (union, state.upstream, back, changes)
            }
            sequencer.interrupt(back)
            if upstream != nil { foldedLastValues.withLock { $0.interrupt(outside: union) } }
            if upstream != nil, let recorder, !changes.isEmpty { recorder.wantedChanged(changes, epoch: sequencer.epoch) }
            upstream?.setWantedTopics(union)
        }
    }

    /// Every quarter second: expire silent nodes, write changed last values (leader); every heartbeat:
    /// repeat this node's interest.
    private func tick() async {
        var lastHeartbeat = ContinuousClock.now
        // The leader's books it cannot vouch for are asked of its upstream anew (after a loss).
        var renewals = RenewalPacer()
        while !Task.isCancelled {
            try? await Task.sleep(for: configuration.lastValueInterval)
            let now = ContinuousClock.now
            let (expired, leading) = state.withLock { ($0.interest.expireNodes(at: now), $0.leading) }
            if expired.changed, leading {
                updateUpstreamTopics()
                // A node silent that long may be cut off only for a while (a stalled link): it learns, in
                // order with the events, that its clients' topics may have left the upstream meanwhile.
                for node in expired.nodes { publish(control: .forgotten(node: node)) }
            }
            if leading { writeLastValues() }
            if leading, hub.folding != nil, let upstream = state.withLock({ $0.upstream }), upstream.state == .authenticated {
                upstream.renewTopics(renewals.due(foldedLastValues.withLock { $0.notWhole() }, now: now))
            }
            if now - lastHeartbeat >= configuration.interestHeartbeat {
                lastHeartbeat = now
                publishInterest()
            }
        }
    }

    private func writeLastValues() {
        var changed = pendingLastValues.withLock { pending in
            defer { pending.removeAll(keepingCapacity: true) }
            return pending
        }
        for (topic, whole) in foldedLastValues.withLock({ $0.takeChanged() }) { changed[topic] = whole }
        guard !changed.isEmpty, let bucket = state.withLock({ $0.lastValueBucket }) else { return }
        for (topic, bytes) in changed {
            // A value past the store's bound would be refused, leaving the one before it to be read as
            // the last: an empty one says there is none (a node would not take it either).
            let bytes = bytes.readableBytes <= maxEventBytes ? bytes : ByteBuffer()
            let sent = bytes.withUnsafeReadableBytes { bucket.putWithoutAck(subjects.lastValueKey(for: topic), $0) }
            if !sent { metrics.publishFailed("last_value", logger: logger) }
        }
    }

    /// How long a node that starts without NATS waits before telling its clients no events come.
    static let unreachedNoticeDelay: Duration = .seconds(2)

    /// Tells this node's subscribers when NATS is lost (events stop), or not reached at start (after
    /// ``unreachedNoticeDelay``, so a usual start says nothing); republishes interest on return.
    private func watch(_ connection: NATSConnection, feed: ClusterFeed) async {
        var previous: NATSState?
        let servers = configuration.displayServers
        for await state in connection.stateUpdates() {
            defer { previous = state }
            switch state {
            case .connecting where previous == nil:
                Task {
                    try? await Task.sleep(for: Self.unreachedNoticeDelay)
                    guard connection.state == .connecting else { return }
                    feed.announceLost("this relay node has not reached NATS (\(servers)) yet; events come when it does")
                }
            case .connected where previous != nil && previous != .connected:
                // (The loss and the link back are told on libnats' thread as they happen: `onChange`.)
                publishInterest()
            default:
                break
            }
        }
    }

    // MARK: the lease

    /// Ends (throwing) only when the lease bucket's TTL is not this node's lease: refused, not obeyed.
    private func leaseLoop(feed: ClusterFeed) async throws(ClusterError) {
        var failures = 0
        var lastProblem: String?
        var foreignRevision: UInt64?
        func problem(_ text: String) {
            failures += 1
            if text != lastProblem {
                logger.warning("cluster lease: \(text); retrying", metadata: ["node": "\(configuration.nodeID)"])
                lastProblem = text
            }
        }
        let backoff = Backoff(initial: .milliseconds(250), cap: .seconds(5))
        var view = LeaseView(hold: configuration.leaseDuration)
        while !Task.isCancelled {
            guard let connection = state.withLock({ $0.connection }) else { return }
            var bucket = state.withLock { $0.leaseBucket }
            if bucket == nil, connection.state == .connecting {
                // Never connected yet: the connection says so itself.
                try? await Task.sleep(for: configuration.leasePollInterval)
                continue
            }
            if bucket == nil {
                do {
                    let lease = try await connection.keyValue(bucket: subjects.leaseBucket, ttl: configuration.leaseDuration, ownQueue: true)
                    // A bucket made by nodes with another lease keeps the lease for its own TTL, not this
                    // node's: the timing below would be wrong and nodes would take it from each other.
                    if let kept = lease.ttl, kept != configuration.leaseBucketTTL {
                        throw ClusterError.leaseMismatch(bucket: lease.name, bucketTTL: kept, configured: configuration.leaseBucketTTL)
                    }
                    let last = await openLastValues(connection)
                    state.withLock {
                        $0.leaseBucket = lease
                        $0.lastValueBucket = last
                    }
                    if last == nil { retryLastValues(connection) }
                    bucket = lease
                    view.reset()
                    failures = 0
                    if lastProblem != nil { logger.info("cluster lease: JetStream reachable again") }
                    lastProblem = nil
                } catch let error as ClusterError {
                    throw error
                } catch {
                    problem("\(error)")
                    try? await Task.sleep(for: backoff.delay(attempt: failures))
                    continue
                }
            }
            guard let bucket else { continue }
            let entry: KeyValueBucket.Entry?
            let sentWith = connection.continuity
            let askedAt = ContinuousClock.now
            do {
                entry = try await bucket.get(subjects.leaseKey)
                failures = 0
            } catch {
                view.reset()
                problem("reading the lease: \(error)")
                // After a NATS restart the bucket may be gone: bind (or create) it again.
                if failures >= 3 { state.withLock { $0.leaseBucket = nil } }
                try? await Task.sleep(for: backoff.delay(attempt: failures))
                continue
            }
            // A value that is not a relay node's lease (someone else wrote it) names no leader (so
            // /healthz says 503) and is not obeyed: the leader, if there is one, takes the lease back at
            // its next renewal. A follower does not take it: a leader may still be connected upstream,
            // so the follower waits for the leader's renewal or the value's lapse (its TTL).
            let holder = entry.flatMap { LeaseValue(parsing: $0.value) }
            view.read(
                revision: entry?.revision, holder: holder != nil, sentWith: sentWith, answeredWith: connection.continuity, at: .now)
            if let entry, holder == nil, entry.revision != foreignRevision {
                foreignRevision = entry.revision
                metrics.rejected(
                    "lease", "the lease key holds \(entry.value.count) bytes that are not a relay node's lease", logger: logger)
            }
            Self.tell(feed, lease: entry, holder: holder, askedAt: askedAt)
            if let holder, holder.node != configuration.nodeID, let term = holder.term, let through = holder.through {
                // Good for three renewals and a read: past it (lease reads failing) no event is refused by it.
                feed.leaderStamped(term: term, through: through, freshFor: configuration.renewInterval * 3 + configuration.leasePollInterval)
            }
            observe(leader: holder?.node, term: holder?.term, feed: feed)
            // Spread: leave a free lease to a live node that leads no market (for a bounded while).
            if entry == nil, let spread, spread.shouldDefer(market: market, liveNodes: state.withLock({ $0.interest.liveNodes })) {
                try? await Task.sleep(for: configuration.leasePollInterval)
                continue
            }
            if entry == nil, !Task.isCancelled {
                let asked = ContinuousClock.now
                let term = Self.newTerm()
                if let revision = try? await bucket.create(subjects.leaseKey, leaseValue(term: term)) {
                    let allowed = view.upstreamAllowed(takenAt: revision, continuity: connection.continuity, now: .now)
                    state.withLock { $0.ownTerm = term }
                    observe(leader: configuration.nodeID, term: term, feed: feed)
                    feed.leaseRead(term: term, askedAt: .now)
                    await lead(bucket: bucket, revision: revision, takenAt: asked, upstreamFrom: allowed, term: term, feed: feed)
                    // What this node saw before its term tells nothing about the bucket after it.
                    view.reset()
                    continue
                }
            }
            try? await Task.sleep(for: configuration.leasePollInterval)
        }
    }

    /// The last-value store, made (or changed) to its bounds. One that cannot be (the NATS servers'
    /// JetStream memory cannot reserve them, or its account's limits, or NATS failing) is bound as it
    /// is if it exists, never made without them; `nil`: none now (the node goes on without it, its
    /// lease unaffected, and tries again every ``ClusterConfiguration/lastValueRetry``), and said so.
    private func openLastValues(_ connection: NATSConnection) async -> KeyValueBucket? {
        let bucket = subjects.lastValueBucket
        do {
            return try await connection.keyValue(
                bucket: bucket, ttl: nil, limits: KeyValueLimits(valueBytes: maxEventBytes, bytes: configuration.lastValueBytes))
        } catch {
            let why = "could not be bounded to \(configuration.lastValueBytes >> 20) MB and \(maxEventBytes)-byte values (\(error))"
            if let existing = try? await connection.keyValue(bucket: bucket, ttl: nil, creating: false) {
                logger.warning("the cluster's last-value store \(bucket) \(why); bound as it is (see cluster.lastValueMB)")
                return existing
            }
            logger.warning("the cluster's last-value store \(bucket) \(why); this node goes on without it for now (see cluster.lastValueMB)")
            return nil
        }
    }

    /// Tries to bind the last-value store again every ``ClusterConfiguration/lastValueRetry``, off the
    /// lease loop (a slow NATS never holds a lease read up, and a leader's loop is in its term), while
    /// `connection` is still the node's, its buckets are bound on it and no store is.
    private func retryLastValues(_ connection: NATSConnection) {
        @Sendable func wanted(_ state: State) -> Bool {
            !state.stopped && state.connection === connection && state.leaseBucket != nil && state.lastValueBucket == nil
        }
        let task = Task {
            while !Task.isCancelled {
                try? await Task.sleep(for: configuration.lastValueRetry)
                guard !Task.isCancelled else { return }
                guard state.withLock({ wanted($0) }) else { return }
                guard let last = await openLastValues(connection) else { continue }
                let bound = state.withLock { state in
                    // Not one replaced meanwhile (its connection's buckets may be bound anew).
                    guard !Task.isCancelled, wanted(state) else { return false }
                    state.lastValueBucket = last
                    return true
                }
                if bound { logger.info("the cluster's last-value store \(subjects.lastValueBucket) is bound", metadata: ["node": "\(configuration.nodeID)"]) }
                return
            }
        }
        // One at a time: a rebind of the buckets replaces the one before; a stopped node keeps none.
        let replaced = state.withLock { state -> Task<Void, Never>? in
            if state.stopped { return task }
            let before = state.lastValueRetry
            state.lastValueRetry = task
            return before
        }
        replaced?.cancel()
    }

    /// Whose the next epoch is, read as this node's `term` ends: the lease loop reads again only after
    /// the term's teardown. (A read the loop made since wins: the feed takes the newest asked.)
    private func readLeaseAfter(term: String, bucket: KeyValueBucket, feed: ClusterFeed) {
        Task { [subjects] in
            let askedAt = ContinuousClock.now
            let entry: KeyValueBucket.Entry?
            do { entry = try await bucket.get(subjects.leaseKey) } catch { return }
            let holder = entry.flatMap { LeaseValue(parsing: $0.value) }
            // Its own term, still there until the teardown lets it go: it says nothing of the next.
            guard holder?.term != term else { return }
            Self.tell(feed, lease: entry, holder: holder, askedAt: askedAt)
        }
    }

    /// What the lease says of terms, as read (`entry`, and its `holder` when a relay node wrote it) at
    /// `askedAt`: the one it holds is live, and with none held none is; a foreign value says nothing.
    private static func tell(_ feed: ClusterFeed, lease entry: KeyValueBucket.Entry?, holder: LeaseValue?, askedAt: ContinuousClock.Instant) {
        if entry == nil {
            feed.leaseRead(term: nil, askedAt: askedAt)
        } else if let holder {
            feed.leaseRead(term: holder.term, termless: holder.term == nil, askedAt: askedAt)
        }
    }

    /// Notes the lease's holder and its term; a change away from another node's term (another node, or
    /// the same name restarted) tells this node's subscribers that events stopped (the first event from
    /// the new leader then announces the gap).
    private func observe(leader holder: String?, term: String?, feed: ClusterFeed) {
        spread?.observe(market: market, leader: holder)
        let (previous, change, failover) = state.withLock { state -> (String?, LeaderChange, Bool) in
            let previous = state.leader
            let change = LeaderChange(
                from: previous.map { LeaderChange.Holder(node: $0, term: state.leaderTerm) },
                to: holder.map { LeaderChange.Holder(node: $0, term: term) }, me: configuration.nodeID, ownTerm: state.ownTerm)
            state.leader = holder
            state.leaderTerm = term
            if let holder, let term { state.termHolders.note(term, heldBy: holder) }
            var failover = false
            if let holder {
                failover = state.lastKnownLeader != nil && (state.lastKnownLeader != holder || change.newTerm)
                state.lastKnownLeader = holder
            }
            return (previous, change, failover)
        }
        guard change.changed else { return }
        // Another node's term, new here: its request for every node's interest may have come before this read.
        if let holder, let term, holder != configuration.nodeID {
            let answered = state.withLock { state in
                defer { state.answeredTerm = term }
                return state.answeredTerm == term
            }
            if !answered { termAnswers.request { [weak self] in self?.publishInterest() } }
        }
        if failover { metrics.failovers.increment() }
        logger.info(
            "cluster leader of \(market): \(previous ?? "none") → \(holder ?? "none")\(change.newTerm ? " (a new term)" : "")",
            metadata: ["node": "\(configuration.nodeID)"])
        if let previous, change.othersTermEnded {
            let name = ClusterText.visible(previous, limit: 64)
            feed.announceLost("the cluster leader \(name) gave up the upstream connection (its lease ended); another node takes over")
        }
    }

    /// A notice on the control subject; a refused publish is counted and logged.
    private func publish(control: ClusterControl) {
        let connection = state.withLock { $0.connection }
        // Each message on its own: a refusal in parts loses only the parts that failed.
        for text in control.messages where connection?.publish(subjects.upstreamControl, text) != true {
            metrics.publishFailed("control", logger: logger)
        }
    }

    /// What this node writes as the lease's value in term `term`.
    private func leaseValue(term: String) -> String {
        LeaseValue(
            node: configuration.nodeID, leaseMs: configuration.leaseDuration.milliseconds, term: term, through: sequencer.stampedThrough(term: term)
        ).text
    }

    /// A new term's name: 12 random letters and digits (also its positions epoch).
    private static func newTerm() -> String {
        let alphabet = Array("abcdefghijklmnopqrstuvwxyz0123456789")
        return String((0..<12).map { _ in alphabet.randomElement() ?? "x" })
    }

    private enum TermEnd {
        case shutdown(validUntil: ContinuousClock.Instant)
        /// Leadership spreads: this market goes to a node that leads none (``LeadershipSpread``).
        case handOff(validUntil: ContinuousClock.Instant)
        case lost(String)
    }

    /// One term as leader: upstream connected while the lease is renewed (from `upstreamFrom` on, see
    /// ``LeaseView``), closed before it can lapse.
    private func lead(
        bucket: KeyValueBucket, revision: UInt64, takenAt: ContinuousClock.Instant, upstreamFrom: ContinuousClock.Instant, term: String,
        feed: ClusterFeed
    ) async {
        guard let connection = state.withLock({ $0.connection }) else { return }
        let upstream: UpstreamClient
        do {
            upstream = try await makeUpstream()
        } catch {
            // Released only once no earlier holder can still be connected (a node that saw this lease
            // held takes a released one at once); before that it is left to lapse.
            let release = ContinuousClock.now >= upstreamFrom
            let then = release ? "releasing the lease" : "leaving the lease to lapse"
            logger.error("this node took the lease but cannot make its upstream client: \(error); \(then)")
            if release { try? await bucket.delete(subjects.leaseKey) }
            try? await Task.sleep(for: configuration.leaseDuration)
            return
        }
        let union = state.withLock { state in
            state.leading = true
            state.upstream = upstream
            // What it refused while it followed was never told: named at each node's next publish
            // (the interest request below asks for them now).
            state.interest.nameRefusalsAgain()
            return state.interest.union
        }
        metrics.leader.record(1)
        let wait = upstreamFrom - ContinuousClock.now
        if wait > .zero {
            logger.warning(
                "this node leads the cluster but connects upstream only in \(wait.milliseconds) ms: it took a lease it had not seen held (just started, back on NATS, or NATS lost the lease bucket), and a holder NATS forgot may still be connected for up to 3/5 of the lease",
                metadata: ["node": "\(configuration.nodeID)", "upstream": "\(upstream.configuration.endpoint)", "topics": "\(union.count)"])
        } else {
            logger.info(
                "this node leads the cluster: connecting upstream",
                metadata: ["node": "\(configuration.nodeID)", "upstream": "\(upstream.configuration.endpoint)", "topics": "\(union.count)"])
        }
        upstream.setWantedTopics(union)
        // A deadline already passed holds the client from connecting until ``renew`` moves it.
        upstream.setDeadline(wait > .zero ? .now : takenAt + configuration.upstreamDeadlineAfter)
        if !connection.publish(subjects.interestRequest, term) { metrics.publishFailed("control", logger: logger) }
        let upstreamRun = Task { try? await upstream.run() }
        state.withLock { state in
            state.upstreamApplied = union
            state.upstreamDropped = []
        }
        sequencer.begin(stamps: stampsPositions, term: term)
        // The tape's reader knows from here what the term receives (the epoch's first records).
        recorder?.begin(epoch: sequencer.epoch, holding: union.map(\.description))
        let publisher = Task { await self.publish(from: upstream, to: connection) }
        let filling = fills.map { fills in
            Task { await fills.lead(connection: connection) { [weak self] in self?.state.withLock { $0.interest.union } ?? [] } }
        }

        let end = await renew(
            bucket: bucket, revision: revision, takenAt: takenAt, upstreamFrom: upstreamFrom, term: term, upstream: upstream, feed: feed)
        // The term is over as far as this node goes: what it still sends of it (flushed after a
        // partition) may reach it after the next term's epoch, and is stale then.
        feed.leaseRead(term: nil, askedAt: nil)
        readLeaseAfter(term: term, bucket: bucket, feed: feed)
        // Closed first: nothing that ends more slowly (a fill's REST request) may hold it open.
        upstream.shutdown()
        // A fill cut short answers nobody: the nodes ask the next leader for the union of their outages.
        filling?.cancel()
        await filling?.value
        await upstreamRun.value
        await publisher.value
        // The term's last blocks are on the tape before the lease goes (the next leader's come after),
        // and nothing of the term after them.
        if let recorder, let epoch = sequencer.epoch {
            recorder.interrupted(epoch: epoch)
            await Self.ended(epoch, recorder)
        }
        sequencer.end()
        state.withLock { state in
            state.leading = false
            state.upstream = nil
        }
        metrics.leader.record(0)
        writeLastValues()
        switch end {
        case .lost(let reason):
            logger.warning("this node no longer leads: \(reason); upstream closed", metadata: ["node": "\(configuration.nodeID)"])
            // Cut off from NATS: what it published since waits in libnats' buffer and would reach the
            // nodes once the link is back, in the next leader's term (stale events, a false outage):
            // dropped with the connection. Else the nodes hear it closed.
            if await connection.discardPendingIfDisconnected() {
                // Bound to the connection closed: bound again on the new one at the next lease read.
                state.withLock {
                    $0.leaseBucket = nil
                    $0.lastValueBucket = nil
                }
            } else {
                publish(control: .upstreamDown(reason: "the cluster leader \(configuration.nodeID) closed its upstream: \(reason)"))
            }
        case .shutdown(let validUntil), .handOff(let validUntil):
            if case .handOff = end {
                logger.info("handing the \(market) upstream to a node that leads no market", metadata: ["node": "\(configuration.nodeID)"])
                publish(control: .upstreamDown(reason: "the cluster leader \(configuration.nodeID) hands the \(market) upstream to an idle node"))
            } else {
                publish(control: .upstreamDown(reason: "the cluster leader \(configuration.nodeID) is shutting down; another node takes over"))
            }
            // Delete only a lease that is surely still ours, and only once no earlier holder can still
            // be connected (a follower that saw it held takes a released lease at once); before that
            // it lapses by itself.
            if ContinuousClock.now < validUntil, ContinuousClock.now >= upstreamFrom {
                do {
                    try await bucket.delete(subjects.leaseKey)
                    logger.info("upstream closed and lease released for a successor", metadata: ["node": "\(configuration.nodeID)"])
                } catch {
                    logger.warning("could not release the lease (it lapses on its own): \(error)")
                }
            }
            _ = await connection.flush()
        }
    }

    /// Renews the lease until it is lost or shutdown begins.
    /// Each renewal also moves the upstream client's own deadline (see
    /// ``ClusterConfiguration/upstreamDeadlineAfter``), so the socket closes in time even if this task
    /// never runs again; before `upstreamFrom` the deadline stays passed, so the client does not connect.
    private func renew(
        bucket: KeyValueBucket, revision: UInt64, takenAt: ContinuousClock.Instant, upstreamFrom: ContinuousClock.Instant, term: String,
        upstream: UpstreamClient, feed: ClusterFeed
    ) async -> TermEnd {
        var revision = revision
        var lastRenewed = takenAt
        var opened = ContinuousClock.now >= upstreamFrom
        var nextRenewal = ContinuousClock.now + configuration.renewInterval
        /// The upstream may stay connected 3/5 of the lease past the last renewal, once it may connect at all.
        func extend() {
            if opened { upstream.setDeadline(lastRenewed + configuration.upstreamDeadlineAfter) }
        }
        /// A renewal showed the lease gone or another node's: the upstream closes at once, not at its
        /// deadline (its client's service thread closes the socket when it sees a deadline passed).
        func lose(_ reason: String) -> TermEnd {
            upstream.setDeadline(.now)
            metrics.renewFailed.increment()
            return .lost(reason + "; upstream closed at once")
        }
        while true {
            let deadline = lastRenewed + configuration.dropUpstreamAfter
            var wake = min(deadline, nextRenewal)
            if !opened { wake = min(wake, upstreamFrom) }
            do {
                try await Task.sleep(until: wake)
            } catch {
                return .shutdown(validUntil: deadline)
            }
            if ContinuousClock.now >= deadline {
                return .lost("the lease could not be renewed for \(configuration.dropUpstreamAfter)")
            }
            if !opened, ContinuousClock.now >= upstreamFrom {
                opened = true
                extend()
                logger.info(
                    "connecting upstream now: no earlier holder can still be connected", metadata: ["node": "\(configuration.nodeID)"])
            }
            guard ContinuousClock.now >= nextRenewal else { continue }
            let sent = ContinuousClock.now
            let (key, node, last, nodeID) = (subjects.leaseKey, leaseValue(term: term), revision, configuration.nodeID)
            let outcome = await Self.race(until: deadline) { () async throws(NATSError) -> UInt64 in
                try await bucket.update(key, node, last: last)
            }
            switch outcome {
            case .success(let next):
                revision = next
                lastRenewed = sent
                extend()
                metrics.renewed.increment()
                // The lease holds this term as of `sent`: what this node's feed held since is read.
                feed.leaseRead(term: term, askedAt: sent)
                if opened, let spread,
                    spread.shouldHandOff(
                        market: market, liveNodes: state.withLock({ $0.interest.liveNodes }), leadingSince: max(takenAt, upstreamFrom))
                {
                    return .handOff(validUntil: lastRenewed + configuration.dropUpstreamAfter)
                }
            case .failure(.rejected(let text)):
                // Someone wrote the key since. This node's own lease there (a renewal NATS applied but
                // whose answer was lost) is renewed from its revision; a value no relay node wrote is
                // not obeyed but taken back with a revision-checked write, the upstream staying up (no
                // node takes over a value that is not a lease). Another node's lease, or none, ends
                // the term at once.
                let outcome = await Self.race(until: deadline) { () async throws(NATSError) -> (UInt64, foreign: Bool) in
                    guard let entry = try await bucket.get(key) else { throw .gone("the lease key is empty") }
                    if let holder = LeaseValue(parsing: entry.value) {
                        // Another term under this name is another process's (two nodes named alike).
                        guard holder.node == nodeID, holder.term == term else { throw .rejected("held by \(holder.node)") }
                        return (try await bucket.update(key, node, last: entry.revision), false)
                    }
                    return (try await bucket.update(key, node, last: entry.revision), true)
                }
                let next: UInt64
                let foreign: Bool
                switch outcome {
                case .success(let taken): (next, foreign) = taken
                case .failure(.rejected(let held)): return lose("the lease was taken over (\(held))")
                case .failure(.gone): return lose("the lease is gone from NATS (\(text))")
                case .failure(.unavailable(let why)):
                    return lose("a renewal was refused (\(text)) and the lease could not be read (\(why))")
                }
                if foreign {
                    metrics.rejected("lease", "the lease key was overwritten, not by a relay node; taken back", logger: logger)
                }
                revision = next
                lastRenewed = sent
                extend()
                metrics.renewed.increment()
            case .failure(.gone(let text)):
                return lose("the lease bucket is gone from NATS (\(text))")
            case .failure(.unavailable(let text)):
                metrics.renewFailed.increment()
                logger.warning("lease renewal failed: \(text)", metadata: ["node": "\(configuration.nodeID)"])
            }
            nextRenewal = ContinuousClock.now + configuration.renewInterval
            if Task.isCancelled { return .shutdown(validUntil: lastRenewed + configuration.dropUpstreamAfter) }
        }
    }

    /// Ends the term's recording (``TapeRecorder/end(epoch:)``), waiting off the cooperative pool
    /// until everything it was given is written.
    private static func ended(_ epoch: String, _ recorder: TapeRecorder) async {
        // A serial queue of its own (a thread of its own): never behind other blocking work.
        await BlockingWork.run(on: DispatchQueue(label: "relay.tape.end")) { recorder.end(epoch: epoch) }
    }

    /// Runs `operation`, giving up (as unavailable) at `deadline`.
    private static func race<T: Sendable>(
        until deadline: ContinuousClock.Instant, _ operation: @escaping @Sendable () async throws(NATSError) -> T
    ) async -> Result<T, NATSError> {
        await withTaskGroup(of: Result<T, NATSError>?.self) { group in
            group.addTask {
                do throws(NATSError) { return .success(try await operation()) } catch { return .failure(error) }
            }
            group.addTask {
                try? await Task.sleep(until: deadline)
                return nil
            }
            defer { group.cancelAll() }
            return await group.next().flatMap { $0 } ?? .failure(.unavailable("no answer before the renewal deadline"))
        }
    }

    /// The leader's publisher: every upstream event's exact bytes on its topic's subject, and each
    /// lost connection as a notice on the control subject, in upstream order.
    private func publish(from upstream: UpstreamClient, to connection: NATSConnection) async {
        var subjectsByTopic: [Topic: String] = [:]
        // A new epoch per leadership term (``TermSequencer``): positions go on only within it. Announced
        // before the first event (NATS keeps one publisher's order), then before the next events at
        // least a second after the last, for nodes that join later.
        var announced = ContinuousClock.now - .seconds(10)
        // An outage or a loss: the tape and the folded last values are interrupted, and every node told.
        func interrupted(_ control: ClusterControl) {
            recorder?.interrupted(epoch: sequencer.epoch)
            foldedLastValues.withLock { $0.interruptAll() }
            publish(control: control)
        }
        await upstream.inbox.drain { items in
            if let epoch = sequencer.epoch, ContinuousClock.now - announced >= .seconds(1) {
                announced = .now
                publish(control: .epoch(epoch))
            }
            for item in items {
            switch item {
            case .element(.events(let raw)):
                var events: [MarketEvent] = []
                var failed = 0
                sequencer.stamp(raw) { stamped in
                    events = stamped
                    for event in stamped {
                        let topic = event.topic
                        let subject: String
                        if let known = subjectsByTopic[topic] {
                            subject = known
                        } else {
                            if subjectsByTopic.count > 200_000 { subjectsByTopic.removeAll() }
                            subject = subjects.subject(for: topic)
                            subjectsByTopic[topic] = subject
                        }
                        let sent = event.bytes.withUnsafeReadableBytes { connection.publish(subject, $0) }
                        if !sent {
                            metrics.publishFailed("event", logger: logger)
                            failed += 1
                        }
                    }
                }
                // (NATS refuses a message past the server's max_payload, or while its buffer is full.)
                // Every node's clients are told what they miss, once for the run, as of any loss
                // before the hub.
                if failed > 0 { publish(control: .loss(count: failed)) }
                // Slices of the frame, kept only until the next write to the store (which copies them). A
                // folded topic's last value is its whole state instead.
                let folding = hub.folding
                var folded: [MarketEvent] = []
                pendingLastValues.withLock { pending in
                    for event in events {
                        if folding?.eventTypes.contains(event.eventType) == true { folded.append(event) } else { pending[event.topic] = event.bytes }
                    }
                }
                if let folding, !folded.isEmpty {
                    foldedLastValues.withLock { values in
                        for event in folded { values.apply(event, folding: folding) }
                    }
                }
                metrics.natsOut.increment(by: events.count)
            case .element(.connectionLost(let reason)): interrupted(.upstreamDown(reason: "upstream connection lost (\(reason))"))
            case .lost(let lost, _): interrupted(.loss(count: lost.count))
            case .element(.lost(let count, _, _)): interrupted(.loss(count: count))
            case .element(.authenticated), .element(.seed), .element(.epoch), .element(.leaderStamped), .element(.recovered), .element(.recoveryEnded),
                .element(.notice):
                break
            case .element(.refused(let topics, let code, let reason)):
                // Every node's clients of these topics are told (this node's too: it reads the control subject).
                publish(control: .refused(topics: topics, code: code, reason: reason))
            }
            }
        }
    }
}
