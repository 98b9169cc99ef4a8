import Cluster
import MarketCore
import NIOCore
import AlpacaWire
import PolygonWire
import Testing

@Suite struct InterestPartsTests {
    func topics(_ count: Int) -> [Topic] { (0..<count).map { Topic(eventType: "Q", ticker: "TICKER\($0)")! } }

    @Test func aSetPastNATSsPayloadLimitTravelsInPartsFarBelowIt() {
        let all = topics(120_000)
        let parts = InterestTable.Part.split(all, generation: 1)
        #expect(parts.count == 60)
        #expect(parts.allSatisfy { $0.text.utf8.count < 128 * 1024 })
        #expect(parts.reduce(0) { $0 + $1.text.utf8.count } > 1_048_576, "the whole set is past 1 MB")
        var table = InterestTable(ttl: .seconds(3), maxTopicsPerNode: 200_000, maxTopics: 200_000)
        var outcome = InterestTable.Outcome.gathering
        for part in parts {
            let header = InterestTable.Part.parse(part.text)
            #expect(header?.part == part.part && header?.parts == 60 && header?.generation == 1)
            outcome = table.receive(part, from: "big", at: .now)
        }
        #expect(outcome == .complete(.init(changed: true)))
        #expect(table.union.count == 120_000)
    }

    @Test func aLostPartDropsTheSetUntilTheNextPublishAndTheOldSetStays() {
        var table = InterestTable(ttl: .seconds(3))
        let first = InterestTable.Part.split(topics(10), generation: 1)
        #expect(table.receive(first[0], from: "a", at: .now) == .complete(.init(changed: true)))
        let second = InterestTable.Part.split(topics(5_000), generation: 2)
        #expect(table.receive(second[0], from: "a", at: .now) == .gathering)
        #expect(table.receive(second[2], from: "a", at: .now) == .outOfSequence)
        #expect(table.union.count == 10)
        // The next generation starts over and completes.
        for part in InterestTable.Part.split(topics(5_000), generation: 3) { _ = table.receive(part, from: "a", at: .now) }
        #expect(table.union.count == 5_000)
    }

    @Test func aSetPastTheCapIsRefusedWhole() {
        var table = InterestTable(ttl: .seconds(3), maxTopicsPerNode: 3_000)
        var outcomes: [InterestTable.Outcome] = []
        for part in InterestTable.Part.split(topics(5_000), generation: 1) { outcomes.append(table.receive(part, from: "a", at: .now)) }
        #expect(outcomes.contains(.tooManyTopics))
        #expect(table.union.isEmpty)
    }

    @Test func nodesPastTheCapAreRefusedAndKnownOnesStillCount() {
        var table = InterestTable(ttl: .seconds(3), maxNodes: 3)
        for node in ["a", "b", "c"] {
            #expect(table.receive(InterestTable.Part.split(topics(2), generation: 1)[0], from: node, at: .now) != .tooManyNodes)
        }
        #expect(table.receive(InterestTable.Part.split(topics(5), generation: 1)[0], from: "invented", at: .now) == .tooManyNodes)
        #expect(table.union.count == 2)
        #expect(table.receive(InterestTable.Part.split(topics(4), generation: 2)[0], from: "a", at: .now) == .complete(.init(changed: true)))
        #expect(table.union.count == 4)
    }

    @Test func headersThatAreNotPartsAreRefused() {
        for text in ["Q.AAPL,T.MSFT", "1 2/1\nQ.AAPL", "1 0/1\n", "x 1/1\n", "1 1/1001\n", ""] {
            #expect(InterestTable.Part.parse(text) == nil, "\(text)")
        }
        #expect(InterestTable.Part.parse("5 1/1\n")?.topics == "")
    }
}

@Suite struct ClusterChecksTests {
    let aapl = Topic(eventType: "Q", ticker: "AAPL")!

    func check(_ text: String) -> Result<MarketEvent, WireRejection> {
        Array(text.utf8).withUnsafeBytes { EventCheck(market: .stocks, wire: .polygon, maxBytes: ClusterChecks.maxEventBytes).event($0, topic: aapl) }
    }

