import DemoFeed
import Foundation
import Histogram
import Logging
import PolygonWire

#if canImport(FoundationNetworking)
    import FoundationNetworking
#endif
#if canImport(Glibc)
    import Glibc
#endif

/// Runs one scenario end to end over loopback: a synthetic upstream (the demo feed with send stamps),
/// the relay as a child process, and the subscriber connections, then measures.
public struct BenchRunner: Sendable {
    public var scenario: BenchScenario
    /// The relay executable to run (`relay`, normally this very binary).
    public var relayBinary: String
    public var showRelayLogs: Bool
    public var progress: @Sendable (String) -> Void

    public init(scenario: BenchScenario, relayBinary: String, showRelayLogs: Bool = false, progress: @escaping @Sendable (String) -> Void) {
        self.scenario = scenario
        self.relayBinary = relayBinary
        self.showRelayLogs = showRelayLogs
        self.progress = progress
    }

    public struct BenchError: Error, CustomStringConvertible {
        public var description: String
    }

    public func run() async throws -> BenchResult {
        Self.raiseFileLimit()
        var logger = Logger(label: "relay.bench")
        logger.logLevel = .critical
        let s = scenario
        let feed = DemoFeed(
            configuration: {
                var c = DemoFeedConfiguration(
                    port: 0, eventsPerSecond: s.rate, tickInterval: .milliseconds(10), maxEventsPerFrame: s.frameEvents, seed: 1)
                c.universe = s.tickers
                c.stampNanoseconds = true
                return c
            }(), logger: logger)
        let feedTask = Task { try await feed.run() }
        defer { feedTask.cancel() }
        let feedURL = try await feed.url()

        let relay = RelayProcess(
            binary: relayBinary,
            arguments: ["serve", "--listen", "127.0.0.1:0", "--upstream", feedURL, "--upstream-key", "bench", "--log-level", "warning"],
            showLogs: showRelayLogs)
        let port = try await relay.start()
        let relayURL = "ws://127.0.0.1:\(port)/stocks"
        progress("relay pid \(relay.process.processIdentifier) on \(relayURL), upstream \(feedURL)")

        let window = BenchSubscriber.Window()
        let shards = (0..<16).map { _ in BenchSubscriber.LatencyShard() }
        var subscribers: [BenchSubscriber] = []
        for index in 0..<s.subscribers {
            let topics = s.wildcard ? ["Q.*", "T.*"] : s.symbols(forSubscriber: index).flatMap { ["Q.\($0)", "T.\($0)"] }
            subscribers.append(BenchSubscriber(topics: topics, stalled: false, latency: shards[index % shards.count]))
        }
        let stalledShard = BenchSubscriber.LatencyShard()
        for _ in 0..<s.stalledSubscribers {
            subscribers.append(BenchSubscriber(topics: ["Q.*", "T.*"], stalled: true, latency: stalledShard))
        }

        let result: BenchResult
        do {
            result = try await withThrowingTaskGroup(of: Void.self) { group in
                try await connect(subscribers, to: relayURL, window: window, logger: logger, in: &group)
                defer { group.cancelAll() }
                return try await measure(subscribers: subscribers, shards: shards, feed: feed, relay: relay, port: port, window: window)
            }
        } catch {
            await relay.stop()
            throw error
        }
        await relay.stop()
        return result
    }

