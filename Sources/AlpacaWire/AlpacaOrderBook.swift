import MarketCore
import NIOCore

/// One crypto order book as Alpaca's `orderbooks` channel builds it (``TopicFold``): the vendor's whole
/// book (`"r":true`) replaces it, each increment sets the levels it names, and a level of size 0 is
/// removed. A late subscriber gets ``whole()``: the book as one `o` map marked `"r":true`, as Alpaca sends
/// it after a subscribe, with the time and position of the last event folded in.
///
/// Bounded: at most `levels` price levels per side, the best ones. A level beyond them is not kept
/// (counted in ``levelsDropped``), so a book deeper than the bound is served to its best `levels`; once
/// such a side shrinks below the bound it may lack a level it left out, and the book is not whole until
/// the vendor's next whole book.
///
/// Not whole until the first whole book arrives, after an event that cannot be read, or after
/// ``interrupt()`` (the events stopped): a state the relay knows may be wrong is never served.
/// A class confined to its hub.
public final class AlpacaOrderBook: TopicFold {
    public let symbol: String
    public let levels: Int
    /// Best first: bids from the highest price, asks from the lowest.
    private(set) var bids = Side(descending: true)
    private(set) var asks = Side(descending: false)
    public private(set) var isWhole = false
    /// Levels not kept because a side was full (and better levels filled it).
    public private(set) var levelsDropped = 0
    private var time: MessagePack.Value?
    private var position: EventPosition?
    /// The whole book as last rendered, until the next event changes it.
    private var rendered: MarketEvent?

    public init(symbol: String, levels: Int) {
        self.symbol = symbol
        self.levels = max(levels, 1)
    }

    /// One side of the book: price levels sorted best first.
    struct Side {
        let descending: Bool
        var prices: [Double] = []
        var sizes: [Double] = []
        /// Levels past the bound were left out since the last whole book: a side that shrinks below the
        /// bound then may lack a level it should show.
        var truncated = false

        /// Where `price` is, or would be inserted, keeping the order.
        func index(of price: Double) -> (index: Int, found: Bool) {
            var low = 0
            var high = prices.count
            while low < high {
                let middle = (low + high) / 2
                let other = prices[middle]
                if other == price { return (middle, true) }
                if descending ? other > price : other < price { low = middle + 1 } else { high = middle }
            }
            return (low, false)
        }

        /// Sets a level (size 0 removes it) within `limit` levels; whether a level was not kept.
        mutating func set(_ price: Double, _ size: Double, limit: Int) -> Bool {
            let (index, found) = index(of: price)
            if size == 0 {
                if found {
                    prices.remove(at: index)
                    sizes.remove(at: index)
                }
                return false
            }
            if found {
                sizes[index] = size
                return false
            }
            guard index < limit else {
                truncated = true
                return true
            }
            prices.insert(price, at: index)
            sizes.insert(size, at: index)
            if prices.count > limit {
                prices.removeLast()
                sizes.removeLast()
                truncated = true
                return true
            }
            return false
        }

        /// Sets many levels (``set(_:_:limit:)`` each); returns how many were not kept. Past a few, best
        /// first (the same price in the order given): levels sent worst first would each be inserted at
        /// the front and move every level kept, a cost of `levels × limit` an upstream could make large.
        mutating func set(all levels: [(Double, Double)], limit: Int) -> Int {
            var dropped = 0
            if levels.count <= 32 {
                for (price, size) in levels where set(price, size, limit: limit) { dropped += 1 }
                return dropped
            }
            let order = levels.indices.sorted { left, right in
                let (a, b) = (levels[left].0, levels[right].0)
                return a == b ? left < right : (descending ? a > b : a < b)
            }
            for index in order where set(levels[index].0, levels[index].1, limit: limit) { dropped += 1 }
            return dropped
        }

        mutating func clear() {
            prices.removeAll(keepingCapacity: true)
            sizes.removeAll(keepingCapacity: true)
            truncated = false
        }

        /// Whether a level it left out may now belong among those it keeps.
        func hasHole(limit: Int) -> Bool { truncated && prices.count < limit }

        var value: MessagePack.Value {
            .array(zip(prices, sizes).map { .map([.init(.string("p"), .double($0)), .init(.string("s"), .double($1))]) })
        }
    }

    public func apply(_ event: MarketEvent) {
        rendered = nil
        guard let value = try? MessagePack.decode(event.bytes.readableBytesView), case .map = value,
            let bidLevels = Self.levels(value["b"]), let askLevels = Self.levels(value["a"])
        else {
            // A change that cannot be read leaves a book nobody can vouch for: not whole until the next reset.
            isWhole = false
            return
        }
        if case .bool(true)? = value["r"] {
            bids.clear()
            asks.clear()
            isWhole = true
        }
        levelsDropped += bids.set(all: bidLevels, limit: levels) + asks.set(all: askLevels, limit: levels)
        // A side past its bound that shrank may lack a level it left out: not whole until the next reset.
        if bids.hasHole(limit: levels) || asks.hasHole(limit: levels) { isWhole = false }
        time = value["t"] ?? time
        position = EventPosition.read(from: event.bytes)
    }

    /// A side's levels as (price, size); `nil` when they are not an array of `{"p","s"}` numbers (an
    /// absent side is no change).
    private static func levels(_ value: MessagePack.Value?) -> [(Double, Double)]? {
        guard let value else { return [] }
        guard case .array(let items) = value else { return nil }
        var levels: [(Double, Double)] = []
        levels.reserveCapacity(items.count)
        for item in items {
            guard let price = number(item["p"]), let size = number(item["s"]), price.isFinite, price > 0, size.isFinite, size >= 0 else { return nil }
            levels.append((price, size))
        }
        return levels
    }

    private static func number(_ value: MessagePack.Value?) -> Double? {
        switch value {
        case .double(let number)?: number
        case .int(let number)?: Double(number)
        case .uint(let number)?: Double(number)
        default: nil
        }
    }

    public func whole() -> MarketEvent? {
        guard isWhole else { return nil }
        if let rendered { return rendered }
        let type = AlpacaChannel.orderbooks.eventType
        var fields: [(String, MessagePack.Value)] = [("T", .string(type)), ("S", .string(symbol))]
        if let time { fields.append(("t", time)) }
        fields += [("b", bids.value), ("a", asks.value), ("r", .bool(true))]
        var event = AlpacaEvents.event(type, symbol, fields)
        if let position { event = EventPosition.stamp([event], [position])[0] }
        rendered = event
        return event
    }

    public func interrupt() {
        isWhole = false
        rendered = nil
    }

    /// Two doubles per level, the arrays' headers, and the whole book as last rendered.
    public var footprint: Int { 16 * (bids.prices.capacity + asks.prices.capacity) + 256 + (rendered?.bytes.readableBytes ?? 0) }

    /// The book's levels, best first (tests and the dashboard).
    public var bidLevels: [(price: Double, size: Double)] { Array(zip(bids.prices, bids.sizes)) }
    public var askLevels: [(price: Double, size: Double)] { Array(zip(asks.prices, asks.sizes)) }
}