    @Test func oneMatchingObjectPasses() throws {
        let event = try check(#" {"ev":"Q","sym":"AAPL","bp":1.5} "#).get()
        #expect(event.topic == aapl)
        #expect(event.json == #"{"ev":"Q","sym":"AAPL","bp":1.5}"#)
    }

    @Test func anEventPastItsSizeOrATickerPastItsLengthIsRefused() {
        let padding = String(repeating: " ", count: ClusterChecks.maxEventBytes)
        #expect((try? check(#"{"ev":"Q","sym":"AAPL","bp":1.5}"# + padding).get()) == nil, "past 64 KiB")
        let long = Topic(eventType: "Q", ticker: String(repeating: "A", count: 41))!
        let refused = Array(#"{"ev":"Q","sym":"\#(long.ticker)","bp":1.5}"#.utf8).withUnsafeBytes {
            EventCheck(market: .stocks, wire: .polygon, maxBytes: ClusterChecks.maxEventBytes).event($0, topic: long)
        }
        #expect((try? refused.get()) == nil, "a 41-byte ticker")
    }

    @Test func everythingElseIsRefused() {
        for text in [
            "[1}]garbage", "", "   ", #"[{"ev":"Q","sym":"AAPL"}]"#, #"{"ev":"Q","sym":"MSFT"}"#, #"{"ev":"T","sym":"AAPL"}"#,
            #"{"ev":"Q","sym":"AAPL"} x"#, #"{"ev":"Q","sym":"AAPL""#, #"{"sym":"AAPL"}"#, #"{"ev":"status","status":"x"}"#,
        ] {
            if case .success = check(text) { Issue.record("accepted: \(text)") }
        }
    }

    @Test func interestTopicsFollowTheTopicRules() {
        let limits = SessionLimits(eventTypes: Market.stocks.eventTypes)
        let list = Topic.parseList("Q.AAPL,ZZ.EVIL,T.\(String(repeating: "A", count: 60)),T.NVDA,???")
        let (accepted, refused) = ClusterChecks.interest(list.topics, invalid: list.invalid, limits: limits)
        #expect(accepted == [aapl, Topic(eventType: "T", ticker: "NVDA")!])
        #expect(refused.count == 3)
    }

    @Test func aLeaseValueNamesItsTermAndOneOfAnEarlierVersionStillReads() throws {
        let value = LeaseValue(node: "n1", leaseMs: 5000, term: "k3v9q0x1z2ab")
        #expect(value.text == #"{"leaseMs":5000,"node":"n1","term":"k3v9q0x1z2ab"}"#)
        #expect(LeaseValue(parsing: Array(value.text.utf8)) == value)
        let earlier = try #require(LeaseValue(parsing: Array(#"{"leaseMs":5000,"node":"n1"}"#.utf8)))
        #expect(earlier.node == "n1" && earlier.term == nil)
        #expect(LeaseValue(parsing: Array(#"{"leaseMs":5000,"node":"n1","term":"\#(String(repeating: "t", count: 65))"}"#.utf8)) == nil)
    }

    @Test func aLeaseValueSaysHowFarItsHolderStampedAndNoFurtherThanAPositionGoes() throws {
        let value = LeaseValue(node: "n1", leaseMs: 5000, term: "k3v9q0x1z2ab", through: 41)
        #expect(value.text == #"{"leaseMs":5000,"node":"n1","term":"k3v9q0x1z2ab","through":41}"#)
        #expect(LeaseValue(parsing: Array(value.text.utf8)) == value)
        #expect(LeaseValue(parsing: Array(#"{"leaseMs":5000,"node":"n1","term":"k3v9q0x1z2ab"}"#.utf8))?.through == nil)
        let past = #"{"leaseMs":5000,"node":"n1","term":"k3v9q0x1z2ab","through":\#(EventPosition.maxSequence + 1)}"#
        #expect(LeaseValue(parsing: Array(past.utf8)) == nil, "no relay node writes a position past the largest")
    }

    @Test func leaseValuesRoundTripAndForeignOnesDoNotParse() {
        let value = LeaseValue(node: "n1", leaseMs: 5000)
        #expect(LeaseValue(parsing: Array(value.text.utf8)) == value)
        for text in ["n1", "garbage", "", #"{"node":"","leaseMs":5000}"#, #"{"node":"n1"}"#, #"{"node":"n1","leaseMs":-1}"#] {
            #expect(LeaseValue(parsing: Array(text.utf8)) == nil, "\(text)")
        }
    }

    @Test func userInformationIsRedacted() {
        #expect(ClusterConfiguration.redacted("nats://relay:pw@10.0.0.1:4222") == "nats://***@10.0.0.1:4222")
        #expect(ClusterConfiguration.redacted("tls://tok@host:4222/x@y") == "tls://***@host:4222/x@y")
        #expect(ClusterConfiguration.redacted("nats://host:4222") == "nats://host:4222")
        let configuration = ClusterConfiguration(servers: ["nats://a:b@h1:1", "tls://h2:2"], nodeID: "n")
        #expect(configuration.displayServers == "nats://***@h1:1,tls://h2:2")
        #expect(throws: ClusterError.invalidURL("http://***@h:1")) { try ClusterConfiguration.servers(from: "http://u:secret@h:1") }
    }

    /// Vectors from an independent implementation (Python: cryptography's Ed25519, base64.b32encode,
    /// binascii.crc_hqx), for seeds 0x00…0x1F, all 0xFF, and RFC 8032's first test key.
    @Test(arguments: [
        ("SUAAAAICAMCAKBQHBAEQUCYMBUHA6EARCIJRIFIWC4MBSGQ3DQOR4H776Y", "UAB2CB576PHBBPQ5ODORRZ2LYCMWPZGWGCN2KDK7DXOIMZASKUY3RLKK"),
        ("SUAP777777777777777777777777777777777777777777777777775UUA", "UB3KCWJAISTOJ5IREZN4U45GATMQWBJJ2HPWAK7DBIM2SJLWMDI7LRYD"),
        ("SUAJ2YNRTXX72WTAXKCEV5ES5QWMIRCJYVUXWMTJDFYDXLADDSXH6YALCA", "UDLVVGABQKYQVN6VJP7NHSLEA45A5YLS6PNKMIZFV4BBU2HXA5IRUVAL"),
    ])
    func nkeySeedsGiveTheirPublicKeys(seed: String, publicKey: String) throws {
        #expect(try NKey.publicKey(fromSeed: seed) == publicKey)
    }

    @Test func aUserSeedIsEncodedAsNKeysDo() {
        #expect(NKey.userSeed(Array(UInt8(0)..<32)) == "SUAAAAICAMCAKBQHBAEQUCYMBUHA6EARCIJRIFIWC4MBSGQ3DQOR4H776Y")
    }

    @Test func anNKeySeedGivesItsPublicKey() throws {
        // nats-server itself checks the key in the integration tests; here the encoding's shape.
        let seed = NKey.userSeed([UInt8](repeating: 7, count: 32))
        #expect(seed.hasPrefix("SU"))
        let publicKey = try NKey.publicKey(fromSeed: seed)
        #expect(publicKey.hasPrefix("U") && publicKey.count == 56)
        #expect(throws: NKeyError.self) { try NKey.publicKey(fromSeed: "SUAAAA") }
    }
}

@Suite struct AlpacaClusterChecksTests {
    let topic = Topic(eventType: "t", ticker: "AAPL")!

