import AsyncSupport
import CoreMetrics
import Foundation
import Logging
import MarketDataHub
import NIOCore
import PolygonWire
import ServiceLifecycle
import Synchronization
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
/// socket at 3/5 of the lease after the last renewal, whatever the cooperative pool is doing. On graceful
/// shutdown the leader closes upstream first, then deletes the lease, and a follower takes over within
/// one poll interval.
///
/// `Sendable`; a `Service`. State behind a `Mutex`; ``run()`` owns every task and the NATS connection.
public final class ClusterNode: Service, Sendable {
    /// What `/healthz` shows of the cluster. Value type, `Sendable`.
    public struct Status: Sendable, Equatable {
        public var role: String
        public var node: String
        public var leader: String?
        public var nats: String
        public var liveNodes: [String]
        public var subscriptions: Int
    }

    private struct State {
        var connection: NATSConnection?
        var feed: ClusterFeed?
        var leading = false
        var leader: String?
        var lastKnownLeader: String?
        var upstream: PolygonWebSocket?
        var interest: InterestTable
        var leaseBucket: KeyValueBucket?
        var lastValueBucket: KeyValueBucket?
        var stopped = false
    }

    public let configuration: ClusterConfiguration
    public let subjects: ClusterSubjects
    private let hub: MarketDataHub
    private let localInterest: LocalInterest
    private let makeUpstream: @Sendable () async throws -> PolygonWebSocket
    /// Whether the leader gives events their positions before publishing them (the nodes keep history).
    private let stampsPositions: Bool
    private let metrics: ClusterMetrics
    private let logger: Logger
    private let state: Mutex<State>
    /// Changed last values waiting for the next write to the last-value store (leader only).
    private let pendingLastValues = Mutex<[Topic: ByteBuffer]>([:])
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

