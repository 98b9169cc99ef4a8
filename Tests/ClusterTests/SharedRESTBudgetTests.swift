import Foundation
import Logging
import MarketCore
import MarketREST
import RelayBench
import RelayTestSupport
import Testing

@testable import Cluster

/// The account's REST budget shared by several nodes through a real nats-server's key-value store.
@Suite(
    "REST budget shared by a cluster's nodes", .serialized, .timeLimit(.minutes(2)),
    .enabled(
        if: NATSServerProcess.binary != nil || ProcessInfo.processInfo.environment["RELAY_REQUIRE_NATS"] == "1",
        "nats-server is not installed (scripts/test installs it)"))
struct SharedRESTBudgetTests {
    func nodes(
        _ count: Int, rate: RESTRate, maxWait: Duration, url: String, requestTimeout: Duration = .seconds(1)
    ) async throws -> [SharedRESTBudget] {
        let cluster = "b\(UInt32.random(in: 0...UInt32.max))"
        var nodes: [SharedRESTBudget] = []
        for index in 0..<count {
            let budget = SharedRESTBudget(
                rate: rate, maxWait: maxWait, cluster: ClusterConfiguration(servers: [url], name: cluster, nodeID: "node-\(index)"),
                requestTimeout: requestTimeout, logger: Logger(label: "budget-test"))
            #expect(await budget.reachable(within: .seconds(10)), "node \(index) reached the shared bucket")
            nodes.append(budget)
        }
        return nodes
    }

    /// One node of 100 requests a second on a nats-server that is then stopped (`SIGSTOP`): `body` runs
    /// while NATS stalls; the server goes on and is stopped after, whatever `body` did.
    func withStalledNode(requestTimeout: Duration = .seconds(1), _ body: (SharedRESTBudget) async throws -> Void) async throws {
        let nats = try NATSServerProcess()
        let url = try await nats.start()
        let node = try await nodes(
            1, rate: RESTRate(requests: 100, per: .seconds(1)), maxWait: .seconds(20), url: url, requestTimeout: requestTimeout)[0]
        kill(nats.process.processIdentifier, SIGSTOP)
        var failure: (any Error)?
        do {
            // Stopped before any request is made: a call the server answered as the signal reached it
            // would end and pass its turn on.
            try await eventually("nats-server's every thread stopped", timeout: .seconds(5)) { Self.isStopped(nats.process.processIdentifier) }
            try await body(node)
        } catch { failure = error }
        kill(nats.process.processIdentifier, SIGCONT)
        await node.close()
        await nats.stop()
        if let failure { throw failure }
    }

    /// Whether every thread of process `pid` is stopped (`T` in `/proc/PID/task/TID/stat`).
    static func isStopped(_ pid: Int32) -> Bool {
        let tasks = (try? FileManager.default.contentsOfDirectory(atPath: "/proc/\(pid)/task")) ?? []
        return !tasks.isEmpty && tasks.allSatisfy { task in
            guard let stat = try? String(contentsOfFile: "/proc/\(pid)/task/\(task)/stat", encoding: .utf8),
                let close = stat.lastIndex(of: ")")
            else { return false }
            // The state follows the command's name in parentheses: "PID (NAME) S …".
            return stat[stat.index(after: close)...].dropFirst().first == "T"
        }
    }

    /// `count` foreground requests of `node` at once, bounded by its wait: their admissions.
    func takes(_ count: Int, of node: SharedRESTBudget) async -> [RESTBudget.Admission] {
        await withTaskGroup(of: RESTBudget.Admission.self) { group in
            for _ in 0..<count { group.addTask { await node.take(.foreground, bounded: true) } }
            return await group.reduce(into: []) { $0.append($1) }
        }
    }