    private func connect(
        _ subscribers: [BenchSubscriber], to url: String, window: BenchSubscriber.Window, logger: Logger,
        in group: inout ThrowingTaskGroup<Void, any Error>
    ) async throws {
        // Each subscriber reports once: nil when subscribed, why not when it failed before that.
        let (readyStream, readyContinuation) = AsyncStream.makeStream(of: String?.self)
        let began = ContinuousClock.now
        // At most 256 handshakes in flight, so 10,000 clients do not stampede the listener.
        var started = 0
        var ready = 0
        var readyIterator = readyStream.makeAsyncIterator()
        let deadline = ContinuousClock.now + .seconds(120)
        // A handshake that neither completes nor fails must not hang the run: at the deadline the
        // watchdog reports a failure.
        group.addTask {
            try await Task.sleep(until: deadline)
            readyContinuation.yield("the 120 s deadline passed")
        }
        while ready < subscribers.count {
            while started < subscribers.count, started - ready < 256 {
                let subscriber = subscribers[started]
                group.addTask {
                    // Like a real client, retry a connection that failed before it subscribed.
                    for attempt in 1...3 {
                        do {
                            try await subscriber.run(url: url, window: window, logger: logger) { readyContinuation.yield(nil) }
                            return
                        } catch {
                            if subscriber.subscribed.withLock({ $0 }) { return }
                            if attempt == 3 { readyContinuation.yield("\(error)") }
                            try? await Task.sleep(for: .milliseconds(200 * attempt))
                        }
                    }
                }
                started += 1
            }
            guard ContinuousClock.now < deadline else {
                throw BenchError(description: "only \(ready) of \(subscribers.count) subscribers connected")
            }
            guard let report = await readyIterator.next() else { break }
            if let failure = report {
                throw BenchError(description: "only \(ready) of \(subscribers.count) subscribers were subscribed: \(failure)")
            }
            ready += 1
            if ready % 1000 == 0 || ready == subscribers.count {
                progress("\(ready)/\(subscribers.count) subscribers connected (\((ContinuousClock.now - began).components.seconds) s)")
            }
        }
    }

