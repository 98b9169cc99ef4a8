import AlpacaWire
import MarketCore

/// The demo's crypto order books, as Alpaca's `orderbooks` channel sends them: each pair's book of
/// about ``depth`` levels a side around its price, changed every other tick by one increment (two
/// levels set, levels the price crossed or left far behind removed with size 0), and sent whole
/// (`"r":true`) to a connection that subscribes to it. Value type; owned by its market's generator.
struct DemoBooks {
    /// Levels a side a book starts with, and how far from the price a level may stray.
    static let depth = 20
    /// Levels a side always has next to the price.
    static let nearLevels: Int64 = 8

    struct Book {
        /// Price (in the market's units, cents) → size (in 1/10,000).
        var bids: [Int64: Int64] = [:]
        var asks: [Int64: Int64] = [:]
        /// The `t` of its newest event, Unix ns: each event's is later than the one before.
        var time: Int64 = 0
    }

    private(set) var books: [String: Book] = [:]
    private var random: SplitMix64
    private var ticks = 0

    /// Books for `prices` (Alpaca symbol → price in cents).
    init(prices: [String: Int64], seed: UInt64) {
        random = SplitMix64(seed: seed)
        for (symbol, price) in prices {
            var book = Book()
            let step = Self.step(price)
            for level in 1...Int64(Self.depth) {
                // No bid at a price of nothing or less (a coin walked down to a unit).
                if price - level * step > 0 { book.bids[price - level * step] = size() }
                book.asks[price + level * step] = size()
            }
            books[symbol] = book
        }
    }

    /// The space between levels: about a basis point of the price, at least one unit.
    static func step(_ price: Int64) -> Int64 { max(price / 10_000, 1) }

    private mutating func size() -> Int64 { Int64(random.next() % 50_000) + 1 }

    /// One tick: every other one, an increment per book around its pair's price now (`prices`).
    mutating func tick(prices: [String: Int64], nanoseconds: Int64) -> [MarketEvent] {
        ticks += 1
        guard ticks % 2 == 0 else { return [] }
        var events: [MarketEvent] = []
        for symbol in books.keys.sorted() {
            guard var book = books[symbol], let price = prices[symbol] else { continue }
            let step = Self.step(price)
            var bidChanges: [Int64: Int64] = [:]
            var askChanges: [Int64: Int64] = [:]
            let reach = Int64(Self.depth * 2) * step
            // What the price crossed or left far behind goes.
            for level in book.bids.keys where level >= price || level < price - reach { bidChanges[level] = 0 }
            for level in book.asks.keys where level <= price || level > price + reach { askChanges[level] = 0 }
            // The levels next to the price are always there (a liquid pair): what the price left empty is refilled.
            for offset in 1...Self.nearLevels {
                if price - offset * step > 0, book.bids[price - offset * step] == nil { bidChanges[price - offset * step] = size() }
                if book.asks[price + offset * step] == nil { askChanges[price + offset * step] = size() }
            }
            for _ in 0..<2 {
                let offset = Int64(random.next() % UInt64(Self.depth)) + 1
                // Past the near levels a change may remove its level.
                let removes = offset > Self.nearLevels && random.next() % 4 == 0
                if random.next() % 2 == 0 {
                    guard price - offset * step > 0 else { continue }
                    bidChanges[price - offset * step] = removes ? 0 : size()
                } else {
                    askChanges[price + offset * step] = removes ? 0 : size()
                }
            }
            for (level, size) in bidChanges { book.bids[level] = size == 0 ? nil : size }
            for (level, size) in askChanges { book.asks[level] = size == 0 ? nil : size }
            book.time = max(book.time + 1, nanoseconds)
            books[symbol] = book
            events.append(
                Self.event(
                    symbol, bids: bidChanges.sorted { $0.key > $1.key }, asks: askChanges.sorted { $0.key < $1.key }, time: book.time, reset: false))
        }
        return events
    }

    /// The pairs with books.
    var symbols: [String] { books.keys.sorted() }

    /// A book whole, as Alpaca sends it after a subscribe.
    func reset(_ symbol: String) -> MarketEvent? {
        guard let book = books[symbol] else { return nil }
        return Self.event(symbol, bids: book.bids.sorted { $0.key > $1.key }, asks: book.asks.sorted { $0.key < $1.key }, time: book.time, reset: true)
    }

    private static func event(_ symbol: String, bids: [(key: Int64, value: Int64)], asks: [(key: Int64, value: Int64)], time: Int64, reset: Bool)
        -> MarketEvent
    {
        func levels(_ side: [(key: Int64, value: Int64)]) -> MessagePack.Value {
            // Divided, not multiplied, so each is the double nearest its decimal text.
            .array(side.map { .map([.init(.string("p"), .double(Double($0.key) / 100)), .init(.string("s"), .double(Double($0.value) / 10_000))]) })
        }
        var fields: [(String, MessagePack.Value)] = [
            ("T", .string("o")), ("S", .string(symbol)), ("t", AlpacaEvents.time(nanoseconds: time)), ("b", levels(bids)), ("a", levels(asks)),
        ]
        if reset { fields.append(("r", .bool(true))) }
        return AlpacaEvents.event("o", symbol, fields)
    }
}