    /// - Parameters:
    ///   - localInterest: where this node's hub reports the topics it wants.
    ///   - makeUpstream: a new upstream client, made each time this node becomes leader.
    package init(
        configuration: ClusterConfiguration, market: String, hub: MarketDataHub, localInterest: LocalInterest,
        metricsFactory: any MetricsFactory = MetricsSystem.factory, logger: Logger, spread: LeadershipSpread? = nil,
        stampsPositions: Bool = false, gapFill: ClusterGapFillHook? = nil, vendor: UpstreamVendor = .polygon,
        makeUpstream: @escaping @Sendable () async throws -> PolygonWebSocket
    ) throws(ClusterError) {
        self.stampsPositions = stampsPositions
        self.configuration = configuration
        self.market = market
        self.spread = spread
        subjects = try ClusterSubjects(cluster: configuration.name, market: market, vendor: vendor)
        topicRules = SessionLimits(eventTypes: subjects.eventTypes)
        self.hub = hub
        self.localInterest = localInterest
        self.makeUpstream = makeUpstream
        let metrics = ClusterMetrics(factory: metricsFactory)
        self.metrics = metrics
        self.logger = logger
        let sequencer = TermSequencer()
        self.sequencer = sequencer
        fills = gapFill.map { [subjects] in
            ClusterGapFill(
                hook: $0, subjects: subjects, node: configuration.nodeID, hub: hub, sequencer: sequencer, metrics: metrics, logger: logger)
        }
        state = Mutex(State(interest: InterestTable(ttl: configuration.interestTTL, maxTopicsPerNode: configuration.maxTopicsPerNode)))
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
    public var upstream: PolygonWebSocket? { state.withLock { $0.upstream } }

    /// A topic's last event from the cluster's last-value store (for `/v1/last` on a node whose clients
    /// do not want the topic).
    public func lastEvent(for topic: Topic) async -> MarketEvent? {
        guard !topic.isWildcard, let bucket = state.withLock({ $0.lastValueBucket }) else { return nil }
        guard let entry = try? await bucket.get(subjects.lastValueKey(for: topic)), !entry.value.isEmpty else { return nil }
        switch ClusterChecks.event(entry.value, topic: topic, market: subjects.wireMarket, vendor: subjects.vendor) {
        case .success(let event): return event
        case .failure(let rejection):
            metrics.rejected("event", "\(rejection) (last-value store, \(topic))", logger: logger)
            return nil
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
        let feed = ClusterFeed(connection: connection, subjects: subjects, hub: hub, metrics: metrics, logger: logger) {
            [weak self] topic in await self?.lastEvent(for: topic)
        }
        state.withLock { state in
            state.connection = connection
            state.feed = feed
        }
        feed.start()
        await fills?.start(connection: connection, feed: feed)
        let interestSink = NATSMessageSink { [weak self] subject, payload in
            self?.received(interestOf: String(cString: subject), payload: String(decoding: payload, as: UTF8.self))
        }
        _ = connection.subscribe(subjects.allInterest, sink: interestSink)
        let requestSink = NATSMessageSink { [weak self] _, _ in self?.publishInterest() }
        _ = connection.subscribe(subjects.interestRequest, sink: requestSink)

        let interestPublisher = Debouncer(delay: .milliseconds(20))
        localInterest.listen { [weak self] topics in
            feed.setWanted(topics)
            interestPublisher.poke { [weak self] in self?.publishInterest() }
        }
        logger.info(
            "cluster node starting",
            metadata: [
                "node": "\(configuration.nodeID)", "cluster": "\(configuration.name)", "nats": "\(configuration.displayServers)",
                "lease_s": "\(configuration.leaseDuration)",
            ])

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
        state.withLock { $0.stopped = true }
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

    /// Publishes this node's wanted set in parts (see ``InterestTable/Part``), capped at
    /// ``ClusterConfiguration/maxTopicsPerNode`` (the leader would refuse more): past it, the first
    /// topics in order are asked for, and the rest is counted and logged, never dropped silently.
    private func publishInterest() {
        guard let connection = state.withLock({ $0.connection }) else { return }
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
        let part = InterestTable.Part(generation: header.generation, part: header.part, parts: header.parts, topics: Array(topics))
        let (outcome, upstream) = state.withLock { state in
            (state.interest.receive(part, from: node, at: .now), state.upstream)
        }
        switch outcome {
        case .gathering:
            break
        case .complete(let changed):
            if changed, upstream != nil { updateUpstreamTopics() }
        case .outOfSequence:
            metrics.rejected(
                "interest", "from node \(node): a part out of sequence (one was lost); its next publish replaces it", logger: logger)
        case .tooManyTopics:
            metrics.rejected(
                "interest", "node \(node) wants more than \(configuration.maxTopicsPerNode) topics; its previous set stays", logger: logger)
        }
    }

    /// Upstream subscription changes, at most one batch per 50 ms.
    private let upstreamUpdate = Debouncer(delay: .milliseconds(50))

    private func updateUpstreamTopics() {
        upstreamUpdate.poke { [weak self] in
            guard let self else { return }
            let (union, upstream) = state.withLock { ($0.interest.union, $0.upstream) }
            upstream?.setWantedTopics(union)
        }
    }

    /// Every quarter second: expire silent nodes, write changed last values (leader); every heartbeat:
    /// repeat this node's interest.
    private func tick() async {
        var lastHeartbeat = ContinuousClock.now
        while !Task.isCancelled {
            try? await Task.sleep(for: configuration.lastValueInterval)
            let now = ContinuousClock.now
            let (expired, leading) = state.withLock { ($0.interest.expire(at: now), $0.leading) }
            if expired, leading { updateUpstreamTopics() }
            if leading { writeLastValues() }
            if now - lastHeartbeat >= configuration.interestHeartbeat {
                lastHeartbeat = now
                publishInterest()
            }
        }
    }

    private func writeLastValues() {
        let changed = pendingLastValues.withLock { pending in
            defer { pending.removeAll(keepingCapacity: true) }
            return pending
        }
        guard !changed.isEmpty, let bucket = state.withLock({ $0.lastValueBucket }) else { return }
        for (topic, bytes) in changed {
            let sent = bytes.withUnsafeReadableBytes { bucket.putWithoutAck(subjects.lastValueKey(for: topic), $0) }
            if !sent { metrics.publishFailed("last_value", logger: logger) }
        }
    }

    /// Tells this node's subscribers when NATS is lost (events stop); republishes interest on return.
    private func watch(_ connection: NATSConnection, feed: ClusterFeed) async {
        var previous: NATSState?
        for await state in connection.stateUpdates() {
            defer { previous = state }
            switch state {
            case .reconnecting:
                feed.announceLost("this relay node lost its connection to NATS")
            case .connected where previous != nil && previous != .connected:
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
        while !Task.isCancelled {
            guard let connection = state.withLock({ $0.connection }) else { return }
            var bucket = state.withLock { $0.leaseBucket }
            if bucket == nil {
                do {
                    let lease = try await connection.keyValue(bucket: subjects.leaseBucket, ttl: configuration.leaseDuration)
                    // A bucket made by nodes with another lease keeps the lease for its own TTL, not this
                    // node's: the timing below would be wrong and nodes would take it from each other.
                    if let kept = lease.ttl, kept != configuration.leaseBucketTTL {
                        throw ClusterError.leaseMismatch(bucket: lease.name, bucketTTL: kept, configured: configuration.leaseBucketTTL)
                    }
                    let last = try await connection.keyValue(bucket: subjects.lastValueBucket, ttl: nil)
                    state.withLock {
                        $0.leaseBucket = lease
                        $0.lastValueBucket = last
                    }
                    bucket = lease
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
            do {
                entry = try await bucket.get(subjects.leaseKey)
                failures = 0
            } catch {
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
            if let entry, holder == nil, entry.revision != foreignRevision {
                foreignRevision = entry.revision
                metrics.rejected(
                    "lease", "the lease key holds \(entry.value.count) bytes that are not a relay node's lease", logger: logger)
            }
            observe(leader: holder?.node, feed: feed)
            // Spread: leave a free lease to a live node that leads no market (for a bounded while).
            if entry == nil, let spread, spread.shouldDefer(market: market, liveNodes: state.withLock({ $0.interest.liveNodes })) {
                try? await Task.sleep(for: configuration.leasePollInterval)
                continue
            }
            if entry == nil, !Task.isCancelled {
                let asked = ContinuousClock.now
                if let revision = try? await bucket.create(subjects.leaseKey, leaseValue) {
                    observe(leader: configuration.nodeID, feed: feed)
                    await lead(bucket: bucket, revision: revision, takenAt: asked, feed: feed)
                    continue
                }
            }
            try? await Task.sleep(for: configuration.leasePollInterval)
        }
    }

    /// Notes the lease's holder; a change away from another node tells this node's subscribers that
    /// events stopped (the first event from the new leader then announces the gap).
    private func observe(leader holder: String?, feed: ClusterFeed) {
        spread?.observe(market: market, leader: holder)
        let (previous, failover) = state.withLock { state -> (String?, Bool) in
            let previous = state.leader
            state.leader = holder
            var failover = false
            if let holder {
                failover = state.lastKnownLeader != nil && state.lastKnownLeader != holder
                state.lastKnownLeader = holder
            }
            return (previous, failover)
        }
        guard previous != holder else { return }
        if failover { metrics.failovers.increment() }
        logger.info(
            "cluster leader of \(market): \(previous ?? "none") → \(holder ?? "none")", metadata: ["node": "\(configuration.nodeID)"])
        if let previous, previous != configuration.nodeID {
            feed.announceLost("the cluster leader \(previous) gave up the upstream connection (its lease ended); another node takes over")
        }
    }

    /// A notice on the control subject; a refused publish is counted and logged.
    private func publish(control text: String) {
        guard let connection = state.withLock({ $0.connection }), connection.publish(subjects.upstreamControl, text) else {
            metrics.publishFailed("control", logger: logger)
            return
        }
    }

    /// What this node writes as the lease's value.
    private var leaseValue: String { LeaseValue(node: configuration.nodeID, leaseMs: configuration.leaseDuration.milliseconds).text }

    private enum TermEnd {
        case shutdown(validUntil: ContinuousClock.Instant)
        /// Leadership spreads: this market goes to a node that leads none (``LeadershipSpread``).
        case handOff(validUntil: ContinuousClock.Instant)
        case lost(String)
    }

    /// One term as leader: upstream connected while the lease is renewed, closed before it can lapse.
    private func lead(bucket: KeyValueBucket, revision: UInt64, takenAt: ContinuousClock.Instant, feed: ClusterFeed) async {
        guard let connection = state.withLock({ $0.connection }) else { return }
        let upstream: PolygonWebSocket
        do {
            upstream = try await makeUpstream()
        } catch {
            logger.error("this node took the lease but cannot make its upstream client: \(error); releasing the lease")
            try? await bucket.delete(subjects.leaseKey)
            try? await Task.sleep(for: configuration.leaseDuration)
            return
        }
        let union = state.withLock { state in
            state.leading = true
            state.upstream = upstream
            return state.interest.union
        }
        metrics.leader.record(1)
        logger.info(
            "this node leads the cluster: connecting upstream",
            metadata: ["node": "\(configuration.nodeID)", "upstream": "\(upstream.configuration.endpoint)", "topics": "\(union.count)"])
        upstream.setWantedTopics(union)
        upstream.setDeadline(takenAt + configuration.upstreamDeadlineAfter)
        if !connection.publish(subjects.interestRequest, "") { metrics.publishFailed("control", logger: logger) }
        let upstreamRun = Task { try? await upstream.run() }
        sequencer.begin(stamps: stampsPositions)
        let publisher = Task { await self.publish(from: upstream, to: connection) }
        let filling = fills.map { fills in Task { await fills.lead(connection: connection) } }

        let end = await renew(bucket: bucket, revision: revision, takenAt: takenAt, upstream: upstream)
        // A fill cut short answers nobody: the nodes ask the next leader for the union of their outages.
        filling?.cancel()
        await filling?.value
        upstream.shutdown()
        await upstreamRun.value
        await publisher.value
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
            publish(control: "the cluster leader \(configuration.nodeID) closed its upstream: \(reason)")
        case .shutdown(let validUntil), .handOff(let validUntil):
            if case .handOff = end {
                logger.info("handing the \(market) upstream to a node that leads no market", metadata: ["node": "\(configuration.nodeID)"])
                publish(control: "the cluster leader \(configuration.nodeID) hands the \(market) upstream to an idle node")
            } else {
                publish(control: "the cluster leader \(configuration.nodeID) is shutting down; another node takes over")
            }
            // Delete only a lease that is surely still ours.
            if ContinuousClock.now < validUntil {
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
    /// never runs again.
    private func renew(
        bucket: KeyValueBucket, revision: UInt64, takenAt: ContinuousClock.Instant, upstream: PolygonWebSocket
    ) async -> TermEnd {
        var revision = revision
        var lastRenewed = takenAt
        while true {
            let deadline = lastRenewed + configuration.dropUpstreamAfter
            do {
                try await Task.sleep(until: min(deadline, .now + configuration.renewInterval))
            } catch {
                return .shutdown(validUntil: lastRenewed + configuration.dropUpstreamAfter)
            }
            if ContinuousClock.now >= deadline {
                return .lost("the lease could not be renewed for \(configuration.dropUpstreamAfter)")
            }
            let sent = ContinuousClock.now
            let (key, node, last) = (subjects.leaseKey, leaseValue, revision)
            let outcome = await Self.race(until: deadline) { () async throws(NATSError) -> UInt64 in
                try await bucket.update(key, node, last: last)
            }
            switch outcome {
            case .success(let next):
                revision = next
                lastRenewed = sent
                upstream.setDeadline(sent + configuration.upstreamDeadlineAfter)
                metrics.renewed.increment()
                if let spread,
                    spread.shouldHandOff(market: market, liveNodes: state.withLock({ $0.interest.liveNodes }), leadingSince: takenAt)
                {
                    return .handOff(validUntil: lastRenewed + configuration.dropUpstreamAfter)
                }
            case .failure(.rejected(let text)):
                // Someone wrote the key. A relay node's lease there means it was taken over; anything
                // else is not obeyed: taken back with a revision-checked write.
                let outcome = await Self.race(until: deadline) { () async throws(NATSError) -> UInt64 in
                    guard let entry = try await bucket.get(key) else { return try await bucket.create(key, node) }
                    if let holder = LeaseValue(parsing: entry.value) { throw .rejected("held by \(holder.node)") }
                    return try await bucket.update(key, node, last: entry.revision)
                }
                guard case .success(let next) = outcome else {
                    metrics.renewFailed.increment()
                    return .lost("the lease was taken over (\(text))")
                }
                metrics.rejected("lease", "the lease key was overwritten or deleted, not by a relay node; taken back", logger: logger)
                revision = next
                lastRenewed = sent
                upstream.setDeadline(sent + configuration.upstreamDeadlineAfter)
                metrics.renewed.increment()
            case .failure(.unavailable(let text)):
                metrics.renewFailed.increment()
                logger.warning("lease renewal failed: \(text)", metadata: ["node": "\(configuration.nodeID)"])
            }
            if Task.isCancelled { return .shutdown(validUntil: lastRenewed + configuration.dropUpstreamAfter) }
        }
    }

    /// Runs `operation`, giving up (as unavailable) at `deadline`.
    private static func race(
        until deadline: ContinuousClock.Instant, _ operation: @escaping @Sendable () async throws(NATSError) -> UInt64
    ) async -> Result<UInt64, NATSError> {
        await withTaskGroup(of: Result<UInt64, NATSError>?.self) { group in
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
    private func publish(from upstream: PolygonWebSocket, to connection: NATSConnection) async {
        var subjectsByTopic: [Topic: String] = [:]
        // A new epoch per leadership term (``TermSequencer``): positions go on only within it. Announced
        // before the first event (NATS keeps one publisher's order) and again every second, for nodes
        // that join later.
        var announced = ContinuousClock.now - .seconds(10)
        await upstream.inbox.drain { items in
            if let epoch = sequencer.epoch, ContinuousClock.now - announced >= .seconds(1) {
                announced = .now
                publish(control: "\(ClusterFeed.epochPrefix)\(epoch)")
            }
            for item in items {
            switch item {
            case .element(.events(let raw)):
                var events: [MarketEvent] = []
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
                        if !sent { metrics.publishFailed("event", logger: logger) }
                    }
                }
                // Slices of the frame, kept only until the next write to the store (which copies them).
                pendingLastValues.withLock { pending in
                    for event in events { pending[event.topic] = event.bytes }
                }
                metrics.natsOut.increment(by: events.count)
            case .element(.connectionLost(let reason)):
                publish(control: "upstream connection lost (\(reason))")
            case .lost(_, let count), .element(.lost(let count, _, _)):
                publish(control: "\(ClusterFeed.lossPrefix)\(count)")
            case .element(.authenticated), .element(.seed), .element(.epoch), .element(.recovered), .element(.recoveryEnded):
                break
            case .element(.refused(let topics, let code, let reason)):
                // Every node's clients of these topics are told (this node's too: it reads the control subject).
                for control in RefusalWire.controls(topics, code: code, reason: reason) { publish(control: control) }
            }
            }
        }
    }
}