    private func measure(
        subscribers: [BenchSubscriber], shards: [BenchSubscriber.LatencyShard], feed: DemoFeed, relay: RelayProcess, port: Int,
        window: BenchSubscriber.Window
    ) async throws -> BenchResult {
        let s = scenario
        progress("warming up \(s.warmupSeconds) s")
        try await Task.sleep(for: .seconds(s.warmupSeconds))

        let metricsBefore = await relayMetrics(port: port)
        let noticesBefore = subscribers.map { $0.counts.withLock { $0.laggingNotices } }
        let relayCPU0 = relay.cpuSeconds()
        let benchCPU0 = Self.ownCPUSeconds()
        let wall0 = ContinuousClock.now
        window.start.store(WallClock.nowNanoseconds(), ordering: .relaxed)
        feed.startTally()
        var lastReceived = subscribers.reduce(0) { $0 + $1.counts.withLock { $0.received } }
        for second in 1...max(Int(s.durationSeconds.rounded(.up)), 1) {
            try await Task.sleep(for: .seconds(min(1, s.durationSeconds - Double(second - 1))))
            let received = subscribers.reduce(0) { $0 + $1.counts.withLock { $0.received } }
            let cpu = relay.cpuSeconds() - relayCPU0
            let elapsed = Double((ContinuousClock.now - wall0).components.seconds)
            progress(
                "  \(second)s  \(received - lastReceived) events delivered in the last second, relay CPU \(Int(cpu / max(elapsed, 1) * 100))%"
            )
            lastReceived = received
        }
        let tally = feed.stopTally()
        let wall = ContinuousClock.now - wall0
        let seconds = wall.seconds
        let relayCPU = relay.cpuSeconds() - relayCPU0
        let benchCPU = Self.ownCPUSeconds() - benchCPU0
        guard let first = tally.firstStamp, let last = tally.lastStamp else { throw BenchError(description: "the feed sent nothing") }
        window.end.store(last, ordering: .relaxed)
        progress("draining in-flight events")
        try await Task.sleep(for: .milliseconds(1500))
        let metricsAfter = await relayMetrics(port: port)

        let upstreamEvents = tally.eventsByTicker.values.reduce(0, +)
        var expected = 0
        var delivered = 0
        var latency = Histogram<UInt64>(highestTrackableValue: 120_000_000_000, numberOfSignificantValueDigits: .three)
        var laggingFast = 0
        var stalledDelivered = 0
        var laggingStalled = 0
        for (index, subscriber) in subscribers.enumerated() {
            var counts = subscriber.counts.withLock { $0 }
            counts.laggingNotices -= noticesBefore[index]
            let got = counts.byStamp.reduce(0) { $0 + ($1.key >= first && $1.key <= last ? $1.value : 0) }
            if subscriber.stalled {
                stalledDelivered += counts.received
                laggingStalled += counts.laggingNotices
                continue
            }
            delivered += got
            laggingFast += counts.laggingNotices
            if s.wildcard {
                expected += upstreamEvents
            } else {
                let symbols = Set(subscriber.topics.compactMap { Topic(parsing: $0)?.ticker })
                expected += symbols.reduce(0) { $0 + (tally.eventsByTicker[$1] ?? 0) }
            }
        }
        for shard in shards { latency.add(shard.histogram.withLock { $0 }) }
        let window = Double(last - first) / 1e9 + 0.01  // ticks are 10 ms apart: the window spans one more
        let writes = Int((metricsAfter["relay_downstream_writes_total"] ?? 0) - (metricsBefore["relay_downstream_writes_total"] ?? 0))
        let deliveredAll = (metricsAfter["relay_events_delivered_total"] ?? 0) - (metricsBefore["relay_events_delivered_total"] ?? 0)
        func ms(_ percentile: Double) -> Double { Double(latency.valueAtPercentile(percentile)) / 1e6 }
        return BenchResult(
            scenario: s,
            upstreamEvents: upstreamEvents,
            upstreamEventsPerSecond: Double(upstreamEvents) / window,
            expected: expected,
            delivered: delivered,
            deliveredPerSecond: Double(delivered) / window,
            deliveryRatio: expected > 0 ? Double(delivered) / Double(expected) : 1,
            latencyMs: .init(p50: ms(50), p99: ms(99), p999: ms(99.9), max: Double(latency.maxRecorded) / 1e6, samples: latency.totalCount),
            relayDropped: Int(
                (metricsAfter[#"relay_events_dropped_total{reason="buffer_full"}"#] ?? 0)
                    - (metricsBefore[#"relay_events_dropped_total{reason="buffer_full"}"#] ?? 0)),
            laggingNoticesFast: laggingFast,
            stalledDelivered: stalledDelivered,
            laggingNoticesStalled: laggingStalled,
            relayWrites: writes,
            eventsPerWrite: writes > 0 ? deliveredAll / Double(writes) : 0,
            relayCPUSeconds: relayCPU,
            relayCPUPercent: relayCPU / seconds * 100,
            relayPeakRSSMB: Double(relay.peakResidentBytes()) / 1_048_576,
            relayRSSMB: Double(relay.residentBytes()) / 1_048_576,
            benchCPUPercent: benchCPU / seconds * 100)
    }

    /// The relay's Prometheus metrics, name (with labels) → value.
    private func relayMetrics(port: Int) async -> [String: Double] {
        guard let url = URL(string: "http://127.0.0.1:\(port)/metrics"),
            let (data, _) = try? await URLSession.shared.data(from: url)
        else { return [:] }
        var values: [String: Double] = [:]
        for line in String(decoding: data, as: UTF8.self).split(separator: "\n") where !line.hasPrefix("#") {
            guard let space = line.lastIndex(of: " "), let value = Double(line[line.index(after: space)...]) else { continue }
            values[String(line[..<space])] = value
        }
        return values
    }

    static func ownCPUSeconds() -> Double {
        var usage = rusage()
        getrusage(RUSAGE_SELF.rawValue, &usage)
        func seconds(_ t: timeval) -> Double { Double(t.tv_sec) + Double(t.tv_usec) / 1e6 }
        return seconds(usage.ru_utime) + seconds(usage.ru_stime)
    }

    /// Many clients need many descriptors: raise the soft limit to the hard one (the relay inherits it).
    static func raiseFileLimit() {
        var limit = rlimit()
        guard getrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit) == 0 else { return }
        limit.rlim_cur = limit.rlim_max
        _ = setrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit)
    }
}
