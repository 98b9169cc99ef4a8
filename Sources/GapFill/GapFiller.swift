import CoreMetrics
import Foundation
import Logging
import MarketDataHub
import NIOCore
import MarketREST
import MarketCore

/// The gap fill's limits. Value type, `Sendable`.
public struct GapFillSettings: Sendable, Equatable {
    /// The longest outage filled; a longer one gets its notice only.
    public var maxWindow: Duration = .seconds(15 * 60)
    /// The most topics one fill asks for, those held by the most subscribers first.
    public var maxTopics = 500
    /// REST requests per second, all fills of all markets together.
    public var requestsPerSecond = 20.0
    /// The most events recovered for one topic; past it the topic is told missing from where it stopped.
    public var eventsPerTopic = 100_000
    /// The most REST pages read for one topic (`next_url` paging); past it the rest is missing.
    public var pagesPerTopic = 50
    /// The longest one fill may take, all its topics together: past it the topics not yet filled are
    /// told missing, so that the market's later outages (filled one after another) are not held up.
    public var maxDuration: Duration = .seconds(180)
    /// The longest one REST request may take, its whole body included (a trickled body too).
    public var requestTimeout: Duration = .seconds(10)

    public init() {}
}

/// Fills a market's upstream outages from the vendor's REST API, read through the REST seam
/// (``MarketHistory``, e.g. `PolygonHistory`): for each topic held by name whose type has a history
/// (``MarketHistory/kind(of:)``), the events of the window the relay did not
/// receive, delivered to the topic's holders oldest first and flagged, then one `recovered` status per
/// fill saying what came and what is missing. Wildcards are not filled (a `T.*` fill would cost a
/// request per ticker): their holders have the outage notice.
///
/// One fill at a time per market, and at most one request waiting for it: a newer request takes the
/// waiting one's place, since the hub's ledger makes each request cover every gap not filled yet and
/// its end settles the earlier ones. Except when the newer one spans more than a fill covers
/// (`maxWindow`) and the waiting one does not: the waiting one is filled, then the newer one told
/// skipped (two waiting at most). An upstream that drops its connection every few seconds, or a REST
/// host slow enough that each fill takes its whole `maxDuration`, thus never piles up fills (each
/// holding its topics' last events, each spending REST calls on windows long settled). Requests go
/// through the REST client's gate below interactive ones (`bulk`) and through a ``RequestPace`` shared
/// by every market. An actor.
public actor GapFiller {
    private let market: Market
    private let hub: MarketDataHub
    private let history: any MarketHistory
    private let pace: RequestPace
    private let settings: GapFillSettings
    private let logger: Logger
    /// Results refused, as often as the REST host sends them: a line every ten seconds.
    private let warnings = ThrottledLog()
    /// The fills under way (one, then those waiting, if any), and the requests waiting for it: one, or
    /// one that fits the window before a newer one that does not.
    private var running: Task<Void, Never>?
    private var waiting: [GapFillRequest] = []
    /// The newest request's generation taken so far: requests reach the actor on tasks of their own,
    /// not always in order, and an older one covers less.
    private var newest = 0
    /// Where a single relay's fills go (its source's inbox), from ``start(into:)``.
    private var outlet: (any RecoveryOutlet)?
    /// REST requests made since start (the fills themselves are counted by the hub: ``MarketDataHub/gapFillStatistics``).
    public private(set) var requests = 0
    private let fillsComplete: Counter
    private let fillsIncomplete: Counter
    private let fillsSkipped: Counter
    private let fillsMerged: Counter
    private let recoveredCounter: Counter
    private let resultsRefused: Counter
    private let requestsOK: Counter
    private let requestsFailed: Counter
    private let duration: CoreMetrics.Timer

    public init(
        market: Market, hub: MarketDataHub, history: any MarketHistory, pace: RequestPace, settings: GapFillSettings,
        metricsFactory: any MetricsFactory = MetricsSystem.factory, logger: Logger = Logger(label: "relay.gap-fill")
    ) {
        self.market = market
        self.hub = hub
        self.history = history
        self.pace = pace
        self.settings = settings
        self.logger = logger
        fillsComplete = Counter(label: "relay_gap_fills_total", dimensions: [("result", "complete")], factory: metricsFactory)
        fillsIncomplete = Counter(label: "relay_gap_fills_total", dimensions: [("result", "incomplete")], factory: metricsFactory)
        fillsSkipped = Counter(label: "relay_gap_fills_total", dimensions: [("result", "skipped")], factory: metricsFactory)
        fillsMerged = Counter(label: "relay_gap_fills_total", dimensions: [("result", "merged")], factory: metricsFactory)
        recoveredCounter = Counter(label: "relay_gap_fill_events_total", factory: metricsFactory)
        resultsRefused = Counter(label: "relay_gap_fill_results_refused_total", factory: metricsFactory)
        requestsOK = Counter(label: "relay_gap_fill_requests_total", dimensions: [("result", "ok")], factory: metricsFactory)
        requestsFailed = Counter(label: "relay_gap_fill_requests_total", dimensions: [("result", "failed")], factory: metricsFactory)
        duration = CoreMetrics.Timer(label: "relay_gap_fill_seconds", factory: metricsFactory)
    }

    /// Asks the hub to hand every recovery to this filler, whose results go to `outlet` (the market
    /// source's inbox, ``InboxOutlet``: the hub's one way in).
    public func start(into outlet: any RecoveryOutlet) async {
        self.outlet = outlet
        await hub.setRecoveryHandler { [weak self] request in
            guard let self else { return }
            Task { await self.enqueue(request) }
        }
    }

    /// Stops filling: the fill under way is cancelled (what it delivered stays delivered).
    public func stop() async {
        await hub.setRecoveryHandler(nil)
        outlet = nil
        running?.cancel()
        running = nil
        waiting = []
    }

    /// Fills `request` now, or after the fill under way, in place of any request waiting already.
    func enqueue(_ request: GapFillRequest) {
        guard let outlet else { return }
        // One older than a request already taken is covered by it (its gaps are in the newer one's).
        guard request.generation > newest else {
            fillsMerged.increment()
            return
        }
        newest = request.generation
        guard running == nil else {
            if let last = waiting.last, fits(last), !fits(request) {
                // It reaches back to the waiting one's gaps and past the window: filled alone, the
                // waiting one's gaps would go unfilled with it.
                waiting = [last, request]
            } else if waiting.isEmpty {
                waiting = [request]
            } else {
                fillsMerged.increment()
                waiting[waiting.count - 1] = request
            }
            return
        }
        running = Task { await fillInTurn(request, into: outlet) }
    }

    private func fillInTurn(_ first: GapFillRequest, into outlet: any RecoveryOutlet) async {
        var next: GapFillRequest? = first
        while let request = next {
            await fill(request, into: outlet)
            // Stopped: `stop()` let go of this task and what waited.
            if Task.isCancelled { return }
            next = waiting.isEmpty ? nil : waiting.removeFirst()
        }
        running = nil
    }

    /// Whether `request`'s window is one a fill covers.
    private func fits(_ request: GapFillRequest) -> Bool {
        Duration.milliseconds(request.through - request.from) <= settings.maxWindow
    }

    /// Waits for the fills under way and waiting now (tests).
    public func idle() async {
        await running?.value
    }

    /// Fills one request's outage, handing what it recovers to `outlet` (the hub, or a cluster leader's
    /// publisher). Ends early, without a summary, when its task is cancelled.
    public func fill(_ request: GapFillRequest, into outlet: any RecoveryOutlet) async {
        let started = ContinuousClock.now
        guard fits(request) else {
            fillsSkipped.increment()
            await outlet.noteFillSkipped(generation: request.generation)
            logger.warning(
                "outage longer than the gap fill covers: notice only",
                metadata: ["window_ms": "\(request.through - request.from)", "max_seconds": "\(settings.maxWindow.components.seconds)"])
            return
        }
        var summary = GapFillSummary(from: request.from, through: request.through)
        // A derived bar (`AM.AAPL@5m`) is the relay's own, built from trades: the vendor has none to ask for.
        let fillable = request.topics.filter { !$0.topic.isWildcard && !$0.topic.isDerived && history.kind(of: $0.topic.eventType) != nil }
        for held in request.topics where held.topic.isDerived {
            summary.missing[held.topic] = "not filled: a derived bar is built from live trades; the bars of the outage are not rebuilt"
        }
        guard !fillable.isEmpty else {
            await outlet.finishFill(generation: request.generation)
            return
        }
        for held in fillable.dropFirst(settings.maxTopics) {
            summary.missing[held.topic] = "not filled: one fill asks for at most \(settings.maxTopics) topics (those the relay had an event of before the outage first, then those held by the most clients)"
        }
        // One topic at a time, so that a fill takes at most one core from the live stream: two at once
        // filled 20% sooner but took the live p99 from 12 to 291 ms (README, Performance).
        let deadline = started + settings.maxDuration
        for held in fillable.prefix(settings.maxTopics) {
            guard ContinuousClock.now < deadline else {
                summary.missing[held.topic] = "not filled: the fill took longer than \(settings.maxDuration.components.seconds) s"
                continue
            }
            switch await fill(held, request, outlet, deadline: deadline) {
            case .success(let count): summary.recovered[held.topic] = count
            case .failure(let failure):
                summary.missing[held.topic] = failure.reason
                if failure.delivered > 0 { summary.recovered[held.topic] = failure.delivered }
            }
        }
        guard !Task.isCancelled else {
            await outlet.finishFill(generation: request.generation)
            return
        }
        await outlet.announceRecovered(summary, generation: request.generation)
        let events = summary.recovered.values.reduce(0, +)
        recoveredCounter.increment(by: events)
        let elapsed = (ContinuousClock.now - started).components
        duration.recordNanoseconds(elapsed.seconds * 1_000_000_000 + elapsed.attoseconds / 1_000_000_000)
        if summary.isComplete {
            fillsComplete.increment()
            logger.info(
                "gap filled", metadata: ["events": "\(events)", "topics": "\(summary.recovered.count)", "window_ms": "\(request.through - request.from)"])
        } else {
            fillsIncomplete.increment()
            logger.warning(
                "gap fill incomplete",
                metadata: ["events": "\(events)", "missing": "\(summary.missing.count)", "first_missing": "\(summary.missing.first.map { "\($0.key): \($0.value)" } ?? "")"])
        }
    }

    struct FillFailure: Error {
        /// Why, as every holder of the topic is told it (and the log): visible, at most
        /// ``reasonBytes`` (it carries what the REST host chose).
        var reason: String
        var delivered: Int

        static let reasonBytes = 512

        init(reason: String, delivered: Int) {
            self.reason = VisibleText.visible(reason, limit: Self.reasonBytes)
            self.delivered = delivered
        }
    }

    /// One topic: its pages fetched, mapped, bounded by the window and by what the relay had before the
    /// outage, then delivered (what came before a failure too). Off the actor: reading and mapping a
    /// page does not hold up `requests` or a new fill's queueing.
    private nonisolated func fill(
        _ held: GapFillRequest.Held, _ request: GapFillRequest, _ outlet: any RecoveryOutlet, deadline: ContinuousClock.Instant
    ) async -> Result<Int, FillFailure> {
        let topic = held.topic
        guard let kind = history.kind(of: topic.eventType) else { return .success(0) }
        let wire = hub.wire
        let order = wire.recoveryOrder(of: topic.eventType)
        let lastBefore = held.lastBefore.flatMap { wire.orderValue(order, of: $0) }
        // Trades and quotes from the last one the relay had (its millisecond: `q` tells them apart), or
        // from the outage's start; bars from the start of the minute it began in.
        // The last event's own time, within a day before the window (a wild `t` asks for nothing absurd).
        let fromMs = kind == .minuteBars
            ? request.from / 60_000 * 60_000
            : min(max(held.lastBefore.flatMap { wire.orderValue(.time, of: $0) } ?? request.from, request.from - 86_400_000), request.through)
        var events: [(MarketEvent, Int64)] = []
        var next: String?
        var firstPage = true
        var failure: String?
        var pages = 0
        let window = fromMs..<max(fromMs, request.through)
        func tookTooLong() -> String {
            "the fill took longer than \(settings.maxDuration.components.seconds) s: recovered through \(events.last?.1 ?? fromMs) (Unix ms), the rest is missing"
        }
        pages: while firstPage || next != nil {
            if pages == settings.pagesPerTopic {
                failure = "more than \(settings.pagesPerTopic) REST pages: recovered through \(events.last?.1 ?? fromMs) (Unix ms), the rest is missing"
                break pages
            }
            if ContinuousClock.now >= deadline {
                failure = tookTooLong()
                break pages
            }
            pages += 1
            do { try await pace.next() } catch { return .failure(FillFailure(reason: "cancelled", delivered: 0)) }
            // The pace may have waited past it: no page is begun then.
            if ContinuousClock.now >= deadline {
                failure = tookTooLong()
                break pages
            }
            // Within the fill's time however the page goes: a vendor's pause (its 429s), the account's
            // budget and the request's retries all wait inside it.
            let (history, cursor, room) = (self.history, next, settings.eventsPerTopic - events.count)
            let answer: Result<HistoryPage, RESTError>
            do {
                answer = try await RESTDeadline.within(deadline - .now) {
                    await history.page(of: topic, window: window, cursor: cursor, room: room, priority: .bulk)
                }
            } catch {
                if Task.isCancelled { return .failure(FillFailure(reason: "cancelled", delivered: 0)) }
                await countRequest()
                requestsFailed.increment()
                failure = tookTooLong()
                break pages
            }
            firstPage = false
            await countRequest()
            switch answer {
            case .success(let page):
                requestsOK.increment()
                noteRefused(page.refused, topic)
                next = page.next
                let room = settings.eventsPerTopic - events.count
                events += page.events.prefix(room)
                if page.events.count > room {
                    failure = "more than \(settings.eventsPerTopic) events: recovered through \(events.last?.1 ?? request.from) (Unix ms), the rest is missing"
                    break pages
                }
            case .failure(.malformed(let what)):
                requestsFailed.increment()
                failure = "unreadable REST answer: \(what)"
                break pages
            case .failure(let error):
                requestsFailed.increment()
                let since = events.last.map { " after \($0.1) (Unix ms)" } ?? ""
                failure = "REST \(error)\(since); the rest of the window is missing"
                break pages
            }
        }
        let delivered = await deliver(topic, filtered(events, kind, order, lastBefore, request), order: order, to: outlet)
        if let failure { return .failure(FillFailure(reason: failure, delivered: delivered)) }
        return .success(delivered)
    }

    /// Results with no price or time, or a value that is not exactly JSON of its kind: counted, not copied.
    private nonisolated func noteRefused(_ refused: Int, _ topic: Topic) {
        guard refused > 0 else { return }
        resultsRefused.increment(by: refused)
        warnings.log(
            .warning, "refused", "REST results refused: a value missing, implausible or not valid JSON", metadata: ["topic": "\(topic)", "results": "\(refused)"],
            to: logger)
    }

    private func countRequest() { requests += 1 }

    /// What the relay did not have: after its last event of the topic before the outage, before the
    /// reconnect, and for bars only those whose minute had ended by then (the live one is still to come).
    private nonisolated func filtered(
        _ events: [(MarketEvent, Int64)], _ kind: HistoryKind, _ order: RecoveryOrder, _ lastBefore: Int64?, _ request: GapFillRequest
    ) -> [(MarketEvent, Int64)] {
        events.filter { event, time in
            if let lastBefore, let value = hub.wire.orderValue(order, of: event), value <= lastBefore { return false }
            if kind == .minuteBars {
                // Without a bar of it before, a bar that ended before the outage began was delivered live.
                return time + 60_000 <= request.through && (lastBefore != nil || time + 60_000 > request.from)
            }
            return time < request.through
        }
    }

    /// Events handed to the hub per call: live events are published between two of them, so a large
    /// fill does not hold up the live stream.
    static let deliveryChunk = 1_000

    private nonisolated func deliver(_ topic: Topic, _ events: [(MarketEvent, Int64)], order: RecoveryOrder, to outlet: any RecoveryOutlet) async -> Int {
        guard !events.isEmpty else { return 0 }
        // Oldest first; a stable sort keeps REST's order within one timestamp.
        let sorted = events.enumerated().sorted { ($0.element.1, $0.offset) < ($1.element.1, $1.offset) }.map(\.element.0)
        var delivered = 0
        var start = 0
        while start < sorted.count {
            let end = min(start + Self.deliveryChunk, sorted.count)
            delivered += await outlet.deliverRecovered(topic, Array(sorted[start..<end]), order: order)
            start = end
        }
        return delivered
    }
}
