import Dispatch
import Foundation
import MarketDataHub
import MarketCore
import NIOCore
import NIOPosix
import PolygonWire
import RelayServer
import Synchronization
import Testing

/// Holds every event loop of a group until released: a loop that does not run for a while, as one
/// that is busy or descheduled on a saturated machine. Releasing twice is harmless.
final class EventLoopStall: Sendable {
    private let gate = DispatchSemaphore(value: 0)
    private let loops: Int
    private let entered = Atomic<Int>(0)
    private let released = Atomic<Bool>(false)

    init(_ group: any EventLoopGroup) {
        let all = Array(group.makeIterator())
        loops = all.count
        for loop in all {
            loop.execute {
                self.entered.wrappingAdd(1, ordering: .relaxed)
                self.gate.wait()
            }
        }
    }

    /// Every loop is held.
    var holding: Bool { entered.load(ordering: .relaxed) == loops }

    func release() {
        guard !released.exchange(true, ordering: .relaxed) else { return }
        for _ in 0..<loops { gate.signal() }
    }
}

/// The server runs on an event loop group of its own, which the test holds still; the clients and
/// everything else in the process keep theirs.
@Suite("A stalled event loop", .serialized)
struct StalledLoopTests {
    /// `count` quotes of about 100 bytes each, numbered from `first`.
    static func quotes(_ count: Int, from first: Int) -> [MarketEvent] {
        (first..<first + count).map { n in
            MarketEvent(
                eventType: "Q", ticker: "S\(n % 50)",
                bytes: ByteBuffer(string: #"{"ev":"Q","sym":"S\#(n % 50)","bp":100.01,"bs":2,"ap":100.03,"as":3,"t":1700000000\#(n % 1000),"q":\#(n)}"#))
        }
    }

    /// The drains run on the pool and hand each turn's frames to the connection's event loop. A loop
    /// that does not run for a while does not update its channels' writability, so the frames handed
    /// to it and not yet written count against the connection's outbound limit: past it the drain
    /// stops taking, and the client's events wait in its own bounded hub buffer, where the
    /// slow-consumer policy applies (counted, told), instead of piling up in the loop's task queue.
    @Test func framesHandedToALoopThatDoesNotRunAreBoundByTheOutboundLimit() async throws {
        let hub = MarketDataHub(wire: .polygon, history: nil)
        var configuration = RelayServerConfiguration(
            host: "127.0.0.1", port: 0, authentication: try ClientAuthentication.resolve(keys: ["client-key"], listenHost: "127.0.0.1"))
        configuration.connectionLimits.outboundBytes = 32_768
        let group = MultiThreadedEventLoopGroup(numberOfThreads: 2)
        configuration.eventLoopGroup = group
        let server = RelayServer(configuration: configuration, markets: [ServedMarket(market: .stocks, hub: hub, feed: TestFeed())], logger: testLogger)
        // The group is shut down however the test ends (its loops released first, by the stall's defer).
        do { try await run(server, hub, on: group) } catch {
            try? await group.shutdownGracefully()
            throw error
        }
        try await group.shutdownGracefully()
    }

    /// The test's steps, with `group` the server's loops.
    private func run(_ server: RelayServer, _ hub: MarketDataHub, on group: MultiThreadedEventLoopGroup) async throws {
        try await withServices([server]) {
            let port = try await server.listeningPort()
            let client = try await WSTestClient.authenticated(url: "ws://127.0.0.1:\(port)/stocks")
            client.send(ClientAction(.subscribe, params: "Q.*"))
            _ = try await client.nextParsed()
            // The subscription reaches the hub after its answer: a quote at a time until one arrives.
            var served = false
            for attempt in 0..<100 where !served {
                await hub.publish(Self.quotes(1, from: attempt))
                served = (try? await client.nextEvents(1, timeout: .milliseconds(100))) != nil
            }
            try #require(served, "served before the loops stand still")

            let stall = EventLoopStall(group)
            defer { stall.release() }
            try await eventually("every event loop to be held") { stall.holding }
            // A publish at a time, each taken by the drain before the next (its hub buffer empty again),
            // until the drain stops taking: 5,000 events (about 500 KB) is far past the 32 KiB limit.
            var published = 0
            var stopped = false
            while published < 5_000 {
                await hub.publish(Self.quotes(100, from: 1 + published))
                published += 100
                let taken = (try? await eventually("the drain to take the publish", timeout: .seconds(2)) { await hub.bufferStatistics.maxFill == 0 }) != nil
                if !taken {
                    stopped = true
                    break
                }
            }
            #expect(stopped, "the drain kept handing frames to a loop that did not run: \(published) events")
            #expect(published <= 1_000, "it stopped near the limit (32 KiB and a turn), after \(published) events")
            // What follows waits in the client's own buffer of 1,000 events, and past it is dropped and counted.
            await hub.publish(Self.quotes(1_100, from: 1 + published))
            #expect(await hub.bufferStatistics.lagging == 1, "the client is behind, as a slow one")
            stall.release()
            // The loop runs again: the client is told what it lost (with the events published after its
            // buffer has room again), and is served on.
            let publisher = Task {
                var next = 1_000_000
                while !Task.isCancelled {
                    await hub.publish(Self.quotes(5, from: next))
                    next += 5
                    try? await Task.sleep(for: .milliseconds(50))
                }
            }
            defer { publisher.cancel() }
            let notice = try await client.waitForStatus(StatusMessage.Kind.lagging, timeout: .seconds(30))
            #expect(((notice.fields["dropped"] as? NSNumber)?.intValue ?? 0) > 0)
            #expect(try await client.nextEvents(5).count >= 5)
            await client.close()
        }
    }
}
