import AlpacaWire
import Foundation
import Hummingbird
import MarketCore
import Synchronization

/// The demo feed's news, as Alpaca's news stream sends it (`/v1beta1/news`, Alpaca's protocol only): a
/// story about one or two of the stock majors every ``DemoFeedConfiguration/newsInterval``, and any
/// story on demand (`POST /news?symbols=AAPL,TSLA&bytes=3000000`, the feed's key required), so a large
/// item can be sent when a test or a person wants one.
extension DemoFeed {
    /// Stories written from these: a symbol's name goes where `%@` stands.
    static let headlines = [
        "%@ shares rise after quarterly revenue beats estimates",
        "%@ announces a new share buyback program",
        "Analyst upgrades %@ to outperform, citing margin expansion",
        "%@ falls as guidance for the next quarter disappoints",
        "%@ to present at an industry conference next week",
        "Options traders bet on a bigger move in %@ ahead of earnings",
    ]

    /// Generates a story every interval until cancelled.
    func generateNews(seed: UInt64) async {
        var random = SplitMix64(seed: seed)
        let symbols = DemoMarket.majors(of: .stocks).map(\.ticker)
        let clock = ContinuousClock()
        while !Task.isCancelled {
            do {
                try await clock.sleep(for: configuration.newsInterval)
            } catch {
                return
            }
            guard !symbols.isEmpty else { continue }
            var named = [symbols[Int(random.next() % UInt64(symbols.count))]]
            // One story in three names a second company.
            if random.next() % 3 == 0 {
                let second = symbols[Int(random.next() % UInt64(symbols.count))]
                if second != named[0] { named.append(second) }
            }
            let template = Self.headlines[Int(random.next() % UInt64(Self.headlines.count))]
            publishNews(symbols: named, headline: template.replacingOccurrences(of: "%@", with: named[0]))
        }
    }

    /// Sends one story now to every news connection that holds one of `symbols` or `*` (a story naming
    /// none goes to `*` only), its content `contentBytes` long when given. Returns its id and the
    /// connections it went to.
    @discardableResult
    public func publishNews(symbols: [String], headline: String? = nil, contentBytes: Int? = nil) -> (id: Int64, connections: Int) {
        let id = nextNewsID.withLock { id in
            id += 1
            return id
        }
        let title = headline ?? "\(symbols.first ?? "Markets") in the news"
        let paragraph = "<p>\(title). This is the relay's demo feed: the story is made up, its shape is Alpaca's.</p>"
        var content = paragraph
        if let contentBytes {
            content = String(repeating: paragraph, count: max(contentBytes / paragraph.utf8.count, 1))
            content += String(repeating: "x", count: max(contentBytes - content.utf8.count, 0))
        }
        let now = WallClock.nowNanoseconds()
        let bytes = AlpacaNews.item(
            id: id, headline: title, summary: title + ".", author: "Demo Desk", content: content, url: "https://example.com/news/\(id)",
            symbols: symbols, createdNanoseconds: now)
        lastNews.withLock { $0 = (bytes, symbols) }
        return (id, send(news: bytes, symbols: symbols))
    }

    /// Sends the last story again, byte for byte (as a vendor repeats one); returns the connections it
    /// went to (0 when no story was published yet).
    @discardableResult
    public func publishLastNewsAgain() -> Int {
        guard let (bytes, symbols) = lastNews.withLock({ $0 }) else { return 0 }
        return send(news: bytes, symbols: symbols)
    }

    /// Sends a story to every news connection that holds one of its routes, once each.
    private func send(news bytes: ByteBuffer, symbols: [String]) -> Int {
        // As the relay routes it: an event per symbol (`_` for none), the same item in each.
        let events = AlpacaNews.events(bytes, symbols: symbols)
        guard let event = events.first else { return 0 }
        let targets = connections.withLock { connections in
            connections.values.filter { connection in
                connection.market == .news && connection.alpaca != nil && events.contains(where: connection.wants)
            }
        }
        var frames = 0
        for connection in targets {
            for payload in AlpacaDelivery.payloads([event], codec: connection.alpaca ?? .json) {
                connection.outputs.yield(.frame(payload))
                frames += 1
            }
        }
        if frames > 0 { monitor.countSent(frames: frames, events: targets.count) }
        return targets.count
    }

    /// `POST /news?symbols=AAPL,TSLA&bytes=N&headline=…`: one story now (the feed's key required).
    func addNews(to router: Router<BasicRequestContext>) {
        router.post("/news") { request, _ -> String in
            guard self.presentsKey(request) else { throw HTTPError(.unauthorized, message: "the feed's API key is required") }
            guard self.configuration.alpaca, self.configuration.servedMarkets.contains(.news) else {
                throw HTTPError(.notFound, message: "news is served in Alpaca's protocol only, with the news market")
            }
            let query = request.uri.queryParameters
            let symbols = query.get("symbols").map { $0.split(separator: ",").map(String.init) } ?? []
            var bytes: Int?
            if let text = query.get("bytes") {
                guard let value = Int(text), (0...(64 << 20)).contains(value) else {
                    throw HTTPError(.badRequest, message: "bytes: 0 to \(64 << 20), got \(text)")
                }
                bytes = value
            }
            let sent = self.publishNews(symbols: symbols, headline: query.get("headline"), contentBytes: bytes)
            return "{\"id\":\(sent.id),\"connections\":\(sent.connections)}\n"
        }
    }
}
