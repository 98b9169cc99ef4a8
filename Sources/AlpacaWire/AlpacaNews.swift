import MarketCore
import NIOCore
import Synchronization

/// Alpaca's news stream (`/v1beta1/news`): each item is one map, `{"T":"n","id":…,"headline":…,
/// "summary":…,"author":…,"created_at":…,"updated_at":…,"url":…,"content":…,"symbols":[…],"source":…}`,
/// and goes to whoever holds any of its symbols (or `*`). Pure, apart from ``NewsSent``.
///
/// The relay routes an item by each of its symbols: reading it gives one event per symbol
/// (`n.AAPL`, `n.TSLA`), all sharing the item's one copy of its bytes, so every part of the relay that
/// works per topic (the wanted set, rights, history, resume, last values, the cluster's subjects) works
/// for news unchanged. A connection holding two of an item's symbols, or `*`, would take it twice: its
/// framing sends each item once (``NewsSent``), as Alpaca does.
public enum AlpacaNews {
    /// The event type of an item (`T`).
    public static let eventType = AlpacaChannel.news.eventType

    /// The symbols an item is routed by, at most: a story naming more reaches the first ones' holders
    /// and `*` (Alpaca's items name a few; this bounds what one item can cost in copies).
    public static let maxSymbols = 100

    /// What an item's copies may hold together: the hub writes each copy's positions into it (so each
    /// copy is bytes of its own once resume is on), so a large item is routed by fewer of its symbols
    /// (a 3 MiB item by 10); `*` holders get it whatever it names.
    public static let maxRoutedBytes = 32 << 20

    /// The ticker of an item that names no symbol: only `*` (alpaca-py treats such an item so too).
    public static let noSymbol = "_"

    /// The tickers an item of `itemBytes` (0: unknown) is routed by: its symbols as topics may name
    /// them, each once, in order, at most ``maxSymbols`` and at most ``maxRoutedBytes`` together;
    /// ``noSymbol`` when none is usable.
    public static func routes(_ symbols: [String], itemBytes: Int = 0) -> [String] {
        let limit = itemBytes > 0 ? max(1, min(maxSymbols, maxRoutedBytes / itemBytes)) : maxSymbols
        var seen = Set<String>()
        var routes: [String] = []
        // A symbol no topic could name (past the ticker rules or their length, or a derived bar's, with
        // `@`, which the upstream's events may not name) is not routed: the item goes to the symbols
        // that can be held, or to `_` when there is none.
        for symbol in symbols
        where routes.count < limit && Topic.isTicker(symbol) && !Topic.namesRelayTopic(symbol)
            && symbol.utf8.count <= SessionLimits().maxTickerLength && seen.insert(symbol).inserted
        {
            routes.append(symbol)
        }
        return routes.isEmpty ? [noSymbol] : routes
    }

    /// The item's `id` (an integer), found without decoding the rest of it; `nil` when it has none.
    public static func id(in bytes: UnsafeRawBufferPointer) -> Int64? { fields(in: bytes).id }

    /// The `id` of an item event.
    public static func id(of event: borrowing MarketEvent) -> Int64? {
        event.bytes.withUnsafeReadableBytes { id(in: $0) }
    }

    /// What tells one version of an item from another: its `id` with its `updated_at` (a story Alpaca
    /// sends again, updated, under the same id is new to a client); `nil` for a map without an id.
    public static func version(of event: borrowing MarketEvent) -> Int? {
        event.bytes.withUnsafeReadableBytes { bytes -> Int? in
            let found = fields(in: bytes)
            guard let id = found.id else { return nil }
            var hasher = Hasher()
            hasher.combine(id)
            if let updated = found.updated { hasher.combine(bytes: UnsafeRawBufferPointer(rebasing: bytes[updated])) }
            return hasher.finalize()
        }
    }

    /// The `id` and where the `updated_at` value lies, read without decoding anything else.
    private static func fields(in bytes: UnsafeRawBufferPointer) -> (id: Int64?, updated: Range<Int>?) {
        var reader = MessagePack.Reader(bytes)
        guard let entries = try? reader.mapCount() else { return (nil, nil) }
        var id: Int64?
        var updated: Range<Int>?
        for _ in 0..<entries {
            do {
                let key = try reader.stringBytes()
                if let key, key.count == 2, key[0] == UInt8(ascii: "i"), key[1] == UInt8(ascii: "d") {
                    id = try reader.value().integer
                } else if let key, key.elementsEqual("updated_at".utf8) {
                    updated = try reader.skip()
                } else {
                    if key == nil { _ = try reader.skip() }
                    _ = try reader.skip()
                }
            } catch {
                return (nil, nil)
            }
            if id != nil, updated != nil { break }
        }
        return (id, updated)
    }

