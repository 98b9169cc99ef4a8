import AlpacaWire
import PolygonWire

/// One benchmark setup: the upstream's rate and shape, and who subscribes to what. Value type,
/// `Sendable`. The named scenarios are documented in the README with the figures measured.
public struct BenchScenario: Sendable, Codable {
    public var name: String
    /// Fast subscriber connections.
    public var subscribers: Int
    /// Symbols each subscriber follows (quotes and trades of each: two topics per symbol).
    public var symbolsPerSubscriber: Int
    /// Symbols in the upstream's market.
    public var universe: Int
    /// Upstream quotes and trades per second.
    public var rate: Double
    /// Events per upstream frame.
    public var frameEvents: Int
    /// Subscribe to `Q.*` and `T.*` instead of symbols.
    public var wildcard: Bool
    /// Extra subscribers that subscribe to everything and then never read.
    public var stalledSubscribers: Int
    /// Measured seconds, after `warmupSeconds`.
    public var durationSeconds: Double
    public var warmupSeconds: Double
    /// Relay processes: 1 is a single relay; more run as a cluster on a NATS server the bench starts,
    /// with subscriber `i` on node `i % nodes`, followed by a kill -9 and a SIGTERM failover.
    public var nodes: Int = 1
    /// The markets served, each with its own upstream connection (to the one synthetic feed) and its
    /// share of the rate, the universe and the subscribers (subscriber `i` on market `i % count`).
    public var markets: [Market] = [.stocks]
    /// Alpaca's protocol on both sides: the feed, the relay's upstream and the subscribers, in
    /// ``alpacaCodec`` (MessagePack, as Alpaca's SDKs; or JSON, as a plain WebSocket client).
    public var alpaca = false
    public var alpacaCodec: AlpacaCodec = .messagePack
    /// The share of subscribers (0…1) that also hold derived 5-second bars of each of their symbols
    /// (`AM.AAPL@5s`; Polygon's stocks and crypto): what building bars costs the fan-out.
    public var barShare: Double = 0
    /// Those subscribers hold the bars only (not their symbols' quotes and trades).
    public var barsOnly = false

    public static let fanout = BenchScenario(
        name: "fanout", subscribers: 100, symbolsPerSubscriber: 20, universe: 100, rate: 50_000, frameEvents: 50,
        wildcard: false, stalledSubscribers: 0, durationSeconds: 10, warmupSeconds: 2)
    public static let manyClients = BenchScenario(
        name: "many-clients", subscribers: 10_000, symbolsPerSubscriber: 1, universe: 100, rate: 50, frameEvents: 50,
        wildcard: false, stalledSubscribers: 0, durationSeconds: 10, warmupSeconds: 2)
    public static let firehose = BenchScenario(
        name: "firehose", subscribers: 4, symbolsPerSubscriber: 0, universe: 1000, rate: 200_000, frameEvents: 100,
        wildcard: true, stalledSubscribers: 0, durationSeconds: 10, warmupSeconds: 2)
    public static let slowConsumer = BenchScenario(
        name: "slow-consumer", subscribers: 100, symbolsPerSubscriber: 20, universe: 100, rate: 50_000, frameEvents: 50,
        wildcard: false, stalledSubscribers: 1, durationSeconds: 10, warmupSeconds: 2)

    /// `fanout` on three nodes of a cluster (run after a single-node `fanout` by `relay bench cluster`).
    public static let cluster: BenchScenario = {
        var scenario = BenchScenario.fanout
        scenario.name = "cluster"
        scenario.nodes = 3
        return scenario
    }()

    /// `fanout`'s load split across three markets at once (stocks, crypto, options), each with its own
    /// upstream connection: a third of the rate, the symbols and the subscribers each.
    public static let markets: BenchScenario = {
        var scenario = BenchScenario.fanout
        scenario.name = "markets"
        scenario.markets = [.stocks, .crypto, .options]
        return scenario
    }()

    /// `fanout` in Alpaca's protocol: the feed and the relay's upstream speak it, and the subscribers
    /// are MessagePack clients as Alpaca's SDKs are (`t.`/`q.` of their symbols).
    public static let alpaca: BenchScenario = {
        var scenario = BenchScenario.fanout
        scenario.name = "alpaca"
        scenario.alpaca = true
        return scenario
    }()

