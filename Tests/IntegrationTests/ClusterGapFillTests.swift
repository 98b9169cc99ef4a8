#if canImport(Glibc)
    import Glibc
#endif
import Foundation
import PolygonWire
import Synchronization
import Testing

/// A TCP socket listening on a free loopback port: its descriptor and port.
func listeningSocket() throws -> (fd: Int32, port: Int) {
    let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
    var address = sockaddr_in()
    address.sin_family = sa_family_t(AF_INET)
    address.sin_addr.s_addr = in_addr_t(UInt32(0x7F00_0001).bigEndian)
    var length = socklen_t(MemoryLayout<sockaddr_in>.size)
    let bound = withUnsafeMutablePointer(to: &address) {
        $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { pointer in
            bind(fd, pointer, length) == 0 && listen(fd, 16) == 0 && getsockname(fd, pointer, &length) == 0
        }
    }
    guard fd >= 0, bound else { throw RawSocket.Failure(description: "a listening socket: errno \(errno)") }
    return (fd, Int(UInt16(bigEndian: address.sin_port)))
}

/// A REST API that takes connections and never answers: a leader's fill through it hangs.
final class SilentListener: Sendable {
    let port: Int
    private let fd: Int32
    /// Connections taken so far (each held open, never read).
    let accepted = Atomic<Int>(0)

    init() throws {
        (fd, port) = try listeningSocket()
        Thread.detachNewThread { [self] in
            while true {
                let connection = accept(fd, nil, nil)
                if connection < 0 { return }
                accepted.add(1, ordering: .relaxed)
            }
        }
    }

    /// Stops taking connections (the held ones close with the process).
    func close() { shutdown(fd, Int32(SHUT_RDWR)) }
}

private func int(_ value: Any?) -> Int64? { (value as? NSNumber)?.int64Value }

@Suite(
    "Cluster on NATS: gap fill", .serialized, .timeLimit(.minutes(3)),
    .enabled(if: ClusterHarness.enabled, "nats-server is not installed (scripts/test installs it)"))
