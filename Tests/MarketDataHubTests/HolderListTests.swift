import Testing

@testable import MarketDataHub

@Suite("HolderList")
struct HolderListTests {
    final class Holder {
        let n: Int
        init(_ n: Int) { self.n = n }
    }

    /// A fixed shuffle, so a failure repeats.
    struct Steps: RandomNumberGenerator {
        var state: UInt64
        mutating func next() -> UInt64 {
            state = state &* 6_364_136_223_846_793_005 &+ 1_442_695_040_888_963_407
            return state >> 11
        }
    }

    @Test func holdersTakenOutInAnyOrderLeaveExactlyTheOthersAcrossTheTablesThreshold() {
        let holders = (0..<200).map(Holder.init)
        var list = HolderList<Holder>()
        for (index, holder) in holders.enumerated() {
            list.append(holder)
            #expect(list.isIndexed == (index + 1 > HolderList<Holder>.placesFrom), "after \(index + 1) holders")
        }
        var steps = Steps(state: 7)
        var left = holders
        left.shuffle(using: &steps)
        var kept = Set(holders.map(\.n))
        while let holder = left.popLast() {
            let removed = list.remove(holder)
            #expect(removed)
            kept.remove(holder.n)
            #expect(Set(list.map(\.n)) == kept, "after taking out \(holder.n)")
            #expect(list.count == kept.count)
            // Taking out one that is not there changes nothing.
            let again = list.remove(holder)
            #expect(!again)
        }
        #expect(list.isEmpty && !list.isIndexed)
    }

    @Test func theTableIsDroppedOnlyWellBelowItsThresholdAndBuiltAgainAbove() {
        let threshold = HolderList<Holder>.placesFrom
        var list = HolderList((0...threshold).map(Holder.init))
        #expect(list.isIndexed)
        let members = list.members
        // Going up and down by one around the threshold keeps the table.
        let removed = list.remove(members[0])
        #expect(removed && list.isIndexed)
        list.append(members[0])
        #expect(list.isIndexed)
        for member in members.prefix(threshold / 2 + 2) { list.remove(member) }
        #expect(!list.isIndexed, "\(list.count) holders")
        #expect(Set(list.map(\.n)) == Set(members.dropFirst(threshold / 2 + 2).map(\.n)))
        // Built again, right, when it grows past the threshold once more.
        for member in members.prefix(threshold / 2 + 2) { list.append(member) }
        #expect(list.isIndexed)
        for member in members {
            let removed = list.remove(member)
            #expect(removed, "\(member.n)")
        }
        #expect(list.isEmpty)
    }
}

@Suite("MarketDataHub holders")
struct HubHoldersTests {
    @Test func manyHoldersOfOneTopicLeavingInAnyOrderLeaveTheRestReceivingOnce() async throws {
        let hub = MarketDataHub(wire: .polygon, history: nil)
        var subscriptions: [HubSubscription] = []
        for _ in 0..<300 { subscriptions.append(await hub.subscribe(to: topics("Q.A", "Q.*", "T.Z"))) }
        // A third leave, a third drop the topic and its wildcard (keeping T.Z), in a mixed order.
        var steps = HolderListTests.Steps(state: 11)
        let order = Array(subscriptions.indices).shuffled(using: &steps)
        let leaving = Set(order.prefix(100))
        let dropping = Set(order.dropFirst(100).prefix(100))
        for index in order.prefix(200) {
            if leaving.contains(index) {
                await hub.remove(subscriptions[index].id)
            } else {
                await hub.remove(topics("Q.A", "Q.*"), from: subscriptions[index].id)
            }
        }
        #expect(await hub.subscriberCount == 200)
        await hub.publish([event("Q", "A", 1), event("T", "Z", 2)])
        for (index, subscription) in subscriptions.enumerated() where !leaving.contains(index) {
            let expected = dropping.contains(index) ? ["T.Z"] : ["Q.A", "T.Z"]
            let got = try await take(expected.count, from: subscription.events)
            #expect(got.map(\.topic.description) == expected, "subscriber \(index)")
        }
        for index in leaving {
            var events = subscriptions[index].events.makeAsyncIterator()
            let next = await events.next()
            #expect(next == nil, "subscriber \(index) left: its stream ends")
        }
        // The last holders going leave nothing wanted.
        for (index, subscription) in subscriptions.enumerated() where !leaving.contains(index) { await hub.remove(subscription.id) }
        #expect(await hub.wantedTopics == [])
        #expect(await hub.subscriberCount == 0)
    }
}
