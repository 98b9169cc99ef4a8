import AlpacaWire
import MarketCore
import NIOCore
import Testing

@testable import Cluster

/// The leader's books for the cluster's last-value store, within their bytes.
@Suite struct FoldedLastValuesTests {
    let folding = AlpacaWireProtocol(feed: .crypto).folding(of: .crypto, limits: FoldLimits())

    /// A whole book of `symbol` with `levels` levels a side.
    func book(_ symbol: String, levels: Int, whole: Bool = true) -> MarketEvent {
        func side(_ from: Double) -> MessagePack.Value {
            .array((0..<levels).map { .map([.init(.string("p"), .double(from + Double($0))), .init(.string("s"), .double(1))]) })
        }
        var fields: [(String, MessagePack.Value)] = [("T", .string("o")), ("S", .string(symbol)), ("b", side(100)), ("a", side(1000))]
        if whole { fields.append(("r", .bool(true))) }
        return AlpacaEvents.event("o", symbol, fields)
    }

    @Test func booksPastTheirBytesGoOldestFirstAndAreEmptiedInTheStore() throws {
        let folding = try #require(folding)
        let limit = 64 << 10
        var values = FoldedLastValues(bytesLimit: limit)
        var emptied: Set<String> = []
        var largest = 0
        for n in 0..<200 {
            values.apply(book("S\(n)/USD", levels: 50), folding: folding)
            for (topic, bytes) in values.takeChanged() where bytes.readableBytes == 0 { emptied.insert(topic.ticker) }
            largest = max(largest, values.bytes)
        }
        // Past the bound only by what the last book's whole form added (trimmed at the next change).
        #expect(largest <= limit + 8 << 10, "\(largest) bytes of books under a bound of \(limit)")
        #expect(values.count < 200 && values.count > 10, "\(values.count) books kept")
        #expect(emptied.contains("S0/USD") && !emptied.contains("S199/USD"), "the oldest let go (and emptied in the store), the newest kept")
        // The oldest book kept, changed again, is the newest: the next ones let go of others first.
        let oldest = try #require((0..<200).first { !emptied.contains("S\($0)/USD") })
        values.apply(book("S\(oldest)/USD", levels: 50), folding: folding)
        for n in 200..<205 { values.apply(book("S\(n)/USD", levels: 50), folding: folding) }
        let gone = Set(values.takeChanged().filter { $0.1.readableBytes == 0 }.map(\.0.ticker))
        #expect(!gone.contains("S\(oldest)/USD") && gone.contains("S\(oldest + 1)/USD"), "\(oldest): \(gone.sorted())")
        // While the books are above seven tenths, a book let go for room is not made again from a change
        // (it would be asked of the upstream anew and push another out), only from its vendor's next
        // whole book.
        _ = values.takeChanged()
        let count = values.count
        values.apply(book("S0/USD", levels: 1, whole: false), folding: folding)
        #expect(values.count == count && !values.takeChanged().contains { $0.0.ticker == "S0/USD" })
        values.apply(book("S0/USD", levels: 1), folding: folding)
        #expect(values.takeChanged().contains { $0.0.ticker == "S0/USD" && $0.1.readableBytes > 0 })
        #expect(!values.notWhole().contains { $0.ticker == "S0/USD" })
        // With room again (the other books left the upstream set), one is made again from a change,
        // and asked of the upstream whole.
        values.interrupt(outside: [Topic(eventType: "o", ticker: "S1/USD")!, Topic(eventType: "o", ticker: "S0/USD")!])
        values.apply(book("S1/USD", levels: 1, whole: false), folding: folding)
        #expect(values.notWhole().contains { $0.ticker == "S1/USD" })
    }
}
