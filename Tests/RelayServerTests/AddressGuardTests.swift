import PolygonWire
import Testing

@testable import RelayServer

@Suite("Address guard: per-address tallies and failed authentication")
struct AddressGuardTests {
    @Test func anIPv6Slash64CountsAsOneAddress() {
        #expect(AddressGuard.key(for: "2001:db8:1:2::1") == AddressGuard.key(for: "2001:db8:1:2:ffff:ffff:ffff:ffff"))
        #expect(AddressGuard.key(for: "2001:db8:1:2::1") != AddressGuard.key(for: "2001:db8:1:3::1"))
        #expect(AddressGuard.key(for: "::ffff:10.1.2.3") == "10.1.2.3")
        #expect(AddressGuard.key(for: "192.0.2.7") == "192.0.2.7")
        let guardian = AddressGuard(limits: .init(perAddress: 2), openFileLimit: 10_000)
        #expect(guardian.admit("2001:db8:1:2::1") == nil)
        #expect(guardian.admit("2001:db8:1:2::99") == nil)
        #expect(guardian.admit("2001:db8:1:2::abcd") == .perAddress(2), "a third address of the same /64")
        #expect(guardian.admit("2001:db8:1:3::1") == nil)
    }

    @Test func failuresDelayTheNextAnswerDoublingUpToTheCapAndAreForgotten() {
        let limits = RelayServerConfiguration.ConnectionLimits(
            failureWindow: .seconds(60), failureDelay: .milliseconds(500), maxFailureDelay: .seconds(4))
        let guardian = AddressGuard(limits: limits, openFileLimit: 10_000)
        let start = ContinuousClock.now
        let delays = (0..<7).map { guardian.failedAuthentication(from: "198.51.100.1", at: start + .seconds($0)) }
        #expect(delays == [.zero, .milliseconds(500), .seconds(1), .seconds(2), .seconds(4), .seconds(4), .seconds(4)])
        // Another address is not slowed by this one.
        #expect(guardian.failedAuthentication(from: "198.51.100.2", at: start + .seconds(7)) == .zero)
        // A window later the first starts over, and the table is swept of what expired.
        #expect(guardian.failedAuthentication(from: "198.51.100.3", at: start + .seconds(200)) == .zero)
        #expect(guardian.failureRecords == 1)
        #expect(guardian.failedAuthentication(from: "198.51.100.1", at: start + .seconds(201)) == .zero)
    }

    @Test func anAddressWithTenFailuresWaitingForAnswersIsGuessing() {
        let guardian = AddressGuard(limits: .init(), openFileLimit: 10_000)
        #expect(guardian.failedAuthentication(from: "203.0.113.5") == .zero, "the first is answered at once, not held")
        for _ in 0..<9 { _ = guardian.failedAuthentication(from: "203.0.113.5") }
        #expect(!guardian.isGuessing("203.0.113.5"))
        _ = guardian.failedAuthentication(from: "203.0.113.5")
        #expect(guardian.isGuessing("203.0.113.5"), "ten delayed answers in flight")
        #expect(guardian.failedUnlessGuessing(from: "203.0.113.5") == nil, "guessing: refused, and not counted")
        #expect(guardian.failedUnlessGuessing(from: "203.0.113.6") == .zero)
        #expect(!guardian.isGuessing("203.0.113.6"), "another address is not concerned")
        guardian.failureAnswered(from: "203.0.113.5")
        #expect(!guardian.isGuessing("203.0.113.5"))
    }

