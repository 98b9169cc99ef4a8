import AlpacaWire
import DemoFeed
import Foundation
import RelayComposition
import RelayConfiguration
import Testing
import Upstream

/// An order book as a client builds it from Alpaca's JSON `o` messages: a reset replaces it, a level of
/// size 0 goes.
struct ClientBook: Equatable, CustomStringConvertible {
    var bids: [Double: Double] = [:]
    var asks: [Double: Double] = [:]

    mutating func apply(_ message: [String: Any]) {
        if message["r"] as? Bool == true {
            bids = [:]
            asks = [:]
        }
        for (key, levels) in [("b", message["b"]), ("a", message["a"])] {
            for level in levels as? [[String: Any]] ?? [] {
                guard let price = (level["p"] as? NSNumber)?.doubleValue, let size = (level["s"] as? NSNumber)?.doubleValue else { continue }
                if key == "b" { bids[price] = size == 0 ? nil : size } else { asks[price] = size == 0 ? nil : size }
            }
        }
    }

    var description: String {
        let bid = bids.sorted { $0.key > $1.key }.prefix(3).map { "\($0.key)x\($0.value)" }
        let ask = asks.sorted { $0.key < $1.key }.prefix(3).map { "\($0.key)x\($0.value)" }
        return "\(bids.count) bids \(bid)… \(asks.count) asks \(ask)…"
    }
}

/// One client's `o` messages of one symbol, in order, from Alpaca's JSON frames.
final class BookStream {
    let client: WSTestClient
    let symbol: String
    private var pending: [[String: Any]] = []