    /// `alpaca` with JSON subscribers: each event converted to Alpaca's JSON, once for all of them.
    public static let alpacaJSON: BenchScenario = {
        var scenario = BenchScenario.alpaca
        scenario.name = "alpaca-json"
        scenario.alpacaCodec = .json
        return scenario
    }()

    /// Bars built for 10,000 symbols from their trades: 100 subscribers each holding the 5-second bars of
    /// 100 symbols and nothing else, so the upstream sends trades only (its 30% share of the rate).
    public static let bars: BenchScenario = {
        var scenario = BenchScenario(
            name: "bars", subscribers: 100, symbolsPerSubscriber: 100, universe: 10_000, rate: 333_000, frameEvents: 100,
            wildcard: false, stalledSubscribers: 0, durationSeconds: 10, warmupSeconds: 6)
        scenario.barShare = 1
        scenario.barsOnly = true
        return scenario
    }()

    public static let named: [BenchScenario] = [.fanout, .manyClients, .firehose, .slowConsumer, .cluster, .markets, .alpaca, .alpacaJSON, .bars]

    /// A subscriber's WebSocket path on a relay of this scenario.
    func path(of market: Market) -> String {
        guard alpaca else { return "/\(market)" }
        return market == .crypto ? "/v1beta3/crypto/us" : "/v2/iex"
    }

    /// The market's tickers: `S000`, `S001`, … (crypto `X:S000-USD`, options `O:S000`, forex `C:S000-USD`, …).
    func tickers(of market: Market) -> [String] {
        let width = max(String(universe - 1).count, 3)
        return (0..<max(universe / max(markets.count, 1), 1)).map { index in
            let digits = String(index)
            let base = "S" + String(repeating: "0", count: width - digits.count) + digits
            switch market {
            case .crypto, .forex: return market.topicTicker(base + "-USD")
            default: return market.topicTicker(base)
            }
        }
    }

    /// The stocks tickers (one-market scenarios).
    var tickers: [String] { tickers(of: markets.first ?? .stocks) }

    /// The market of subscriber `index`.
    func market(ofSubscriber index: Int) -> Market { markets.isEmpty ? .stocks : markets[index % markets.count] }

    /// The quote and trade channels a subscriber follows on `market`.
    static func channels(of market: Market) -> [String] {
        switch market {
        case .crypto: ["XQ", "XT"]
        case .forex: ["C"]
        case .indices: ["V"]
        default: ["Q", "T"]
        }
    }

    /// The topics of subscriber `index`.
    func topics(forSubscriber index: Int) -> [String] {
        let market = market(ofSubscriber: index)
        let channels = alpaca ? ["q", "t"] : Self.channels(of: market)
        if wildcard { return channels.map { "\($0).*" } }
        let barType: String? = alpaca ? (market == .stocks || market == .crypto ? "b" : nil) : [Market.stocks: "AM", .crypto: "XA"][market]
        // A share of each hundred subscribers, spread over the indices rather than the first ones.
        let holdsBars = barType != nil && Double(index * 37 % 100) < barShare * 100
        return symbols(forSubscriber: index).flatMap { symbol in
            (holdsBars && barsOnly ? [] : channels.map { "\($0).\(symbol)" }) + (holdsBars ? ["\(barType ?? "AM").\(symbol)@5s"] : [])
        }
    }

    /// The symbols of subscriber `index`: a spread that covers its market's universe evenly across subscribers.
    func symbols(forSubscriber index: Int) -> [String] {
        let all = tickers(of: market(ofSubscriber: index))
        guard !all.isEmpty else { return [] }
        let count = min(symbolsPerSubscriber, all.count)
        // A stride coprime-ish with the universe spreads each subscriber's picks across it.
        let stride = 37 % all.count == 0 ? 1 : 37
        // The bars scenario: every symbol of the universe held once (subscriber i takes the i-th run).
        if barsOnly { return (0..<count).map { all[(index * count + $0) % all.count] } }
        return (0..<count).map { all[(index * 7 + $0 * stride) % all.count] }
    }
}
