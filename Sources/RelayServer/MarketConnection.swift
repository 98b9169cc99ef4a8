import Logging
import MarketDataHub
import NIOCore
import NIOWebSocket
import MarketCore

/// One downstream market client: the Polygon conversation (``ServerSession``) on the way in, its hub
/// subscription on the way out.
///
/// An actor whose executor is its channel's event loop, so its state and its handler live on that loop:
/// a client message is handled synchronously as NIO reads it (no reading task). No task waits on the
/// client's hub stream either: its loop's ``LoopDrain`` reads it when the hub says it queued something.
/// Hub calls (`subscribe`, `add`, `remove`) run one after another in a short-lived task, in the order
/// the client asked.
///
/// Acknowledgements are written before the hub is asked to add a topic, so a client never sees an
/// event before the ack of its subscription.
actor MarketConnection {
    /// What every connection of one market shares, made once per market (``RelayServer``): each
    /// connection holds a reference, not a copy (10,000 idle clients held ~700 bytes each of copies).
    final class Dependencies: Sendable {
        let hub: MarketDataHub
        /// Broken tagged sessions of this market.
        let shelf: SessionShelf
        let configuration: RelayServerConfiguration
        /// The session limits on this connection's market.
        let limits: SessionLimits
        let metrics: DownstreamMetrics
        /// The market's delivery metrics.
        let delivery: DeliveryMetrics
        let keyConnections: KeyConnections
        let logger: Logger
        /// Refusals, a line per reason per 10 s (a client may cause them as often as it likes).
        let refusals: ThrottledLog
        /// Distinct topics per key and in all.
        /// Holds `topics` for a key's kept session: taken over from the closing connection, unchecked.
        let shelfReserve: @Sendable ([Topic], String) -> Void
        /// Gives back topics a shelved session held for a key (by name).
        let shelfRelease: @Sendable ([Topic], String) -> Void

        init(
            hub: MarketDataHub, shelf: SessionShelf, configuration: RelayServerConfiguration, limits: SessionLimits,
            metrics: DownstreamMetrics, delivery: DeliveryMetrics, keyConnections: KeyConnections, logger: Logger, refusals: ThrottledLog,
            shelfReserve: @escaping @Sendable ([Topic], String) -> Void, shelfRelease: @escaping @Sendable ([Topic], String) -> Void
        ) {
            self.hub = hub
            self.shelf = shelf
            self.configuration = configuration
            self.limits = limits
            self.metrics = metrics
            self.delivery = delivery
            self.keyConnections = keyConnections
            self.logger = logger
            self.refusals = refusals
            self.shelfReserve = shelfReserve
            self.shelfRelease = shelfRelease
        }
    }

    /// What this connection tells its address's guard (``AddressGuard``), one connection's own: one
    /// value, not a closure each.
    struct AddressHooks: Sendable {
        let addresses: AddressGuard
        let address: String
        /// Its place in the address's pending connections, settled once it authenticates.
        let ticket: AddressGuard.Ticket?

        /// Told once the client authenticated (and was admitted).
        func authenticated() { if let ticket { addresses.settle(ticket) } }
        /// Told each time a client's key is refused (counted per address); says how long to wait
        /// before answering the failure.
        func authenticationFailed() -> Duration { addresses.failedAuthentication(from: address) }
        /// Told when a delayed failure's answer went out.
        func failureAnswered() { addresses.failureAnswered(from: address) }
        /// Whether this connection's address has too many failures waiting for their answers.
        func addressIsGuessing() -> Bool { addresses.isGuessing(address) }
    }

    /// The close code for a client the `disconnect` policy removed: "try again later".
    static let tooSlowCloseCode = WebSocketErrorCode(codeNumber: 1013)

    /// Whether this connection's hub changes are under way, waiting for a slot, or none.
    private enum Worker {
        case idle, waiting, running
    }

    private enum HubChange {
        case join
        case add([Topic], ResumeRequest?)
        case remove([Topic])
        case conflate(ConflationMode?)
        /// Its key's buffer.
        case buffer(Int)
        /// Its key's name, whose connections share replays and tape reads.
        case owner(String)
        case leave
        /// A tagged session's connection ended: its subscriber is parked and the session shelved.
        case shelve(String, SessionShelf.Session)
        /// A window passed since a session (broken at this instant) was taken back: the topics it still
        /// holds for the connection, not subscribed again, are let go.
        case letGo(ContinuousClock.Instant)

        /// A tagged session shelved: it starts at once, whatever the limit (see ``HubChangeSlots``).
        var isUrgent: Bool {
            if case .shelve = self { true } else { false }
        }
    }

    /// The default interval of a connection that asks for conflation without one.
    static let defaultConflation: Duration = .milliseconds(250)

    nonisolated let unownedExecutor: UnownedSerialExecutor
    private let loop: any EventLoop
    private let handler: NIOLoopBound<WebSocketConnectionHandler>
    private let dependencies: Dependencies
    private let hooks: AddressHooks
    /// What drains the hub streams of this connection's event loop.
    private let drain: LoopDrain
    private var session: any DownstreamSession
    private var admitted: ClientGrant?
    private var subscription: HubSubscription?
    /// Its loop's sign-in deadlines (the server's auth timeout).
    private let signIn: NIOLoopBound<LoopDeadlineQueue<MarketConnection>>
    private var hubChanges: [HubChange] = []
    /// Reading is held while more than ``maxQueuedChanges`` changes wait (each may carry a thousand
    /// topics): a client that sends subscribes faster than the hub takes them is read no faster.
    private var readingHeld = false
    static let maxQueuedChanges = 16
    /// Its loop's limit on connections with hub changes under way.
    private let hubSlots: NIOLoopBound<HubChangeSlots<MarketConnection>>
    private var worker = Worker.idle
    private var ended = false
    /// A failed authentication is being answered (after its delay): nothing more is read.
    private var refusing = false
    /// The connection's feed (once it joined the hub).
    private var feed: ClientFeed?
    /// The client asked for its events' receive and send times (its key, or a subscribe option).
    private var wantsTimes = false
    /// `key#tag` of a tagged session.
    private var sessionName: String?
    /// A tagged session's name while its market has no epoch yet (a cluster node before its leader's
    /// first term): positions are tracked, and the session is kept under this name when the connection
    /// breaks, once an epoch names them.
    private var unnamedSession: String?
    /// The broken session this one took back: its topics resume from where it broke. Keeps the topics
    /// not subscribed again yet, for a window from the take-back (``letGoAtWindowsEnd(brokeAt:)``).
    private var resuming: SessionShelf.Session? {
        // Its topics subscribed again take over its holds in the key's budget (``TopicLedger``).
        didSet { if oldValue?.topics != resuming?.topics { transferring.topics = resuming?.topics ?? [] } }
    }
    /// The topics of `resuming`, as the session's budget reads them (on the same loop, but through a
    /// `Sendable` closure).
    private let transferring: TransferableTopics
    /// Where this tagged connection stands, for the running relay's checkpoint of its sessions.
    private var standing: SessionStanding?
    /// The session is still open on an older connection (closed now): its first subscribe waits for it.
    private var takingOver = false
    /// Topics of the connections it took over that had not closed when its wait for their session ran
    /// out (``ResumeSettings/takeOverWait``): subscribed here, each is told once that it was not resumed.
    private var notTakenOver: Set<Topic> = []
    private var notTakenOverWhy = ""

    /// - Parameter session: the vendor's conversation (Polygon's or Alpaca's), not yet authenticated.
    init(
        handler: NIOLoopBound<WebSocketConnectionHandler>, loop: any EventLoop, session: any DownstreamSession, dependencies: Dependencies,
        drain: LoopDrain, signIn: NIOLoopBound<LoopDeadlineQueue<MarketConnection>>, hubSlots: NIOLoopBound<HubChangeSlots<MarketConnection>>,
        hooks: AddressHooks, transferring: TransferableTopics
    ) {
        self.transferring = transferring
        self.loop = loop
        self.signIn = signIn
        self.hubSlots = hubSlots
        self.unownedExecutor = loop.executor.asUnownedSerialExecutor()
        self.handler = handler
        self.dependencies = dependencies
        self.drain = drain
        self.hooks = hooks
        self.session = session
    }

    /// The handler's callbacks into this connection. Called on the loop, so they enter the actor's
    /// isolation synchronously.
    nonisolated func conversation() -> WebSocketConversation {
        WebSocketConversation(
            opened: { self.assumeIsolated { $0.opened() } },
            received: { message in self.assumeIsolated { $0.received(message) } },
            closed: { self.assumeIsolated { $0.closed() } })
    }

    /// Closes with `code` (the shutdown's 1012). Safe from anywhere.
    nonisolated func close(code: WebSocketErrorCode, reason: String) {
        loop.execute { self.assumeIsolated { $0.handler.value.close(code: code, reason: reason) } }
    }

    private func opened() {
        handler.value.write(session.connectedFrame, binary: session.isBinary)
        signIn.value.add(self)
    }

    /// The sign-in deadlines of a server whose clients have `timeout` to authenticate, one queue per loop.
    static func signInDeadlines(_ timeout: Duration) -> PerLoop<LoopDeadlineQueue<MarketConnection>> {
        PerLoop { loop in
            LoopDeadlineQueue(loop: loop, delay: TimeAmount(timeout)) { connection in connection.assumeIsolated { $0.authenticationTimedOut() } }
        }
    }

    /// A refusal the client can repeat as often as it likes: a line per reason per 10 s for the server.
    private func logRefusal(_ reason: String, _ message: @autoclosure () -> Logger.Message, metadata: @autoclosure () -> Logger.Metadata = [:]) {
        dependencies.refusals.log(.info, reason, message(), metadata: metadata(), to: dependencies.logger)
    }

    private func authenticationTimedOut() {
        guard !session.isAuthenticated, !ended, !refusing else { return }
        handler.value.refuse(session.authTimeoutFrame, binary: session.isBinary, reason: "no authentication")
    }

    private func received(_ message: ByteBuffer) {
        guard !ended, !refusing else { return }
        if !session.isAuthenticated, hooks.addressIsGuessing() {
            stopReading()
            logRefusal("guessing", "downstream client refused: its address has too many failed authentications waiting")
            handler.value.refuse(
                session.refusalFrame(ClientKeyMiddleware.guessing),
                binary: session.isBinary, reason: "authentication failures")
            return
        }
        let wasAuthenticated = session.isAuthenticated
        session.epoch = dependencies.hub.epoch
        let reaction = session.respond(to: message)
        if let grant = session.grant, !wasAuthenticated, !signedIn(grant) { return }
        if reaction.close, reaction.marketRefused {
            // A right key on a market it may not use: no guess, so answered at once and not counted.
            stopReading()
            logRefusal("market", "downstream client refused: its key may not use this market")
            let handler = self.handler.value
            for frame in reaction.frames { handler.write(frame, binary: session.isBinary, flush: false) }
            handler.flush()
            handler.close(code: .policyViolation, reason: "market not allowed")
            return
        }
        if reaction.close {
            // Answered after a delay that grows with the address's recent failures (a guesser gets few
            // answers; a correct key on another connection is answered at once meanwhile).
            stopReading()
            let delay = hooks.authenticationFailed()
            logRefusal(
                "authentication", "downstream client refused: authentication failed", metadata: ["answeredAfterMs": "\(delay.milliseconds)"])
            let frames = reaction.frames
            let binary = session.isBinary
            let refuse: @Sendable () -> Void = {
                self.assumeIsolated { connection in
                    let handler = connection.handler.value
                    for frame in frames { handler.write(frame, binary: binary, flush: false) }
                    handler.flush()
                    handler.close(code: .policyViolation, reason: "authentication failed")
                }
            }
            if delay > .zero {
                let answered = hooks.failureAnswered
                loop.scheduleTask(in: TimeAmount(delay)) {
                    refuse()
                    answered()
                }
            } else {
                refuse()
            }
            return
        }
        let handler = self.handler.value
        for frame in reaction.frames { handler.write(frame, binary: session.isBinary, flush: false) }
        handler.flush()
        if let interval = reaction.conflate {
            let grantInterval: Duration? = if case .interval(let interval) = admitted?.conflation { interval } else { nil }
            change(.conflate(ConflationMode(interval: interval == .zero ? grantInterval ?? Self.defaultConflation : interval, whileLagging: true)))
        }
        if reaction.timestamps { askForTimes() }
        if !reaction.added.isEmpty { change(.add(reaction.added, reaction.resume)) }
        if !reaction.removed.isEmpty { change(.remove(reaction.removed)) }
    }

    /// A client's key was accepted: admitted within its key's connections (and, for a tagged session,
    /// its name's connections still closing), its key's settings applied, its session opened. `false`:
    /// refused (answered, and closing).
    private func signedIn(_ grant: ClientGrant) -> Bool {
        // A key's connection limit, answered as Polygon answers one: the status, then 1008.
        if let refused = dependencies.keyConnections.admit(grant) {
            logRefusal(refused.reason, "downstream connection refused: \(refused.message)")
            handler.value.refuse(session.connectionLimitFrame(refused.message), binary: session.isBinary, reason: "max connections")
            return false
        }
        admitted = grant
        if let tag = session.sessionTag, dependencies.hub.epoch != nil {
            let name = "\(grant.name)#\(tag)"
            sessionName = name
            let loop = self.loop
            let handler = self.handler
            let takenOverAnswer = TimeAmount(dependencies.configuration.resume.takenOverAnswer)
            // Open first, then take: a broken connection shelves its session before it leaves the
            // open ones, so either it is still open (and is taken over, waiting for its session) or
            // its session is already on the shelf. Taking first left a gap between the two in which
            // a session shelved meanwhile was missed (seen once in a full run: a reconnect resumed nothing).
            let standing = SessionStanding()
            let opening = dependencies.shelf.open(name, id: ObjectIdentifier(self), standing: standing) {
                loop.execute {
                    handler.value.close(code: WebSocketErrorCode(codeNumber: 4000), reason: "session taken over", answerWithin: takenOverAnswer)
                }
            }
            guard opening != .refused else {
                // A name whose connections taken over are still closing, as many as it may have: refused
                // as a key over its connection limit is (its status), closed with 1013, its place given back.
                logRefusal(
                    "session-closing", "downstream client refused: its session's connections are still closing", metadata: ["session": "\(name)"])
                sessionName = nil
                dependencies.keyConnections.release(grant)
                admitted = nil
                // 1013, try again later: it passes as they close.
                handler.value.refuse(
                    session.connectionLimitFrame(SessionShelf.stillClosingMessage(name)), binary: session.isBinary, reason: "session still closing",
                    code: WebSocketErrorCode(codeNumber: 1013))
                return false
            }
            self.standing = standing
            takeBack(dependencies.shelf.take(name, into: standing))
            let tookOver = opening == .tookOver
            takingOver = resuming == nil && tookOver
            if tookOver, let resuming {
                // It resumes the session it took back and does not wait for the open one's: that
                // one's other topics are told, as they are subscribed, that they are not resumed.
                notTakenOver = dependencies.shelf.topicsStillClosing(name).subtracting(resuming.topics)
                notTakenOverWhy = "a session kept earlier was taken back while the connection this one took over was still open"
            }
            // Its session let go before its window ended (a full shelf, or not restored after a
            // restart): the topics it had are told `gap` as they are subscribed.
            if let forgotten = dependencies.shelf.forgotten.take(name) {
                let lost = forgotten.topics.subtracting(resuming?.topics ?? [])
                if !lost.isEmpty {
                    if notTakenOver.isEmpty { notTakenOverWhy = forgotten.why }
                    notTakenOver.formUnion(lost)
                }
            }
            // The open one's topics, subscribed here before it closes, take its holds over.
            if tookOver { transferring.topics = dependencies.shelf.topicsStillClosing(name).union(resuming?.topics ?? []) }
            standing.holds([], takenBack: resuming)
            let position = AcknowledgedPosition(start: 0, marginBytes: dependencies.configuration.resume.marginBytes)
            position.standing = standing
            handler.value.acknowledgedPosition = position
            feed?.tracksPositions.store(true, ordering: .relaxed)
        } else if let tag = session.sessionTag {
            unnamedSession = "\(grant.name)#\(tag)"
            handler.value.acknowledgedPosition = AcknowledgedPosition(start: 0, marginBytes: dependencies.configuration.resume.marginBytes)
            feed?.tracksPositions.store(true, ordering: .relaxed)
        }
        // Joins the hub once signed in and admitted: a connection that never is costs the hub nothing
        // (it subscribed at its upgrade before, and a client opening and closing sockets made the hub
        // subscribe and remove one each time). Its key's settings follow the join.
        change(.join)
        if grant.timestamps { askForTimes() }
        if let events = grant.buffer { change(.buffer(events)) }
        if grant.isConfiguredKey { change(.owner(grant.name)) }
        switch grant.conflation {
        case .off: break
        case .whileLagging: change(.conflate(ConflationMode(interval: nil, whileLagging: true)))
        case .interval(let interval): change(.conflate(ConflationMode(interval: interval, whileLagging: true)))
        }
        // Messages up to the full size from now on, and no longer pending for its address.
        handler.value.messageLimit.open()
        hooks.authenticated()
        dependencies.logger.debug("downstream client authenticated", metadata: ["key": "\(grant.name)"])
        return true
    }

    /// From now on, the connection's events carry their receive and send times.
    private func askForTimes() {
        wantsTimes = true
        feed?.wantsTimes.store(true, ordering: .relaxed)
    }

    /// A refusal is under way: nothing more is read, and the auth timeout has nothing left to do.
    private func stopReading() {
        refusing = true
    }

    private func closed() {
        guard !ended else { return }
        ended = true
        let grant = admitted
        if let admitted { dependencies.keyConnections.release(admitted) }
        admitted = nil
        var shelved: (String, SessionShelf.Session)?
        // A session tagged before its market had an epoch is kept if one names its positions now.
        let sessionName = self.sessionName ?? (dependencies.hub.epoch != nil ? unnamedSession : nil)
        if let sessionName, let grant, let position = handler.value.acknowledgedPosition,
            let kept = keptStanding(position, topics: session.topics.union(resuming?.topics ?? []), takenBack: resuming)
        {
            dependencies.logger.debug(
                "tagged session kept", metadata: ["session": "\(sessionName)", "epoch": "\(kept.epoch)", "resumeAfter": "\(kept.resumeAfter)"])
            shelved = (sessionName, SessionShelf.Session(kept, brokeAt: .now, carriedOver: session.carriedOver ?? resuming?.carriedOver))
            // The shelved session holds its topics in the key's budget until it is taken back or let go,
            // as the connection did (each is held by this key already, and a hold that moves is not
            // checked, so none is refused): parked sessions count against the topic and subscription
            // limits like open connections.
            dependencies.shelfReserve(Array(shelved?.1.topics ?? []), grant.name)
        } else if let sessionName {
            dependencies.shelf.closed(sessionName, id: ObjectIdentifier(self))
        }
        session.releaseAll()
        // Nothing the client asked for matters now, but leaving the hub does (after a join in flight).
        hubChanges.removeAll()
        if let shelved {
            dependencies.shelf.shelving()
            change(.shelve(shelved.0, shelved.1))
        } else {
            change(.leave)
        }
    }

    /// Parks the connection's subscriber and keeps its session (as the close made it) on the shelf,
    /// where it stands now: an add still on its way at the close has counted since (a first add's
    /// start, a later one's floor, a session it took over meanwhile).
    private func shelve(_ closing: SessionShelf.Session, as name: String) async {
        // Closed before its first subscribe took over the session of the connection it replaced: that
        // one's joins this one's (kept alone, this one's would replace it on the shelf). So does one kept
        // under its name since (by a connection it replaced, after this one's take-over stopped waiting;
        // or by the connection that replaced it, when this one's close was held up past that one's wait:
        // then this one's is the older session of the two).
        var newer: SessionShelf.Session?
        if takingOver {
            await takeOver(name, lettingGoAtWindowsEnd: false)
        } else if resuming == nil, sessionName != nil, let late = dependencies.shelf.take(name, into: standing) {
            if late.brokeAt > closing.brokeAt { newer = late }
            takeBack(late, lettingGoAtWindowsEnd: false)
        }
        var shelved = closing
        let older = newer == nil ? resuming : nil
        if let position = handler.value.acknowledgedPosition,
            let kept = keptStanding(position, topics: closing.topics.union(older?.topics ?? []), takenBack: older)
        {
            shelved = SessionShelf.Session(kept, brokeAt: closing.brokeAt, carriedOver: closing.carriedOver)
        }
        if let newer {
            shelved = SessionStanding.merged(newer, over: shelved)
            // The checkpoint finds it so until it is kept (not the newer one under this one's).
            standing?.tookBack(shelved)
        }
        // Parked first, so its topics never stop being wanted; then shelved; then no longer open. The
        // topics of a session it took back and had not subscribed again are held by that one's parked
        // subscriber: this one takes them over before that one goes (or, with none of its own, is it).
        // (The closing session holds them too: it was made of this connection's and those.) Added once
        // parked, so nothing is queued for them (a snapshot each, past a buffer's room).
        if let id = subscription?.id, await dependencies.hub.park(id) {
            if let left = resuming?.topics, !left.isEmpty, resuming?.parked != nil { _ = await dependencies.hub.add(left, to: id) }
            shelved.parked = id
            if let parked = resuming?.parked { await dependencies.hub.remove(parked) }
        } else {
            // None of its own (never joined, or evicted as too slow): the taken-back one's, if any.
            shelved.parked = resuming?.parked
        }
        // The shelved session took over the taken-back one's topics: those held in the key's budget at
        // the close hold their own; one taken over after it keeps the taken-back one's hold.
        releaseBudget(Array(resuming?.topics.intersection(closing.topics) ?? []))
        resuming = nil
        subscription = nil
        // Nothing to keep (no topics: gone before its first subscribe, with no session to take over):
        // kept, it would replace one kept under its name since. Its parked subscriber holds nothing.
        if !shelved.topics.isEmpty {
            dependencies.shelf.keep(shelved, as: name)
        } else if let parked = shelved.parked {
            await dependencies.hub.remove(parked)
        }
        dependencies.shelf.closed(name, id: ObjectIdentifier(self))
        dependencies.shelf.shelved()
    }

    /// Where the session stands as it would be kept now, holding `topics`: in the epoch of its position
    /// (a session it took back and had not resubscribed wholly keeps that one's start and topics; one of
    /// an older epoch stands for both, so that they resume as `gap`, never partly). Closed before its
    /// first topics were added, it stands where a session it took back (`takenBack`) stood (not at 0).
    private func keptStanding(_ position: AcknowledgedPosition, topics: Set<Topic>, takenBack: SessionShelf.Session?) -> SessionStanding.Now? {
        if !position.isStarted, let takenBack {
            return SessionStanding.Now(takenBack, topics: topics)
        }
        guard let epoch = position.epoch.flatMap({ $0.isEmpty ? nil : $0 }) ?? dependencies.hub.epoch else { return nil }
        return SessionStanding.kept(epoch: epoch, acknowledged: position.resumeAfter, floors: position.floors, topics: topics, takenBack: takenBack)
    }

    // MARK: the hub

    private func change(_ change: HubChange) {
        hubChanges.append(change)
        if hubChanges.count > Self.maxQueuedChanges, !readingHeld {
            readingHeld = true
            handler.value.holdReading(true)
        }
        switch worker {
        case .running:
            return
        case .waiting:
            guard change.isUrgent else { return }
            hubSlots.value.startNow(self)
            startWorker()
        case .idle:
            if hubSlots.value.start(self, urgent: change.isUrgent) { startWorker() } else { worker = .waiting }
        }
    }

    private func startWorker() {
        worker = .running
        Task { await self.applyHubChanges() }
    }

    /// Resumes from `taken`, the session it took back (if any): its protocol state is adopted, and
    /// its parked subscriber let go a window on unless `lettingGoAtWindowsEnd` is false (a closing
    /// connection's shelved session takes it over instead).
    private func takeBack(_ taken: SessionShelf.Session?, lettingGoAtWindowsEnd: Bool = true) {
        resuming = taken
        guard let taken else { return }
        if lettingGoAtWindowsEnd { letGoAtWindowsEnd(brokeAt: taken.brokeAt) }
        if let carried = taken.carriedOver { session.adopt(carriedOver: carried) }
    }

    /// Takes over the session of the connection it replaced under `name`, once that one has closed.
    private func takeOver(_ name: String, lettingGoAtWindowsEnd: Bool = true) async {
        takingOver = false
        let (taken, stillClosing) = await dependencies.shelf.takeOver(name, for: ObjectIdentifier(self), into: standing)
        takeBack(taken, lettingGoAtWindowsEnd: lettingGoAtWindowsEnd)
        transferring.topics = resuming?.topics ?? []
        if !stillClosing.isEmpty {
            if notTakenOver.isEmpty {
                let wait = dependencies.configuration.resume.takeOverWait
                notTakenOverWhy = "the connection this session took over had not closed within \(wait.milliseconds) ms"
            }
            notTakenOver.formUnion(stillClosing)
        }
    }

    /// A session taken back holds its topics for the connection (its parked subscriber keeps them
    /// wanted) until they are subscribed again, or for a window (``ResumeSettings/window``) from when
    /// it was taken: a client that signed in near the end of the session's own window still has a
    /// whole window to subscribe them, and none keeps them longer. Once per take-back (at sign-in, or
    /// a take-over: a connection does one or the other).
    private func letGoAtWindowsEnd(brokeAt: ContinuousClock.Instant) {
        loop.scheduleTask(in: TimeAmount(dependencies.configuration.resume.window)) { [weak self] in
            self?.assumeIsolated { if !$0.ended { $0.change(.letGo(brokeAt)) } }
        }
    }

    private func applyHubChanges() async {
        let hub = dependencies.hub
        while !hubChanges.isEmpty {
            if readingHeld, hubChanges.count <= Self.maxQueuedChanges / 2 {
                readingHeld = false
                handler.value.holdReading(false)
            }
            switch hubChanges.removeFirst() {
            case .join:
                let target = FeedTarget()
                let joined = await hub.subscribe(whenQueued: { target.kick() })
                subscription = joined
                let writability = handler.value.writability
                let feed = ClientFeed(
                    subscription: joined, handler: handler, writability: writability, drain: drain,
                    metrics: dependencies.delivery, framing: session.framing)
                self.feed = feed
                if handler.value.acknowledgedPosition != nil { feed.tracksPositions.store(true, ordering: .relaxed) }
                if wantsTimes { feed.wantsTimes.store(true, ordering: .relaxed) }
                target.set(feed)
                writability.onWritable { feed.kick() }
                feed.kick()
            case .add(let topics, let resume):
                guard let joined = subscription else { continue }
                let id = joined.id
                if takingOver, let sessionName {
                    await takeOver(sessionName)
                    // Off the shelf now: the checkpoint finds it here meanwhile (the add may read a tape).
                    standing?.holds(session.topics, takenBack: resuming)
                }
                if let resume {
                    // Resumed as the client asks: not told as topics of a connection taken over.
                    notTakenOver.subtract(topics)
                    // Where the client stands in market sequences is not known from per-topic positions:
                    // from the epoch's start, so that a break during the replay loses nothing.
                    let later = handler.value.acknowledgedPosition?.isStarted == true
                    if let position = handler.value.acknowledgedPosition { position.start(at: 0, epoch: await hub.position.epoch) }
                    let from: HubResume =
                        switch resume {
                        case .positions(let epoch, let positions): .positions(epoch: epoch, positions)
                        case .time(let milliseconds): .time(milliseconds: milliseconds)
                        }
                    let resumed = await hub.add(topics, to: id, resuming: from)
                    // Added after other topics: their replay comes after events of those the client may
                    // have acknowledged, so it stands before the replay until it has the replay.
                    if later, let replayedFrom = resumed.replayedFrom, let epoch = resumed.epoch {
                        handler.value.acknowledgedPosition?.replaying(
                            from: replayedFrom, in: epoch, through: resumed.sequence, epoch: epoch, replayedThrough: joined.replayedQueued)
                    }
                    // Those of a taken-back session are this connection's now, as a take-back's are.
                    if let broken = resuming, !joined.wasEvicted {
                        let back = topics.filter { broken.topics.contains($0) }
                        if !back.isEmpty { await handedOver(back, of: broken) }
                    }
                } else if let broken = resuming {
                    // A tagged session back: the topics it held resume from where it broke, the rest plainly.
                    let back = topics.filter { broken.topics.contains($0) }
                    let rest = topics.filter { !broken.topics.contains($0) }
                    if !back.isEmpty { await takeBack(back, of: broken, into: joined) }
                    if !rest.isEmpty { await addPlainly(rest, to: id) }
                } else {
                    await addPlainly(topics, to: id)
                }
            case .conflate(let mode):
                if let id = subscription?.id { await hub.setConflation(mode, for: id) }
            case .buffer(let events):
                if let id = subscription?.id { await hub.setBufferLimit(events, for: id) }
            case .owner(let key):
                if let id = subscription?.id { await hub.setOwner(key, for: id) }
            case .remove(let topics):
                if let id = subscription?.id { await hub.remove(topics, from: id) }
                handler.value.acknowledgedPosition?.removed(topics)
            case .leave:
                if let id = subscription?.id { await hub.remove(id) }
                if let parked = resuming?.parked { await hub.remove(parked) }
                releaseBudget(Array(resuming?.topics ?? []))
                resuming = nil
                subscription = nil
            case .shelve(let name, let session):
                await shelve(session, as: name)
            case .letGo(let brokeAt):
                guard let taken = resuming, taken.brokeAt == brokeAt else { continue }
                // Let go before the wait: a close meanwhile shelves only what is still held.
                resuming = nil
                releaseBudget(Array(taken.topics))
                if let parked = taken.parked { await hub.remove(parked) }
            }
        }
        standing?.holds(session.topics, takenBack: resuming)
        finishedChanges()
    }

    /// Topics subscribed with nothing to resume from. Each stands from where it was added (the same
    /// step on the hub): a position read before could predate its run in the history, and a break then
    /// resume as `gap`; the session's position may be earlier, and the topic's history not whole before
    /// it. Those of a connection taken over whose session this one does not resume are told so, once.
    private func addPlainly(_ topics: [Topic], to id: SubscriberID) async {
        let hub = dependencies.hub
        let unresumed = notTakenOver.intersection(topics)
        notTakenOver.subtract(unresumed)
        var added: (epoch: String?, sequence: UInt64)
        if unresumed.isEmpty {
            added = await hub.add(topics, to: id)
        } else {
            let outcome = await hub.add(topics, to: id, resuming: .unavailable(unresumed, why: notTakenOverWhy))
            // No epoch: its subscriber is gone (evicted); it stands where the hub is, as a plain add's would.
            added = outcome.epoch == nil ? await hub.position : (outcome.epoch, outcome.sequence)
        }
        handler.value.acknowledgedPosition?.start(at: added.sequence, epoch: added.epoch)
        handler.value.acknowledgedPosition?.added(topics.lazy.map { ($0, added.sequence) }, epoch: added.epoch)
    }

    /// Topics of the session being taken back (`broken`) are subscribed again: they resume from where it
    /// broke.
    private func takeBack(_ back: [Topic], of broken: SessionShelf.Session, into joined: HubSubscription) async {
        let hub = dependencies.hub
        let id = joined.id
        // Added after other topics: their replay comes after what the client may have
        // acknowledged of those.
        let later = handler.value.acknowledgedPosition?.isStarted == true
        // From where it broke (each topic added after the session's start from where it was
        // added). If the epoch changed since (a cluster's failover), the hub answers across the
        // terms: the former term's events from its tape, then this term's, or a `gap`. Which one is
        // the hub's answer's (a failover may come while the add waits for the hub), so the position
        // starts after it (writes before are lifted to it).
        let resumed = await hub.add(back, to: id, resuming: .marketSequence(epoch: broken.epoch, broken.resumeAfter, floors: broken.floors))
        let sameEpoch = (resumed.epoch ?? broken.epoch) == broken.epoch
        // Where each topic stood in the broken session's epoch.
        let brokenFloors = back.map { ($0, broken.floors[$0] ?? broken.resumeAfter) }
        if sameEpoch {
            handler.value.acknowledgedPosition?.start(at: broken.resumeAfter, epoch: broken.epoch)
            handler.value.acknowledgedPosition?.added(brokenFloors, epoch: broken.epoch)
        }
        if sameEpoch, later {
            handler.value.acknowledgedPosition?.replaying(
                from: broken.resumeAfter, in: broken.epoch, through: resumed.sequence, epoch: resumed.epoch, replayedThrough: joined.replayedQueued)
        }
        if !sameEpoch {
            // In this epoch each topic stands from where it was added. The hub may have replayed the
            // former term's tail (from its tape) and this term's events before it: until the client
            // has that replay, it stands where the session broke (with its floors there), so a break
            // during it resumes across the terms again and skips none of it. (Only if it replayed
            // some: topics told `gap` resume from where they were added.) Topics the connection
            // holds that were not the session's have no floor in the former term: a break then
            // resumes them across the terms too, a `gap` where its tape has not got them.
            handler.value.acknowledgedPosition?.start(at: resumed.sequence, epoch: resumed.epoch)
            handler.value.acknowledgedPosition?.added(back.lazy.map { ($0, resumed.sequence) }, epoch: resumed.epoch)
            if back.contains(where: { (resumed.replayed[$0] ?? 0) > 0 }) {
                handler.value.acknowledgedPosition?.replaying(
                    from: broken.resumeAfter, in: broken.epoch, floors: brokenFloors,
                    through: resumed.sequence, epoch: resumed.epoch, replayedThrough: joined.replayedQueued)
            }
        }
        // The connection's subscriber is gone (evicted as too slow, before or during the add): the
        // parked subscriber keeps every topic of the session for the shelf.
        guard resumed.epoch != nil, !joined.wasEvicted else { return }
        await handedOver(back, of: broken)
    }

    /// Topics of the taken-back session `broken` are this connection's now: the parked subscriber lets
    /// them go (and goes once it holds none), and so does the session's hold on them in the key's
    /// budget (this connection holds its own). It keeps holding the session's other topics until they
    /// are subscribed again: unwanted meanwhile, they would not be received, and their resume would be
    /// a `gap`.
    private func handedOver(_ back: [Topic], of broken: SessionShelf.Session) async {
        let left = broken.topics.subtracting(back)
        if let parked = broken.parked {
            if left.isEmpty { await dependencies.hub.remove(parked) } else { await dependencies.hub.remove(back, from: parked) }
        }
        releaseBudget(back)
        if left.isEmpty {
            resuming = nil
        } else {
            resuming = SessionShelf.Session(
                epoch: broken.epoch, resumeAfter: broken.resumeAfter, topics: left, brokeAt: broken.brokeAt,
                carriedOver: broken.carriedOver, floors: broken.floors.filter { left.contains($0.key) })
            resuming?.parked = broken.parked
        }
    }

    private func finishedChanges() {
        // Empty now: its buffer goes too (an idle connection keeps none; changes are rare).
        hubChanges = []
        if readingHeld {
            readingHeld = false
            handler.value.holdReading(false)
        }
        worker = .idle
        // The next connection of this loop in line (its actor runs on this loop too).
        hubSlots.value.finished()?.assumeIsolated { $0.startWorker() }
    }

    /// Gives back a taken-back session's hold on `topics` in its key's budget.
    private func releaseBudget(_ topics: [Topic]) {
        guard !topics.isEmpty, let sessionName else { return }
        dependencies.shelfRelease(topics, SessionShelf.key(of: sessionName))
    }
}
