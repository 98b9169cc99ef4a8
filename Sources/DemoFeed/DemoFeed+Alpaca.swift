import AlpacaWire
import HummingbirdWebSocket
import NIOCore
import NIOWebSocket
import PolygonWire

/// The demo feed in Alpaca's protocol (``DemoFeedConfiguration/alpaca``): the same generated market,
/// each trade, quote and bar written as Alpaca sends it, and the server side of Alpaca's conversation.
extension DemoFeed {
    /// Alpaca's events for what a tick generated: trades (`t`), quotes (`q`) and minute bars (`b`), its
    /// stock symbols as they are, its crypto pairs and option contracts as Alpaca names them (`X:BTC-USD`
    /// is `BTC/USD`, `O:SPY251219C00650000` is `SPY251219C00650000`); options have trades and quotes only.
    /// - Parameter stamp: when given, added as `"rt"` (send time, Unix ns) for the benchmark's latency.
    static func alpacaEvents(
        _ records: [DemoTape.Record], _ bars: [DemoTape.Bar], tickers: [String], market: Market, stamp: Int64? = nil
    ) -> [MarketEvent] {
        let extra: [(String, MessagePack.Value)] = stamp.map { [("rt", .int($0))] } ?? []
        let crypto = market == .crypto
        let options = market == .options
        // Divided, not multiplied by 0.01: the quotient is the double nearest the decimal price, so it
        // is written as that price (`3414.74`, not `3414.7400000000002`), as Alpaca's are.
        let divisor = Double(pow10(DemoMarket.decimals(of: market)))
        func symbol(_ index: UInt16) -> String? {
            guard Int(index) < tickers.count else { return nil }
            return AlpacaSymbol.of(tickers[Int(index)], market: market)
        }
        var events: [MarketEvent] = []
        events.reserveCapacity(records.count + bars.count)
        for bar in bars where !options {
            guard let name = symbol(bar.ticker) else { continue }
            events.append(
                AlpacaEvents.bar(
                    name, open: Double(bar.open) / divisor, high: Double(bar.high) / divisor, low: Double(bar.low) / divisor,
                    close: Double(bar.close) / divisor, volume: Double(bar.volume), trades: Int64(bar.trades), startNanoseconds: bar.start * 1_000_000))
        }
        for record in records {
            guard let name = symbol(record.ticker) else { continue }
            let nanoseconds = record.time * 1_000_000
            if options {
                switch record.kind {
                case .trade:
                    events.append(
                        AlpacaEvents.optionTrade(name, price: Double(record.price) / divisor, size: Int64(record.size), nanoseconds: nanoseconds, extra: extra))
                case .quote:
                    events.append(
                        AlpacaEvents.optionQuote(
                            name, bid: Double(record.price) / divisor, ask: Double(record.ask) / divisor, bidSize: Int64(record.size),
                            askSize: Int64(record.askSize), nanoseconds: nanoseconds, extra: extra))
                }
                continue
            }
            switch record.kind {
            case .trade:
                events.append(
                    AlpacaEvents.trade(
                        name, id: record.sequence, price: Double(record.price) / divisor, size: crypto ? Double(record.size) / 100 : Double(record.size),
                        nanoseconds: nanoseconds, crypto: crypto, extra: extra))
            case .quote:
                events.append(
                    AlpacaEvents.quote(
                        name, bid: Double(record.price) / divisor, ask: Double(record.ask) / divisor,
                        size: crypto ? Double(record.size) / 100 : Double(record.size), nanoseconds: nanoseconds, crypto: crypto, extra: extra))
            }
        }
        return events
    }

    private static func pow10(_ exponent: Int) -> Int { (0..<exponent).reduce(1) { value, _ in value * 10 } }

    /// Alpaca's conversation with one client: the feed's key (any secret), subscriptions per channel.
    func readAlpaca(inbound: WebSocketInboundStream, outbound: WebSocketOutboundWriter, connection id: Int, market: Market, codec: AlpacaCodec)
        async throws
    {
        let expectedKey = configuration.apiKey
        var limits = SessionLimits()
        if let limit = configuration.alpacaTopicLimit { limits.topicsPerConnection = limit }
        var session = AlpacaServerSession(codec: codec, feed: .standard(for: market), limits: limits) { key in
            guard expectedKey == nil || key == expectedKey else { return nil }
            return ClientGrant(name: "demo")
        }
        for try await message in inbound.messages(maxSize: 1 << 20) {
            let bytes: [UInt8]
            switch message {
            case .text(let text): bytes = Array(text.utf8)
            case .binary(let data): bytes = Array(data.readableBytesView)
            }
            let wasAuthenticated = session.isAuthenticated
            let reaction = session.receive(bytes)
            monitor.update { snapshot in
                if !wasAuthenticated && session.isAuthenticated { snapshot.authenticatedConnections += 1 }
                // In Polygon's terms for the monitor: what the connection asked for, as topics.
                if !reaction.added.isEmpty {
                    let params = reaction.added.map(\.description).sorted().joined(separator: ",")
                    snapshot.record(.init(connection: id, kind: .subscribe, params: params, market: market))
                }
                if !reaction.removed.isEmpty {
                    let params = reaction.removed.map(\.description).sorted().joined(separator: ",")
                    snapshot.record(.init(connection: id, kind: .unsubscribe, params: params, market: market))
                }
            }
            for frame in reaction.frames {
                try await outbound.write(.custom(WebSocketFrame(fin: true, opcode: codec == .messagePack ? .binary : .text, data: ByteBuffer(bytes: frame))))
            }
            if reaction.close {
                try await outbound.close(.policyViolation, reason: "auth failed")
                return
            }
            let topics = session.topics
            // A book subscribed to is owed whole, as Alpaca sends it after a subscribe.
            let books = reaction.added.filter { $0.eventType == "o" }.map(\.ticker)
            let dropped = reaction.removed.filter { $0.eventType == "o" }.map(\.ticker)
            connections.withLock { connections in
                connections[id]?.topics = topics
                connections[id]?.booksOwed.formUnion(books)
                connections[id]?.booksOwed.subtract(dropped)
            }
        }
    }
}