    @Test func acceptedConnectionsArePendingUntilSettledAndTheBudgetHolds() throws {
        let guardian = AddressGuard(limits: .init(pendingPerAddress: 2, descriptorReserve: 10), openFileLimit: 14)
        #expect(guardian.descriptorBudget == 4 && guardian.pendingBudget == 2)
        let (a, _) = guardian.accept("192.0.2.1")
        let (b, _) = guardian.accept("192.0.2.1")
        #expect(guardian.accept("192.0.2.1").1 == .pending(2))
        guardian.settle(try #require(a))
        let c = try #require(guardian.accept("192.0.2.1").0)
        guardian.settle(c)
        #expect(guardian.accept("192.0.2.9").0 != nil)
        #expect(guardian.accept("192.0.2.8").1 == .descriptors(4), "four open: the budget is spent")
        guardian.closed(try #require(b))
        #expect(guardian.accepted(from: "192.0.2.1") == (open: 2, pending: 0))
        #expect(guardian.accept("192.0.2.8").0 != nil)
    }

    @Test func pendingConnectionsOfEveryAddressTogetherAreCapped() throws {
        var limits = RelayServerConfiguration.ConnectionLimits(pendingPerAddress: 2, descriptorReserve: 0)
        limits.pending = 3
        let guardian = AddressGuard(limits: limits, openFileLimit: 100)
        let first = try ["192.0.2.1", "192.0.2.2", "192.0.2.3"].map { try #require(guardian.accept($0).0) }
        #expect(guardian.accept("192.0.2.4").1 == .pendingInAll(3), "a fourth address finds no pending place")
        guardian.settle(first[0])
        let fourth = try #require(guardian.accept("192.0.2.4").0, "a settled connection frees a place")
        #expect(guardian.pendingInAll == 3)
        guardian.closed(first[1])
        #expect(guardian.pendingInAll == 2, "a pending connection that closes frees its place")
        guardian.closed(first[0])
        #expect(guardian.pendingInAll == 2, "a settled one that closes held none")
        guardian.settle(fourth)
        guardian.settle(fourth)
        #expect(guardian.pendingInAll == 1, "settled once")
        #expect(guardian.accept("192.0.2.5").0 != nil && guardian.accept("192.0.2.6").0 != nil)
        // At most half the descriptors, whatever the setting says.
        #expect(AddressGuard(limits: .init(descriptorReserve: 24), openFileLimit: 1_024).pendingBudget == 500)
        #expect(AddressGuard(limits: .init(descriptorReserve: 24), openFileLimit: 1 << 20).pendingBudget == 10_000)
    }

    @Test func httpConnectionsAreCappedPerAddressAndInAllAtAQuarterOfTheBudgetAndFreedAtClose() throws {
        var limits = RelayServerConfiguration.ConnectionLimits(descriptorReserve: 0)
        (limits.httpConnections, limits.httpConnectionsPerAddress) = (4, 3)
        let guardian = AddressGuard(limits: limits, openFileLimit: 10_000)
        #expect(guardian.httpPerAddress == 2, "one address holds at most half of them")
        let addresses = ["192.0.2.1", "192.0.2.1", "192.0.2.1", "192.0.2.2", "192.0.2.3", "192.0.2.4"]
        let tickets = try addresses.map { try #require(guardian.accept($0).0) }
        #expect(guardian.serveHTTP(tickets[0]) == nil && guardian.serveHTTP(tickets[1]) == nil)
        #expect(guardian.serveHTTP(tickets[2]) == .perAddress(2), "a third of one address")
        #expect(guardian.serveHTTP(tickets[3]) == nil && guardian.serveHTTP(tickets[4]) == nil)
        #expect(guardian.serveHTTP(tickets[5]) == .total(4), "a fifth in all")
        #expect(guardian.serveHTTP(tickets[3]) == nil && guardian.httpConnections(of: "192.0.2.2") == (1, 4), "counted once")
        // A refused connection was never counted; a served one is freed when it closes.
        guardian.closed(tickets[2])
        #expect(guardian.httpConnections(of: "192.0.2.1") == (2, 4))
        guardian.closed(tickets[0])
        #expect(guardian.httpConnections(of: "192.0.2.1") == (1, 3))
        #expect(guardian.serveHTTP(tickets[5]) == nil)
        // However many the setting allows, HTTP takes at most a quarter of the descriptor budget.
        limits.httpConnections = 1_000
        #expect(AddressGuard(limits: limits, openFileLimit: 40).httpBudget == 10)
        #expect(AddressGuard(limits: limits, openFileLimit: 2).httpBudget == 1)
    }
}

@Suite("Topic ledger: distinct topics per key and in all")
struct TopicLedgerTests {
    func topics(_ names: String...) -> [Topic] { names.compactMap { Topic(parsing: $0) } }

    @Test func aKeysTopicsAndAllTopicsAreCappedAndFreedByReference() {
        let ledger = TopicLedger(perKey: 3, total: 4)
        #expect(ledger.reserve(topics("Q.A", "Q.B", "Q.C"), for: "one").refused.isEmpty)
        // The same topic held by another connection of the key costs no new place.
        #expect(ledger.reserve(topics("Q.A"), for: "one").refused.isEmpty)
        let overKey = ledger.reserve(topics("Q.D"), for: "one")
        #expect(overKey.refused == topics("Q.D") && overKey.reason?.contains("key \"one\"") == true)
        // Another key shares the relay's four: Q.A is already counted in all, Q.E is the fourth, Q.F one too many.
        let overAll = ledger.reserve(topics("Q.A", "Q.E", "Q.F"), for: "two")
        #expect(overAll.refused == topics("Q.F") && overAll.reason?.contains("at most 4 distinct topics") == true)
        // Q.A is freed for "one" only when both of its connections gave it up.
        ledger.release(topics("Q.A"), for: "one")
        #expect(ledger.counts(key: "one") == (all: 4, key: 3))
        ledger.release(topics("Q.A", "Q.B"), for: "one")
        #expect(ledger.counts(key: "one") == (all: 3, key: 1), "Q.A is still held by key two; Q.B is gone")
        #expect(ledger.reserve(topics("Q.F"), for: "two").refused.isEmpty)
    }
}

@Suite("Topic ledger: subscriptions per key and in all")
struct SubscriptionLedgerTests {
    func topics(_ names: String...) -> [Topic] { names.compactMap { Topic(parsing: $0) } }

    /// The same topics on many connections cost no distinct place but a subscription each: capped per
    /// key and in all. A hold that moves (a session shelved, a session taken back subscribing its
    /// topics again) is never refused, and the count comes back to what it was.
    @Test func subscriptionsAreCappedPerKeyAndInAllAndAHoldThatMovesIsNeverRefused() {
        let ledger = TopicLedger(perKey: 100, total: 100, subscriptionsPerKey: 4, subscriptions: 6)
        #expect(ledger.reserve(topics("Q.A", "Q.B"), for: "one").refused.isEmpty)
        #expect(ledger.reserve(topics("Q.A", "Q.B"), for: "one").refused.isEmpty, "a second connection of the same topics")
        let overKey = ledger.reserve(topics("Q.A"), for: "one")
        #expect(overKey.refused == topics("Q.A") && overKey.reason?.contains("at most 4 subscriptions") == true, "\(overKey)")
        #expect(ledger.subscriptionCounts(key: "one") == (all: 4, key: 4))
        #expect(ledger.reserve(topics("Q.A", "Q.C"), for: "two").refused.isEmpty)
        let overAll = ledger.reserve(topics("Q.D"), for: "two")
        #expect(overAll.refused == topics("Q.D") && overAll.reason?.contains("at most 6 subscriptions of this market") == true, "\(overAll)")
        // A connection of key one closes and its session is shelved: the shelf takes its holds over
        // (unchecked), then the connection gives its own back.
        #expect(ledger.reserve(topics("Q.A", "Q.B"), for: "one", checked: false).refused.isEmpty)
        ledger.release(topics("Q.A", "Q.B"), for: "one")
        #expect(ledger.subscriptionCounts(key: "one") == (all: 6, key: 4))
        // Taken back: its connection subscribes the session's topics again before the shelf lets them go.
        #expect(ledger.reserve(topics("Q.A", "Q.B"), for: "one", transferring: Set(topics("Q.A", "Q.B"))).refused.isEmpty)
        #expect(ledger.reserve(topics("Q.C"), for: "one", transferring: Set(topics("Q.A", "Q.B"))).refused == topics("Q.C"), "only the session's own")
        ledger.release(topics("Q.A", "Q.B"), for: "one")
        #expect(ledger.subscriptionCounts(key: "one") == (all: 6, key: 4))
        for key in ["one", "one", "two"] { ledger.release(topics("Q.A", "Q.B", "Q.C"), for: key) }
        #expect(ledger.subscriptionCounts(key: "one") == (all: 0, key: 0))
        #expect(ledger.counts(key: "one") == (all: 0, key: 0))
    }
}

@Suite("Topic ledger: Polygon's options cap")
struct TickerCapTests {
    func topics(_ names: String...) -> [Topic] { names.compactMap { Topic(parsing: $0) } }

    func optionsLedger(cap: Int) -> TopicLedger {
        TopicLedger(perKey: 100, total: 100, cap: .init(eventTypes: Market.options.cappedEventTypes, tickers: cap, market: .options, vendor: "Polygon"))
    }

    @Test func contractsPastTheCapAreRefusedAndTheEarliestKeepTheirPlace() {
        let ledger = optionsLedger(cap: 2)
        #expect(ledger.reserve(topics("Q.O:A1", "FMV.O:A1", "Q.O:B1"), for: "one").refused.isEmpty, "A1 counts once for Q and FMV")
        let over = ledger.reserve(topics("Q.O:C1", "T.O:C1"), for: "two")
        #expect(over.refused == topics("Q.O:C1"), "trades are not capped")
        #expect(over.reason?.contains("at most 2 distinct tickers") == true, "\(over.reason ?? "")")
        #expect(over.reason?.contains("options") == true)
        // The first contracts keep their place; C1 gets one once A1 is given up by every topic.
        ledger.release(topics("Q.O:A1"), for: "one")
        #expect(!ledger.reserve(topics("Q.O:C1"), for: "two").refused.isEmpty, "FMV.O:A1 still holds A1")
        ledger.release(topics("FMV.O:A1"), for: "one")
        #expect(ledger.reserve(topics("Q.O:C1"), for: "two").refused.isEmpty)
    }

    @Test func aWildcardOfACappedTypeIsRefused() {
        let ledger = optionsLedger(cap: 1_000)
        #expect(ledger.reserve(topics("Q.*"), for: "one").refused == topics("Q.*"))
        #expect(ledger.reserve(topics("T.*"), for: "one").refused.isEmpty)
    }
}

@Suite("Client keys: markets and per-market patterns")
struct ClientKeyMarketTests {
    @Test func aKeyNamesItsMarketsAndPatternsPerMarket() throws {
        let key = try ClientKey(name: "k", secret: "s", topics: ["crypto:XQ.*", "forex:C.EUR/USD", "Q.AAPL"], markets: ["stocks", "crypto", "forex"])
        let entitlement = key.entitlement
        #expect(entitlement.allows(market: .crypto) && !entitlement.allows(market: .options))
        #expect(entitlement.allows(Topic(parsing: "XQ.X:BTC-USD")!, in: .crypto))
        #expect(!entitlement.allows(Topic(parsing: "XT.X:BTC-USD")!, in: .crypto))
        #expect(
            entitlement.inForm(of: .forex, Market.forex.normalized).allows(Topic(parsing: "C.C:EUR-USD")!, in: .forex),
            "a protocol writes the key's patterns in its market's form")
        #expect(entitlement.allows(Topic(parsing: "C.EUR/USD")!, in: .forex), "the key keeps them as written")
        #expect(entitlement.allows(Topic(parsing: "Q.AAPL")!, in: .stocks))
        #expect(!entitlement.allows(Topic(parsing: "Q.MSFT")!, in: .stocks))
        #expect(!entitlement.allows(Topic(parsing: "Q.AAPL")!, in: .options), "a market the key may not use")
    }

    @Test func anUnknownMarketIsAnErrorNamingIt() {
        #expect(throws: ClientKey.Invalid.self) { try ClientKey(name: "k", secret: "s", markets: ["bonds"]) }
        // A ticker's own prefix is not a market: `X:` stays part of the topic.
        #expect(throws: Never.self) { try ClientKey(name: "k", secret: "s", topics: ["XT.X:BTC-USD"]) }
    }
}