struct ClusterGapFillTests {
    /// The leader's fill hangs on its REST API and the leader dies mid-fill: the new leader fills both
    /// outages (the drop and the failover) at once, and a follower's client gets exactly what the feed
    /// generated, each recovered event once, with the leader's positions.
    @Test func aFillCutShortByAFailoverIsTakenUpByTheNewLeaderForBothOutages() async throws {
        let silent = try SilentListener()
        defer { silent.close() }
        try await ClusterHarness.with(nodes: 0) { cluster in
            let feedREST = "http://127.0.0.1:\(try await cluster.feed.listeningPort())"
            try await cluster.startNode("n1", extra: ["--no-portfolio", "--rest-url", "http://127.0.0.1:\(silent.port)"])
            #expect(try await cluster.agreedLeader(among: ["n1"]) == "n1")
            try await cluster.startNode("n2", extra: ["--no-portfolio", "--rest-url", feedREST])
            #expect(try await cluster.agreedLeader() == "n1")
            let named = GapFillTests.Reader(try await subscribedClient(try cluster.url("n2"), "T.AAPL,Q.MSFT,AM.AAPL"))
            try await named.read(for: .seconds(1))

            // The first outage: n1 reconnects and starts the fill, which hangs on its silent REST API.
            #expect(cluster.feed.inject(.drop, refusingFor: .seconds(2)) == 1)
            try await named.read(until: "the first reconnect") { $0["status"] as? String == StatusMessage.Kind.upstreamReconnected }
            try await eventually("n1's fill to ask its REST API") { silent.accepted.load(ordering: .relaxed) > 0 }
            // The second: n1 dies mid-fill; n2 takes the lease and fills both windows.
            try await cluster.kill("n1")
            try await named.read(until: "the recovered status", timeout: .seconds(60)) {
                $0["status"] as? String == StatusMessage.Kind.recovered
            }
            try await named.read(for: .seconds(1))

            let reconnects = named.statuses(StatusMessage.Kind.upstreamReconnected)
            #expect(reconnects.count == 2, "the drop and the failover: \(reconnects)")
            let first = try #require(int(reconnects.first?["last_event_before_ms"]))
            let last = try #require(int(reconnects.last?["first_event_after_ms"]))
            let recovered = named.statuses(StatusMessage.Kind.recovered)
            #expect(recovered.count == 1, "one fill for both outages: \(recovered)")
            let status = try #require(recovered.first)
            #expect(status["complete"] as? Bool == true, "\(status)")
            #expect(int(status["from"]) == first && int(status["through"]) == last, "the union of both windows: \(status)")
            #expect(Set((status["topics"] as? [String: Any] ?? [:]).keys) == ["T.AAPL", "Q.MSFT", "AM.AAPL"])

            let trades = named.events("T", "AAPL")
            let span = "timestamp.gte=\((int(trades.first?["t"]) ?? 0) * 1_000_000)&order=asc&limit=50000"
            GapFillTests.expectExact(
                trades, truth: try await GapFillTests.truth(cluster.feed, "/v3/trades/AAPL", span, key: ClusterHarness.upstreamKey),
                topic: "T.AAPL", outage: first...last)
            let quotes = named.events("Q", "MSFT")
            let quoteSpan = "timestamp.gte=\((int(quotes.first?["t"]) ?? 0) * 1_000_000)&order=asc&limit=50000"
            GapFillTests.expectExact(
                quotes, truth: try await GapFillTests.truth(cluster.feed, "/v3/quotes/MSFT", quoteSpan, key: ClusterHarness.upstreamKey),
                topic: "Q.MSFT", outage: first...last)
            // Recovered events carry the new leader's positions, as live ones do.
            #expect((trades + quotes).filter { int($0["_r"]) == 1 }.allSatisfy { int($0["_s"]) != nil && int($0["_m"]) != nil })
            #expect(cluster.feed.monitor.snapshot.maxOpenConnections == 1, "two upstream connections existed at once")
            await named.client.close()
        }
    }
}

/// A TCP proxy on loopback to one port (a node's way to NATS), that can cut every connection it carries
/// and refuse new ones for a while (one node loses NATS while the others keep it), or stall: accept
/// connections and forward nothing, in either direction, until restored (a partition that heals, or a
/// server that takes TCP connections and never answers).
final class CuttableProxy: Sendable {
    let port: Int
    private let target: Int
    private let listener: Int32
    private let open = Mutex<[Int32]>([])
    private let refusingUntil = Mutex<ContinuousClock.Instant?>(nil)
    /// While stalled: the clients accepted and not yet connected to the target.
    private let stalled = Mutex<[Int32]?>(nil)

    init(to target: Int) throws {
        self.target = target
        (listener, port) = try listeningSocket()
        Thread.detachNewThread { [self] in acceptLoop() }
    }

    private func acceptLoop() {
        while true {
            let client = accept(listener, nil, nil)
            if client < 0 { return }
            if let until = refusingUntil.withLock({ $0 }), ContinuousClock.now < until {
                Glibc.close(client)
                continue
            }
            let held = stalled.withLock { held -> Bool in
                guard held != nil else { return false }
                held?.append(client)
                return true
            }
            if !held { connect(client) }
        }
    }

    private func connect(_ client: Int32) {
        guard let upstream = try? RawSocket(port: target, timeout: .seconds(3600)) else {
            Glibc.close(client)
            return
        }
        let server = dup(upstream.fd)
        open.withLock { $0 += [client, server] }
        Thread.detachNewThread { [self] in pipe(from: client, to: server) }
        Thread.detachNewThread { [self] in pipe(from: server, to: client) }
    }