    func check(_ bytes: [UInt8]) -> Result<MarketEvent, WireRejection> {
        bytes.withUnsafeBytes { EventCheck(market: .stocks, wire: .alpaca(.iex), maxBytes: ClusterChecks.maxEventBytes).event($0, topic: topic) }
    }

    @Test func anAlpacaEventFromNATSIsOneMapNamingItsSubjectsTopicAndNothingElse() throws {
        let trade = AlpacaEvents.trade("AAPL", id: 1, price: 187.25, size: 100, nanoseconds: 0)
        let bytes = Array(trade.bytes.readableBytesView)
        let accepted = try check(bytes).get()
        #expect(accepted.topic == topic && Array(accepted.bytes.readableBytesView) == bytes)
        // Another topic, bytes after the map, no map, a map cut short: refused.
        let other = AlpacaEvents.trade("MSFT", id: 1, price: 1, size: 1, nanoseconds: 0)
        for bad in [Array(other.bytes.readableBytesView), bytes + [0xC0], [0x91] + bytes, Array(bytes.dropLast(3))] {
            guard case .failure = check(bad) else {
                Issue.record("accepted \(bad.prefix(8))")
                continue
            }
        }
    }
}

/// Positions from NATS are checked before the history does arithmetic on them.
@Suite struct ClusterPositionChecksTests {
    func check(_ text: String) -> Result<MarketEvent, WireRejection> {
        Array(text.utf8).withUnsafeBytes {
            EventCheck(market: .stocks, wire: .polygon, maxBytes: ClusterChecks.maxEventBytes).event($0, topic: Topic(parsing: "T.AAPL")!)
        }
    }

    @Test func anEventWhosePositionsOverflowIsRefusedAndAPlausibleOneAccepted() {
        let base = #"{"ev":"T","sym":"AAPL","p":1,"s":1,"t":1700000000000"#
        for tail in [
            #","_s":18446744073709551615,"_m":18446744073709551615}"#, #","_s":1,"_m":18446744073709551614}"#, #","_s":0,"_m":5}"#,
            #","_s":1,"_m":9007199254740993}"#,
        ] {
            guard case .failure(let rejection) = check(base + tail) else {
                Issue.record("accepted: \(tail)")
                continue
            }
            #expect(rejection.description.contains("implausible position"), "\(rejection)")
        }
        #expect((try? check(base + #","_s":3,"_m":9007199254740992}"#).get()) != nil)
        #expect((try? check(base + "}").get()) != nil, "an event with no positions passes as before")
        #expect(EventPosition.read(from: ByteBuffer(string: base + #","_s":1,"_m":18446744073709551615}"#)) == nil)
    }
}