    /// An item as Alpaca's stream sends it (the demo feed, tests): times as MessagePack timestamps,
    /// which alpaca-py reads with `to_datetime()`, and JSON clients get as RFC 3339 text.
    public static func item(
        id: Int64, headline: String, summary: String, author: String, content: String, url: String?, symbols: [String], source: String = "benzinga",
        createdNanoseconds: Int64, updatedNanoseconds: Int64? = nil
    ) -> ByteBuffer {
        var writer = MessagePack.Writer(capacity: 256 + content.utf8.count + headline.utf8.count + summary.utf8.count)
        writer.mapHeader(11)
        writer.string("T")
        writer.string(eventType)
        writer.string("id")
        writer.int(id)
        writer.string("headline")
        writer.string(headline)
        writer.string("summary")
        writer.string(summary)
        writer.string("author")
        writer.string(author)
        writer.string("created_at")
        writer.value(AlpacaEvents.time(nanoseconds: createdNanoseconds))
        writer.string("updated_at")
        writer.value(AlpacaEvents.time(nanoseconds: updatedNanoseconds ?? createdNanoseconds))
        writer.string("url")
        writer.value(url.map { .string($0) } ?? .null)
        writer.string("content")
        writer.string(content)
        writer.string("symbols")
        writer.value(.array(symbols.map { .string($0) }))
        writer.string("source")
        writer.string(source)
        return ByteBuffer(bytes: writer.bytes)
    }

    /// An item's events, one per route (``routes(_:itemBytes:)``), sharing `bytes`.
    public static func events(_ bytes: ByteBuffer, symbols: [String], receivedAt: UInt64 = 0) -> [MarketEvent] {
        var unbounded = Int.max
        return events(bytes, symbols: symbols, receivedAt: receivedAt, routedBytes: &unbounded)
    }

    /// ``events(_:symbols:receivedAt:)`` within what the rest of its message may still route
    /// (`routedBytes`, less this item's copies): a message of many items each naming many symbols costs
    /// its message's bound in copies, not items × symbols. An item is routed by one symbol at least.
    public static func events(_ bytes: ByteBuffer, symbols: [String], receivedAt: UInt64 = 0, routedBytes: inout Int) -> [MarketEvent] {
        let size = max(bytes.readableBytes, 1)
        let routed = routes(symbols, itemBytes: bytes.readableBytes).prefix(max(1, routedBytes / size))
        routedBytes -= routed.count * size
        return routed.map { MarketEvent(eventType: eventType, ticker: $0, bytes: bytes, receivedAt: receivedAt) }
    }

    /// What one upstream message's news items may be routed as, in bytes of copies: ``maxRoutedBytes``,
    /// or eight times the message.
    public static func routedBytes(ofMessage bytes: Int) -> Int { max(maxRoutedBytes, 8 * bytes) }
}

/// What one connection was sent of the news lately (each item's version: its id and `updated_at`), so
/// an item routed by several of the symbols it holds goes to it once. Bounded: the last 1,024. The copies of one item travel
/// together (one upstream message, one publish), so a short memory is enough; it also catches an item
/// that a snapshot gives for two symbols. Used on the connection's event loop; the lock is uncontended.
public final class NewsSent: Sendable {
    private struct State {
        var ring: [Int] = []
        var next = 0
        var held: Set<Int> = []
    }

    public static let remembered = 1_024
    private let state = Mutex(State())

    public init() {}

    /// Remembers what `earlier` was sent too, oldest first (a broken connection's memory, for its resume).
    public func remember(_ earlier: NewsSent) {
        let sent = earlier.state.withLock { state in Array(state.ring[state.next...] + state.ring[..<state.next]) }
        for id in sent { _ = firstTime(id) }
    }

    /// Whether `id` (an item's ``AlpacaNews/version(of:)``) was not sent yet (and it now counts as sent).
    public func firstTime(_ id: Int) -> Bool {
        state.withLock { state in
            guard state.held.insert(id).inserted else { return false }
            if state.ring.count < Self.remembered {
                state.ring.append(id)
            } else {
                state.held.remove(state.ring[state.next])
                state.ring[state.next] = id
                state.next = (state.next + 1) % Self.remembered
            }
            return true
        }
    }
}