    private func pipe(from source: Int32, to destination: Int32) {
        var buffer = [UInt8](repeating: 0, count: 65_536)
        while true {
            let count = buffer.withUnsafeMutableBytes { recv(source, $0.baseAddress, $0.count, 0) }
            if count <= 0 { break }
            while stalled.withLock({ $0 != nil }) { usleep(10_000) }
            let sent = buffer.withUnsafeBytes { Glibc.send(destination, $0.baseAddress, count, Int32(MSG_NOSIGNAL)) }
            if sent <= 0 { break }
        }
        shutdown(source, Int32(SHUT_RDWR))
        shutdown(destination, Int32(SHUT_RDWR))
    }

    /// Cuts every connection now and refuses new ones for `duration`.
    func cut(for duration: Duration) {
        refusingUntil.withLock { $0 = .now + duration }
        let all = open.withLock { current in
            defer { current.removeAll() }
            return current
        }
        for fd in all { shutdown(fd, Int32(SHUT_RDWR)) }
    }

    /// Forwards nothing from now on: new connections are accepted and held, bytes wait.
    func stall() {
        stalled.withLock { if $0 == nil { $0 = [] } }
    }

    /// Ends a stall: held connections reach the target, waiting bytes flow.
    func restore() {
        let held = stalled.withLock { held in
            defer { held = nil }
            return held ?? []
        }
        for client in held { connect(client) }
    }

    func close() { shutdown(listener, Int32(SHUT_RDWR)) }
}

extension ClusterGapFillTests {
    /// One node loses NATS (its proxy cut for 3 s) while the leader and the upstream carry on: that node
    /// alone asks, the leader fills its window, and its client gets exactly what it missed.
    @Test func aNodeThatLostNATSIsFilledByTheLeader() async throws {
        try await ClusterHarness.with(nodes: 0) { cluster in
            let feedREST = "http://127.0.0.1:\(try await cluster.feed.listeningPort())"
            let natsPort = try #require(cluster.natsURL.split(separator: ":").last.flatMap { Int($0) })
            let proxy = try CuttableProxy(to: natsPort)
            defer { proxy.close() }
            try await cluster.startNode("n1", extra: ["--no-portfolio", "--rest-url", feedREST])
            #expect(try await cluster.agreedLeader(among: ["n1"]) == "n1")
            try await cluster.startNode("n2", extra: ["--no-portfolio", "--rest-url", feedREST], nats: "nats://127.0.0.1:\(proxy.port)")
            #expect(try await cluster.agreedLeader() == "n1")
            let named = GapFillTests.Reader(try await subscribedClient(try cluster.url("n2"), "T.AAPL,Q.MSFT"))
            try await named.read(for: .seconds(1))

            proxy.cut(for: .seconds(3))
            try await named.read(until: "the recovered status", timeout: .seconds(60)) { $0["status"] as? String == StatusMessage.Kind.recovered }
            try await named.read(for: .seconds(1))
            let back = try #require(named.statuses(StatusMessage.Kind.upstreamReconnected).first)
            let outage = try #require(int(back["last_event_before_ms"]))...(try #require(int(back["first_event_after_ms"])))
            let status = try #require(named.statuses(StatusMessage.Kind.recovered).first)
            #expect(status["complete"] as? Bool == true, "\(status)")
            let trades = named.events("T", "AAPL")
            let span = "timestamp.gte=\((int(trades.first?["t"]) ?? 0) * 1_000_000)&order=asc&limit=50000"
            GapFillTests.expectExact(
                trades, truth: try await GapFillTests.truth(cluster.feed, "/v3/trades/AAPL", span, key: ClusterHarness.upstreamKey),
                topic: "T.AAPL", outage: outage)
            let quotes = named.events("Q", "MSFT")
            let quoteSpan = "timestamp.gte=\((int(quotes.first?["t"]) ?? 0) * 1_000_000)&order=asc&limit=50000"
            GapFillTests.expectExact(
                quotes, truth: try await GapFillTests.truth(cluster.feed, "/v3/quotes/MSFT", quoteSpan, key: ClusterHarness.upstreamKey),
                topic: "Q.MSFT", outage: outage)
            #expect(cluster.feed.monitor.snapshot.totalConnections == 1, "the upstream was never lost")
            await named.client.close()
        }
    }
}
