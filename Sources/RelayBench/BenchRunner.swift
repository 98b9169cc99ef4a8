import AsyncHTTPClient
import DemoFeed
import Foundation
import Histogram
import Logging
import PolygonWire

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
    /// The environment the relays are started from (this process's); the relay's own settings in it
    /// are left out (``RelayProcess/init(binary:arguments:showLogs:captureLogs:environment:isolated:inheriting:)``).
    public var environment = ProcessInfo.processInfo.environment

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
                    port: 0, eventsPerSecond: s.rate / Double(max(s.markets.count, 1)), tickInterval: .milliseconds(10),
                    maxEventsPerFrame: s.frameEvents, seed: 1)
                c.markets = s.markets
                c.universes = Dictionary(uniqueKeysWithValues: s.markets.map { ($0, s.tickers(of: $0)) })
                c.evenRates = true
                c.stampNanoseconds = true
                c.alpaca = s.alpaca
                return c
            }(), logger: logger)
        let feedTask = Task { try await feed.run() }
        defer { feedTask.cancel() }
        var upstreamArguments: [String] = []
        for market in s.markets { upstreamArguments += ["--upstream", try await feed.url(for: market)] }
        if s.alpaca { upstreamArguments += ["--upstream-secret", "bench"] }
        let feedURL = upstreamArguments.count == 2 ? upstreamArguments[1] : "\(s.markets.count) markets"
        let paths = s.markets.map { s.path(of: $0) }.joined(separator: " ")

        // One relay, or a cluster of `nodes` on a NATS server of its own.
        var nats: NATSServerProcess?
        var clusterArguments: [String] = []
        if s.nodes > 1 {
            let server = try NATSServerProcess()
            nats = server
            clusterArguments = ["--cluster", try await server.start(), "--cluster-name", "bench"]
            progress("NATS (JetStream) at \(clusterArguments[1])")
        }
        var relays: [RelayProcess] = []
        var ports: [Int] = []
        // Each relay keeps its data (the tape it records, and resumes from at its start) in a folder of
        // this run's own, removed after it: a run never starts from an earlier run's history or
        // snapshots, nor writes into the directory it was started from.
        let dataDirectory = FileManager.default.temporaryDirectory.appendingPathComponent("relay-bench-\(UUID().uuidString)").path
        func stopAll() async {
            for relay in relays { await relay.stop() }
            await nats?.stop()
            try? FileManager.default.removeItem(atPath: dataDirectory)
        }
        do {
            for node in 0..<max(s.nodes, 1) {
                // Isolated: configured by these arguments alone, not by an operator's RELAY_CLUSTER,
                // RELAY_TAPE_DIR or RELAY_CLIENT_KEYS in the environment the bench was started from.
                let relay = RelayProcess(
                    binary: relayBinary,
                    arguments: [
                        "serve", "--listen", "127.0.0.1:0", "--upstream-key", "bench", "--log-level", "warning", "--no-portfolio",
                        "--data-dir", "\(dataDirectory)/node\(node + 1)",
                    ] + upstreamArguments + (s.nodes > 1 ? clusterArguments + ["--node-id", "node\(node + 1)"] : []),
                    showLogs: showRelayLogs, isolated: true, inheriting: environment)
                relays.append(relay)
                ports.append(try await relay.start())
                progress("relay pid \(relay.process.processIdentifier) on ws://127.0.0.1:\(ports[node]) \(paths), upstream \(feedURL)")
            }
            if s.nodes > 1 { _ = try await leader(ports: ports) }
        } catch {
            await stopAll()
            throw error
        }

        let window = BenchSubscriber.Window()
        // Per node, 16 shared latency histograms.
        let shards = (0..<relays.count).map { _ in (0..<16).map { _ in BenchSubscriber.LatencyShard() } }
        var subscribers: [BenchSubscriber] = []
        var nodeOf: [Int] = []
        for index in 0..<s.subscribers {
            let topics = s.topics(forSubscriber: index)
            let node = index % relays.count
            subscribers.append(
                BenchSubscriber(
                    topics: topics, stalled: false, latency: shards[node][(index / relays.count) % 16], alpaca: s.alpaca ? s.alpacaCodec : nil))
            nodeOf.append(node)
        }
        let stalledShard = BenchSubscriber.LatencyShard()
        for index in 0..<s.stalledSubscribers {
            subscribers.append(
                BenchSubscriber(
                    // Of the market its URL is (its place among all the subscribers).
                    topics: (s.alpaca ? ["q", "t"] : BenchScenario.channels(of: s.market(ofSubscriber: s.subscribers + index))).map { "\($0).*" }, stalled: true,
                    latency: stalledShard, alpaca: s.alpaca ? s.alpacaCodec : nil))
            nodeOf.append(index % relays.count)
        }

        var result: BenchResult
        do {
            result = try await withThrowingTaskGroup(of: Void.self) { group in
                try await connect(
                    subscribers,
                    to: nodeOf.enumerated().map { index, node in "ws://127.0.0.1:\(ports[node])\(s.path(of: s.market(ofSubscriber: index)))" },
                    window: window, logger: logger, in: &group)
                defer { group.cancelAll() }
                var result = try await measure(
                    subscribers: subscribers, nodeOf: nodeOf, shards: shards, feed: feed, relays: relays, ports: ports, window: window)
                if s.nodes > 1 {
                    result.failover = try await failovers(subscribers: subscribers, nodeOf: nodeOf, relays: relays, ports: ports)
                }
                return result
            }
        } catch {
            await stopAll()
            throw error
        }
        await stopAll()
        return result
    }

    /// Waits until node 1 names a leader; returns its index.
    private func leader(ports: [Int], among alive: Set<Int>? = nil, timeout: Duration = .seconds(30)) async throws -> Int {
        let deadline = ContinuousClock.now + timeout
        while ContinuousClock.now < deadline {
            for (index, port) in ports.enumerated() where alive?.contains(index) ?? true {
                if let data = await Self.loopbackGET(port: port, path: "/healthz"),
                    let object = try? JSONSerialization.jsonObject(with: data) as? [String: Any],
                    let cluster = object["cluster"] as? [String: Any], let leader = cluster["leader"] as? String,
                    let number = Int(leader.dropFirst("node".count)), alive?.contains(number - 1) ?? true
                {
                    return number - 1
                }
            }
            try await Task.sleep(for: .milliseconds(50))
        }
        throw BenchError(description: "no cluster leader within \(timeout)")
    }

    /// Kills the leader (SIGKILL), then stops the next one (SIGTERM), each time timing how long until
    /// every subscriber on the surviving nodes receives an event sent after the stop.
    private func failovers(subscribers: [BenchSubscriber], nodeOf: [Int], relays: [RelayProcess], ports: [Int]) async throws
        -> BenchResult.Failover
    {
        var alive = Set(relays.indices)
        var seconds: [Double] = []
        for (signal, name) in [(SIGKILL, "kill -9"), (SIGTERM, "SIGTERM")] {
            let leader = try await leader(ports: ports, among: alive)
            alive.remove(leader)
            let watched = subscribers.indices.filter { alive.contains(nodeOf[$0]) && !subscribers[$0].stalled }
            guard !watched.isEmpty else {
                throw BenchError(description: "no subscriber on the nodes left to time the \(name) failover: as many subscribers as nodes at least")
            }
            let stoppedAt = WallClock.nowNanoseconds()
            for index in watched { subscribers[index].counts.withLock { $0.probeAfter = stoppedAt; $0.firstArrivalAfterProbe = nil } }
            progress("\(name) of the leader node\(leader + 1); waiting for events on the other nodes")
            if signal == SIGKILL { await relays[leader].kill() } else { relays[leader].terminate() }
            let deadline = ContinuousClock.now + .seconds(30)
            var slowest: Int64?
            while ContinuousClock.now < deadline {
                let arrivals = watched.map { subscribers[$0].counts.withLock { $0.firstArrivalAfterProbe } }
                if arrivals.allSatisfy({ $0 != nil }) {
                    slowest = arrivals.compactMap { $0 }.max()
                    break
                }
                try await Task.sleep(for: .milliseconds(10))
            }
            guard let slowest else { throw BenchError(description: "events did not resume within 30 s after \(name) of the leader") }
            seconds.append(Double(slowest - stoppedAt) / 1e9)
            progress("  events resumed on every surviving node after \(BenchResult.format(seconds.last ?? 0, digits: 3)) s")
        }
        return BenchResult.Failover(killSeconds: seconds[0], terminateSeconds: seconds[1])
    }

    private func connect(
        _ subscribers: [BenchSubscriber], to urls: [String], window: BenchSubscriber.Window, logger: Logger,
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
                let url = urls[started]
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
        subscribers: [BenchSubscriber], nodeOf: [Int], shards: [[BenchSubscriber.LatencyShard]], feed: DemoFeed, relays: [RelayProcess],
        ports: [Int], window: BenchSubscriber.Window
    ) async throws -> BenchResult {
        let s = scenario
        progress("warming up \(s.warmupSeconds) s")
        try await Task.sleep(for: .seconds(s.warmupSeconds))

        let metricsBefore = await relayMetrics(ports: ports)
        let noticesBefore = subscribers.map { $0.counts.withLock { $0.laggingNotices } }
        let relayCPU0 = relays.reduce(0) { $0 + $1.cpuSeconds() }
        let benchCPU0 = Self.ownCPUSeconds()
        let wall0 = ContinuousClock.now
        window.start.store(WallClock.nowNanoseconds(), ordering: .relaxed)
        feed.startTally()
        var lastReceived = subscribers.reduce(0) { $0 + $1.counts.withLock { $0.received } }
        for second in 1...max(Int(s.durationSeconds.rounded(.up)), 1) {
            try await Task.sleep(for: .seconds(min(1, s.durationSeconds - Double(second - 1))))
            let received = subscribers.reduce(0) { $0 + $1.counts.withLock { $0.received } }
            let cpu = relays.reduce(0) { $0 + $1.cpuSeconds() } - relayCPU0
            let elapsed = Double((ContinuousClock.now - wall0).components.seconds)
            progress(
                "  \(second)s  \(received - lastReceived) events delivered in the last second, relay CPU \(Int(cpu / max(elapsed, 1) * 100))%"
            )
            lastReceived = received
        }
        let tally = feed.stopTally()
        let wall = ContinuousClock.now - wall0
        let seconds = wall.seconds
        let relayCPU = relays.reduce(0) { $0 + $1.cpuSeconds() } - relayCPU0
        let benchCPU = Self.ownCPUSeconds() - benchCPU0
        guard let first = tally.firstStamp, let last = tally.lastStamp else { throw BenchError(description: "the feed sent nothing") }
        window.end.store(last, ordering: .relaxed)
        progress("draining in-flight events")
        try await Task.sleep(for: .milliseconds(1500))
        let metricsAfter = await relayMetrics(ports: ports)

        let upstreamEvents = tally.eventsByTicker.values.reduce(0, +)
        var expected = 0
        var delivered = 0
        var latency = Histogram<UInt64>(highestTrackableValue: 120_000_000_000, numberOfSignificantValueDigits: .three)
        var laggingFast = 0
        var stalledDelivered = 0
        var laggingStalled = 0
        var perNode = Array(repeating: (expected: 0, delivered: 0), count: relays.count)
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
            let wanted: Int
            if s.wildcard {
                // Every event of the subscriber's market.
                let market = s.market(ofSubscriber: index)
                wanted = tally.eventsByTicker.reduce(0) { $0 + (Market.of(ticker: $1.key) == market ? $1.value : 0) }
            } else {
                let symbols = Set(subscriber.topics.compactMap { Topic(parsing: $0)?.ticker })
                wanted = symbols.reduce(0) { $0 + (tally.eventsByTicker[$1] ?? 0) }
            }
            expected += wanted
            perNode[nodeOf[index]].expected += wanted
            perNode[nodeOf[index]].delivered += got
        }
        var nodes: [BenchResult.Node] = []
        for (node, nodeShards) in shards.enumerated() {
            var nodeLatency = Histogram<UInt64>(highestTrackableValue: 120_000_000_000, numberOfSignificantValueDigits: .three)
            for shard in nodeShards { nodeLatency.add(shard.histogram.withLock { $0 }) }
            latency.add(nodeLatency)
            let figures = perNode[node]
            nodes.append(
                BenchResult.Node(
                    name: relays.count > 1 ? "node\(node + 1)" : "relay",
                    deliveryRatio: figures.expected > 0 ? Double(figures.delivered) / Double(figures.expected) : 1,
                    p50Ms: Double(nodeLatency.valueAtPercentile(50)) / 1e6, p99Ms: Double(nodeLatency.valueAtPercentile(99)) / 1e6,
                    peakRSSMB: Double(relays[node].peakResidentBytes()) / 1_048_576))
        }
        let window = Double(last - first) / 1e9 + 0.01  // ticks are 10 ms apart: the window spans one more
        let writes = Int((metricsAfter["relay_downstream_writes_total"] ?? 0) - (metricsBefore["relay_downstream_writes_total"] ?? 0))
        let deliveredAll = (metricsAfter["relay_events_delivered_total"] ?? 0) - (metricsBefore["relay_events_delivered_total"] ?? 0)
        func ms(_ percentile: Double) -> Double { Double(latency.valueAtPercentile(percentile)) / 1e6 }
        // Bars whose window ended inside the measured window, as the subscribers received them.
        let barsBuilt = subscribers.reduce(0) { $0 + $1.counts.withLock { $0.bars } }
        var result = BenchResult(
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
            relayPeakRSSMB: Double(relays.map { $0.peakResidentBytes() }.max() ?? 0) / 1_048_576,
            relayRSSMB: Double(relays.reduce(0) { $0 + $1.residentBytes() }) / 1_048_576,
            benchCPUPercent: benchCPU / seconds * 100,
            nodes: relays.count > 1 ? nodes : nil)
        result.barsBuilt = barsBuilt
        result.barsPerSecond = Double(barsBuilt) / window
        return result
    }

    /// The relays' Prometheus metrics, name (with labels) → value summed over the nodes.
    private func relayMetrics(ports: [Int]) async -> [String: Double] {
        var values: [String: Double] = [:]
        for port in ports {
            guard let data = await Self.loopbackGET(port: port, path: "/metrics") else { continue }
            Self.add(metrics: String(decoding: data, as: UTF8.self), to: &values)
        }
        return values
    }

    /// Adds each series of a Prometheus text page to `values` under its whole name, its bare name and
    /// its name with each one of its labels (`relay_events_dropped_total{reason="buffer_full"}` sums
    /// every market's, whatever other labels come before it).
    public static func add(metrics text: String, to values: inout [String: Double]) {
        for line in text.split(separator: "\n") where !line.hasPrefix("#") {
            guard let space = line.lastIndex(of: " "), let value = Double(line[line.index(after: space)...]) else { continue }
            values[String(line[..<space]), default: 0] += value
            guard let brace = line.firstIndex(of: "{"), brace < space, let end = line[..<space].lastIndex(of: "}") else { continue }
            let name = line[..<brace]
            values[String(name), default: 0] += value
            let labels = line[line.index(after: brace)..<end].split(separator: "\",").map { $0.hasSuffix("\"") ? $0 : $0 + "\"" }
            guard labels.count > 1 else { continue }
            for label in labels { values["\(name){\(label)}", default: 0] += value }
        }
    }

    /// The body of a GET to a relay on this machine, or nil when it does not answer 200 within 5 s.
    /// (AsyncHTTPClient, which the relay already carries, rather than URLSession: that one would load
    /// FoundationNetworking, and with it libcurl and some twenty libraries, into every relay process.)
    static func loopbackGET(port: Int, path: String) async -> Data? {
        let request = HTTPClientRequest(url: "http://127.0.0.1:\(port)\(path)")
        guard let response = try? await HTTPClient.shared.execute(request, timeout: .seconds(5)), response.status == .ok,
            let body = try? await response.body.collect(upTo: 64 << 20)
        else { return nil }
        return Data(body.readableBytesView)
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
