import AsyncSupport
import MarketCore
import NIOCore
import Testing

@testable import MarketDataHub

/// The pump between a source's inbox and its hub: a backlog goes to the hub in publishes a subscriber's
/// buffer holds several of, in order.
@Suite("Hub pump: a backlog in publishes of a bounded size")
struct HubPumpTests {
    /// Queues `frames` frames of `size` events each (`Q.S<n>`, numbered from 0) and finishes the inbox.
    static func backlog(frames: Int, size: Int) -> SourceInbox {
        let inbox = SourceInbox.source(capacity: 1_000_000)
        var number = 0
        for _ in 0..<frames {
            var frame: [MarketEvent] = []
            for _ in 0..<size {
                frame.append(event("Q", "S\(number % 50)", number))
                number += 1
            }
            _ = inbox.push(.events(frame))
        }
        return inbox
    }

    /// A flood of control messages (an upstream's error frames, a NATS publisher's) is bounded in the
    /// source's inbox and told as one outage; the node's own seeds are not control messages.
    @Test func aFloodOfControlMessagesIsBoundedAndToldAsOneOutage() async {
        let inbox = SourceInbox.source(capacity: 2)
        for _ in 0..<10_000 { _ = inbox.push(.lost(count: 1, topics: nil, reason: "flood")) }
        #expect(inbox.push(.seed(event("Q", "A"))), "a seed is the node's own asking, past the control bound")
        #expect(!inbox.push(.epoch("e2")), "still past the bound")
        inbox.finish()
        var items: [String] = []
        await inbox.drain { run in
            for item in run {
                switch item {
                case .element(.lost): items.append("lost")
                case .element(.connectionLost(let reason)): items.append(reason)
                case .element(.seed(let seeded)): items.append("seed \(seeded.topic)")
                default: items.append("other")
                }
            }
        }
        let floods = SourceInbox.maxControlMessages
        #expect(items.count == floods + 3, "\(items.count) items")
        #expect(items.prefix(floods).allSatisfy { $0 == "lost" })
        #expect(
            Array(items.suffix(3)) == [
                "\(10_000 - floods) control messages were dropped from the source: they came faster than the relay took them; events may be missing",
                "seed Q.A",
                "1 control message was dropped from the source: they came faster than the relay took them; events may be missing",
            ])
    }

    /// Events weigh their bytes too: a capacity of 200 holds 200 small events, or 11 of 64 KB (17
    /// each), and what is dropped is told by its count of events, not its weight.
    @Test func largeEventsWeighTheirBytesAndLossesAreToldInEvents() async {
        let small = (0..<100).map { event("Q", "S\($0 % 5)", $0) }
        #expect(SourceInbox.weight(of: small) == 100, "a usual event weighs one (100 of them, 2.7 KB)")
        #expect(SourceInbox.weight(of: small + small) == 200, "each event by itself")
        let large = { (n: Int) in MarketEvent(eventType: "Q", ticker: "BIG", bytes: ByteBuffer(repeating: UInt8(ascii: " "), count: 64 << 10)) }
        #expect(SourceInbox.weight(of: [large(0)]) == 17)
        let inbox = SourceInbox.source(capacity: 200)
        let kept = (0..<20).filter { inbox.push(.events([large($0)])) }.count
        #expect(kept == 11, "11 × 17 = 187 of 200; the next would pass it")
        #expect(inbox.push(.events([event("Q", "S", 1)])), "room for a small one still")
        inbox.finish()
        var lost: [(count: Int, topics: Set<Topic>?)] = []
        await inbox.drain { run in
            for case .lost(let dropped, _) in run { lost.append((dropped.count, dropped.topics)) }
        }
        #expect(lost.count == 1 && lost.first?.count == 9 && lost.first?.topics == topics("Q.BIG"), "\(lost)")
        #expect(inbox.queuedWeight == 0, "what was taken is given back whole")
    }

    /// Pushes merge into runs, which the inbox weighs again as they are taken: a run weighs what its
    /// pushes did, so what is queued goes back to nothing, never below (the bound would wear away).
    @Test func aMergedRunWeighsWhatItsPushesDid() async {
        let inbox = SourceInbox.source(capacity: 1_000)
        let threeKB = { (n: Int) in MarketEvent(eventType: "Q", ticker: "S\(n)", bytes: ByteBuffer(repeating: UInt8(ascii: " "), count: 3_000)) }
        for n in 0..<10 { #expect(inbox.push(.events([threeKB(n)]))) }
        #expect(inbox.queuedWeight == 10)
        inbox.finish()
        var runs = 0
        await inbox.drain { run in runs += run.count }
        #expect(runs == 1, "merged into one run")
        #expect(inbox.queuedWeight == 0, "\(inbox.queuedWeight) left queued")
    }

    @Test func aBacklogLargerThanASubscribersBufferGoesToTheHubInTurns() async {
        // 30 frames of 100 events and one of 1,700 (a frame larger than the buffer on its own).
        let inbox = Self.backlog(frames: 30, size: 100)
        var large: [MarketEvent] = []
        for number in 3_000..<4_700 { large.append(event("Q", "S\(number % 50)", number)) }
        _ = inbox.push(.events(large))
        inbox.finish()
        let hub = MarketDataHub(wire: .polygon, history: nil)
        var publishes: [Int] = []
        await HubPump.run(inbox, into: hub, lossReason: "test", published: { publishes.append($0) })
        #expect(publishes.reduce(0, +) == 4_700, "every event published once")
        #expect(publishes.allSatisfy { $0 <= HubPump.publishLimit }, "publishes of \(publishes.max() ?? 0) events: at most \(HubPump.publishLimit)")
        #expect(HubPump.publishLimit * 3 < MarketDataHub.defaultBufferLimit, "a subscriber's buffer holds several publishes")
    }

    @Test func aSubscriberGetsABacklogInOrderWithTheSourcesMessagesWhereTheyCame() async throws {
        let inbox = Self.backlog(frames: 6, size: 100)
        _ = inbox.push(.notice(Notice(.replay, message: "halfway")))
        var rest: [MarketEvent] = []
        for number in 600..<900 { rest.append(event("Q", "S\(number % 50)", number)) }
        _ = inbox.push(.events(rest))
        inbox.finish()
        let hub = MarketDataHub(wire: .polygon, history: nil)
        let subscription = await hub.subscribe(to: topics("Q.*"))
        var publishes: [Int] = []
        await HubPump.run(inbox, into: hub, lossReason: "test", published: { publishes.append($0) })
        let received = try await take(901, from: subscription.events)
        let numbers = received.compactMap { event -> Int? in
            guard event.eventType == "Q", let text = event.bytes.getString(at: event.bytes.readerIndex, length: event.bytes.readableBytes),
                let field = text.split(separator: ":").last?.dropLast()
            else { return nil }
            return Int(field)
        }
        #expect(numbers == Array(0..<900), "every event, once, in order")
        let notice = received.firstIndex { $0.eventType != "Q" }
        #expect(notice == 600, "the source's notice between the events it came between")
        #expect(publishes.allSatisfy { $0 <= HubPump.publishLimit })
    }
}