    /// Connects, authenticates and subscribes to `symbol`'s order book.
    init(url: String, key: String, symbol: String) async throws {
        client = WSTestClient(url: url)
        self.symbol = symbol
        _ = try await client.nextFrame()
        client.send(#"{"action":"auth","key":"\#(key)","secret":"any"}"#)
        #expect(try await client.nextFrame().contains("authenticated"))
        client.send(#"{"action":"subscribe","orderbooks":["\#(symbol)"]}"#)
    }

    /// The next `o` message of the symbol; fails after `timeout`.
    func next(timeout: Duration = .seconds(15)) async throws -> [String: Any] {
        let deadline = ContinuousClock.now + timeout
        while pending.isEmpty {
            guard ContinuousClock.now < deadline else { throw TimeoutError(description: "no order book message of \(symbol) in \(timeout)") }
            let frame = try await client.nextFrame()
            let items = (try? JSONSerialization.jsonObject(with: Data(frame.utf8)) as? [[String: Any]]) ?? []
            pending += items.filter { $0["T"] as? String == "o" && $0["S"] as? String == symbol }
        }
        return pending.removeFirst()
    }

    func close() async { await client.close() }
}

/// Alpaca's crypto order books through the whole relay (the demo feed in Alpaca's protocol upstream): a
/// client that subscribes after the vendor's whole book went by gets the book whole first, equal to the
/// feed's own.
@Suite("Order books: late joiners start whole", .serialized)
struct OrderBookTests {
    func withCryptoRelay(_ body: (Relay.Components, DemoFeed) async throws -> Void) async throws {
        var feedConfiguration = DemoFeedConfiguration(port: 0, apiKey: "alpaca-key", eventsPerSecond: 400, tickInterval: .milliseconds(10), seed: 11)
        feedConfiguration.alpaca = true
        feedConfiguration.markets = [.crypto]
        let feed = DemoFeed(configuration: feedConfiguration, logger: testLogger)
        try await withServices([feed]) {
            var settings = RelaySettings(
                listen: .init(host: "127.0.0.1", port: 0), upstreamKey: "alpaca-key", clientKeys: ["client-key"], upstreamTuning: fastUpstreamTuning())
            settings.vendors = Relay.vendors
            settings.upstreams = [try MarketUpstream(url: try await feed.url(for: .crypto), vendors: Relay.vendors)]
            settings.upstreamSecret = "alpaca-secret"
            settings.portfolio = nil
            let relay = Relay(settings: settings, logger: testLogger)
            try await withServices([relay]) {
                let parts = try await within(.seconds(10), "the relay to start") { try await relay.ready() }
                try await waitFor(try #require(parts.upstreams[.crypto]).stateUpdates(), "the upstream to authenticate") { $0 == .authenticated }
                try await body(parts, feed)
            }
        }
    }

    /// The feed's own book, read on a connection of its own, up to a given change.
    final class Truth {
        let stream: BookStream
        var book = ClientBook()
        var at: String?

        init(_ stream: BookStream) { self.stream = stream }

        /// The book right after the change stamped `time` (each of the demo's changes has a time of its own).
        func through(_ time: String) async throws -> ClientBook {
            let deadline = ContinuousClock.now + .seconds(15)
            while at != time {
                guard ContinuousClock.now < deadline else {
                    throw TimeoutError(description: "the feed's book never reached the change at \(time) (it is at \(at ?? "none"))")
                }
                let message = try await stream.next()
                book.apply(message)
                at = message["t"] as? String
            }
            return book
        }
    }

    static func setting(_ name: String, default value: Int) -> Int {
        ProcessInfo.processInfo.environment[name].flatMap { Int($0) } ?? value
    }

    /// Joins at random moments (RELAY_BOOK_JOINS of them over RELAY_BOOK_SECONDS; a few in the suite):
    /// each late joiner's first message is the whole book, level for level the feed's own at that
    /// change, and the changes after it keep the two equal.
    @Test func aLateJoinersBookIsTheFeedsOwnLevelForLevel() async throws {
        let joins = Self.setting("RELAY_BOOK_JOINS", default: 12)
        let seconds = Self.setting("RELAY_BOOK_SECONDS", default: 3)
        try await withCryptoRelay { parts, feed in
            let relayURL = "ws://127.0.0.1:\(parts.port)/v1beta3/crypto/us"
            let truth = Truth(try await BookStream(url: try await feed.url(for: .crypto), key: "alpaca-key", symbol: "BTC/USD"))
            // The first holder: the relay subscribes upstream and passes the vendor's whole book on.
            let holder = try await BookStream(url: relayURL, key: "client-key", symbol: "BTC/USD")
            let first = try await holder.next()
            #expect(first["r"] as? Bool == true, "the vendor's whole book first: \(first)")
            var random = SystemRandomNumberGenerator()
            var compared = 0
            let started = ContinuousClock.now
            for join in 0..<joins {
                let late = try await BookStream(url: relayURL, key: "client-key", symbol: "BTC/USD")
                let whole = try await late.next()
                #expect(whole["r"] as? Bool == true, "join \(join): the first message is the whole book: \(whole)")
                var book = ClientBook()
                book.apply(whole)
                let time = try #require(whole["t"] as? String, "the whole book has the time of its last change")
                let expected = try await truth.through(time)
                #expect(book == expected, "join \(join) at \(time): \(book) against the feed's \(expected)")
                #expect(book.bids.count > 5 && book.asks.count > 5, "a book of both sides: \(book)")
                compared += 1
                for _ in 0..<2 {
                    let change = try await late.next()
                    #expect(change["r"] == nil, "changes after the whole book are not resets")
                    book.apply(change)
                    let changeTime = try #require(change["t"] as? String)
                    #expect(book == (try await truth.through(changeTime)), "join \(join), the change at \(changeTime)")
                }
                await late.close()
                // Paced to spread the joins over the run (not a synchronisation).
                let spacing = max(seconds * 1000 / max(joins, 1), 1)
                try await Task.sleep(for: .milliseconds(Int.random(in: 0...spacing, using: &random)))
            }
            print("order books: \(compared) late joins over \(ContinuousClock.now - started), each equal to the feed's book")
            await holder.close()
            await truth.stream.close()
        }
    }

    @Test(.enabled(if: alpacaSDKsAvailable, "scripts/test installs Alpaca's SDKs"))
    func alpacaPysOrderbookTakesTheWholeBookAsItsResetModel() async throws {
        let python = try #require(alpacaPython)
        try await withCryptoRelay { parts, _ in
            // Someone holds the book already: alpaca-py joins late.
            let holder = try await BookStream(url: "ws://127.0.0.1:\(parts.port)/v1beta3/crypto/us", key: "client-key", symbol: "BTC/USD")
            _ = try await holder.next()
            for sdk in ["alpaca-py", "alpaca-trade-api"] {
                let result = try await runPython(
                    AlpacaDownstreamTests.script, ["--sdk", sdk, "--port", "\(parts.port)", "--orderbooks", "--crypto", "--symbols", "BTC/USD", "--want", "3"],
                    timeout: .seconds(60), python: python)
                #expect(result.status == 0, "\(sdk): \(result.output.suffix(3000))")
                let books = AlpacaDownstreamTests.kinds(AlpacaDownstreamTests.lastJSON(result.output))["orderbooks"] ?? []
                let first = try #require(books.first, "\(sdk) got no order book: \(result.output.suffix(2000))")
                #expect(first["symbol"] as? String == "BTC/USD", "\(sdk): \(first)")
                #expect((first["bids"] as? [[Double]])?.count ?? 0 > 5 && (first["asks"] as? [[Double]])?.count ?? 0 > 5, "\(sdk): the whole book first: \(first)")
                if sdk == "alpaca-py" {
                    #expect(first["type"] as? String == "alpaca.data.models.orderbooks.Orderbook", "\(first)")
                    #expect(first["reset"] as? Bool == true, "alpaca-py reads it as a reset: \(first)")
                    #expect(books.dropFirst().allSatisfy { $0["reset"] as? Bool == false }, "then changes")
                }
            }
            await holder.close()
        }
    }
}

extension OrderBookTests {
    /// The only holder leaves and comes back within the upstream's 50 ms batch: the upstream never saw
    /// it go, so no whole book comes by itself. The relay asks for the book anew (unsubscribes and
    /// subscribes it upstream) and the vendor's whole book reaches the holder; a late joiner then gets
    /// the book whole again, equal to the feed's.
    @Test func aBookTheRelayCannotVouchForIsAskedOfTheUpstreamAnew() async throws {
        try await withCryptoRelay { parts, feed in
            let relayURL = "ws://127.0.0.1:\(parts.port)/v1beta3/crypto/us"
            let truth = Truth(try await BookStream(url: try await feed.url(for: .crypto), key: "alpaca-key", symbol: "BTC/USD"))
            let holder = try await BookStream(url: relayURL, key: "client-key", symbol: "BTC/USD")
            #expect(try await holder.next()["r"] as? Bool == true)
            holder.client.send(#"{"action":"unsubscribe","orderbooks":["BTC/USD"]}"#)
            holder.client.send(#"{"action":"subscribe","orderbooks":["BTC/USD"]}"#)
            // The vendor's whole book again (its changes meanwhile are to a book the relay no longer vouches for).
            var renewed: [String: Any] = [:]
            for _ in 0..<2_000 {
                renewed = try await holder.next(timeout: .seconds(20))
                if renewed["r"] as? Bool == true { break }
            }
            #expect(renewed["r"] as? Bool == true, "the book came whole again: \(renewed)")
            let asked = feed.monitor.snapshot.actions.filter { $0.params.contains("o.BTC/USD") }.map(\.kind)
            #expect(asked.suffix(2) == [.unsubscribe, .subscribe], "asked anew upstream: \(asked)")
            let late = try await BookStream(url: relayURL, key: "client-key", symbol: "BTC/USD")
            let whole = try await late.next()
            #expect(whole["r"] as? Bool == true)
            var book = ClientBook()
            book.apply(whole)
            #expect(book == (try await truth.through(try #require(whole["t"] as? String))))
            await late.close()
            await holder.close()
            await truth.stream.close()
        }
    }
}