    @Test func threeNodesTogetherSpendTheAccountsBudgetOnce() async throws {
        let nats = try NATSServerProcess()
        let url = try await nats.start()
        let nodes = try await nodes(3, rate: RESTRate(requests: 5, per: .seconds(60)), maxWait: .milliseconds(300), url: url)
        // Each node alone would grant 5 at once; together they may only grant the account's 5.
        let admissions = await withTaskGroup(of: RESTBudget.Admission.self) { group in
            for node in nodes {
                for _ in 0..<10 { group.addTask { await node.take(.foreground, bounded: true) } }
            }
            return await group.reduce(into: []) { $0.append($1) }
        }
        #expect(admissions.filter { $0 == .granted }.count == 5, "\(admissions)")
        let refused = admissions.compactMap { admission -> Duration? in
            if case .refused(let after) = admission { return after }
            return nil
        }
        #expect(refused.count == 25)
        #expect(refused.allSatisfy { $0 >= .seconds(1) }, "each refusal says when a token is free again")
        // Six of each node's ten waited for one of its four calls, and every turn was given back.
        for node in nodes { #expect(node.gate.counts == CallGate.Counts(inFlight: 0, waiting: 0)) }
        for node in nodes { await node.close() }
        await nats.stop()
    }

    /// While NATS stalls, a node does not queue a call to the shared bucket per request (each would hold
    /// a thread of the NATS pool for the request timeout): after one failed, the next second's requests
    /// count on the node's own bucket at once.
    @Test func whileNATSStallsRequestsCountOnTheirOwnAfterOneCallFailed() async throws {
        try await withStalledNode { node in
            // The first waits for NATS (up to the request timeout), fails, and counts on the node.
            #expect(await node.take(.foreground, bounded: true) == .granted)
            let asked = node.gate.started
            let started = ContinuousClock.now
            let admissions = await takes(40, of: node)
            let took = ContinuousClock.now - started
            #expect(admissions.allSatisfy { $0 == .granted }, "\(admissions)")
            // Each would otherwise ask the stalled NATS in its turn. One may ask it again, had a second
            // passed since the failure (a slow machine): the others count on their own meanwhile.
            #expect(node.gate.started - asked <= 1, "\(node.gate.started - asked) of 40 requests asked NATS (in \(took))")
        }
    }

    /// While NATS stalls before any call failed, a node's requests do not fill the NATS pool (other
    /// callers' lookups and seeding reads wait there): four calls ask at once, 64 requests wait their
    /// turn, the rest try again shortly; once the first call fails, all count on their own.
    @Test func whileNATSStallsAtMostFourCallsHoldTheNATSPool() async throws {
        // A request timeout of 8 s: the four calls hold their turns that long, whatever the machine's pace.
        try await withStalledNode(requestTimeout: .seconds(8)) { node in
            let started = ContinuousClock.now
            let requests = Task { await takes(100, of: node) }
            // Four ask NATS, 64 wait their turn (the other 32 come back every 100 ms).
            let full = CallGate.Counts(inFlight: SharedRESTBudget.maxCallsInFlight, waiting: SharedRESTBudget.maxCallsWaiting)
            try await eventually("four calls in flight and 64 waiting", timeout: .seconds(5)) { node.gate.counts == full }
            // Another caller of the NATS pool is not queued behind them: it ends while they still wait
            // for NATS (the first of them ends only at the request timeout, and the line with it).
            await NATSConnection.blocking {}
            #expect(node.gate.counts == full, "a call on the NATS pool waited behind the budget's")
            // The status page does not wait behind them either, nor asks NATS itself.
            _ = await node.snapshot()
            #expect(node.gate.counts == full, "the snapshot waited behind the requests")
            #expect(node.gate.started == SharedRESTBudget.maxCallsInFlight)
            let admissions = await requests.value
            #expect(admissions.allSatisfy { $0 == .granted }, "\(admissions)")
            // The first failure (at the request timeout) lets every waiter go: none asks NATS in its turn
            // (one may ask again, had a second passed since the failure).
            let took = ContinuousClock.now - started
            #expect(node.gate.started <= SharedRESTBudget.maxCallsInFlight + 1, "\(node.gate.started) calls asked NATS (in \(took))")
            #expect(node.gate.counts == CallGate.Counts(inFlight: 0, waiting: 0))
        }
    }

    /// Anyone who may publish on the cluster's NATS can write the bucket: a value past what the relay
    /// writes is read within bounds (and written back so), so it neither crashes a node nor stops the
    /// nodes' REST calls for good.
    @Test func aBucketValueOutOfBoundsIsReadWithinThem() async throws {
        let nats = try NATSServerProcess()
        let url = try await nats.start()
        let cluster = "b\(UInt32.random(in: 0...UInt32.max))"
        let node = SharedRESTBudget(
            rate: RESTRate(requests: 100, per: .seconds(1)), maxWait: .seconds(5),
            cluster: ClusterConfiguration(servers: [url], name: cluster, nodeID: "node-0"), logger: Logger(label: "budget-test"))
        #expect(await node.reachable(within: .seconds(10)))
        let writer = try await connectedNATS(url, name: "budget-writer")
        let bucket = try await writer.keyValue(bucket: "\(cluster)-rest-budget", ttl: .seconds(60))
        func overwrite(_ text: String) async throws {
            if let entry = try await bucket.get("account") {
                _ = try await bucket.update("account", text, last: entry.revision)
            } else {
                _ = try await bucket.create("account", text)
            }
        }
        // A count far below anything, from the start of time: no overflow, a full bucket.
        try await overwrite("-1e300,\(Int64.min),0")
        let started = ContinuousClock.now
        #expect(await node.take(.foreground, bounded: true) == .granted)
        #expect(ContinuousClock.now - started < .seconds(2))
        // No tokens, counted at the end of time: written back counted at most a clock's allowance
        // ahead (from there it refills), not never.
        try await overwrite("0,\(Int64.max),0")
        await node.pause(for: .milliseconds(100))
        let written = try #require(try await bucket.get("account")).text
        let updated = try #require(Int64(String(written.split(separator: ",")[1])), "\(written)")
        #expect(updated <= WallClock.nowMilliseconds() + SharedRESTBudget.maxClockAhead.milliseconds, "\(written)")
        // Paused until the end of time: refused for the relay's longest pause, two minutes, at most.
        try await overwrite("1,0,\(Int64.max)")
        let paused = await node.take(.foreground, bounded: true)
        guard case .refused(let after) = paused else {
            Issue.record("not refused while paused: \(paused)")
            return
        }
        #expect(after <= SharedRESTBudget.maxPause + SharedRESTBudget.pauseSlack && after > .seconds(100), "\(after)")
        await writer.close()
        await node.close()
        await nats.stop()
    }

    @Test func aVendors429PausesEveryNode() async throws {
        let nats = try NATSServerProcess()
        let url = try await nats.start()
        let nodes = try await nodes(2, rate: RESTRate(requests: 100, per: .seconds(1)), maxWait: .milliseconds(200), url: url)
        #expect(await nodes[1].take(.foreground, bounded: true) == .granted)
        await nodes[0].pause(for: .seconds(30))
        let other = await nodes[1].take(.foreground, bounded: true)
        guard case .refused(let after) = other else {
            Issue.record("the other node was not paused: \(other)")
            return
        }
        #expect(after > .seconds(20), "refused until the vendor's Retry-After has passed: \(after)")
        #expect(await nodes[1].snapshot().pausedUntil != nil)
        for node in nodes { await node.close() }
        await nats.stop()
    }
}
